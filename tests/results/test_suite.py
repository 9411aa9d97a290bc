"""``kerngen suite``: fast_p and the geometric mean against eager and torch.compile (pure, and
hand-computed through run_suite with a deterministic fake Evaluator), why a problem has no kernel
(read from runs the scripted search records), the --json output and the table."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.budget import SearchBudget, SearchConfig, StopKind
from kerngen.agent.context import minimal_context
from kerngen.agent.proposer import Branch
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, scripted_spec
from kerngen.agent.search import run_search
from kerngen.errors import KerngenError, ProblemError
from kerngen.harness.evaluator import Candidate
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Timing, Verdict
from kerngen.problems.ref import ProblemRef
from kerngen.results.suite import (
    Why, expand_problems, fast_p, geomean, reference_metrics, run_suite, suite_metrics,
)
from tests.cli_output import stderr_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "runs" / "20261122-023101-softmax-f340"
KERNELBENCH = ROOT / "tests" / "data" / "kernelbench"
NO_LIMITS = dict(max_llm_calls=None, max_tokens=None, wall_minutes=None, gpu_minutes=None)

runner = CliRunner()


def _t(ms: float) -> Timing:
    return Timing(median_ms=ms, q25_ms=ms * 0.98, q75_ms=ms * 1.02, min_ms=ms * 0.95, max_ms=ms * 1.1,
                  mean_ms=ms, reps=50, warmup=3)


class FakeEvaluator:
    """Deterministic: eager 1.0 ms, torch.compile 0.8 ms, floor 0.4 ms, every kernel 0.5 ms;
    ``problems`` overrides per problem source: (eager, compile or None, floor, kernel ms or a
    Verdict) or a KerngenError to raise from the baseline."""

    def __init__(self, kernel_ms: float = 0.5, verdict: Verdict = Verdict.ok, problems: dict | None = None) -> None:
        self.kernel_ms, self.verdict = kernel_ms, verdict
        self.problems = problems or {}
        self.concurrency = 1
        self.calls: list[tuple[str, ProblemRef]] = []
        self.budgets: list[float] = []
        self.closed = False

    def gpu_facts(self) -> GpuFacts:
        return GpuFacts(name="fake GPU")

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline:
        self.calls.append(("baseline", problem))
        self.budgets.append(budget_ms)
        eager, compiled, floor, _ = self._of(problem)
        return Baseline(problem=problem.label(), gpu="fake GPU", eager=_t(eager),
                        compiled=_t(compiled) if compiled is not None else None,
                        compile_error="" if compiled is not None else "BackendCompilerFailed: no triton",
                        floor_ms=floor, floor_bound="memory")

    def evaluate(self, problem, candidates, options=None, on_result=None) -> list[EvalResult]:
        self.calls.append(("evaluate", problem))
        kernel = self._of(problem)[3]
        verdict = kernel if isinstance(kernel, Verdict) else Verdict.ok
        out = []
        for c in candidates:
            assert isinstance(c, Candidate)
            ok = verdict is Verdict.ok
            out.append(EvalResult(verdict=verdict, config=c.spec.full_config(c.config),
                                  timing=_t(kernel) if ok else None, message="fake" if ok else "4096 elements differ"))
        return out

    def _of(self, problem: ProblemRef) -> tuple:
        got = self.problems.get(problem.source)
        if isinstance(got, KerngenError):
            raise got
        if got is not None:
            return got
        return 1.0, 0.8, 0.4, (self.kernel_ms if self.verdict is Verdict.ok else self.verdict)

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def runs(tmp_path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    shutil.copytree(SHIPPED, d / SHIPPED.name)
    return d


# ----- recorded runs, made by the scripted search ---------------------------------------------
class _AllFail(ScriptedProposer):
    """Every branch fails: a compile error, a wrong result, an answer without a spec."""

    def implement(self, ctx, parent, idea, m):
        self.calls["implement"] += 1
        return [Branch(spec=scripted_spec(1.0, "compile", 3, name=f"c-{idea.text[:20]}")),
                Branch(spec=scripted_spec(1.0, "incorrect", 3, name=f"i-{idea.text[:20]}")),
                Branch(error="the answer held no JSON spec")][:m]


class _NoVariant(ScriptedProposer):
    """The playbook's way of having nothing: no ideas, and a reason."""

    reason = "no variant admits float64 at this shape"

    def ideas(self, ctx, parent, k):
        self.calls["ideas"] += 1
        return []


