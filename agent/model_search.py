"""``kerngen generate MODEL.py`` on the offline playbook (issue 34): the model's forward as a plan, a kernel per
region where one is correct and faster than PyTorch, checked and timed end to end.

1. The eager baseline: the plan with every region as PyTorch, each step timed alone: a region's share of the
   eager time.
2. The regions a family covers, heaviest first, each in its share of the budget (:mod:`.model_tune`: a region's
   weight is its share of the eager time times the gain still possible, its time over its roofline floor): each
   offered variant at its real shapes, then the best correct one at a few more configurations of its tunables
   (a short tune). Each kernel step is run on the eager run's own intermediate values (outputs poisoned),
   compared with PyTorch's value of the region (the harness's comparison and tolerance), timed alone. The fastest
   correct one is kept when it beats the region's PyTorch time; else the region stays PyTorch, and the table
   says why. A progress line per region and per configuration. One region's search is
   :func:`.model_region.search_region`; each evaluation is journaled as it ends (:mod:`.model_journal`), so
   ``resume=True`` goes on from an interrupted run: its finished regions are not searched again (their recorded
   choice and tries kept, their kernel step rebuilt from the recorded variant and configuration), a region
   interrupted mid-way keeps its recorded tries and tries what it had not. With ``propose`` (the LLM per region,
   :mod:`.model_llm`), its candidates come after the tune, tried the same way, and the regions no family covers
   that it wants are searched too.
3. The assembled plan checked end to end (:func:`kerngen.harness.model.check.check_plan`) and timed against the
   model in eager mode and under torch.compile, and as an ``nn.Module`` under torch.compile; the record
   (:mod:`.model_run`) lands in the run folder.

:func:`retune_model` (``kerngen replay RUN --tune``): a run's kernel regions searched again on this GPU, each from
its recorded variant and configuration (its tune around them first, then the other variants while its time
lasts), then checked and timed end to end; the record names the run and the regions whose choice changed.

The device, the kernel launcher and the timer are injected (a GPU: the CUDA launcher and CUDA-event timer; the
CPU tests: the emulator and a wall clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from kerngen.errors import JournalError, KerngenError
from kerngen.harness.gpu.facts import gpu_facts
from kerngen.harness.model.bench import Timer, step_times, time_end_to_end
from kerngen.harness.model.check import ModelCheck, check_plan
from kerngen.harness.model.execute import Launcher, PlanRunner
from kerngen.harness.model.module import PlanModule
from kerngen.harness.model.plan import KernelStep, ModelPlan
from kerngen.harness.results import GpuFacts

from kerngen.agent.journal import Journal
from kerngen.agent.model_journal import (
    JournalState, ModelRunResumed, ModelRunStarted, RegionFinished, RegionStarted, journal_state, open_model_journal,
    reopen_model_journal,
)
from kerngen.agent.model_llm import FAMILY as LLM_FAMILY
from kerngen.agent.model_llm import RegionProposer
from kerngen.agent.model_region import NOT_TRIED, RegionSearch, decide, search_region
from kerngen.agent.model_run import ModelRun, RegionRow, write_model_run
from kerngen.agent.model_tune import RegionBudget, region_floor, weight
from kerngen.agent.playbook import NotCovered
from kerngen.agent.playbook.model_plan import ModelPlanning, RegionPlan, assemble, kernel_step, plan_model, plan_partition

__all__ = ["NOT_TRIED", "replay_model", "retune_model", "search_model"]

BASELINE_WHY = "the eager baseline"
TUNE = 8  # configurations of a region's best variant tried after its variants


@dataclass
class _Baseline:
    """The eager run every region's search starts from: the plan with every region as PyTorch, its values, the
    rows of the regions (share of eager time, floor, weight)."""

    planning: ModelPlanning
    sizes: dict[str, Any]
    eager_plan: ModelPlan
    model: Any
    inputs: Any
    env: dict[str, Any]
    rows: dict[int, RegionRow]
    weights: dict[int, float]
    views_ms: float
    facts: GpuFacts | None
    searched: list[RegionPlan]  # the regions a family covers, and those no family covers that the proposer wants


def search_model(problem: Any, run_dir: Path, *, device: Any, launcher: Launcher, timer: Timer,
                 minutes: float = 5.0, compile: bool = True, log: Callable[[str], None] = print,
                 facts: GpuFacts | None = None, tune: int = TUNE, resume: bool = False,
                 propose: RegionProposer | None = None) -> ModelRun:
    """The model search into ``run_dir``; ``resume``: go on from the journal there (``minutes``: this session's);
    ``propose``: more candidates per region beside the playbook's (the LLM per region, :mod:`.model_llm`), also for
    the regions no family covers that it wants."""
    import torch

    began = time.monotonic()
    dev = torch.device(device)
    state: JournalState | None = None
    if resume:
        journal, events, truncated = reopen_model_journal(run_dir)
        try:
            state = journal_state(events, truncated)
            if state.started.replay_of:
                raise KerngenError(f"model run {run_dir.name} is a replay: run kerngen replay --tune again")
            if state.started.problem_sha256 != problem.sha256:
                raise KerngenError(f"{problem.path}: not the problem model run {run_dir.name} searched (its sha256 "
                                   "differs)")
            tune = max(0, min(tune, state.started.tune))
            journal.append(ModelRunResumed(session=state.sessions + 1, device=_device_name(dev), minutes=minutes,
                                           truncated_bytes=truncated))
        except BaseException:
            journal.close()
            raise
        log(f"resuming {run_dir.name}: {len(state.finished)} regions finished, "
            f"{sum(len(t) for t in state.tries.values())} tries of regions begun"
            + (f"; a torn last line ({truncated} bytes) dropped" if truncated else ""))
    else:
        journal = open_model_journal(run_dir, ModelRunStarted(
            run_id=run_dir.name, problem=str(problem.name), problem_path=_path(problem), problem_sha256=problem.sha256,
            device=_device_name(dev), minutes=minutes, tune=tune))
    with journal:
        b = _baseline(problem, dev, launcher, timer, facts, log, propose)
        chosen = _finished(state, b, log) if state is not None else {}
        todo = [rp for rp in b.searched if state is None or rp.region.index not in state.finished]
        ctx = _context(problem, b, dev, launcher, timer, tune, journal, log, propose)
        budget = _search(ctx, b, todo, chosen, 60.0 * minutes, prior=state.tries if state else {}, journal=journal)
        run = _finish(problem, b, chosen, run_dir, dev, launcher, timer, compile, log, began)
        run.sessions = state.sessions + 1 if state is not None else 1
        run.stopped = "done" if not budget.over else "the budget ran out (regions not tried say so)"
        write_model_run(run, run_dir)
    return run


def retune_model(run: ModelRun, problem: Any, run_dir: Path, *, device: Any, launcher: Launcher, timer: Timer,
                 minutes: float = 2.0, compile: bool = True, log: Callable[[str], None] = print,
                 facts: GpuFacts | None = None, tune: int = TUNE) -> ModelRun:
    """``kerngen replay RUN --tune``: each of ``run``'s kernel regions searched again on this device from its
    recorded variant and configuration, in ``minutes`` split by weight; the other regions stay PyTorch. A new
    record in ``run_dir`` (``replay_of``, ``changed``: the regions whose variant or configuration differs)."""
    import torch

    if problem.sha256 != run.problem_sha256:
        raise KerngenError(f"{problem.path}: not the problem run {run.id} planned (its sha256 differs)")
    began = time.monotonic()
    dev = torch.device(device)
    recorded = {r.region: r for r in run.regions}
    journal = open_model_journal(run_dir, ModelRunStarted(
        run_id=run_dir.name, problem=run.problem, problem_path=_path(problem), problem_sha256=problem.sha256,
        device=_device_name(dev), minutes=minutes, tune=tune, replay_of=run.id))
    with journal:
        b = _baseline(problem, dev, launcher, timer, facts, log)
        kernels = {r.region for r in run.regions if r.chosen == "kernel"}
        todo = [rp for rp in b.planning.kernels if rp.region.index in kernels]
        starts: dict[int, tuple[str, dict[str, int] | None]] = {}
        for rp in b.planning.kernels:
            rec = recorded.get(rp.region.index)
            if rp.region.index not in kernels:
                b.rows[rp.region.index].why = f"PyTorch in {run.id}: " + (rec or b.rows[rp.region.index]).why[:300]
            elif _offered_step(rp, rec.variant or "", rec.config, b.sizes) is not None:
                starts[rp.region.index] = (rec.variant or "", rec.config)
            else:  # a record from another kerngen (or anyone): its kernel is searched for again from the offer
                log(f"r{rp.region.index}: the recorded kernel ({str(rec.variant)[:40]}) is not one offered here")
        ctx = _context(problem, b, dev, launcher, timer, tune, journal, log)
        chosen: dict[int, KernelStep] = {}
        _search(ctx, b, todo, chosen, 60.0 * minutes, starts=starts, journal=journal)
        new = _finish(problem, b, chosen, run_dir, dev, launcher, timer, compile, log, began)
        new.replay_of, new.retuned = run.id, True
        new.changed = [r.region for r in new.regions if r.region in kernels and
                       (r.chosen, r.variant, r.config) != (recorded[r.region].chosen, recorded[r.region].variant,
                                                           recorded[r.region].config)]
        new.stopped = f"replay of {run.id} on this device, tuned again ({len(new.changed)} regions changed)"
        write_model_run(new, run_dir)
    return new


def replay_model(run: ModelRun, problem: Any, run_dir: Path, *, device: Any, launcher: Launcher, timer: Timer,
                 compile: bool = True, log: Callable[[str], None] = print) -> ModelRun:
    """A model run's plan again on this device (another GPU): checked end to end against ``problem`` (whose sha256
    must be the run's), timed against the model in eager mode and under torch.compile; a new record in
    ``run_dir`` (its regions' figures are the recorded run's: the plan is not searched again)."""
    import torch

    if problem.sha256 != run.problem_sha256:
        raise KerngenError(f"{problem.path}: not the problem run {run.id} planned (its sha256 differs)")
    began = time.monotonic()
    dev = torch.device(device)
    run.plan.validate()
    check = check_plan(problem, run.plan, launcher, dev)
    log(f"end to end on {_device_name(dev)}: {'correct' if check.ok else 'NOT correct'}: {check.message}")
    new = run.model_copy(update={"id": run_dir.name, "device": _device_name(dev), "check": check, "timing": None,
                                 "problem_path": str(Path(problem.path).resolve()), "replay_of": run.id,
                                 "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    if check.ok:
        model = problem.build_model(dev, 0)
        inputs = problem.make_inputs(dev, 0)
        new.timing = time_end_to_end(model, inputs, PlanModule(run.plan, model, launcher), timer, compile=compile)
        log(_timing_line(new.timing))
    new.elapsed_s = time.monotonic() - began
    new.stopped = f"replay of {run.id} on this device"
    write_model_run(new, run_dir)
    return new


def _baseline(problem: Any, dev: Any, launcher: Launcher, timer: Timer, facts: GpuFacts | None,
              log: Callable[[str], None], propose: RegionProposer | None = None) -> _Baseline:
    import torch

    planning = plan_model(problem)
    part = planning.partition
    sizes = {k: v for k, v in (getattr(problem.info, "sizes", None) or {}).items()}
    eager_plan = plan_partition(part, sizes, planning.plan.problem, planning.plan.problem_sha256,
                                pytorch={r.index: BASELINE_WHY for r in part.regions}).plan
    model = problem.build_model(dev, 0)
    inputs = problem.make_inputs(dev, 0)
    values = problem.bindings(model, inputs, [])
    base = PlanRunner(eager_plan, launcher)
    with torch.no_grad():
        times = step_times(base, values, timer)
        _, env = base(values, keep=True)
    total = sum(times) or 1e-9
    eager_ms = {r.index: sum(t for s, t in zip(eager_plan.steps, times) if s.region == r.index) for r in part.regions}
    rows = {rp.region.index: RegionRow(region=rp.region.index, nodes=list(rp.region.nodes),
                                       family=rp.region.match.family if rp.region.match else None,
                                       eager_ms=eager_ms[rp.region.index], share=eager_ms[rp.region.index] / total,
                                       why=rp.why) for rp in planning.regions}
    log(f"eager steps: {total:.4f} ms over {len(part.regions)} regions; "
        f"{len(planning.kernels)} covered by a family ({100 * sum(rows[r.region.index].share for r in planning.kernels):.1f}%"
        " of the time)")
    if facts is None and dev.type == "cuda":  # the limits too: a variant's default may not fit this GPU's SMs
        facts = gpu_facts(dev.index if dev.index is not None else torch.cuda.current_device(), with_ceilings=False)
    searched = planning.kernels + [rp for rp in planning.fallbacks
                                   if propose is not None and propose.wants(rp.region, rows[rp.region.index].share)]
    weights: dict[int, float] = {}
    with torch.no_grad():
        for rp in searched:
            row = rows[rp.region.index]
            fl = region_floor(base, row.region, env, dev, facts, str(problem.info.dtype))
            row.floor_ms = fl.ms
            row.weight = weights[row.region] = weight(row.share, row.eager_ms, fl)
    return _Baseline(planning, sizes, eager_plan, model, inputs, env, rows, weights,
                     sum(t for s, t in zip(eager_plan.steps, times) if s.region is None), facts, searched)


def _context(problem: Any, b: _Baseline, dev: Any, launcher: Launcher, timer: Timer, tune: int, journal: Journal,
             log: Callable[[str], None], propose: RegionProposer | None = None) -> RegionSearch:
    from kerngen.harness.gpu.compare import compare
    from kerngen.problems.info import default_tolerance

    atol, rtol = default_tolerance(problem.info.dtype)
    return RegionSearch(b.eager_plan, b.env, dev, launcher, timer, compare, atol, rtol, b.sizes, b.facts, tune,
                        journal, log, propose)


def _search(ctx: RegionSearch, b: _Baseline, todo: list[RegionPlan], chosen: dict[int, KernelStep], seconds: float,
            *, journal: Journal, prior: dict[int, list] | None = None,
            starts: dict[int, tuple[str, dict[str, int] | None]] | None = None) -> RegionBudget:
    """The regions ``todo``, heaviest first, each in its share of the budget (the search's: planning and the
    eager baseline come before it, as a folder's first problem's baseline does); their kernels into ``chosen``."""
    import torch

    budget = RegionBudget({rp.region.index: b.weights[rp.region.index] for rp in todo}, seconds)
    with torch.no_grad():
        for n, rp in enumerate(sorted(todo, key=lambda rp: -b.weights[rp.region.index]), 1):
            row = b.rows[rp.region.index]
            began = time.monotonic()
            until = budget.deadline(row.region)
            row.budget_s = max(0.0, until - began)
            journal.append(RegionStarted(region=row.region, row=row))
            ctx.log(f"[{n}/{len(todo)}] r{row.region} {row.family or 'no family'}: {100 * row.share:.1f}% of eager, floor "
                    f"{_floor(row.floor_ms)}, weight {row.weight:.3f}, {row.budget_s:.1f} s")
            best = search_region(ctx, rp, row, until, budget, prior=(prior or {}).get(row.region),
                                 start=(starts or {}).get(row.region))
            step = decide(row, best)
            if step is not None:
                chosen[row.region] = step
            journal.append(RegionFinished(region=row.region, row=row))
            ctx.log(f"r{row.region} {row.family} ({100 * row.share:.1f}% of eager): "
                    + (f"kernel {row.variant} {row.kernel_ms:.4f} ms vs PyTorch {row.eager_ms:.4f} ms"
                       if step is not None else f"PyTorch: {row.why}"))
    return budget


def _finished(state: JournalState, b: _Baseline, log: Callable[[str], None]) -> dict[int, KernelStep]:
    """The finished regions of a journal: their recorded rows in place of this session's, the kernel steps of
    those that chose one rebuilt from the plan's own offer. A journal naming a region, variant or configuration
    the plan does not offer: a one-line JournalError. A finished region whose kernel was an LLM's answer (its source is
    not in the journal, and a handed journal's source would not be trusted) is searched again."""
    offers = {rp.region.index: rp for rp in b.searched}
    chosen: dict[int, KernelStep] = {}
    for idx in [*state.finished, *state.tries]:
        if idx not in offers and idx in b.rows and b.rows[idx].family is None:  # a region only the LLM was asked about
            log(f"r{idx}: no family covers it and the LLM is not asked on a resume: it stays PyTorch")
            state.finished.pop(idx, None)
            state.tries.pop(idx, None)
        elif idx not in offers:
            raise JournalError(f"model run {state.started.run_id}: its journal names region {idx}, which no family "
                               "covers in this model")
    for idx, rec in list(state.finished.items()):  # an LLM-chosen region leaves it (searched again)
        here = b.rows[idx]
        row = rec.model_copy(update={"region": idx, "nodes": here.nodes, "family": here.family})
        if row.chosen == "kernel" and (row.variant or "").startswith(f"{LLM_FAMILY}-") and row.variant not in offers[idx].offered:
            log(f"r{idx}: its kernel was an LLM's answer ({row.variant}): the region is searched again")
            del state.finished[idx]
            continue
        if row.chosen == "kernel":
            step = _offered_step(offers[idx], row.variant or "", row.config, b.sizes)
            if step is None:
                raise JournalError(f"model run {state.started.run_id}: its journal's kernel for region {idx} "
                                   f"({str(row.variant)[:40]}, {str(row.config)[:80]}) is not one this model offers")
            chosen[idx] = step
        b.rows[idx] = row
    return chosen


def _offered_step(rp: RegionPlan, variant: str, config: dict[str, int] | None, sizes: dict[str, Any]
                  ) -> KernelStep | None:
    """Region ``rp``'s kernel step of ``variant`` at ``config`` when the plan offers that variant and every
    value of ``config`` is one of its spec's tunables' (None: it does not)."""
    if variant not in rp.offered:
        return None
    try:
        step = kernel_step(rp.region, variant, sizes)
    except (NotCovered, Exception):  # noqa: BLE001 - not offered at these shapes
        return None
    if config is None:
        return step
    tun, default = step.spec.tunables, step.spec.default_config()
    if set(config) != set(tun) or any(v not in tun[k] and v != default.get(k) for k, v in config.items()):
        return None
    return step.model_copy(update={"config": dict(config)})


def _finish(problem: Any, b: _Baseline, chosen: dict[int, KernelStep], run_dir: Path, dev: Any, launcher: Launcher,
            timer: Timer, compile: bool, log: Callable[[str], None], began: float) -> ModelRun:
    """The assembled plan checked end to end and timed; the record (not yet written)."""
    plan = assemble(b.eager_plan, chosen)
    check = check_plan(problem, plan, launcher, dev)
    log(f"end to end: {'correct' if check.ok else 'NOT correct'}: {check.message}")
    run = ModelRun(id=run_dir.name, problem=b.planning.plan.problem, problem_path=_path(problem),
                   problem_sha256=problem.sha256, device=_device_name(dev),
                   started=datetime.now(timezone.utc).isoformat(timespec="seconds"), plan=plan,
                   regions=[b.rows[r.index] for r in b.planning.partition.regions], views_ms=b.views_ms, check=check)
    if check.ok:
        run.timing = time_end_to_end(b.model, b.inputs, PlanModule(plan, b.model, launcher), timer, compile=compile)
        log(_timing_line(run.timing))
    run.elapsed_s = time.monotonic() - began
    return run


def _path(problem: Any) -> str:
    return str(Path(problem.path).resolve()) if getattr(problem, "path", None) else ""


def _timing_line(t: Any) -> str:
    return (f"eager {t.eager_ms:.4f} ms, torch.compile {_ms(t.compile_ms)}, kerngen {t.kerngen_ms:.4f} ms, "
            f"kerngen + compile {_ms(t.kerngen_compile_ms)}")


def _floor(v: float | None) -> str:
    return f"{v:.3g} ms" if v is not None else "unknown (no data sheet for this device)"


def _ms(v: float | None) -> str:
    return f"{v:.4f} ms" if v is not None else "not measured"


def _device_name(dev: Any) -> str:
    import torch

    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (emulated kernels: times say nothing)"


ModelCheck  # re-exported for callers reading a run's check
