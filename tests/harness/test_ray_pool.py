"""The Ray evaluator (``--ray``): which GPUs of a cluster time (one model), the local pool's shards
(a batch's problems side by side), the command line's plumbing, a missing Ray, an address nothing
answers at; and the cases on a local Ray cluster with the fake worker (``ray_cluster_cases.py``)
and on a cluster of several nodes, some lost (``ray_node_cases.py``), each run in a fresh
interpreter (``ray_cluster_cases.py``'s docstring says why)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.errors import KerngenError
from kerngen.harness.evaluator import Candidate
from kerngen.harness.results import Verdict

pytest.importorskip("ray")
from kerngen.harness.pool.ray_pool import PROBE_TIMEOUT_S, choose_gpus, head_address, probe  # noqa: E402
from tests.harness.ray_cluster_cases import FAKE, PROBLEM, spec_of  # noqa: E402 - needs ray

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("cases", ["ray_cluster_cases.py", "ray_node_cases.py"])
def test_the_cases_on_a_local_ray_cluster(cases):
    """The cases in a fresh interpreter (ray_cluster_cases.py's docstring says why): a minute or so each."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           f"tests/harness/{cases}"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


# ----- an address nothing answers at -------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def test_an_unreachable_address_is_one_line_and_exit_2_within_seconds(tmp_path):
    """Ray's own client retries such an address for minutes, printing warnings: kerngen first
    reaches the head with a bounded TCP connect and says so in one line. (The command's own start,
    Python, torch and Ray, takes seconds on a quiet machine, more on a busy CI one: the 15 s are
    checked on the GPU host, scripts/device/i38.sh.)"""
    address = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kerngen", "generate", "softmax", "--proposer", "scripted",
                           "--runs-dir", str(tmp_path), "--ray", address], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert time.monotonic() - started < 60  # Ray's client alone: over 2 minutes
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot reach the Ray cluster at '{address}'" in lines[0], proc.stderr[-2000:]
    assert not any(tmp_path.iterdir())  # no run folder


def test_the_probe_names_what_it_could_not_reach(monkeypatch):
    assert head_address("local") is None
    assert head_address("10.0.0.7:6380") == ("10.0.0.7", 6380)
    assert head_address("10.0.0.7") == ("10.0.0.7", 6379)
    assert head_address("ray://head.example:10002") == ("head.example", 10002)
    assert head_address("ray://head.example") == ("head.example", 10001)
    assert head_address("[::1]:6379") == ("::1", 6379)
    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # what `auto` joins, as ray.init reads it
    with pytest.raises(KerngenError, match=rf"cannot reach the Ray cluster at 'auto' \(\S+:{port}: "):
        probe("auto")
    started = time.monotonic()
    with pytest.raises(KerngenError, match=rf"at '127.0.0.1:{port}' \(127.0.0.1:{port}: Connection refused\)"):
        probe(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 2
    asked: list[float] = []

    def silent(where, timeout):  # a host that drops the connect: no answer within the bound
        asked.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    with pytest.raises(KerngenError, match=r"at '10.1.2.3:6379' \(10.1.2.3:6379: no answer within 5 s\)"):
        probe("10.1.2.3:6379")
    assert asked == [PROBE_TIMEOUT_S] == [5.0]


# ----- which GPUs time (no cluster) ----------------------------------------------------------------
def test_one_model_is_used_whole_and_a_mixed_cluster_needs_a_pick():
    assert choose_gpus(["H100", "H100"], None) == [0, 1]
    with pytest.raises(KerngenError, match=r"different models \(1 x A100, 2 x H100\).*--ray-gpu-model"):
        choose_gpus(["H100", "A100", "H100"], None)
    assert choose_gpus(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"], "h100") == [0]
    with pytest.raises(KerngenError, match="no GPU of model 'L40S'.*1 x A100"):
        choose_gpus(["A100", "H100"], "L40S")
    with pytest.raises(KerngenError, match="matches several GPU models"):
        choose_gpus(["H100 PCIe", "H100 SXM"], "H100")


def test_the_local_pool_splits_into_one_shard_per_gpu_too(tmp_path, monkeypatch):
    """What `generate DIR` runs its problems on, side by side, on a host of several GPUs."""
    from kerngen.harness.pool.local import WorkerPool

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    with WorkerPool(devices=["0", "1"], timeout_s=5.0, worker_module=FAKE) as pool:
        shards = pool.shards()
        assert [s.concurrency for s in shards] == [1, 1] and all(s.gpu_facts() is pool.gpu_facts() for s in shards)
        done = [s.evaluate(PROBLEM, [Candidate(spec=spec_of("fine"))])[0] for s in shards]
        assert [r.worker for r in done] == [0, 1] and all(r.verdict is Verdict.ok for r in done)
        shards[0].close()  # a shard owns no worker: the pool's stay up
        assert all(w.alive for w in pool.workers)


# ----- the command line ------------------------------------------------------------------------------
def test_suite_and_tune_take_the_cluster_from_the_option_or_the_environment(monkeypatch):
    from kerngen.cli import compose

    made: list[tuple[str, dict]] = []

    def refuse(kind, **kw):
        made.append((kind, kw))
        raise KerngenError("no cluster here")

    monkeypatch.setattr(compose, "make_evaluator", refuse)
    runner = CliRunner()
    res = runner.invoke(kerngen.cli.app.app, ["suite", "softmax"], env={"KERNGEN_RAY_ADDRESS": "auto"})
    assert res.exit_code == 2 and made[-1] == ("pool", {"ray": "auto", "ray_gpu_model": None, "gpus": 1})
    res = runner.invoke(kerngen.cli.app.app, ["suite", "softmax", "--ray", "10.0.0.1:6379", "--ray-gpu-model", "H100"])
    assert res.exit_code == 2 and made[-1][1]["ray"] == "10.0.0.1:6379" and made[-1][1]["ray_gpu_model"] == "H100"
    for command in ("generate", "tune", "suite"):
        out = runner.invoke(kerngen.cli.app.app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "--ray " in out and "--ray-gpu-model" in out and "KERNGEN_RAY_ADDRESS" in out


def test_without_ray_installed_the_flag_is_one_line(monkeypatch):
    import kerngen.harness.pool as pool_package
    from kerngen.cli.compose import make_evaluator

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    monkeypatch.delitem(sys.modules, "kerngen.harness.pool.ray_pool")
    monkeypatch.delattr(pool_package, "ray_pool")
    with pytest.raises(KerngenError, match=r"pip install 'kerngen\[ray\]'"):
        make_evaluator("pool", ray="auto")
    with pytest.raises(KerngenError, match="give --ray ADDRESS too"):
        make_evaluator("pool", ray_gpu_model="H100")
