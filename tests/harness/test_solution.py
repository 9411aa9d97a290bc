"""``kerngen bench PROBLEM --solution FILE``: a user's own KernelBench ModelNew checked against the
problem (harness/gpu/solution.py). The check runs on any device: here on the CPU; the timing and
the command's process on a GPU (tests/harness/test_gpu_solution.py)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.errors import NoGPUError
from kerngen.harness.gpu.solution import check_solution
from kerngen.harness.pool.local import NO_GPU
from kerngen.harness.results import Verdict
from kerngen.problems.load import import_module, load_problem
from kerngen.problems.ref import ProblemRef
from tests.cli_output import stderr_of

DATA = Path(__file__).resolve().parents[1] / "data" / "solutions"
SOFTMAX = ProblemRef(source="softmax", shape=(64, 256))


def _check(problem: ProblemRef, solution: str):
    result, *_ = check_solution(load_problem(problem), import_module(DATA / solution), "cpu", seeds=2)
    return result


def test_a_correct_solution_passes():
    r = _check(SOFTMAX, "softmax_good.py")
    assert r.verdict is Verdict.ok and "correct on 2 input sets" in r.message and r.max_abs_err < 1e-5


def test_a_wrong_solution_is_incorrect_with_where():
    r = _check(SOFTMAX, "softmax_wrong.py")
    assert r.verdict is Verdict.incorrect and "seed" in r.message and r.max_abs_err > 0.01


def test_a_solution_takes_the_references_weights_where_they_match():
    r = _check(ProblemRef(source=str(DATA / "linear_problem.py")), "linear_solution.py")
    assert r.verdict is Verdict.ok, r.message


def test_a_file_without_modelnew_is_said(tmp_path):
    (tmp_path / "none.py").write_text("x = 1\n")
    result, *_ = check_solution(load_problem(SOFTMAX), import_module(tmp_path / "none.py"), "cpu")
    assert result.verdict is Verdict.runtime_error and "no class ModelNew" in result.message


def _bench(*args: str):
    return CliRunner().invoke(kerngen.cli.app.app, ["bench", *args])


def test_bench_solution_usage_errors_come_before_any_gpu(monkeypatch):
    res = _bench("softmax", "--solution", "no-such-solution.py")
    assert res.exit_code == 2 and "no such file" in stderr_of(res)
    from kerngen.harness.pool import local

    def no_gpu() -> list[str]:
        raise NoGPUError(NO_GPU)

    monkeypatch.setattr(local, "visible_devices", no_gpu)
    res = _bench("softmax", "--shape", "64x256", "--solution", str(DATA / "softmax_good.py"))
    assert res.exit_code == 2 and "no CUDA device" in stderr_of(res)


def test_the_help_says_it_runs_the_users_python():
    res = CliRunner().invoke(kerngen.cli.app.app, ["bench", "--help"], env={"COLUMNS": "300"})
    text = " ".join(res.output.split())
    assert "--solution" in text and "your own Python" in text and "only files you trust" in text
