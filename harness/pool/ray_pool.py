"""The Evaluator on a Ray cluster: one actor per GPU (``num_gpus=1``), each hosting today's worker
process (:class:`~kerngen.harness.pool.worker_proc.WorkerProcess`), driven by the local pool's own
dispatch (:class:`~kerngen.harness.pool.local.WorkerPool`): the driver compiles on its cores (the
static stage), cubins and requests travel to the actors as the protocol's JSON, one candidate per
actor at a time, results in order, the deadline honoured. The actor only relays: a candidate's
crash or hang kills its worker process inside the actor and costs that candidate's verdict, never
the actor or the search. An actor that is itself lost (its process or its node gone) costs no
verdict: the candidate in flight goes to another actor (once; with none left it comes back as the
harness's ``harness_error``, left for a resume), the lost one leaves the rotation, and Ray restarts
it where a GPU is free (``max_restarts=-1``), after which it rejoins; one restarted on a GPU of
another model is let go. Ray's own task retries stay off (``max_task_retries=0``): they would run
the candidate again on the same actor only, which cannot come back while its node is gone, and
behind the search's back; the pool's one re-dispatch is its own, to another GPU.

A median means something on one GPU model only: a cluster whose GPUs are of several models is
refused for timing unless one model is picked (``gpu_model``: only its actors are used).

Ray is an optional dependency (``pip install 'kerngen[ray]'``): this module is the only one that
imports it, and :mod:`kerngen.cli.compose` imports this module only where ``--ray`` is used."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from typing import Sequence

import ray
from pydantic import TypeAdapter
from ray.exceptions import GetTimeoutError, NodeDiedError, RayActorError, RayError

from kerngen.errors import KerngenError, NoGPUError
from kerngen.harness.gpu.profile import ProfileRequest, find_ncu, run_ncu
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.pool.protocol import HelloRequest, Reply, Request
from kerngen.harness.pool.worker_proc import WorkerDied, WorkerLost, WorkerProcess, WorkerTimeout
from kerngen.harness.results import GpuFacts, ProfileOutcome

START_TIMEOUT_S = 300.0  # a worker process's start (torch import, CUDA context), as in WorkerProcess
# the driver's own limit on an actor's answer, past every limit the actor keeps itself (a worker's
# start, its problem's preparation, the candidate's timeout): only an actor stuck in Ray hits it
RELAY_SLACK_S = 60.0
# "local" starts a Ray instance on this machine (its GPUs); "auto" joins the cluster this machine
# is part of (`ray start`); anything else is the address of a cluster (host:port or ray://host:port)
LOCAL = "local"
# an address is first reached with a plain TCP connect bounded by this: Ray's own client retries an
# address nothing answers at for minutes, printing warnings (measured with Ray 2.60: over 2 minutes)
PROBE_TIMEOUT_S = 5.0
GCS_PORT, CLIENT_PORT = 6379, 10001  # Ray's defaults: `ray start --head`, the ray:// client server
# how long a pool with no actor left waits for Ray to restart one (an actor's process killed: a few
# seconds on the same node) before it gives up on its candidates (a node gone: its GPU never comes back)
RESTART_GRACE_S = 15.0

_REQUEST: TypeAdapter = TypeAdapter(Request)
log = logging.getLogger(__name__)


class ActorLost(WorkerLost):
    """An actor (or its node) is gone: a fault of the cluster, never a candidate's verdict."""


# ----- the actor: one GPU of the cluster, hosting one worker process -----------------------------
# The relay's outcome travels as a plain triple (kind, text, log tail) so that no kerngen class
# crosses Ray's pickling: both ends speak the worker protocol's JSON.
REPLY, TIMEOUT, DIED, OTHER_MODEL, KILLED = "reply", "timeout", "died", "other-model", "killed"


def relay_died(exc: WorkerDied) -> tuple[str, str, str]:
    """The relay of a worker's death: KILLED for a SIGKILL the actor did not send. A node going down kills the
    actor's worker first, and the actor, alive a moment longer, would otherwise answer that the candidate's worker
    died: a kernel's verdict for a cluster's fault (the CPU Ray tests saw it under load, 2026-11-28)."""
    return (KILLED if exc.killed_outside else DIED), str(exc), exc.log_tail


