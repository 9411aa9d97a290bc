"""A corpus of realistic answers to the softmax implement prompt (tests/data/answers/), each
driven through what a search does with it: parse_answer, the launch plan resolved for the
built-in softmax problem at the spec's default configuration, the real compile boundary (sandboxed
NVRTC, no GPU) and the launch-argument check. ``manifest.json`` says how each must end: ``"compiles"``,
or ``{"repair": substring of the error message, "kind": AnswerProblem (for parse failures)}``.

The headline: no answer dies silently. Every answer ends as a compiled candidate or as an error
whose one line names its real cause."""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from kerngen.agent.llm.answers import AnswerError, AnswerProblem, parse_answer
from kerngen.errors import CompileError, SpecError
from kerngen.harness.compile.compiler import compile_many, job_for
from kerngen.harness.spec.kparams import check_launch_args
from kerngen.harness.spec.plan import ResolvedPlan, resolve
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import parse_problem_ref

CORPUS = Path(__file__).resolve().parents[1] / "data" / "answers"
MANIFEST: dict[str, object] = json.loads((CORPUS / "manifest.json").read_text())
ARCH = "sm_90"
HEADLINE = 0.9  # the share of the corpus that must end as the manifest says


@dataclass
class Outcome:
    stage: str  # "parse", "plan", "compile", "arguments" (where it failed) or "compiled"
    message: str = ""
    kind: AnswerProblem | None = None  # for a parse failure


@functools.cache
def nvrtc_missing() -> str:
    """Why no source can be compiled here ("" when NVRTC answers)."""
    try:
        from kerngen.harness.compile.nvrtc_info import nvrtc_version

        nvrtc_version()
    except Exception as exc:  # no cuda-bindings, no libnvrtc: the compile half of the corpus skips
        return f"NVRTC unavailable: {type(exc).__name__}: {exc}"
    return ""


def _problem():
    info = load_problem(parse_problem_ref("softmax")).info
    return info.sizes, info.tensor_facts()


def _front(text: str) -> tuple[Outcome | None, KernelSpec | None, ResolvedPlan | None]:
    """Parse and resolve: an Outcome where that already fails, else the spec and its plan."""
    try:
        spec = parse_answer(text, KernelSpec)
    except AnswerError as exc:
        return Outcome("parse", str(exc), exc.kind), None, None
    sizes, tensors = _problem()
    try:
        plan = resolve(spec, sizes=sizes, tensors=tensors, config=spec.default_config())
    except SpecError as exc:
        return Outcome("plan", str(exc)), None, None
    return None, spec, plan


@functools.cache
def outcomes() -> dict[str, Outcome]:
    """Every answer's end; the compiles run together on all cores (not once per test)."""
    done: dict[str, Outcome] = {}
    pending: list[tuple[str, KernelSpec, ResolvedPlan]] = []
    for name in MANIFEST:
        outcome, spec, plan = _front((CORPUS / name).read_text())
        if outcome is not None:
            done[name] = outcome
        else:
            assert spec is not None and plan is not None
            pending.append((name, spec, plan))
    if pending and not nvrtc_missing():
        jobs = [job_for(spec, plan, ARCH) for _, spec, plan in pending]
        for (name, _, plan), compiled in zip(pending, compile_many(jobs, cache=None)):
            if isinstance(compiled, CompileError):
                done[name] = Outcome("compile", str(compiled))
                continue
            try:
                check_launch_args(compiled.cubin, plan, compiled.info.log)
            except CompileError as exc:
                done[name] = Outcome("arguments", str(exc))
                continue
            done[name] = Outcome("compiled")
    return done


def _matches(expected: object, outcome: Outcome) -> bool:
    if expected == "compiles":
        return outcome.stage == "compiled"
    assert isinstance(expected, dict)
    if outcome.stage == "compiled" or expected["repair"] not in outcome.message or "\n" in outcome.message:
        return False
    return "kind" not in expected or outcome.kind == AnswerProblem(expected["kind"])


def _needs_compiler(name: str) -> bool:
    """Whether this answer's expected end lies past the parse and the plan."""
    return name not in outcomes() or outcomes()[name].stage in ("compiled", "compile", "arguments")


def test_the_corpus_is_large_and_every_file_is_listed():
    files = {p.name for p in CORPUS.iterdir() if p.name != "manifest.json"}
    assert files == set(MANIFEST)
    assert len(files) >= 25
    correct = [n for n, e in MANIFEST.items() if e == "compiles"]
    assert len(correct) >= 10 and len(files) - len(correct) >= 10


@pytest.mark.parametrize("name", list(MANIFEST))
def test_each_answer_ends_as_its_manifest_says(name):
    if _needs_compiler(name) and nvrtc_missing():
        pytest.skip(nvrtc_missing())
    expected, outcome = MANIFEST[name], outcomes()[name]
    assert _matches(expected, outcome), (name, expected, outcome)


def test_no_answer_dies_silently():
    """The headline: at least 90% of the corpus ends as a compiled candidate or as an error whose
    message names the cause the manifest expects (with this manifest: all of it)."""
    if nvrtc_missing():
        pytest.skip(nvrtc_missing())
    ends = outcomes()
    good = [name for name, expected in MANIFEST.items() if _matches(expected, ends[name])]
    assert len(good) / len(MANIFEST) >= HEADLINE
    assert len(good) == len(MANIFEST), sorted(set(MANIFEST) - set(good))


def test_correct_answers_read_as_the_same_kernel_in_every_form():
    """The forms differ (JSON, JSONC, JSON5, YAML, code block + plan); what they mean does not:
    each correct answer holds one of the corpus's softmax kernels and launches it once per row."""
    sizes, _ = _problem()
    for name, expected in MANIFEST.items():
        if expected != "compiles":
            continue
        outcome, spec, plan = _front((CORPUS / name).read_text())
        assert outcome is None and spec is not None and plan is not None, (name, outcome)
        assert 'extern "C" __global__' in spec.source, name
        assert plan.launches[-1].grid == (sizes["rows"], 1, 1), name
        assert spec.steps and spec.tunables, name


def test_every_cut_and_mutation_of_the_corpus_is_a_spec_or_one_line_error():
    """Answers cut anywhere, or with a character dropped, doubled or replaced by one that JSON,
    YAML or C cares about, still end as a spec or as one AnswerError line, never another
    exception; an answer cut inside its JSON says it was cut off."""
    rng = random.Random(1234)
    specials = '"\\{}[],:/*\n\'#`'
    for name in MANIFEST:
        text = (CORPUS / name).read_text()
        variants = [text[:cut] for cut in range(1, len(text), max(1, len(text) // 8))]
        for _ in range(8):
            i = rng.randrange(len(text))
            variants += [text[:i] + text[i + 1:], text[:i] + text[i] + text[i:],
                         text[:i] + rng.choice(specials) + text[i + 1:]]
        for variant in variants:
            try:
                parse_answer(variant, KernelSpec)
            except AnswerError as exc:
                assert "\n" not in str(exc) and isinstance(exc.kind, AnswerProblem)
    full = (CORPUS / "c01_raw_json.json").read_text()
    for cut in range(full.index("{") + 1, len(full.rstrip()) - 1, 97):
        with pytest.raises(AnswerError) as info:
            parse_answer(full[:cut], KernelSpec)
        assert info.value.kind is AnswerProblem.truncated, (cut, str(info.value))
