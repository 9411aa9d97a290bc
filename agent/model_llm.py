"""The LLM per region of a model run (issue 34): beside the playbook's variants, each region a model run searches
gets kernels the configured LLM writes for it, asked about the region as the problem.

**The question** (``prompts/region.j2`` under the op search's system prompt, ``system.j2``, whose problem is the
region and whose reference is the whole model's source): the region's ATen ops in order, the shapes, dtypes and
strides of what it reads (weights included) and of what it writes, its eager time and roofline floor, the best
kernel so far (its time and, when short, its source), and every earlier answer's outcome. A failed last answer
comes back with its source and what went wrong (to be repaired), a correct one sets the bar for the next. At most
``rounds`` questions a region, none sent past the region's share of the budget.

**Untrusted.** An answer is read by the op path's parser (:meth:`.llm.proposer.LLMProposer.ask_spec`), its source
checked against the compile boundary's policy (:func:`kerngen.harness.compile.source_policy.check_source`: no host
include, no steering of the CUDA headers) before any launcher sees it, then evaluated exactly as a playbook variant
(the model search's ``_try``: the output poisoned, compared with PyTorch's value of the region, timed alone), and
its inputs compared afterwards (a kernel that writes one is refused, the value put back). An answer that cannot be
read, a refused source, a kernel that fails: a failed try with its reason, never an exception through the search.
An endpoint error no later request can get past (a wrong key, an unknown model) stops the LLM for the rest of the
run; the playbook goes on.

**The trajectory**: ``RUN/llm/r<i>/events.jsonl`` per region asked, in the op search's journal format
(:mod:`.journal`): each LLM exchange an ``llm_call`` event, each answer a ``node_created`` (its parent: the attempt
it repairs or improves), its outcome a ``node_evaluated``; appended and fsync'd after each step, every line
redacted (no API key) as every journal line is.

The hook in :func:`.model_search.search_model` is :class:`RegionProposer` (``propose=``) and :func:`ask_region`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from kerngen.agent.budget import SearchBudget, SearchConfig, Usage
from kerngen.agent.journal import Journal, NodeCreated, NodeEvaluated, RunFinished, RunStarted, versions
from kerngen.agent.model_run import RegionRow, VariantTry
from kerngen.agent.playbook.graph import Ref
from kerngen.agent.playbook.region import Region
from kerngen.agent.proposer import Branch, SearchContext
from kerngen.errors import KerngenError, LLMError
from kerngen.harness.compile.source_policy import check_source
from kerngen.harness.model.plan import KernelStep, PlanTensor
from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Timing, Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.info import default_tolerance
from kerngen.text import one_line

__all__ = ["LLM_DIR", "MIN_SHARE", "RegionAsk", "RegionLLM", "RegionProposer", "Refused", "ask_region", "one_value"]

LLM_DIR = "llm"  # RUN/llm/r<i>/events.jsonl: one region's exchanges and attempts
ROUNDS = 3  # questions per region at most: a first kernel, then a repair or a faster one
# An uncovered region is asked about only at this share of the eager forward or more: below it a kernel that took
# no time at all would gain the forward under 5% (Amdahl), while each question costs an LLM answer (tens of seconds
# of the run's budget, and money); the views, getitems and constructors between regions sit far below it.
MIN_SHARE = 0.05
SHOWN = 8_000  # characters of a best kernel's source a prompt shows (a playbook GEMM's is ~10 kB: described)
FAMILY = "llm"  # a kernel step the LLM wrote names this as its family


class Refused(KerngenError):
    """An answer that gives no kernel step (unreadable, no spec): the try fails with this reason."""


@dataclass
class RegionAsk:
    """What a region's proposer sees: the region, its row (eager time, floor, share, what was tried), the best
    correct kernel so far (ms, step; None: none), the eager run's values by name, the problem's sizes, the GPU's
    facts (None: unknown) and when the region's time ends (``time.monotonic()``)."""

    region: Region
    row: RegionRow
    best: tuple[float, KernelStep] | None
    env: Mapping[str, Any]
    sizes: Mapping[str, Any]
    facts: GpuFacts | None
    until: float