class _OutOfMemory(ScriptedEvaluator):
    """The harness runs out of GPU memory on every candidate (as in tests/agent/test_search.py)."""

    def evaluate(self, problem, candidates, options=None, on_result=None):
        self.calls += 1
        return [EvalResult(verdict=Verdict.harness_error, message="harness error: out of GPU memory: 12 GB")
                for _ in candidates]


def _record(runs_dir: Path, run_id: str, source: str, proposer, evaluator=None, rounds: int = 1) -> None:
    run_search(ProblemRef(source=source), proposer, evaluator or ScriptedEvaluator(), runs_dir=runs_dir,
               run_id=run_id, tuner=None, context_factory=minimal_context,
               config=SearchConfig(beam=1, ideas=2, branches=3, repairs=0, tune=False),
               budget=SearchBudget(rounds=rounds, patience=None, **NO_LIMITS))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """softmax: a correct kernel; layernorm: two runs, every candidate failing; rmsnorm: stopped by
    the harness (out of GPU memory); conv2d: no candidates; gelu: no run at all."""
    d = tmp_path_factory.mktemp("recorded")
    _record(d, "softmax-1", "softmax", ScriptedProposer())
    _record(d, "layernorm-1", "layernorm", _AllFail())
    _record(d, "layernorm-2", "layernorm", _AllFail())
    _record(d, "rmsnorm-1", "rmsnorm", ScriptedProposer(), _OutOfMemory(), rounds=3)
    _record(d, "conv2d-1", "conv2d", _NoVariant())
    (d / "broken").mkdir()
    (d / "broken" / "events.jsonl").write_text("{not json\n")  # skipped, not fatal, and said so
    return d


SUITE = ["softmax", "layernorm", "rmsnorm", "conv2d", "gelu"]


# ----- the metric -----------------------------------------------------------------------------
def test_fast_p_counts_correct_and_faster_than_p():
    outcomes = [(True, 2.5), (True, 1.2), (True, 0.8), (False, 3.0), (False, None)]
    assert fast_p(outcomes, 0) == pytest.approx(3 / 5)
    assert fast_p(outcomes, 1) == pytest.approx(2 / 5)
    assert fast_p(outcomes, 1.5) == pytest.approx(1 / 5)
    assert fast_p(outcomes, 2) == pytest.approx(1 / 5)
    assert fast_p(outcomes, 2.5) == 0.0  # strictly faster than p
    assert fast_p([], 1) == 0.0


def test_reference_metrics_geomean_over_correct_only():
    m = reference_metrics("eager", [(True, 2.0), (True, 0.5), (False, 100.0), (False, None)])
    assert m.problems == 4 and m.correct == 2 and m.without_reference == 0
    assert m.fast_p == {"0": 0.5, "1": 0.25, "1.5": 0.25, "2": 0.0}
    assert m.geomean_speedup == pytest.approx(1.0) and m.geomean_of == 2
    assert geomean([]) is None and reference_metrics("eager", []).geomean_speedup is None
    assert math.isclose(geomean([4.0, 1.0]), 2.0)
    assert suite_metrics([]).compile.problems == 0


def test_metrics_against_eager_and_compile_hand_computed(tmp_path):
    """a: 2.0x eager, 1.6x compile; b: 3.0x, 1.0x; c: 1.25x eager, torch.compile failed; d: incorrect
    now; e: PyTorch cannot be measured."""
    ev = FakeEvaluator(problems={
        "a": (1.0, 0.8, 0.4, 0.5), "b": (3.0, 1.0, 0.5, 1.0), "c": (1.0, None, 0.1, 0.8),
        "d": (2.0, 1.0, 0.5, Verdict.incorrect), "e": KerngenError("cannot measure PyTorch on e: out of memory"),
    })
    from kerngen.harness.evaluator import EvalOptions

    rep = run_suite(list("abcde"), ev, tmp_path, kernel=scripted_spec(1.0), options=EvalOptions(budget_ms=123.0))
    a, b, c, d, e = rep.entries
    assert (a.speedup_eager, a.speedup_compile, a.pct_roofline) == pytest.approx((2.0, 1.6, 80.0))
    assert (b.speedup_eager, b.speedup_compile, b.pct_roofline) == pytest.approx((3.0, 1.0, 50.0))
    assert c.speedup_eager == pytest.approx(1.25) and c.speedup_compile is None and c.compile_missing
    assert c.pct_roofline == pytest.approx(12.5) and c.floor_ms == 0.1 and "no triton" in c.compile_error
    assert d.verdict == "incorrect" and d.why.kind is Why.kernel_failed and d.why.verdict == "incorrect"
    assert "4096 elements differ" in d.why.text and not d.compile_missing
    assert e.verdict == "error" and e.why.kind is Why.baseline_error and "out of memory" in e.why.text
    assert not e.compile_missing  # not measured: stays in the compile metrics, as a miss

    m = rep.metrics
    assert (m.problems, m.correct) == (5, 3)
    assert m.eager.problems == 5 and m.eager.without_reference == 0 and m.eager.correct == 3
    assert m.eager.fast_p == pytest.approx({"0": 3 / 5, "1": 3 / 5, "1.5": 2 / 5, "2": 1 / 5})  # a: 2.0 is not > 2
    assert m.eager.geomean_speedup == pytest.approx((2.0 * 3.0 * 1.25) ** (1 / 3)) and m.eager.geomean_of == 3
    assert m.compile.problems == 4 and m.compile.without_reference == 1 and m.compile.correct == 2  # c left out
    assert m.compile.fast_p == pytest.approx({"0": 2 / 4, "1": 1 / 4, "1.5": 1 / 4, "2": 0.0})  # b: 1.0 is not > 1
    assert m.compile.geomean_speedup == pytest.approx(math.sqrt(1.6 * 1.0)) and m.compile.geomean_of == 2
    assert rep.without_kernel == {"kernel_failed": 1, "baseline_error": 1}

    # side by side: each problem's baseline, then its kernel, before the next problem; one budget
    assert [(k, r.source) for k, r in ev.calls] == [
        ("baseline", "a"), ("evaluate", "a"), ("baseline", "b"), ("evaluate", "b"), ("baseline", "c"),
        ("evaluate", "c"), ("baseline", "d"), ("evaluate", "d"), ("baseline", "e")]
    assert set(ev.budgets) == {123.0}


