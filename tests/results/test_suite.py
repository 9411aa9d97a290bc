"""``kerngen suite``: the fast_p metric (pure), run_suite with a deterministic fake Evaluator, the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.results.suite import expand_problems, fast_p, geomean, run_suite, suite_metrics
from kerngen.errors import ProblemError
from kerngen.harness.evaluator import Candidate
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Timing, Verdict
from kerngen.problems.ref import ProblemRef
from tests.cli_output import stderr_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "runs" / "20261122-023101-softmax-f340"
KERNELBENCH = ROOT / "tests" / "data" / "kernelbench"

runner = CliRunner()


def _t(ms: float) -> Timing:
    return Timing(median_ms=ms, q25_ms=ms * 0.98, q75_ms=ms * 1.02, min_ms=ms * 0.95, max_ms=ms * 1.1,
                  mean_ms=ms, reps=50, warmup=3)


class FakeEvaluator:
    """Deterministic: eager 1.0 ms, torch.compile 0.8 ms, floor 0.4 ms, every kernel 0.5 ms."""

    def __init__(self, kernel_ms: float = 0.5, verdict: Verdict = Verdict.ok) -> None:
        self.kernel_ms, self.verdict = kernel_ms, verdict
        self.concurrency = 1
        self.calls: list[tuple[str, ProblemRef]] = []
        self.closed = False

    def gpu_facts(self) -> GpuFacts:
        return GpuFacts(name="fake GPU")

    def baseline(self, problem: ProblemRef, *, budget_ms: float = 300.0, with_compile: bool = True) -> Baseline:
        self.calls.append(("baseline", problem))
        return Baseline(problem=problem.label(), gpu="fake GPU", eager=_t(1.0), compiled=_t(0.8), floor_ms=0.4,
                        floor_bound="memory")

    def evaluate(self, problem, candidates, options=None, on_result=None) -> list[EvalResult]:
        self.calls.append(("evaluate", problem))
        out = []
        for c in candidates:
            assert isinstance(c, Candidate)
            ok = self.verdict is Verdict.ok
            out.append(EvalResult(verdict=self.verdict, config=c.spec.full_config(c.config),
                                  timing=_t(self.kernel_ms) if ok else None, message="fake"))
        return out

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def runs(tmp_path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    shutil.copytree(SHIPPED, d / SHIPPED.name)
    return d


# ----- the metric -----------------------------------------------------------------------------
def test_fast_p_counts_correct_and_faster_than_p():
    outcomes = [(True, 2.5), (True, 1.2), (True, 0.8), (False, 3.0), (False, None)]
    assert fast_p(outcomes, 0) == pytest.approx(3 / 5)
    assert fast_p(outcomes, 1) == pytest.approx(2 / 5)
    assert fast_p(outcomes, 1.5) == pytest.approx(1 / 5)
    assert fast_p(outcomes, 2) == pytest.approx(1 / 5)
    assert fast_p(outcomes, 2.5) == 0.0  # strictly faster than p
    assert fast_p([], 1) == 0.0


def test_suite_metrics_geomean_over_correct_only():
    m = suite_metrics([(True, 2.0), (True, 0.5), (False, 100.0), (False, None)])
    assert m.problems == 4 and m.correct == 2
    assert m.fast_p == {"0": 0.5, "1": 0.25, "1.5": 0.25, "2": 0.0}
    assert m.geomean_speedup == pytest.approx(1.0)
    assert geomean([]) is None and suite_metrics([]).geomean_speedup is None
    assert math.isclose(geomean([4.0, 1.0]), 2.0)


# ----- run_suite ------------------------------------------------------------------------------
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
    assert gelu.verdict == "no_kernel" and not gelu.correct
    assert [c[0] for c in ev.calls] == ["baseline", "evaluate"]  # nothing measured without a kernel
    assert rep.metrics.fast_p == {"0": 0.5, "1": 0.5, "1.5": 0.5, "2": 0.0}
    assert rep.metrics.geomean_speedup == pytest.approx(2.0)


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


def test_run_suite_incorrect_kernel_is_not_correct(runs):
    rep = run_suite(["softmax"], FakeEvaluator(verdict=Verdict.incorrect), runs)
    assert rep.entries[0].verdict == "incorrect" and rep.entries[0].speedup_eager is None
    assert rep.metrics.fast_p["0"] == 0.0 and rep.metrics.geomean_speedup is None


def test_run_suite_with_a_given_kernel(tmp_path):
    from kerngen.agent.scripted import scripted_spec

    rep = run_suite(["softmax"], FakeEvaluator(kernel_ms=0.25), tmp_path, kernel=scripted_spec(1.0),
                    config={"BLOCK": 256})
    e = rep.entries[0]
    assert e.kernel_from.startswith("spec") and e.config == {"BLOCK": 256} and e.speedup_eager == pytest.approx(4.0)
    assert rep.metrics.fast_p["2"] == 1.0


def test_expand_problems():
    files = expand_problems([str(KERNELBENCH)])
    assert files and all(f.endswith(".py") for f in files) and files == sorted(files)
    assert expand_problems(["softmax", files[0]]) == ["softmax", files[0]]
    assert "softmax" in expand_problems([])
    with pytest.raises(ProblemError, match="no-such-problem"):
        expand_problems(["no-such-problem"])


# ----- the command ----------------------------------------------------------------------------

def test_suite_cli_json_and_table(runs):
    res = runner.invoke(kerngen.cli.app.app, ["suite", "softmax", "gelu", "--runs", str(runs), "--evaluator",
                                          "scripted", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [e["verdict"] for e in data["entries"]] == ["ok", "no_kernel"]
    assert set(data["metrics"]["fast_p"]) == {"0", "1", "1.5", "2"}
    res = runner.invoke(kerngen.cli.app.app, ["suite", "softmax", "--runs", str(runs), "--evaluator", "scripted"])
    assert res.exit_code == 0, res.output
    assert "fast_1.5" in res.stdout and "geometric-mean" in res.stdout


def test_suite_cli_unknown_problem_is_one_line_exit_2(runs):
    res = runner.invoke(kerngen.cli.app.app, ["suite", "no-such-problem", "--runs", str(runs), "--evaluator", "scripted"])
    assert res.exit_code == 2
    err = stderr_of(res).strip()
    assert err.startswith("error:") and "no-such-problem" in err and len(err.splitlines()) == 1
