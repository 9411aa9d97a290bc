"""GPU tier of the Ray evaluator (``--ray``): a local Ray cluster that kerngen starts
(``--ray local``: one actor per visible GPU) runs ``kerngen tune`` of a suite problem, against the
local pool on the same GPUs, and a two-problem ``kerngen generate DIR``, run again to show that it
is resumed (nothing searched twice). Prints configurations per minute through Ray and through the
local pool: the engine's overhead, measured. One GPU is enough; with two or more, the two problems
must have run side by side (``multigpu``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("ray")

DATA = Path(__file__).parents[1] / "data" / "kernelbench"
SHAPE = "4096x8192"
EVALS = "24"
PROBLEMS = ("19_ReLU.py", "1_Square_matrix_multiplication_.py")  # two the offline playbook covers


def _kerngen(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kerngen", *args], capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="200"), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, time.monotonic() - started


def _json(proc: subprocess.CompletedProcess):
    text = proc.stdout
    return json.loads(text[min(i for i in (text.find("{"), text.find("[")) if i >= 0):])


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "softmax.json"
    _kerngen("playbook", "softmax", "--shape", SHAPE, "-o", str(path))
    return path


def _tune(spec: Path, *where: str) -> tuple[dict, float]:
    proc, wall = _kerngen("tune", "softmax", "--shape", SHAPE, "--kernel", str(spec), "--max-evals", EVALS,
                          "--strategy", "random", "--seed", "0", "--no-cache", "--json", *where)
    return _json(proc), wall


def test_tune_through_ray_against_the_local_pool(spec):
    local, local_wall = _tune(spec)
    through, ray_wall = _tune(spec, "--ray", "local")
    gpus = torch.cuda.device_count()
    for name, out, wall in (("local pool", local, local_wall), ("ray", through, ray_wall)):
        s = out["summary"]
        print(f"\ntune softmax {SHAPE} on {gpus} x {out['gpu']}, {name}: {s['evaluated']} configs in "
              f"{s['seconds']:.1f} s = {s['evals_per_minute']:.1f} configs/min (command {wall:.1f} s); "
              f"best {s['best_ms']:.4f} ms {s['best_config']}")
    assert through["gpu"] == local["gpu"]
    assert through["summary"]["evaluated"] == local["summary"]["evaluated"] > 0
    assert through["summary"]["failed"] == local["summary"]["failed"] and through["summary"]["best_ms"] is not None
    # the same configurations (seeded), timed on the same GPU model: the same best, give or take noise
    assert through["summary"]["best_ms"] <= 1.25 * local["summary"]["best_ms"]


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("folder")
    d, runs = root / "kb", root / "runs"
    d.mkdir()
    for name in PROBLEMS:
        shutil.copy(DATA / name, d / name)
    args = ("generate", str(d), "--proposer", "playbook", "--rounds", "1", "--minutes", "3", "--runs-dir", str(runs),
            "--json", "--ray", "local")
    first, wall = _kerngen(*args)
    folders = sorted(p.name for p in runs.iterdir() if p.name != "batches")
    again, _ = _kerngen(*args)
    return {"rows": _json(first), "wall_s": wall, "folders": folders, "again": _json(again), "runs": runs}


def test_a_two_problem_folder_through_ray_is_journaled_and_resumed(folder_run):
    rows = folder_run["rows"]
    for r in rows:
        print(f"\n{Path(r['problem']).name}: {r['status']}, best {r['best_ms']} ms, {r['wall_min']:.2f} min")
    print(f"folder of {len(rows)} on {torch.cuda.device_count()} GPU(s) through Ray: {folder_run['wall_s']:.1f} s")
    assert sorted(Path(r["problem"]).name for r in rows) == sorted(PROBLEMS)
    assert all(r["status"] == "finished" and r["best_ms"] is not None for r in rows), rows
    # run again: every problem is finished, none searched again, no new run folder
    assert [r["run"] for r in folder_run["again"]] == [r["run"] for r in rows]
    runs = folder_run["runs"]
    assert sorted(p.name for p in runs.iterdir() if p.name != "batches") == folder_run["folders"]


@pytest.mark.multigpu
def test_two_problems_ran_side_by_side_on_two_gpus(folder_run):
    searched = sum(r["wall_min"] * 60 for r in folder_run["rows"])
    assert folder_run["wall_s"] < 0.8 * searched, (folder_run["wall_s"], searched)
