"""The Ray evaluator (``--ray``): which GPUs of a cluster time (one model), the local pool's shards
(a batch's problems side by side), the command line's plumbing, a missing Ray; and the cases on a
local Ray cluster with the fake worker (``ray_cluster_cases.py``), run in a fresh interpreter (its
docstring says why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.errors import KerngenError
from kerngen.harness.evaluator import Candidate
from kerngen.harness.results import Verdict

pytest.importorskip("ray")
from kerngen.harness.pool.ray_pool import choose_gpus  # noqa: E402 - needs ray
from tests.harness.ray_cluster_cases import FAKE, PROBLEM, spec_of  # noqa: E402 - needs ray

ROOT = Path(__file__).parents[2]


def test_the_cases_on_a_local_ray_cluster():
    """ray_cluster_cases.py in a fresh interpreter (its docstring says why): under a minute."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           "tests/harness/ray_cluster_cases.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


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