# ----- run_suite over recorded runs -------------------------------------------------------------
def test_why_no_kernel_from_the_recorded_runs(recorded):
    ev = FakeEvaluator()
    rep = run_suite(SUITE, ev, recorded)
    soft, layer, rms, conv, gelu = rep.entries
    assert soft.correct and soft.why is None and soft.kernel_from.startswith("run softmax-1 node #")
    assert [(k, r.source) for k, r in ev.calls] == [("baseline", "softmax"), ("evaluate", "softmax")]

    assert layer.verdict == "no_kernel" and layer.why.kind is Why.all_failed
    assert layer.why.run == "layernorm-2" and layer.why.runs == 2 and layer.why.stop is StopKind.rounds
    assert layer.why.verdicts == {"compile_error": 2, "incorrect": 2, "invalid": 2}
    assert "6 candidates: 2 compile_error, 2 incorrect, 2 invalid" in layer.why.text
    assert "newest of 2 runs" in layer.why.text and "stopped: rounds: 1 done" in layer.why.text

    assert rms.why.kind is Why.harness and rms.why.stop is StopKind.harness
    assert "out of GPU memory" in rms.why.reason and "out of GPU memory" in rms.why.text
    assert rms.why.verdicts.get("pending", 0) >= 1 and set(rms.why.verdicts) <= {"pending", "invalid"}

    assert conv.why.kind is Why.no_candidates and conv.why.stop is StopKind.no_candidates
    assert "no variant admits float64" in conv.why.text and "no candidates" in conv.why.text
    assert conv.why.verdicts == {}

    assert gelu.why.kind is Why.no_run and str(recorded) in gelu.why.text and gelu.why.run == ""
    assert gelu.ref == ProblemRef(source="gelu")
    assert rep.without_kernel == {"all_failed": 1, "harness": 1, "no_candidates": 1, "no_run": 1}
    assert rep.without_kernel_text() == ("1 no run, 1 every candidate failed, 1 no candidates, "
                                         "1 harness could not evaluate")  # most first, ties in Why's order
    assert len(rep.skipped_runs) == 1 and rep.skipped_runs[0].startswith("broken: ")
    assert rep.metrics.eager.fast_p["0"] == pytest.approx(1 / 5) and rep.metrics.compile.problems == 5


def test_a_kernel_incorrect_on_remeasure(recorded):
    rep = run_suite(["softmax"], FakeEvaluator(verdict=Verdict.incorrect), recorded)
    e = rep.entries[0]
    assert e.verdict == "incorrect" and e.speedup_eager is None and e.speedup_compile is None
    assert e.why.kind is Why.kernel_failed and e.why.verdict == "incorrect"
    assert "incorrect now (run softmax-1 node #" in e.why.text and "4096 elements differ" in e.why.text
    assert rep.metrics.eager.fast_p["0"] == 0.0 and rep.metrics.eager.geomean_speedup is None
    assert rep.without_kernel == {"kernel_failed": 1}
    rep = run_suite(["softmax"], FakeEvaluator(verdict=Verdict.harness_error), recorded)
    assert rep.entries[0].why.kind is Why.harness  # not the kernel's doing