@ray.remote(num_gpus=1, num_cpus=1, max_restarts=-1, max_task_retries=0)
class GpuActor:
    """Holds the GPU Ray gave it (CUDA_VISIBLE_DEVICES, set by Ray) and a WorkerProcess on it."""

    def __init__(self, index: int, module: str | None, start_timeout_s: float) -> None:
        device = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(g) for g in ray.get_gpu_ids())
        extra = {"module": module} if module else {}  # tests: a fake worker, no GPU
        self.worker = WorkerProcess(index, device.split(",")[0], start_timeout_s=start_timeout_s, **extra)
        self.model = ""  # the GPU's name once a request asked for it

    def where(self) -> tuple[str, str]:
        """(this actor's node address, the GPU it holds)."""
        return ray.util.get_node_ip_address(), self.worker.device

    def request(self, request_json: str, timeout_s: float, model: str = "") -> tuple[str, str, str]:
        """One request to the worker process, with its timeout and restart as in the local pool.
        ``model``: the GPU model the driver times on. The first such request of this actor (or of
        its restart by Ray, maybe on another node) names its GPU first, and a GPU of another model
        answers :data:`OTHER_MODEL`, never a time."""
        try:
            if model and self.model != model:
                hello = self.worker.request(HelloRequest(ceilings=False), self.worker.start_timeout_s)
                self.model = hello.facts.name if hello.facts is not None else f"no GPU ({hello.error})"
                if self.model != model:
                    return OTHER_MODEL, self.model, ""
            reply = self.worker.request(_REQUEST.validate_json(request_json), timeout_s)
        except WorkerTimeout as exc:
            return TIMEOUT, str(exc), ""
        except WorkerDied as exc:
            return relay_died(exc)
        return REPLY, reply.model_dump_json(), ""

    def kill_worker(self) -> None:
        self.worker.kill()

    def has_ncu(self) -> bool:
        return find_ncu() is not None

    def profile(self, request_json: str, arch: str, timeout_s: float) -> str:
        """ncu on this actor's host and GPU (the worker process stays idle and alive meanwhile)."""
        ncu = find_ncu()
        if ncu is None:
            return ProfileOutcome(available=False, error="ncu (Nsight Compute) not found on the actor's host: "
                                                         "no profiler feedback").model_dump_json()
        request = ProfileRequest.model_validate_json(request_json)
        return run_ncu(ncu, request, device=self.worker.device, arch=arch, timeout_s=timeout_s).model_dump_json()

    def close(self) -> None:
        self.worker.close()


