"""agent/llm/source_fold.py: a long parent's repeated helper variants folded in the prompts, with
a true count, the kernels, tunables and launch plan kept as written (issue 36's token target)."""

from __future__ import annotations

import re

import pytest

from kerngen.agent.llm.proposer import LLMProposer
from kerngen.agent.llm.source_fold import FOLD_MARK, fold_repeats
from kerngen.agent.proposer import Failure, NodeSummary
from kerngen.cli.compose import playbook_seed
from kerngen.harness.results import EvalResult, Verdict
from kerngen.problems.ref import parse_problem_ref
from tests.agent.test_prompts import IDEA
from tests.fakes.llm_server import make_context

_STUB = re.compile(r"\{ /\* body folded \((\d+) lines, ([\d,]+) characters\): the code of the (\w+) shown in full, "
                   r"with this variant's numbers \(([^)]*)\) \*/ \}")


@pytest.fixture(scope="module")
def wgmma():
    """The playbook's fp32 GEMM seed on Hopper: gw_mma defined four times, one per BN."""
    spec = playbook_seed(parse_problem_ref("matmul"))
    assert spec is not None and spec.source.count("void gw_mma(") == 4
    return spec


def _bodies(source: str) -> dict[str, str]:
    """BN -> the body of the gw_mma its `#if BN == N` guards."""
    return {m.group(1): m.group(2) for m in re.finditer(r"#if BN == (\d+)\n__device__[^\n]*gw_mma\([^\n]*\) (\{.*?\n\})\n",
                                                        source, re.S)}


def test_the_wgmma_seed_keeps_one_gw_mma_and_folds_three_with_true_counts(wgmma):
    source = wgmma.source.strip()
    shown = fold_repeats(source, {"BN": 128})
    stubs = _STUB.findall(shown)
    assert len(stubs) == 3 and all(name == "gw_mma" for _, _, name, _ in stubs)
    bodies = _bodies(source)
    assert bodies["128"] in shown  # the variant the configuration selects, in full
    for (lines, chars, _, differs), bn in zip(stubs, ("64", "192", "256")):
        assert int(chars.replace(",", "")) == len(bodies[bn]) and int(lines) == bodies[bn].count("\n") + 1
        assert differs == f"m64n{bn}k8" and bodies[bn] not in shown
    assert len(shown) < len(source) - 4000  # ~5 kB of a 21.7 kB source
    # the rest is the source as written: the kernels, the tunables' defaults, every other helper
    folded_out = source
    for bn in ("64", "192", "256"):
        folded_out = folded_out.replace(bodies[bn], "")
    assert _STUB.sub("", shown) == folded_out
    for kernel in ("gemm_wgmma(", "gemm_wgmma_prep(", "#ifndef SPLIT_K", "gw_wait_soft", "C7517"):
        assert kernel in shown


def test_without_a_configuration_the_shortest_variant_is_shown(wgmma):
    source = wgmma.source.strip()
    shown = fold_repeats(source)
    assert _bodies(source)["64"] in shown and [s[3] for s in _STUB.findall(shown)] == ["m64n128k8", "m64n192k8",
                                                                                       "m64n256k8"]
    assert _bodies(source)["256"] in fold_repeats(source, {"BN": 256})


def test_nothing_else_is_folded():
    short = "__device__ int f(int x) { return x; }\n"
    distinct = ("#if A == 1\n__device__ float g(float x) {\n" + "  x = x * 2.f + 1.f;\n" * 30 + "  return x;\n}\n#endif\n"
                "#if A == 2\n__device__ float g(float x) {\n" + "  x = sqrtf(x) - 3.f;\n" * 30 + "  return x;\n}\n#endif\n")
    kernels = "".join(f'extern "C" __global__ void k(float* o) {{\n{"  o[0] = 1.f;" * 40}\n}}\n' for _ in range(2))
    for source in (short * 3, distinct, kernels, "__device__ void h() { /* never closed\n", 'char* s = "{";\n' + short):
        assert fold_repeats(source) == source