def test_run_suite_best_of_newest_run_and_no_kernel(runs):
    ev = FakeEvaluator()
    seen: list[str] = []
    rep = run_suite(["softmax", "gelu"], ev, runs, on_progress=lambda i, label: seen.append(label))
    soft, gelu = rep.entries
    assert rep.gpu == "fake GPU" and seen == ["softmax", "gelu", ""]
    assert soft.verdict == "ok" and "node #37" in soft.kernel_from and soft.config == {"BLOCK": 256}
    assert soft.ref == ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32")  # the run's shape
    assert soft.speedup_eager == pytest.approx(2.0) and soft.speedup_compile == pytest.approx(1.6)
    assert soft.pct_roofline == pytest.approx(80.0) and soft.kernel.iqr_ms == pytest.approx(0.02)
    assert soft.recorded_ms == pytest.approx(0.558474)
    assert gelu.verdict == "no_kernel" and not gelu.correct and gelu.why.kind is Why.no_run
    assert [c[0] for c in ev.calls] == ["baseline", "evaluate"]  # nothing measured without a kernel
    assert rep.metrics.eager.fast_p == {"0": 0.5, "1": 0.5, "1.5": 0.5, "2": 0.0}
    assert rep.metrics.eager.geomean_speedup == pytest.approx(2.0)
    assert rep.metrics.compile.fast_p == {"0": 0.5, "1": 0.5, "1.5": 0.5, "2": 0.0}
    assert rep.metrics.compile.geomean_speedup == pytest.approx(1.6)


def test_run_suite_picks_the_newest_run(runs):
    newer = runs / "newer"
    shutil.copytree(SHIPPED, newer)
    lines = (newer / "events.jsonl").read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    first["run_id"], first["t"] = "newer", first["t"] + 10
    lines[0] = json.dumps(first) + "\n"
    (newer / "events.jsonl").write_text("".join(lines))
    (runs / "broken").mkdir()
    (runs / "broken" / "events.jsonl").write_text("{not json\n")  # skipped, not fatal
    rep = run_suite(["softmax"], FakeEvaluator(), runs)
    assert rep.entries[0].kernel_from.startswith("run newer ")


def test_run_suite_with_a_given_kernel(tmp_path):
    rep = run_suite(["softmax"], FakeEvaluator(kernel_ms=0.25), tmp_path, kernel=scripted_spec(1.0),
                    config={"BLOCK": 256})
    e = rep.entries[0]
    assert e.kernel_from.startswith("spec") and e.config == {"BLOCK": 256} and e.speedup_eager == pytest.approx(4.0)
    assert rep.metrics.eager.fast_p["2"] == 1.0 and rep.runs_dir == "" and rep.skipped_runs == []


def test_expand_problems():
    files = expand_problems([str(KERNELBENCH)])
    assert files and all(f.endswith(".py") for f in files) and files == sorted(files)
    assert expand_problems(["softmax", files[0]]) == ["softmax", files[0]]
    assert "softmax" in expand_problems([])
    with pytest.raises(ProblemError, match="no-such-problem"):
        expand_problems(["no-such-problem"])


# ----- the command ----------------------------------------------------------------------------
def _no_nan(text: str) -> None:
    raise AssertionError(f"not strict JSON: {text}")


