"""The Ray evaluator on a cluster of several nodes that the test starts on this machine (Ray's own
``cluster_utils``: a head and a second node, each with one logical GPU and its own raylet), with
the fake worker (no GPU): a node lost in the middle of a batch (its raylet killed) costs no verdict,
its candidate in flight is re-dispatched to the surviving GPU and the actor rejoins once Ray has
restarted it on a new node; a node lost under one of a batch's problems (``generate DIR``: a shard,
one actor, no other GPU to take its candidate, which comes back as the harness's) hands that
problem to the surviving GPU, which resumes it in its run folder; a cluster whose nodes are of two
GPU models (one node's fake worker named "A100" through that node's environment) is refused.

Not collected by itself (no ``test_`` prefix): ``test_ray_pool.py`` runs it in a fresh interpreter
(``ray_cluster_cases.py`` says why)."""

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
from kerngen.agent.journal import read_events
from kerngen.agent.scripted import ScriptedEvaluator
from kerngen.agent.search import Search
from kerngen.cli.batch import Batch, Status, batch_path
from kerngen.errors import KerngenError
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.results import Verdict

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402 - needs ray

from kerngen.harness.pool.ray_pool import RayPool, quiet_driver  # noqa: E402 - needs ray
from tests.harness.ray_cluster_cases import DATA, FAKE, PROBLEM, ROOT, spec_of  # noqa: E402 - needs ray

pytestmark = pytest.mark.timeout(240)
GRACE_S = 2.0  # how long a pool with no actor left waits for Ray to restart one