def test_braces_in_strings_and_comments_do_not_confuse_it():
    body = "{\n  asm volatile(\"{ .reg .pred p; }\" :: \"r\"(1)); // } a brace in a comment\n" + "  asm(\"\");\n" * 40 + "}"
    source = "".join(f"#if N == {n}\n__device__ void h(int (&d)[{n}]) {body.replace('1', str(n))}\n#endif\n"
                     for n in (1, 2))
    shown = fold_repeats(source, {"N": 2})
    assert shown.count(FOLD_MARK) == 1 and body.replace("1", "2") in shown and shown.endswith("#endif\n")


def _matmul_parent(spec):
    context, parent, failing = make_context()
    return context, parent.model_copy(update={"spec": spec}), failing


def test_the_prompts_fold_a_parent_and_show_a_failing_kernel_at_its_configuration(wgmma):
    context, parent, failing = _matmul_parent(wgmma)
    p = LLMProposer(client=None)  # type: ignore[arg-type]
    implement = p.messages_for(context, "implement", parent=parent, idea=IDEA, branch=0, m_branches=2,
                               approach="x")(False)[1]["content"]
    assert implement.count(FOLD_MARK) == 3 and "write it out or drop the variant" in implement
    assert _bodies(wgmma.source)["64"] in implement and '"BN": [64, 128, 192, 256]' in implement
    result = failing.model_copy(update={"config": {"BN": 192}})
    repair = p.messages_for(context, "repair", failure=Failure(spec=wgmma, result=result, parent=parent), attempt=1,
                            host_problems=[])(False)[1]["content"]
    failing_part = repair.split("This kernel failed.")[1]
    assert _bodies(wgmma.source)["192"] in failing_part and failing_part.count(FOLD_MARK) == 3
    assert repair.split("This kernel failed.")[0].count(FOLD_MARK) == 3  # the parent, for reference: folded too


def test_a_source_with_nothing_to_fold_is_shown_as_written():
    context, parent, _ = make_context()
    p = LLMProposer(client=None)  # type: ignore[arg-type]
    text = p.messages_for(context, "implement", parent=parent, idea=IDEA, branch=0, m_branches=1,
                          approach="x")(False)[1]["content"]
    assert parent.spec.source.strip() in text and FOLD_MARK not in text and "drop the variant" not in text


def test_a_not_run_result_has_no_config_and_still_folds(wgmma):
    context, parent, _ = _matmul_parent(wgmma)
    parent = NodeSummary(node_id=0, spec=wgmma, result=EvalResult(verdict=Verdict.not_run, spec_hash="h"))
    text = LLMProposer(client=None).messages_for(context, "ideas", parent=parent, k=3,  # type: ignore[arg-type]
                                                 categories=[])(True)[1]["content"]
    assert text.count(FOLD_MARK) == 3


def test_a_repair_shows_the_variant_the_problems_own_sizes_select():
    """The attention seed defines fw_pv per HEAD_DIM, a define of the problem's shape (q.shape[3] = 128):
    a kernel under repair shows that variant in full, though another is shorter."""
    from kerngen.agent.context import default_context
    from kerngen.agent.llm.prompting import shown_source
    from kerngen.harness.gpu.presets import preset

    ref = parse_problem_ref("attention")
    spec = playbook_seed(ref)
    assert spec is not None and spec.defines.get("HEAD_DIM") == "q.shape[3]"
    ctx = default_context(ref, preset("h100"), None)
    assert ctx.tensors["q"][3] == 128
    pv = {m.group(1): m.group(2) for m in re.finditer(r"#if HEAD_DIM == (\d+)\n__device__[^\n]*fw_pv\([^\n]*\) "
                                                      r"(\{.*?\n\})\n", spec.source, re.S)}
    assert set(pv) == {"64", "128"} and len(pv["64"]) < len(pv["128"])
    repair = shown_source(spec, {}, ctx)
    assert pv["128"] in repair and pv["64"] not in repair
    parent = shown_source(spec)  # a kernel to improve: the shortest variant
    assert pv["64"] in parent and pv["128"] not in parent
    broken = spec.model_copy(update={"defines": {"HEAD_DIM": "nope.shape[3]"}})  # a define that does not resolve
    assert pv["64"] in shown_source(broken, {}, ctx)
