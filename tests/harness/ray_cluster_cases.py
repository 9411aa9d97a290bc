"""The Ray evaluator on a local Ray cluster that the test starts, with three logical GPUs and the
fake worker (no GPU): GPUs 0 and 1 are named "fake", GPU 2 "A100" (FAKE_GPU_MODELS), so the whole
cluster is of mixed models and is refused unless a model is picked. Spread over two actors, a crash
and a hang cost one verdict each, results in order, the deadline, an actor back on another model,
the batch's problems side by side on the actors and resumed.

Not collected by itself (no ``test_`` prefix): ``test_ray_pool.py`` runs it in a fresh interpreter.
Ray's serialization goes wrong in a process that has run NVRTC compiles in-process (other test
modules do: a 31-character string argument no longer arrives, a 32-character result comes back
changed; kerngen itself compiles only in sandboxed worker processes), so the cluster's driver must
not be the test session's process."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.scripted import ScriptedEvaluator
from kerngen.agent.search import Search
from kerngen.cli.batch import Batch, Status, batch_path
from kerngen.errors import KerngenError
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.gpu.profile import find_ncu
from kerngen.harness.results import Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef

ray = pytest.importorskip("ray")
from kerngen.harness.pool.ray_pool import RayPool  # noqa: E402 - needs ray

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data" / "kernelbench"
FAKE = "tests.fakes.fake_worker"
PROBLEM = ProblemRef(source="softmax", shape=(4, 32))
GPUS = 3

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (starting one takes seconds): its workers inherit this
    environment (the fake GPU names, the repository on the path for the fake worker)."""
    saved = {k: os.environ.get(k) for k in ("FAKE_GPU_MODELS", "PYTHONPATH")}
    os.environ["FAKE_GPU_MODELS"] = "2=A100"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved["PYTHONPATH"]) if p)
    ray.init(num_cpus=GPUS, num_gpus=GPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_gpus_free() -> None:
    """Every GPU of the cluster free again (the actors of a closed pool die a moment later)."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < GPUS and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture
def gpus_free(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    wait_gpus_free()


def fake_pool(**kw) -> RayPool:
    return RayPool("auto", gpu_model="fake", timeout_s=3.0, worker_module=FAKE, start_timeout_s=60.0, **kw)


def spec_of(kernel: str, block: int = 32) -> KernelSpec:
    src = f'extern "C" __global__ void {kernel}(float* out) {{ out[threadIdx.x] = 1.f; }}'
    return KernelSpec.model_validate(
        {"source": src, "steps": [{"kernel": kernel, "grid": [1], "block": [block], "args": [{"name": "out"}]}]})


# ----- the pool on the cluster ---------------------------------------------------------------------
def test_a_mixed_cluster_is_refused_naming_its_models(gpus_free):
    with pytest.raises(KerngenError, match=r"different models \(1 x A100, 2 x fake\)") as info:
        RayPool("auto", worker_module=FAKE, start_timeout_s=60.0)
    assert "\n" not in str(info.value)
    wait_gpus_free()
    with pytest.raises(KerngenError, match="different models"):  # the suite's one actor: refused all the same
        RayPool("auto", gpus=1, worker_module=FAKE, start_timeout_s=60.0)
    wait_gpus_free()
    with RayPool("auto", gpu_model="a100", worker_module=FAKE, start_timeout_s=60.0) as pool:
        assert pool.concurrency == 1 and pool.gpu_facts().name == "A100"


def test_spread_over_two_actors_crash_and_hang_isolated_results_in_order(gpus_free):
    cands = [Candidate(spec=spec_of("fine", 32 * (i + 1))) for i in range(6)]
    cands.insert(2, Candidate(spec=spec_of("hang")))
    cands.insert(4, Candidate(spec=spec_of("crash")))
    cands.append(Candidate(spec=KernelSpec.model_validate({**spec_of("fine").model_dump(), "source": "oops"})))
    seen: list[int] = []
    with fake_pool() as pool:
        assert pool.concurrency == 2 and pool.gpu_facts().name == "fake"
        results = pool.evaluate(PROBLEM, cands, EvalOptions(timeout_s=3.0), on_result=lambda i, r: seen.append(i))
        assert sorted(seen) == list(range(len(cands)))  # once each
        verdicts = [r.verdict for r in results]
        assert verdicts[2] is Verdict.timeout and "worker restarted" in results[2].message
        assert verdicts[4] is Verdict.runtime_error and "illegal address" in results[4].log
        assert verdicts[-1] is Verdict.compile_error and "oops" in results[-1].log
        fine = [(r, c) for r, c in zip(results, cands) if c.spec.steps[0].kernel == "fine" and c.spec.source != "oops"]
        assert all(r.verdict is Verdict.ok for r, _ in fine)
        assert [r.spec_hash for r, _ in fine] == [c.spec.content_hash() for _, c in fine]  # in order
        assert {r.worker for r in results if r.worker is not None} == {0, 1}
        # the actors survived: both answer the next batch
        again = pool.evaluate(PROBLEM, [Candidate(spec=spec_of("fine", 32 * (i + 1))) for i in range(4)])
        assert [r.verdict for r in again] == [Verdict.ok] * 4 and {r.worker for r in again} == {0, 1}
        if find_ncu() is None:  # the profiler is looked for on the actors' host (this one)
            out = pool.profile(PROBLEM, spec_of("fine"))
            assert not out.available and "ncu" in out.error


def test_the_deadline_cancels_what_has_not_started_in_order(gpus_free):
    cands = [Candidate(spec=spec_of("hang")), Candidate(spec=spec_of("hang", 64))]
    cands += [Candidate(spec=spec_of("fine", 32 * (i + 1))) for i in range(4)]
    with fake_pool() as pool:
        options = EvalOptions(timeout_s=2.0)
        seen: list[int] = []

        def on_result(i, r) -> None:  # the budget runs out while both actors are busy with a hang
            seen.append(i)
            options.deadline = time.monotonic()

        results = pool.evaluate(PROBLEM, cands, options, on_result=on_result)
        assert [r.verdict for r in results] == [Verdict.timeout] * 2 + [Verdict.cancelled] * 4
        assert sorted(seen) == list(range(6)) and all(r.worker is None for r in results[2:])
        past = EvalOptions(timeout_s=2.0, deadline=time.monotonic() - 1)
        assert [r.verdict for r in pool.evaluate(PROBLEM, cands[2:], past)] == [Verdict.cancelled] * 4


def test_an_actor_back_on_another_gpu_model_is_let_go(gpus_free):
    """Ray restarts a lost actor wherever a GPU is free: one that comes back on another model (here
    made up: the handle expects an "A100") answers no time and is let go; the candidate it was given
    goes to the other actor (no verdict lost), which takes all the work from then on."""
    with fake_pool() as pool:
        pool.gpu_facts()
        pool.workers[0].model = "A100"
        cands = [Candidate(spec=spec_of("fine", 32 * (i + 1))) for i in range(6)]
        first = pool.evaluate(PROBLEM, cands)
        assert [r.verdict for r in first] == [Verdict.ok] * 6 and {r.worker for r in first} == {1}
        assert "not a A100: let go" in pool.actors[0].lost
        again = pool.evaluate(PROBLEM, cands)
        assert pool.concurrency == 1 and [r.verdict for r in again] == [Verdict.ok] * 6


# ----- a batch: one problem per actor at a time, resumable -------------------------------------------
class _OnActor(ScriptedEvaluator):
    """The scripted evaluator (a search's made-up times), which also has each batch of the search
    run on its own Ray shard: where and when its problem ran."""

    def __init__(self, shard: RayPool, log: list, meet: threading.Barrier) -> None:
        super().__init__()
        self.shard, self.log, self.meet = shard, log, meet

    def evaluate(self, problem, candidates, options=None, on_result=None):
        if self.meet is not None:  # both problems' searches are under way at once, or this breaks
            self.meet.wait(timeout=60)
            self.meet = None
        r = self.shard.evaluate(PROBLEM, [Candidate(spec=spec_of("fine"))])[0]
        self.log.append((problem.source, r.worker, r.verdict))
        return super().evaluate(problem, candidates, options, on_result)


class _Spread:
    """The evaluator `generate DIR` makes: a RayPool of two actors, as scripted shards (None: no
    pool, scripted shards only)."""

    def __init__(self, pool: RayPool | None, log: list) -> None:
        self.pool, self.log, self.meet = pool, log, threading.Barrier(2)

    def shards(self):
        if self.pool is None:
            return [ScriptedEvaluator(), ScriptedEvaluator()]
        return [_OnActor(s, self.log, self.meet) for s in self.pool.shards()]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _wait_for_batch_threads() -> None:
    for t in threading.enumerate():
        if t.name.startswith("kerngen-batch-"):
            t.join(60)


def test_a_batch_runs_one_problem_per_actor_side_by_side_and_resumes(gpus_free, tmp_path, monkeypatch):
    from kerngen.cli import compose

    d, runs = tmp_path / "kb", tmp_path / "runs"
    d.mkdir()
    for name in ("19_ReLU.py", "5_Matrix_scalar_multiplication.py"):
        shutil.copy(DATA / name, d / name)
    log: list = []
    made: list[dict] = []

    def make(kind, **kw):
        made.append(kw)
        return _Spread(fake_pool(), log)

    monkeypatch.setattr(compose, "make_evaluator", make)
    real_run = Search.run
    first_done = threading.Event()

    def second_interrupted(self):
        if "5_Matrix" not in self.settings.problem.source:
            out = real_run(self)
            first_done.set()
            return out
        self._open()
        self.journal.close()
        self.evaluator.evaluate(self.settings.problem, [])  # meets the other search on its actor
        first_done.wait(60)
        raise KeyboardInterrupt  # Ctrl-C in this search, after its folder exists

    monkeypatch.setattr(Search, "run", second_interrupted)
    args = ["generate", str(d), "--runs-dir", str(runs), "--proposer", "scripted", "--rounds", "1", "--no-tune",
            "--ray", "auto"]
    res = CliRunner().invoke(kerngen.cli.app.app, args, env={"COLUMNS": "220"})
    _wait_for_batch_threads()
    assert res.exit_code == 130 and "run the same command again" in res.output, res.output
    assert made[0]["ray"] == "auto"
    # both problems ran at once (the barrier), each on an actor of its own
    workers = {Path(src).name: w for src, w, v in log}
    assert set(workers) == {"19_ReLU.py", "5_Matrix_scalar_multiplication.py"} and set(workers.values()) == {0, 1}
    assert all(v is Verdict.ok for _, _, v in log)
    names = sorted(str(p) for p in d.iterdir())
    state = Batch.model_validate_json(batch_path(names, runs).read_bytes())
    assert sorted(e.status.value for e in state.entries) == ["finished", "running"]
    interrupted = next(e for e in state.entries if e.status is Status.running)

    seen: list[tuple[str, str]] = []

    def recorded(self):
        seen.append((self.settings.mode.value, self.settings.run_dir.name))
        return real_run(self)

    monkeypatch.setattr(Search, "run", recorded)
    monkeypatch.setattr(compose, "make_evaluator", lambda kind, **kw: _Spread(None, log))
    res = CliRunner().invoke(kerngen.cli.app.app, [*args, "--json"], env={"COLUMNS": "220"})
    _wait_for_batch_threads()
    assert res.exit_code == 0, res.output
    assert seen == [("resume", interrupted.run)]  # the finished one is not searched again
    assert {r["status"] for r in json.loads(res.stdout)} == {"finished"}

    def no_cluster(kind, **kw):
        raise AssertionError("a finished batch needs no evaluator")

    monkeypatch.setattr(compose, "make_evaluator", no_cluster)  # once more: the summary only
    res = CliRunner().invoke(kerngen.cli.app.app, [*args, "--json"], env={"COLUMNS": "220"})
    assert res.exit_code == 0 and len(json.loads(res.stdout)) == 2, res.output