@pytest.fixture(scope="module")
def cluster():
    """A head and node "b", one logical GPU each; the tests remove and add nodes."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved) if p)  # the fake worker
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, num_gpus=1, include_dashboard=False))
    c.b = c.add_node(num_cpus=1, num_gpus=1)
    ray.init(address=c.address, log_to_driver=False)
    quiet_driver()  # as kerngen's own connect: a lost node's raylet log stays off stdout (--json)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def wait_for(gpus: int, total: int) -> None:
    """The cluster has ``total`` GPUs, ``gpus`` of them free (a closed pool's actors end a moment later)."""
    deadline = time.monotonic() + 60
    while not (ray.cluster_resources().get("GPU", 0) == total and ray.available_resources().get("GPU", 0) == gpus):
        assert time.monotonic() < deadline, (ray.cluster_resources(), ray.available_resources())
        time.sleep(0.1)


def node_of(worker) -> str:
    return ray.get(worker.actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def wait_gone(worker) -> None:
    """The actor of ``worker`` no longer answers (its node's raylet was killed: its process ends a
    moment later, and may answer once more meanwhile)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(worker.actor.where.remote(), timeout=1)
        except ray.exceptions.RayError:
            return
        time.sleep(0.2)
    raise AssertionError("the actor of a removed node still answers")


def fake_pool() -> RayPool:
    return RayPool("auto", gpu_model="fake", timeout_s=5.0, worker_module=FAKE, start_timeout_s=60.0,
                   restart_grace_s=GRACE_S)


@pytest.fixture
def two_nodes(cluster, tmp_path, monkeypatch):
    """The head and a node "b", whatever an earlier test removed."""
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    if cluster.b is None:
        cluster.b = cluster.add_node(num_cpus=1, num_gpus=1)
    wait_for(2, 2)
    return cluster


def lose_b(cluster) -> None:
    """Node b's raylet and the rest of its processes killed (not a graceful stop)."""
    node, cluster.b = cluster.b, None
    cluster.remove_node(node, allow_graceful=False)


def test_a_cluster_whose_nodes_have_two_gpu_models_is_refused(two_nodes):
    other = two_nodes.add_node(num_cpus=1, num_gpus=1, env_vars={"FAKE_GPU_MODELS": "0=A100"})
    try:
        wait_for(3, 3)
        with pytest.raises(KerngenError, match=r"different models \(1 x A100, 2 x fake\).*--ray-gpu-model") as info:
            RayPool("auto", worker_module=FAKE, start_timeout_s=60.0)
        assert "\n" not in str(info.value)
        wait_for(3, 3)
        with RayPool("auto", gpu_model="A100", worker_module=FAKE, start_timeout_s=60.0) as pool:
            assert pool.concurrency == 1 and pool.gpu_facts().name == "A100"
            assert node_of(pool.workers[0]) == other.node_id
    finally:
        wait_for(3, 3)
        two_nodes.remove_node(other)


def test_a_node_lost_mid_batch_costs_no_verdict_and_its_actor_rejoins_once_restarted(two_nodes):
    """Node b's raylet is killed while its actor runs a candidate: that candidate is run again on
    the head's GPU (it comes back ok, not a harness error or a timeout), every result lands once,
    in order; the next batch runs on the head alone without waiting; once a new node joins, Ray
    restarts the lost actor there and it takes candidates again."""
    cands = [Candidate(spec=spec_of("slow", 32 * (i + 1))) for i in range(6)]  # a second each
    seen: list[int] = []
    killed = threading.Event()
    with fake_pool() as pool:
        assert pool.concurrency == 2
        victim = next(w.index for w in pool.workers if node_of(w) == two_nodes.b.node_id)
        assert victim == pool.actors[victim].index

        def on_result(i, r) -> None:  # under the pool's lock: the node is killed from another thread
            seen.append(i)
            if r.worker == victim and not killed.is_set():
                killed.set()  # its next candidate has started by now: it is killed in flight
                threading.Thread(target=lose_b, args=(two_nodes,)).start()

        t0 = time.monotonic()
        results = pool.evaluate(PROBLEM, cands, EvalOptions(timeout_s=5.0), on_result=on_result)
        assert killed.is_set() and time.monotonic() - t0 < 30
        assert [r.verdict for r in results] == [Verdict.ok] * 6, [r.message for r in results]
        assert [r.spec_hash for r in results] == [c.spec.content_hash() for c in cands]
        assert sorted(seen) == list(range(6))
        on_victim = [i for i, r in enumerate(results) if r.worker == victim]
        assert 1 <= len(on_victim) < 3  # it ran some, then the survivor took the rest and its candidate in flight

        again = pool.evaluate(PROBLEM, cands[:2], EvalOptions(timeout_s=5.0))
        assert [r.verdict for r in again] == [Verdict.ok] * 2 and victim not in {r.worker for r in again}
        assert pool.concurrency == 1 and pool.workers[0].index != victim  # out of the rotation
        assert pool.workers_lost() == ""

        two_nodes.b = two_nodes.add_node(num_cpus=1, num_gpus=1)  # Ray restarts the lost actor there
        deadline = time.monotonic() + 60
        while pool._rotation() < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        back = pool.evaluate(PROBLEM, cands[:2], EvalOptions(timeout_s=5.0))
        assert [r.verdict for r in back] == [Verdict.ok] * 2 and {r.worker for r in back} == {0, 1}
        assert node_of(pool.actors[victim]) == two_nodes.b.node_id


# ----- a batch: the problem of a lost node goes to the surviving GPU ---------------------------------
class _OnActor(ScriptedEvaluator):
    """Each batch of the search first runs one candidate on its Ray shard (whose answer it passes
    on when the harness could not evaluate), then gives the scripted evaluator's made-up times. The
    shard on node b kills that node on its first batch, once both searches are under way."""

    def __init__(self, shard: RayPool, log: list, meet: threading.Barrier, kill=None) -> None:
        super().__init__()
        self.shard, self.log, self.meet, self.kill = shard, log, meet, kill

    def evaluate(self, problem, candidates, options=None, on_result=None):
        if self.meet is not None:
            self.meet.wait(timeout=60)
            self.meet = None
        if self.kill is not None:
            self.kill()
            self.kill = None
        r = self.shard.evaluate(PROBLEM, [Candidate(spec=spec_of("fine"))])[0]
        self.log.append((problem.source, r.worker, r.verdict, r.message))
        if r.verdict is Verdict.harness_error:
            return [r.model_copy(update={"spec_hash": c.spec.content_hash()}) for c in candidates]
        return super().evaluate(problem, candidates, options, on_result)

    def workers_lost(self) -> str:
        return self.shard.workers_lost()


class _Spread:
    """The evaluator `generate DIR` makes: a RayPool of two actors, as scripted shards; the shard
    on node b kills that node."""

    def __init__(self, pool: RayPool, log: list, cluster) -> None:
        self.pool, self.log, self.cluster, self.victim = pool, log, cluster, None

    def shards(self):
        meet, out = threading.Barrier(2), []
        for s in self.pool.shards():
            kill = None
            if node_of(s.workers[0]) == self.cluster.b.node_id:
                self.victim = s.workers[0].index
                kill = lambda w=s.workers[0]: (lose_b(self.cluster), wait_gone(w))  # noqa: E731
            out.append(_OnActor(s, self.log, meet, kill))
        return out

    def close(self) -> None:
        self.pool.close()


def test_a_batch_hands_the_problem_of_a_lost_node_to_the_surviving_gpu(two_nodes, tmp_path, monkeypatch):
    from kerngen.cli import compose  # the composition root the batch asks for its evaluator

    d, runs = tmp_path / "kb", tmp_path / "runs"
    d.mkdir()
    files = ("19_ReLU.py", "5_Matrix_scalar_multiplication.py", "1_Square_matrix_multiplication_.py")
    for name in files:
        shutil.copy(DATA / name, d / name)
    log: list = []
    made: list[_Spread] = []

    def make(kind, **kw):
        made.append(_Spread(fake_pool(), log, two_nodes))
        return made[-1]

    monkeypatch.setattr(compose, "make_evaluator", make)
    real_run = Search.run
    searched: list[tuple[str, str]] = []

    def recorded(self):
        searched.append((self.settings.mode.value, self.settings.run_dir.name))
        return real_run(self)

    monkeypatch.setattr(Search, "run", recorded)
    args = ["generate", str(d), "--runs-dir", str(runs), "--proposer", "scripted", "--rounds", "1", "--no-tune",
            "--ray", "auto", "--json"]
    res = CliRunner().invoke(kerngen.cli.app.app, args, env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert sorted(Path(r["problem"]).name for r in rows) == sorted(files)
    assert {r["status"] for r in rows} == {"finished"}, rows
    # one problem's first batch met the lost node: no verdict, the search stopped, and the surviving
    # GPU resumed it in the same run folder (nothing else was searched twice)
    lost = [i for i, (_, _, v, _) in enumerate(log) if v is Verdict.harness_error]
    assert len(lost) == 1 and made[0].victim is not None
    # the shard of the lost node had no other GPU: its candidate came back as the harness's, not a verdict
    assert "was lost" in log[lost[0]][3] and "not the kernel's verdict, left for a resume" in log[lost[0]][3]
    assert all(w != made[0].victim for _, w, _, _ in log[lost[0] + 1:])  # the surviving GPU took the rest
    lost_run = next(r["run"] for r in rows if r["problem"] == log[lost[0]][0])
    assert [m for m, name in searched if name == lost_run] == ["new", "resume"]
    assert sorted(name for m, name in searched if m == "new") == sorted(r["run"] for r in rows)
    events, _ = read_events(runs / lost_run)
    evaluated = [e.id for e in events if e.type == "node_evaluated"]
    assert evaluated and len(evaluated) == len(set(evaluated))  # nothing evaluated twice
    names = sorted(str(p) for p in d.iterdir())
    state = Batch.model_validate_json(batch_path(names, runs).read_bytes())
    assert all(e.status is Status.finished for e in state.entries)

    def no_cluster(kind, **kw):
        raise AssertionError("a finished batch needs no evaluator")

    monkeypatch.setattr(compose, "make_evaluator", no_cluster)  # again: nothing is searched
    searched.clear()
    res = CliRunner().invoke(kerngen.cli.app.app, args, env={"COLUMNS": "220"})
    assert res.exit_code == 0 and not searched, res.output