# ----- the driver's handle on one actor -----------------------------------------------------------
class ActorWorker:
    """What the pool's dispatch asks of a worker (``index``, ``device``, ``request`` with a timeout
    that raises WorkerTimeout or WorkerDied, ``kill``, ``close``), over one actor. Every request
    names ``model``, the one GPU model timed on: an actor that Ray restarted on a GPU of another
    model is let go, and this request and every later one are ActorLost. An actor lost under a
    request (its process or node gone) is ``down`` until Ray has restarted it (:meth:`back`)."""

    def __init__(self, index: int, actor: "ray.actor.ActorHandle", host: str, gpu: str, model: str,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.index = index
        self.actor = actor
        self.model = model
        self.device = f"{gpu}@{host}"  # in messages: which GPU of which node
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.lost = ""  # why it was let go for good
        self.down = ""  # why it is out of the rotation until Ray restarts it
        self._probe: "ray.ObjectRef | None" = None  # a question to the restarted actor: where are you?

    def request(self, request, timeout_s: float) -> Reply:
        if self.lost:
            raise ActorLost(self.lost)
        if self.down and not self.back():
            raise ActorLost(self.down)
        # the actor may have to (re)start its worker and prepare the problem before the request
        limit = timeout_s + 2 * self.start_timeout_s + RELAY_SLACK_S
        ref = self.actor.request.remote(request.model_dump_json(), timeout_s, self.model)
        try:
            kind, text, tail = ray.get(ref, timeout=limit)
        except GetTimeoutError:
            ray.kill(self.actor, no_restart=False)  # Ray restarts it, with a fresh worker
            raise WorkerTimeout(f"the Ray actor of GPU {self.device} did not answer within {limit:.0f} s; "
                                "actor restarted") from None
        except (RayActorError, NodeDiedError) as exc:  # its process or its node is gone; Ray restarts it
            self.down = f"the Ray actor of GPU {self.device} was lost ({type(exc).__name__}: its node or process gone)"
            self._probe = None
            raise ActorLost(self.down) from None
        except RayError as exc:
            first = " ".join(str(exc).split())[:300]
            raise ActorLost(f"the Ray actor of GPU {self.device} failed: {first}") from None
        if kind == OTHER_MODEL:
            self.lost = f"the Ray actor of GPU {self.device} came back on a {text}, not a {self.model}: let go"
            ray.kill(self.actor, no_restart=True)
            raise ActorLost(self.lost)
        if kind == TIMEOUT:
            raise WorkerTimeout(text)
        if kind == KILLED:  # out of the rotation until the actor answers again (a node going down: it will not)
            self.down = f"the Ray actor of GPU {self.device} lost its worker to a SIGKILL from outside ({text[:200]})"
            self._probe = None
            raise ActorLost(self.down)
        if kind == DIED:
            raise WorkerDied(text, tail)
        return Reply.model_validate_json(text)

    def back(self) -> bool:
        """Whether an actor that was down is back (Ray restarted it, maybe on another node), asked
        without waiting: the answer to the last question is read, the next one asked."""
        if self.lost:
            return False
        if not self.down:
            return True
        if self._probe is None:
            self._probe = self.actor.where.remote()
        ready, _ = ray.wait([self._probe], timeout=0)
        if not ready:
            return False
        probe, self._probe = self._probe, None
        try:
            host, gpu = ray.get(probe)
        except RayError:  # still restarting: asked again next time
            return False
        self.host, self.device, self.down = host, f"{gpu}@{host}", ""
        return True

    def profile(self, request: ProfileRequest, arch: str, timeout_s: float) -> ProfileOutcome:
        try:
            text = ray.get(self.actor.profile.remote(request.model_dump_json(), arch, timeout_s),
                           timeout=timeout_s + RELAY_SLACK_S)
        except RayError as exc:  # GetTimeoutError included: an outcome, as always
            return ProfileOutcome(error=f"not profiled: the Ray actor of GPU {self.device}: {type(exc).__name__}")
        return ProfileOutcome.model_validate_json(text)

    def kill(self) -> None:
        self.actor.kill_worker.remote()  # answered in turn, before the actor's next request

    def close(self) -> None:
        if self.down or self.lost:  # nothing to ask it: its worker process went with it
            ray.kill(self.actor, no_restart=True)
            return
        let_go([self.actor])


def let_go(actors: Sequence["ray.actor.ActorHandle"], wait_s: float = 10.0) -> None:
    """End ``actors``: each closes its worker process (which would outlive a killed actor in its
    own session), then the actors end and their GPUs are free again."""
    if not actors:
        return
    ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=wait_s)
    for actor in actors:
        ray.kill(actor, no_restart=True)


# ----- which GPUs to time on -------------------------------------------------------------------------
def _models(counts: Counter) -> str:
    return ", ".join(f"{n} x {name}" for name, n in sorted(counts.items()))


def choose_gpus(models: Sequence[str], wanted: str | None) -> list[int]:
    """The indexes (into ``models``, one GPU model name per actor) of the GPUs to time on: all of
    them when they are of one model; those whose name contains ``wanted`` (case-insensitive) when
    it is given. A KerngenError naming the models when that leaves several models, or none."""
    counts = Counter(models)
    if wanted:
        keep = [i for i, m in enumerate(models) if wanted.lower() in m.lower()]
        chosen = Counter(models[i] for i in keep)
        if not keep:
            raise KerngenError(f"no GPU of model {wanted!r} in the Ray cluster; it has {_models(counts)}")
        if len(chosen) > 1:
            raise KerngenError(f"--ray-gpu-model {wanted!r} matches several GPU models ({_models(chosen)}): "
                               "name one of them")
        return keep
    if len(counts) > 1:
        raise KerngenError(f"the Ray cluster's GPUs are of different models ({_models(counts)}): a time means "
                           "something on one model only; pick one with --ray-gpu-model NAME")
    return list(range(len(models)))