class RegionProposer(Protocol):
    def wants(self, region: Region, share: float) -> bool:
        """Whether a region no family covers (``share`` of the eager time) is worth asking about."""
        ...

    def propose(self, ask: RegionAsk) -> list[tuple[str, Callable[[], KernelStep]]]:
        """The next candidates for the region, (label, make the step); [] when it has nothing more."""
        ...

    def observe(self, ask: RegionAsk, label: str, got: VariantTry) -> None:
        """What the candidate ``label`` gave (before the next :meth:`propose`)."""
        ...

    def done(self, ask: RegionAsk) -> None:
        """The region's search is over."""
        ...


def ask_region(propose: RegionProposer, ask: RegionAsk, try_one: Callable[..., tuple[VariantTry, KernelStep | None]],
               log: Callable[[str], None]) -> tuple[float, KernelStep] | None:
    """The proposer's candidates for ``ask``'s region, round after round while its time lasts, each tried by
    ``try_one(make, label)`` (the model search's ``_try``) and recorded in the row; the best correct kernel (the
    playbook's or an answer's) returned."""
    import torch

    row = ask.row
    reads = [t.name for t in (*ask.region.inputs, *ask.region.params)]
    try:
        while time.monotonic() < ask.until:
            got_any = False
            for label, make in propose.propose(ask):
                got_any = True
                kept = {n: ask.env[n].clone() for n in reads if isinstance(ask.env.get(n), torch.Tensor)}
                tried, step = try_one(make, label)
                wrote = [n for n, t in kept.items() if not _same(ask.env[n], t)]
                for n in wrote:  # the eager value back, for every later try
                    ask.env[n].copy_(kept[n])
                if wrote:
                    tried, step = VariantTry(variant=label, ok=False,
                                             message=f"it wrote its input {wrote[0]!r} (inputs are read-only)"), None
                row.tried.append(tried)
                propose.observe(ask, label, tried)
                log(f"  r{row.region} {label}: " + (f"correct, {tried.kernel_ms:.4f} ms" if tried.ok
                                                    else f"not kept: {tried.message[:200]}"))
                if tried.ok and step is not None and (ask.best is None or tried.kernel_ms < ask.best[0]):
                    ask.best = (tried.kernel_ms, step)
            if not got_any:
                break
    finally:
        propose.done(ask)
    return ask.best


@dataclass
class _Attempt:
    label: str
    spec: KernelSpec | None
    error: str = ""  # why the answer gave no spec
    outcome: str = "not evaluated"  # for the next prompt
    ok: bool = False
    ms: float = float("inf")
    message: str = ""
    parent: int | None = None


@dataclass
class _Region:
    journal: Journal
    attempts: list[_Attempt] = field(default_factory=list)
    closed: bool = False