def test_suite_cli_json(recorded):
    res = runner.invoke(kerngen.cli.app.app, ["suite", *SUITE, "--runs", str(recorded), "--evaluator", "scripted",
                                              "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout, parse_constant=_no_nan)
    assert set(data) == {"gpu", "runs_dir", "reused", "entries", "metrics", "without_kernel", "skipped_runs"}
    entries = data["entries"]
    assert [e["verdict"] for e in entries] == ["ok", "no_kernel", "no_kernel", "no_kernel", "no_kernel"]
    assert [e["why"] and e["why"]["kind"] for e in entries] == [None, "all_failed", "harness", "no_candidates",
                                                                "no_run"]
    assert entries[1]["why"]["verdicts"] == {"compile_error": 2, "incorrect": 2, "invalid": 2}
    assert entries[2]["why"]["stop"] == "harness" and entries[3]["why"]["stop"] == "no_candidates"
    ok = entries[0]
    for key in ("eager", "compiled", "kernel", "floor_ms", "speedup_eager", "speedup_compile", "pct_roofline"):
        assert ok[key] is not None, key
    # beside true fp32, PyTorch at its defaults (the scripted evaluator makes up 0.9 and 0.7 of eager's time)
    assert ok["eager_defaults"] is not None and ok["defaults_label"] == "PyTorch defaults (TF32 conv)"
    assert ok["speedup_compile_defaults"] == pytest.approx(ok["speedup_compile"] * 0.7 / 0.8)
    assert ok["op"] is None and ok["op_error"] == ""  # an evaluator without time_op: the op's path is not timed
    m = data["metrics"]
    assert set(m) == {"problems", "correct", "eager", "compile", "compile_defaults"}
    for ref, name in (("eager", "eager"), ("compile", "torch.compile"),
                      ("compile_defaults", "torch.compile at PyTorch defaults (TF32 conv)")):
        assert m[ref]["reference"] == name and set(m[ref]["fast_p"]) == {"0", "1", "1.5", "2"}
        assert m[ref]["problems"] == 5 and m[ref]["correct"] == 1 and m[ref]["geomean_of"] == 1
    assert data["without_kernel"] == {"all_failed": 1, "harness": 1, "no_candidates": 1, "no_run": 1}
    assert data["skipped_runs"][0].startswith("broken: ")


def test_suite_cli_table(recorded):
    res = runner.invoke(kerngen.cli.app.app, ["suite", *SUITE, "--runs", str(recorded), "--evaluator", "scripted"],
                        env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    for col in ("eager ms", "compile ms", "kernel ms", "op ms (gap)", "floor ms", "fp32 eager", "fp32 compile",
                "dflt compile", "% of floor", "verdict / why", "dflt: vs PyTorch defaults (TF32 conv)"):
        assert col in out, col
    assert "ok: run softmax-1 node #" in out
    assert "layernorm: every candidate failed: run layernorm-2 (newest of 2 runs" in out  # the why, one line
    assert "rmsnorm: harness could not evaluate: run rmsnorm-1" in out and "gelu: no run: no run of it under" in out
    assert "conv2d: no candidates: run conv2d-1: no candidates; stopped: proposer gave no new candidates" in out
    data = json.loads(runner.invoke(kerngen.cli.app.app, ["suite", "softmax", "--runs", str(recorded), "--evaluator",
                                                          "scripted", "--json"]).stdout)
    eager, compiled = (data["metrics"][k]["geomean_speedup"] for k in ("eager", "compile"))
    assert "vs eager (5 problems): 1 correct; fast_0 = 0.20" in out
    assert f"geometric-mean speedup over 1 correct: {eager:.3f}x" in out
    assert "vs torch.compile (5 problems): 1 correct; fast_0 = 0.20" in out
    assert f"geometric-mean speedup over 1 correct: {compiled:.3f}x" in out
    assert ("no correct kernel for 4 of 5: 1 no run, 1 every candidate failed, 1 no candidates, 1 harness "
            "could not evaluate") in out
    assert "1 unreadable run folder(s)" in out


def test_suite_cli_compile_missing_is_said(tmp_path, monkeypatch):
    from kerngen.cli import compose

    ev = FakeEvaluator(problems={"softmax": (1.0, None, 0.4, 0.5)})
    monkeypatch.setattr(compose, "make_evaluator", lambda kind, **kw: ev)
    spec = tmp_path / "spec.json"
    spec.write_text(scripted_spec(1.0).model_dump_json())
    res = runner.invoke(kerngen.cli.app.app, ["suite", "softmax", "gelu", "--kernel", str(spec), "--evaluator",
                                              "scripted"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "failed" in res.stdout and "torch.compile failed: BackendCompilerFailed: no triton" in res.stdout
    assert "vs torch.compile (1 of 2 problems; 1 without a torch.compile time left out)" in res.stdout
    assert ev.closed


def test_suite_pool_is_one_worker_on_the_first_gpu(monkeypatch):
    import kerngen.cli.results as cli
    from kerngen.cli import compose
    import kerngen.harness.pool.local as local

    made: list[tuple[str, dict]] = []
    monkeypatch.setattr(local, "visible_devices", lambda: ["3", "5"])
    monkeypatch.setattr(compose, "make_evaluator", lambda kind, **kw: made.append((kind, kw)) or FakeEvaluator())
    cli._suite_evaluator("pool")
    cli._suite_evaluator("scripted")
    assert made == [("pool", {"devices": ["3"]}), ("scripted", {})]


def test_suite_cli_unknown_problem_is_one_line_exit_2(runs):
    res = runner.invoke(kerngen.cli.app.app, ["suite", "no-such-problem", "--runs", str(runs), "--evaluator", "scripted"])
    assert res.exit_code == 2
    err = stderr_of(res).strip()
    assert err.startswith("error:") and "no-such-problem" in err and len(err.splitlines()) == 1
