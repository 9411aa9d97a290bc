"""Issue 37 on a GPU: the first problem of a folder gets the same budget as the rest, a user's own
KernelBench ModelNew through ``kerngen bench --solution``, and a roofline floor that PyTorch does not
beat. Run by ``scripts/device/i37.sh`` (which prints a table of what these measured)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kerngen.agent.tree import load_run

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
KB1 = ROOT / "tests" / "data" / "kernelbench" / "level1"
SOLUTIONS = ROOT / "tests" / "data" / "solutions"
OUT = Path(os.environ.get("I37_OUT", "/tmp/i37"))


@pytest.fixture(autouse=True)
def _needs_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _kerngen(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerngen", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def _note(name: str, data: object) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1))


def test_the_first_problem_of_a_folder_evaluates_candidates_like_the_rest(tmp_path):
    d = tmp_path / "kb"
    d.mkdir()
    for name in ("36_RMSNorm_.py", "40_LayerNorm.py", "4_Matrix_vector_multiplication_.py"):
        shutil.copy(KB1 / name, d / name)
    proc = _kerngen("generate", str(d), "--minutes", "0.4", "--runs-dir", str(tmp_path / "runs"), "--json",
                    timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    evaluated = []
    for row in rows:
        run = load_run(tmp_path / "runs" / row["run"])
        evaluated.append(sum(1 for n in run.nodes.values() if n.result is not None and n.verdict != "pending"))
    _note("first_problem", [{"problem": Path(r["problem"]).name, "evaluated": e, "best_ms": r["best_ms"],
                             "wall_min": r["wall_min"], "reason": r["reason"]} for r, e in zip(rows, evaluated)])
    assert all(r["status"] == "finished" for r in rows), rows
    assert evaluated[0] >= 1 and all(e >= 1 for e in evaluated), (evaluated, rows)  # the first one too
    assert rows[0]["best_ms"] is not None, rows[0]


def test_bench_solution_checks_and_times_a_users_modelnew():
    good = _kerngen("bench", "softmax", "--shape", "4096x8192", "--solution", str(SOLUTIONS / "softmax_good.py"),
                    "--json")
    assert good.returncode == 0, good.stderr[-3000:]
    payload = json.loads(good.stdout)["solution"]  # its prints stay off the answer: stdout is one JSON object
    assert payload["verdict"] == "ok" and payload["median_ms"] > 0 and payload["speedup_vs_eager"] > 0
    wrong = _kerngen("bench", "softmax", "--shape", "4096x8192", "--solution", str(SOLUTIONS / "softmax_wrong.py"),
                     "--no-compile")
    assert wrong.returncode == 1 and "incorrect" in wrong.stdout, wrong.stdout + wrong.stderr
    _note("solution", payload)


def test_no_pytorch_time_beats_the_floor():
    got = {}
    for problem, shape in (("matmul", "4096"), ("softmax", "4096x65536")):
        proc = _kerngen("bench", problem, "--shape", shape, "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        base = json.loads(proc.stdout)["baseline"]
        times = [base["eager"]["median_ms"]] + ([base["compiled"]["median_ms"]] if base["compiled"] else [])
        got[problem] = {"floor_ms": base["floor_ms"], "basis": base["floor_basis"],
                        "measured_floor_ms": base["floor_measured_ms"], "pytorch_ms": times}
        assert base["floor_ms"] and "data sheet" in base["floor_basis"], base
        assert base["floor_ms"] <= min(times), base
    assert "3xTF32" in got["matmul"]["basis"]
    _note("floors", got)