def head_address(address: str) -> tuple[str, int] | None:
    """(host, port) that ``address`` reaches first: the cluster's GCS (``host:port``; ``auto``: the
    one this machine's ``ray start`` or RAY_ADDRESS names) or its ray:// client server; None for
    :data:`LOCAL`, or where Ray cannot say (its own connect then decides)."""
    if address == LOCAL:
        return None
    if address == "auto":
        try:  # what ray.init("auto") would join; a private helper of Ray's, hence the fallback
            address = ray._private.services.canonicalize_bootstrap_address_or_die("auto")
        except ConnectionError as exc:
            raise KerngenError(f"no Ray cluster to join at 'auto': {' '.join(str(exc).split())[:200]}") from None
        except Exception:  # noqa: BLE001 - another Ray: no probe, ray.init decides
            return None
    scheme, _, rest = address.rpartition("://")
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit():
        host, port = rest, str(CLIENT_PORT if scheme == "ray" else GCS_PORT)
    return host.strip("[]"), int(port)


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """A KerngenError, within ``timeout_s``, when nothing answers at the cluster's address."""
    where = head_address(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError as exc:
        why = "no answer within {:.0f} s".format(timeout_s) if isinstance(exc, TimeoutError) else (
            exc.strerror or type(exc).__name__)
        raise KerngenError(f"cannot reach the Ray cluster at {address!r} ({where[0]}:{where[1]}: {why}); "
                           "is `ray start --head` running there?") from None


def connect(address: str) -> bool:
    """Join the cluster at ``address`` (or start a local one, :data:`LOCAL`) unless this process is
    connected already (a test's cluster); True when this call connected."""
    if ray.is_initialized():
        return False
    probe(address)
    # actors' and workers' output stays in their logs: the terminal shows kerngen's lines only
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    try:
        ray.init(address=None if address == LOCAL else address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = " ".join(str(exc).split())[:300]
        if "Authentication" in type(exc.__cause__).__name__:  # Ray >= 2.5x: `ray start --head` may ask for a token
            first = "the cluster asks for Ray's token: set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN)"
        raise KerngenError(f"cannot connect to the Ray cluster at {address!r}: {first}") from None
    quiet_driver()
    return True


def quiet_driver() -> None:
    """A node lost mid-run makes Ray print its raylet's last log lines on this process's stdout
    (where ``--json`` writes its summary); kerngen says what it lost in its own results and
    warnings. Ray has no option for it, only this flag of its own (gone in another Ray: no harm)."""
    if hasattr(ray._private.worker, "_worker_logs_enabled"):
        ray._private.worker._worker_logs_enabled = False


# ----- the pool -------------------------------------------------------------------------------------
class RayPool(WorkerPool):
    """Implements :class:`~kerngen.harness.evaluator.Evaluator` (and the Profiler capability) on
    a Ray cluster; see the module. ``gpus`` caps the actors used (the suite times on one); the
    models are checked on every free GPU all the same."""

    def __init__(self, address: str = "auto", *, gpu_model: str | None = None, gpus: int | None = None,
                 timeout_s: float = 60.0, worker_module: str | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, restart_grace_s: float = RESTART_GRACE_S) -> None:
        self._connected = connect(address)
        try:
            workers = self._start_actors(gpu_model, gpus, worker_module, start_timeout_s)
        except BaseException:
            self._disconnect()
            raise
        super().__init__(timeout_s=timeout_s, workers=workers)
        self.actors: list[ActorWorker] = list(workers)  # all of them, those out of the rotation too
        self.restart_grace_s = restart_grace_s
        self._waited = False  # the grace was given since the last actor was lost

    def _start_actors(self, gpu_model: str | None, gpus: int | None, module: str | None,
                      start_timeout_s: float) -> list[ActorWorker]:
        """One actor per free GPU of the cluster, each greeted (its worker started, its GPU named);
        the actors that do not answer in time or cannot start a worker are let go, as are those of
        another model than the one timed on."""
        free = int(ray.available_resources().get("GPU", 0))
        if free < 1:
            raise NoGPUError("the Ray cluster has no free GPU (ray status shows its resources)")
        actors = [GpuActor.remote(i, module, start_timeout_s) for i in range(free)]
        try:
            chosen = self._greet(actors, gpu_model, start_timeout_s)[:gpus or None]
        except BaseException:
            let_go(actors)
            raise
        let_go([a for a in actors if all(a is not w.actor for w in chosen)])
        return chosen

    @staticmethod
    def _greet(actors: list, gpu_model: str | None, start_timeout_s: float) -> list[ActorWorker]:
        """The handles of the actors to time on: those whose worker started and named its GPU, of
        the one model (see :func:`choose_gpus`)."""
        hello = HelloRequest(ceilings=False).model_dump_json()
        refs = [a.request.remote(hello, start_timeout_s) for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=start_timeout_s + RELAY_SLACK_S)
        greeted: list[tuple[ray.actor.ActorHandle, GpuFacts]] = []
        why: list[str] = []
        for actor, ref in zip(actors, refs):
            facts, reason = _greeting(ref, ref in ready, start_timeout_s)
            if facts is None:
                why.append(reason)
            else:
                greeted.append((actor, facts))
        if not greeted:
            raise NoGPUError(f"no GPU actor of the Ray cluster started: {'; '.join(why)[:400]}")
        if why:
            log.warning("%d GPU actor(s) of the Ray cluster let go: %s", len(why), "; ".join(why)[:400])
        keep = choose_gpus([f.name for _, f in greeted], gpu_model)
        chosen = []
        for i in keep:
            actor, facts = greeted[i]
            host, gpu = ray.get(actor.where.remote(), timeout=RELAY_SLACK_S)
            chosen.append(ActorWorker(len(chosen), actor, host, gpu, facts.name, start_timeout_s))
        return chosen

    # ----- the rotation: actors lost go out, those Ray restarted come back ------------------------
    def _rotation(self) -> int:
        """Put in the rotation (``workers``, the free queue) the actors that can take candidates:
        not let go, not down (those Ray restarted are back). With none, Ray is given
        ``restart_grace_s``, once for each time none is left, to restart one (an actor's process
        killed: seconds) before what is left is given up (a node gone: its GPU does not come back).
        Called between dispatches, when every worker is in the free queue."""
        usable = [w for w in self.actors if w.back()]
        if not usable and not self._waited:
            self._waited = True
            deadline = time.monotonic() + self.restart_grace_s
            while not usable and any(not w.lost for w in self.actors) and time.monotonic() < deadline:
                time.sleep(0.5)
                usable = [w for w in self.actors if w.back()]
        if usable:
            self._waited = False
        if usable and usable != self.workers:
            for w in self.workers:
                if w not in usable:
                    log.warning("out of the rotation: %s", w.lost or w.down)
            self.workers, self.concurrency = usable, len(usable)
            while not self._free.empty():
                self._free.get_nowait()
            for w in usable:
                self._free.put(w)
        return len(usable)

    def workers_lost(self) -> str:
        """Why no actor of this pool can take a candidate (all let go, or down and not restarted
        within ``restart_grace_s``), "" while one can: a batch then hands its problem to another shard."""
        if self._rotation():
            return ""
        return "; ".join(w.lost or w.down for w in self.actors)[:400] or "no GPU actor left"

    def _ask(self, request, timeout_s: float):
        """The local pool's (the GPU facts, a baseline), asked again of another actor when the one
        asked was lost or let go (each actor asked once at most)."""
        for _ in self.actors:
            try:
                return super()._ask(request, timeout_s)
            except ActorLost:
                if not self._rotation():
                    raise
        return super()._ask(request, timeout_s)

    def shards(self) -> list["WorkerPool"]:
        out = super().shards()
        for shard in out:  # each its own actor, none of the others to take its work
            shard.actors, shard._waited = list(shard.workers), False
        return out

    # ----- the Profiler capability, on the actor's host --------------------------------------------
    def _find_ncu(self) -> str:
        """Whether the actors' hosts can profile (asked of one actor: the cluster is one model)."""
        try:
            return "actor" if ray.get(self.workers[0].actor.has_ncu.remote(), timeout=RELAY_SLACK_S) else ""
        except RayError:
            return ""

    def _run_ncu(self, worker: ActorWorker, request: ProfileRequest, arch: str, timeout_s: float) -> ProfileOutcome:
        return worker.profile(request, arch, timeout_s)

    def close(self) -> None:
        if self._owner:
            self.workers = self.actors  # those out of the rotation are ended too
        super().close()
        if self._owner:
            self._disconnect()

    def _disconnect(self) -> None:
        if self._connected:
            ray.shutdown()
            self._connected = False


def _greeting(ref: "ray.ObjectRef", ready: bool, waited_s: float) -> tuple[GpuFacts | None, str]:
    """The facts an actor's worker answered the hello with, or (None, why it did not)."""
    if not ready:
        return None, f"no answer within {waited_s:.0f} s (no GPU free for it?)"
    try:
        kind, text, _ = ray.get(ref)
    except RayError as exc:
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    if kind != REPLY:
        return None, text
    reply = Reply.model_validate_json(text)
    return (reply.facts, "") if reply.facts is not None else (None, reply.error or "no GPU facts")


__all__ = ["ActorLost", "ActorWorker", "GpuActor", "LOCAL", "RayPool", "choose_gpus", "connect", "probe", "relay_died",
           "quiet_driver"]
