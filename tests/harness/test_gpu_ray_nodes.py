"""GPU tier, two GPUs: two Ray nodes on this host, each owning one GPU (``ray_nodes.py``), so that
kerngen talks to two nodes over Ray's protocol, and the second one lost mid-run (its raylet killed):

* a folder of four KernelBench files (``generate DIR --ray``) runs one problem per node side by
  side; the second node is killed once both problems have measured something: the run finishes
  (exit 0, every problem finished), the problem of the lost node goes to the surviving GPU, which
  resumes it in its run folder, nothing measured before the loss is gone and nothing is evaluated
  twice; the same command again searches nothing;
* ``kerngen tune`` on both nodes (the tuning cache on) loses the second node mid-run: it evaluates
  every configuration all the same, none of them a harness error or a timeout (what was in flight on
  the lost node ran again on the other GPU), and the same tune again measures nothing new (all
  cache hits; only the best few re-measured, as always).

Prints its figures; where ``KERNGEN_FIGURES`` names a file, appends them there as JSON lines
(``scripts/device/i38.sh`` makes its table of them). Needs Ray on this host (skips without)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kerngen.agent.journal import read_events

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]
pytest.importorskip("ray")
from tests.harness.ray_nodes import TwoNodes  # noqa: E402 - needs ray

DATA = Path(__file__).parents[1] / "data" / "kernelbench" / "level1"
FOLDER = ("19_ReLU.py", "40_LayerNorm.py", "41_Max_Pooling_1D.py", "94_MSELoss.py")  # the playbook covers them
SHAPE, EVALS = "4096x8192", 96
ENV = dict(os.environ, COLUMNS="200", RAY_AUTH_MODE="disabled")


def figure(**fields) -> None:
    print("\n" + json.dumps(fields))
    path = os.environ.get("KERNGEN_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="kgray-", dir="/tmp"))  # short: Ray's socket paths live under it
    two = TwoNodes(root, port=6490)
    try:
        two.start_head()
        yield two
    finally:
        two.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def nodes(cluster):
    """Both nodes up (a test before may have lost the second), both GPUs free."""
    if not cluster.node_up:
        cluster.start_node()
    cluster.wait_gpus(2, timeout_s=180)
    return cluster


def kerngen(*args: str, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kerngen", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or ENV)


def finish(proc: subprocess.Popen, timeout_s: float = 900) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out, err


def evaluated(run_dir: Path) -> list[int]:
    """Ids of the nodes a run's journal has results of, in the order they landed."""
    try:
        events, _ = read_events(run_dir)
    except Exception:  # noqa: BLE001 - not started yet, or its first line not written yet
        return []
    return [e.id for e in events if e.type == "node_evaluated"]


def wait_until(what, timeout_s: float, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"not reached within {timeout_s:.0f} s")


def test_a_folder_on_two_nodes_loses_one_and_finishes_on_the_other(nodes, tmp_path):
    d, runs = tmp_path / "kb", tmp_path / "runs"
    d.mkdir()
    for name in FOLDER:
        shutil.copy(DATA / name, d / name)
    args = ("generate", str(d), "--minutes", "0.4", "--runs-dir", str(runs), "--json", "--ray", nodes.address)
    t0 = time.monotonic()
    proc = kerngen(*args)

    def both_measuring() -> dict[str, set[int]]:
        """The runs under way with results, once two are (one per node): what each has measured."""
        state = next(iter((runs / "batches").glob("*.json")), None) if (runs / "batches").is_dir() else None
        if state is None:
            return {}
        entries = json.loads(state.read_text())["entries"]
        busy = {e["run"]: set(evaluated(runs / e["run"])) for e in entries if e["status"] == "running" and e["run"]}
        return busy if len(busy) == 2 and all(busy.values()) else {}

    before = wait_until(both_measuring, 300)
    killed_at = time.monotonic() - t0
    nodes.kill_node()
    out, err = finish(proc)
    wall = time.monotonic() - t0
    rows = json.loads(out)
    assert sorted(Path(r["problem"]).name for r in rows) == sorted(FOLDER)
    assert all(r["status"] == "finished" for r in rows), rows
    handed = [line for line in err.splitlines() if "its GPU was lost" in line]
    assert len(handed) == 1, err[-3000:]
    for run, ids in before.items():  # nothing measured before the loss is gone; nothing evaluated twice
        after = evaluated(runs / run)
        assert ids <= set(after) and len(after) == len(set(after)), (run, ids, after)
    resumed = [r["run"] for r in rows if any(e.type == "run_resumed" for e in read_events(runs / r["run"])[0])]
    folders = sorted(p.name for p in runs.iterdir() if p.name != "batches")
    counts = {r["run"]: len(evaluated(runs / r["run"])) for r in rows}
    figure(case="folder, node lost", files=len(FOLDER), wall_s=round(wall, 1), killed_at_s=round(killed_at, 1),
           handed=handed[0][:160], resumed=resumed,
           kernels=sum(r["best_ms"] is not None for r in rows))

    again, _ = finish(kerngen(*args))  # the same command: every problem finished, nothing searched
    assert [r["run"] for r in json.loads(again)] == [r["run"] for r in rows]
    assert sorted(p.name for p in runs.iterdir() if p.name != "batches") == folders
    assert {run: len(evaluated(runs / run)) for run in counts} == counts


def _tune(spec: Path, address: str, cache: Path) -> subprocess.Popen:
    return kerngen("tune", "softmax", "--shape", SHAPE, "--kernel", str(spec), "--max-evals", str(EVALS),
                   "--strategy", "random", "--seed", "0", "--json", "--ray", address,
                   env=dict(ENV, KERNGEN_CACHE_DIR=str(cache)))


def _json(out: str) -> dict:
    return json.loads(out[out.index("{"):])


def test_a_tune_that_loses_a_node_evaluates_everything_and_its_rerun_measures_nothing_new(nodes, tmp_path):
    spec, cache = tmp_path / "softmax.json", tmp_path / "cache"
    finish(kerngen("playbook", "softmax", "--shape", SHAPE, "-o", str(spec)))
    t0 = time.monotonic()
    proc = _tune(spec, nodes.address, cache)

    def lines() -> int:
        return sum(len(f.read_bytes().splitlines()) for f in cache.glob("tune/*"))

    wait_until(lambda: lines() >= 24, 300, every_s=0.2)  # the first batch (16 on two GPUs) landed, the next under way
    cached_at_kill = lines()
    nodes.kill_node()
    out, _ = finish(proc)
    first = _json(out)["summary"]
    assert first["evaluated"] == EVALS and first["measured_this_run"] == EVALS
    assert not {"harness_error", "timeout"} & set(first["failed"]), first["failed"]
    # Ray counts a killed node's GPU until it declares the node dead (seconds): a pool started before
    # would wait for an actor on it (its start-up allowance) before letting it go
    nodes.wait_gpus(1, timeout_s=120)
    again = _json(finish(_tune(spec, nodes.address, cache))[0])["summary"]
    assert again["cache_hits"] == EVALS and again["measured_this_run"] == again["remeasured"], again
    figure(case="tune, node lost", evals=EVALS, cached_at_kill=cached_at_kill, wall_s=round(time.monotonic() - t0, 1),
           evals_per_minute=first["evals_per_minute"], failed=first["failed"], best_ms=first["best_ms"],
           rerun_cache_hits=again["cache_hits"], rerun_measured=again["measured_this_run"])