class RegionLLM:
    """A :class:`RegionProposer` over the op search's LLM proposer (``llm``: an
    :class:`~kerngen.agent.llm.proposer.LLMProposer`); trajectories under ``run_dir``/llm."""

    def __init__(self, llm: Any, run_dir: Path, problem: Any, *, rounds: int = ROUNDS,
                 min_share: float = MIN_SHARE) -> None:
        self.llm, self.dir, self.rounds, self.min_share = llm, Path(run_dir) / LLM_DIR, rounds, min_share
        info = problem.info
        self.label, self.ref = str(getattr(problem, "name", "model")), problem.ref
        self.source = str(getattr(problem, "source", "") or "")
        self.atol, self.rtol = default_tolerance(str(info.dtype))
        self.usage = Usage()  # every call the client makes lands in the current region's journal
        llm.client.on_call = self.usage.on_call
        self.usage.listeners.append(self._record_call)
        self.stopped = ""  # why the LLM is asked nothing more (an endpoint error no request gets past)
        self._regions: dict[int, _Region] = {}
        self._current: _Region | None = None

    # ----- RegionProposer -------------------------------------------------------------------
    def wants(self, region: Region, share: float) -> bool:
        return not self.stopped and share >= self.min_share and one_value(region)

    def propose(self, ask: RegionAsk) -> list[tuple[str, Callable[[], KernelStep]]]:
        left = ask.until - time.monotonic()
        if self.stopped or left <= 0:
            return []
        state = self._open(ask)
        if len(state.attempts) >= self.rounds:
            return []
        self.llm.limit_time(left)  # no request starts past the region's time
        names = bind_names(ask.region)
        n = len(state.attempts) + 1
        label = f"{FAMILY}-{n}"
        last = state.attempts[-1] if state.attempts else None
        repair = last is not None and not last.ok
        try:
            branch = self.llm.ask_spec(self.context(ask, names), "region", **self.variables(ask, names, state, n))
        except LLMError as exc:  # fatal: no later request can succeed (a wrong key, an unknown model)
            self.stopped = one_line(str(exc), 300)
            branch = Branch(error=f"LLM endpoint: {self.stopped}")
        except Exception as exc:  # whatever an answer provokes is that answer's failure, never the search's
            branch = Branch(error=f"{type(exc).__name__}: {one_line(str(exc), 300)}")
        if branch is None:  # nothing was sent (the region's time, a budget): no more questions
            return []
        best_llm = min((i for i, a in enumerate(state.attempts) if a.ok), default=None,
                       key=lambda i: state.attempts[i].ms)
        parent = len(state.attempts) - 1 if repair else best_llm  # the attempt this answer repairs or improves
        state.attempts.append(_Attempt(label, branch.spec, branch.error, parent=parent))
        state.journal.append(NodeCreated(id=n - 1, parent=parent, round=n, kind="repair" if repair else "branch",
                                         spec=branch.spec, error=branch.error, notes=branch.notes,
                                         answer=branch.answer))
        return [(label, lambda: self.step(ask.region, names, branch, label, ask.sizes))]

    def observe(self, ask: RegionAsk, label: str, got: VariantTry) -> None:
        state = self._open(ask)
        i, a = next((i, a) for i, a in enumerate(state.attempts) if a.label == label)
        a.ok, a.message, a.ms = got.ok, got.message, got.kernel_ms if got.ok and got.kernel_ms is not None else a.ms
        a.outcome = f"correct, {got.kernel_ms:.4g} ms alone" if got.ok else f"failed: {one_line(got.message, 300)}"
        if a.spec is not None:  # an answer with no spec was journaled as such (node_created's error)
            state.journal.append(NodeEvaluated(id=i, result=EvalResult(
                verdict=verdict_of(got), message=a.outcome, spec_hash=a.spec.content_hash(), config=got.config or {})))

    def done(self, ask: RegionAsk) -> None:
        state = self._regions.get(ask.region.index)
        if state is not None and not state.closed:
            best = min(((a.ms, i) for i, a in enumerate(state.attempts) if a.ok), default=None)
            state.journal.append(RunFinished(
                reason=f"the LLM stopped: {self.stopped}" if self.stopped else f"{len(state.attempts)} answers",
                best=best[1] if best else None, best_ms=best[0] if best else None, usage=self.usage.snapshot()))
            state.journal.close()
            state.closed = True
        self._current = None

    # ----- the step, the prompt -------------------------------------------------------------
    def step(self, region: Region, names: dict[str, str], branch: Branch, label: str,
             sizes: Mapping[str, Any]) -> KernelStep:
        """The answer as the region's kernel step, bound as :func:`.playbook.model_plan.kernel_step` binds one;
        :class:`Refused` for no spec, CompileError for a source the compile boundary refuses."""
        if branch.spec is None:
            raise Refused(branch.error or "the answer held no kernel spec")
        check_source(branch.spec.source)  # here too: the CPU emulator is no NVRTC sandbox
        out = region.output
        return KernelStep(region=region.index, family=FAMILY, variant=label, nodes=list(region.nodes),
                          spec=branch.spec, config=branch.spec.default_config(),
                          sizes={k: v for k, v in sizes.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                          bindings={spec: value for spec, value in names.items()},
                          out=PlanTensor(name=out.name, shape=out.shape, dtype=out.dtype))

    def context(self, ask: RegionAsk, names: dict[str, str]) -> SearchContext:
        """The system prompt's problem: the region, its tensors by their launch names, the whole model's source."""
        facts = region_facts(ask, names)
        gpu = ask.facts or GpuFacts(name="unknown GPU")
        eager = ask.row.eager_ms  # the model timer gives a median only: the prompt shows just that
        timing = Timing(median_ms=eager, q25_ms=eager, q75_ms=eager, min_ms=eager, max_ms=eager, mean_ms=eager,
                        reps=1, warmup=0)
        tensors = {t.name: list(t.shape) for t in facts.inputs} | {"out": list(facts.out.shape)}
        dtypes = {t.name: t.dtype for t in facts.inputs} | {"out": facts.out.dtype}
        ops = ", ".join(o.op for o in facts.ops)
        return SearchContext(
            problem_name=f"{self.label}, region r{facts.index}",
            problem_source=self.source, sizes=dict(facts.sizes), tensors=tensors, dtypes=dtypes, gpu=gpu,
            problem_summary=(f"Region r{facts.index} of the whole model below ({ops}): one kernel spec computes its "
                             f"output `out` {facts.out.shape} {facts.out.dtype} from the tensors listed; the rest of "
                             "the model stays as it is."),
            baseline=Baseline(problem=f"{self.label} r{facts.index}", gpu=gpu.name, eager=timing,
                              floor_ms=ask.row.floor_ms),
            atol=self.atol, rtol=self.rtol, check_sets=4)

    def variables(self, ask: RegionAsk, names: dict[str, str], state: _Region, n: int) -> dict[str, Any]:
        """The variables of ``region.j2`` for question ``n`` of the region."""
        best = None
        if ask.best is not None:
            ms, step = ask.best
            small = len(step.spec.source) <= SHOWN
            best = {"label": step.variant, "ms": ms, "who": "an earlier answer of yours" if step.family == FAMILY
                    else f"the playbook's {step.family} family", "spec": step.spec if small else None,
                    "chars": len(step.spec.source), "description": one_line(step.spec.description, 300)}
        last = state.attempts[-1] if state.attempts and not state.attempts[-1].ok else None
        return {"region": region_facts(ask, names), "best": best, "round": n, "rounds": self.rounds,
                "attempts": [{"label": a.label, "outcome": a.outcome} for a in state.attempts],
                "last": None if last is None else {"label": last.label, "spec": last.spec,
                                                   "message": one_line(last.message or last.error, 600)}}

    # ----- the trajectory ---------------------------------------------------------------------
    def _open(self, ask: RegionAsk) -> _Region:
        index = ask.region.index
        state = self._regions.get(index)
        fresh = state is None
        if state is None:
            state = self._regions[index] = _Region(Journal(self.dir / f"r{index}"))
            # the op search's first event: the region as its problem, one answer a round (a repair or a faster one)
            state.journal.append(RunStarted(
                run_id=f"{self.dir.parent.name}-r{index}", problem=self.ref, proposer="llm", versions=versions(),
                model=getattr(getattr(self.llm.client, "config", None), "model", None), gpu=ask.facts,
                config=SearchConfig(beam=1, ideas=1, branches=1, repairs=max(0, self.rounds - 1), tune=False),
                budget=SearchBudget(rounds=self.rounds, max_llm_calls=None, max_tokens=None, wall_minutes=None,
                                    gpu_minutes=None, patience=None)))
        self._current = state
        if fresh:
            self.llm.report_earlier_calls()  # the endpoint check, made before any journal: the first region's
        return state

    def _record_call(self, call: Any) -> None:
        if self._current is not None:
            self._current.journal.on_llm_call(self.usage)(call)


# ----- what the prompt says of a region ------------------------------------------------------
@dataclass(frozen=True)
class TensorFact:
    name: str  # the launch's name
    value: str  # the model graph's value
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    contiguous: bool


@dataclass(frozen=True)
class OpFact:
    name: str
    op: str
    overload: str
    args: str
    shape: tuple[int, ...] | None
    dtype: str | None


@dataclass(frozen=True)
class RegionFacts:
    index: int
    family: str  # "" where no family covers it
    why: str
    ops: tuple[OpFact, ...]
    inputs: tuple[TensorFact, ...]
    out: TensorFact
    eager_ms: float
    share: float
    floor_ms: float | None
    sizes: dict[str, int | float]


def one_value(region: Region) -> bool:
    """Whether one kernel step can stand for the region: its value is one floating-point tensor, and no other node
    of it is read outside it (a ``split`` whose three items feed three regions is not one output)."""
    g = region.graph
    return (g.shape(g.output) is not None and "float" in str(g.dtype(g.output) or "")
            and {n.name for n in g.live()} == set(region.nodes))


def bind_names(region: Region) -> dict[str, str]:
    """The launch's name of each tensor the region reads -> the model graph's value: the value's own name, as
    :func:`.playbook.model_plan.kernel_step` binds them (``conv1.weight`` is a name expressions read, and the
    playbook's kernel a prompt shows uses it), but for one the output's name ``out`` would shadow."""
    out: dict[str, str] = {}
    for t in (*region.inputs, *region.params):
        name = t.name
        while name in out or name == "out":
            name += "_"
        out[name] = t.name
    return out


def region_facts(ask: RegionAsk, names: dict[str, str]) -> RegionFacts:
    r, row = ask.region, ask.row
    g = r.graph
    tensors = {t.name: t for t in (*r.inputs, *r.params)}
    inputs = tuple(_tensor(n, v, tensors[v].shape, tensors[v].dtype, ask.env.get(v)) for n, v in names.items())
    out = r.output
    ops = tuple(OpFact(n.name, n.op, n.overload, ", ".join(f"{k}={_arg(v)}" for k, v in n.args.items())[:600],
                       n.shape, n.dtype) for n in g.live())
    sizes = {k: v for k, v in ask.sizes.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return RegionFacts(r.index, r.match.family if r.match else "", one_line(r.why or "no family covers it", 300),
                       ops, inputs, _tensor("out", out.name, out.shape, out.dtype, None), row.eager_ms, row.share,
                       row.floor_ms, sizes)


def verdict_of(got: VariantTry) -> Verdict:
    """A try's outcome as the op journal's verdict (the model search records a message, not a verdict)."""
    if got.ok:
        return Verdict.ok
    kind = got.message.split(":", 1)[0]
    if kind == "CompileError" or (kind == "EmuError" and "compile" in got.message.lower()):
        return Verdict.compile_error
    if kind in ("PlanError", "SpecError", "Refused", "ValidationError"):
        return Verdict.invalid_spec
    return Verdict.runtime_error if kind.endswith("Error") else Verdict.incorrect


def _tensor(name: str, value: str, shape: Any, dtype: Any, t: Any) -> TensorFact:
    shape = tuple(int(s) for s in shape)
    strides = tuple(int(s) for s in t.stride()) if hasattr(t, "stride") else _contiguous(shape)
    return TensorFact(name, value, shape, str(dtype), strides, strides == _contiguous(shape) or len(shape) == 0)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for s in reversed(shape):
        out.append(step)
        step *= max(1, s)
    return tuple(reversed(out))


def _arg(v: Any) -> str:
    if isinstance(v, Ref):
        return f"`{v}`"
    if isinstance(v, tuple):
        return "[" + ", ".join(_arg(x) for x in v) + "]"
    return repr(v)


def _same(a: Any, b: Any) -> bool:
    import torch

    if a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))

