"""One region's search in a model run (issue 34): its offered variants at their default configurations, then a
short tune of the best correct one (:func:`.model_tune.tune_configs`), each kernel step run on the eager run's own
intermediate values (its output poisoned), compared with PyTorch's value of the region and timed alone; every
evaluation journaled as it ends (:mod:`.model_journal`).

``prior`` (a resume): the tries a journal recorded for the region. A candidate recorded there is not run again:
its recorded try is kept, and its kernel step rebuilt from the plan's own offer (the variant and configuration are
looked up among what is offered here, never built from the journal's text). ``start`` (a re-tune on another
GPU): the recorded variant and configuration, tried first and tuned before the other variants.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from kerngen.expr import TensorFacts
from kerngen.harness.model.bench import Timer
from kerngen.harness.model.execute import Launcher, PlanRunner
from kerngen.harness.model.plan import KernelStep, ModelPlan
from kerngen.harness.results import GpuFacts
from kerngen.harness.tune.prune import static_reason

from kerngen.agent.journal import Journal
from kerngen.agent.model_llm import RegionAsk, RegionProposer, ask_region
from kerngen.agent.model_journal import RegionTried
from kerngen.agent.model_run import RegionRow, VariantTry
from kerngen.agent.model_tune import RegionBudget, tune_configs
from kerngen.agent.playbook import NotCovered
from kerngen.agent.playbook.model_plan import RegionPlan, assemble, kernel_step

__all__ = ["NOT_TRIED", "Best", "RegionSearch", "decide", "search_region", "tensor_cores_first"]

NOT_TRIED = "not tried: the budget ran out"
# the tensor-core variants first, by the GPU's major compute capability: a short budget reaches a region's first
# variants only, and the offer lists the FFMA ones first (4x H200, 2026-11-28: resnet18's convs tried igemm and direct
# first, slower than cuDNN, and never reached wgmma); wgmma is sm_90a's alone, 3xTF32 on mma.sync runs from sm_80
TENSOR_CORES_FIRST = {9: ("wgmma", "tf32x3"), 8: ("tf32x3",)}
KEEP = 64  # recorded tries a resume did not reach, kept per region (a handed journal may hold any number)


@dataclass
class Best:
    """The fastest correct kernel of a region so far: its time, its step, the index of its try."""

    ms: float
    step: KernelStep
    index: int


@dataclass
class RegionSearch:
    """What every region's search shares: the eager plan and its values, the device, launcher, timer and
    tolerance, the problem's sizes, the tune's count, the journal and the log."""

    eager_plan: ModelPlan
    env: dict[str, Any]
    device: Any
    launcher: Launcher
    timer: Timer
    compare: Callable[..., Any]
    atol: float
    rtol: float
    sizes: dict[str, Any]
    facts: GpuFacts | None
    tune: int
    journal: Journal | None
    log: Callable[[str], None]
    propose: RegionProposer | None = None  # the LLM per region (:mod:`.model_llm`): its candidates after the tune


def search_region(ctx: RegionSearch, rp: RegionPlan, row: RegionRow, until: float, budget: RegionBudget,
                  prior: list[VariantTry] | None = None, start: tuple[str, dict[str, int] | None] | None = None) -> Best | None:
    """Region ``rp``'s search until ``until`` (monotonic seconds): its tries appended to ``row.tried`` (and the
    journal), the best correct kernel returned (None: none)."""
    recorded = {_key(t.variant, t.config): t for t in prior or [] if t.message != NOT_TRIED}
    best: Best | None = None
    order = tensor_cores_first(rp.offered, ctx.device)
    if start is not None and start[0] in order:  # a re-tune: the recorded kernel first, at its configuration
        order.remove(start[0])
        order.insert(0, start[0])
    else:
        start = None
    for k, variant in enumerate(order):
        # every region's first variant is tried while the whole budget lasts; the others in its own share
        if budget.over or (k and time.monotonic() > until):
            row.tried.append(VariantTry(variant=variant, ok=False, message=NOT_TRIED))
            continue
        cfg = start[1] if start is not None and k == 0 else _fitting(ctx, rp, variant, row.region)
        label = variant if cfg is None else f"{variant} {_cfg(cfg, {})}"
        best = _better(best, _attempt(ctx, rp, row, variant, cfg, None, recorded, label))
        if start is not None and k == 0 and best is not None:  # its neighbours here before other variants
            best = _tune(ctx, rp, row, best, until, recorded)
    if start is None and best is not None:
        best = _tune(ctx, rp, row, best, until, recorded)
    if ctx.propose is not None:
        best = _ask(ctx, rp, row, best, until)
    # a recorded try this session did not reach (a variant no longer offered): kept in the record, as data
    row.tried.extend(t.model_copy(update={"parent": None}) for t in list(recorded.values())[:KEEP])
    return best


def _fitting(ctx: RegionSearch, rp: RegionPlan, variant: str, seed: int) -> dict[str, int] | None:
    """None when the variant's default configuration fits this GPU (or nothing is known of it: no SM count);
    else the first configuration near it that does (:func:`.model_tune.tune_configs`), or None to try the default
    and report why it fails. The offer judges sm_90's limits; a cooperative grid of one block an SM at its default
    (the lstm family's 128) cannot be resident on a GPU of fewer SMs (an H100 PCIe: 114), and the default's failure
    would drop the variant untuned."""
    if ctx.facts is None or ctx.facts.sm_count <= 0:
        return None
    try:
        step = kernel_step(rp.region, variant, ctx.sizes)
    except Exception:  # noqa: BLE001 - a variant that does not build: its own try builds it again and says why
        return None
    tensors = {n: ctx.env[v] for n, v in step.bindings.items() if v in ctx.env}
    if step.out.name in ctx.env:
        tensors["out"] = ctx.env[step.out.name]
    shapes = {n: TensorFacts(tuple(t.shape)) for n, t in tensors.items()}
    _, kind, _ = static_reason(step.spec, step.config, sizes=step.sizes, tensors=shapes, gpu=ctx.facts)
    if not kind:
        return None
    found = tune_configs(step.spec, dict(step.config), step.sizes, tensors, ctx.facts, 1, seed=seed)
    return found[0] if found else None


def tensor_cores_first(offered: list[str], device: Any) -> list[str]:
    """``offered`` with the variants on this GPU's tensor cores first (:data:`TENSOR_CORES_FIRST`), the rest in the
    offer's order; unchanged off a CUDA device."""
    prefs: tuple[str, ...] = ()
    if getattr(device, "type", None) == "cuda":
        import torch

        prefs = TENSOR_CORES_FIRST.get(torch.cuda.get_device_capability(device)[0], ())
    return sorted(offered, key=lambda v: next((i for i, p in enumerate(prefs) if p in v), len(prefs)))


def decide(row: RegionRow, best: Best | None) -> KernelStep | None:
    """The region's choice in ``row`` (kernel, or PyTorch and why); its kernel step when it is a kernel."""
    if best is not None and best.ms < row.eager_ms:
        row.chosen, row.variant, row.kernel_ms, row.why = "kernel", best.step.variant, best.ms, ""
        row.config, row.chosen_try = dict(best.step.config), best.index
        return best.step
    row.chosen, row.variant, row.config, row.chosen_try = "pytorch", None, None, None
    if best is not None:
        row.kernel_ms = best.ms
        row.why = (f"its best kernel ({best.step.variant}, {best.ms:.4f} ms) is slower than PyTorch "
                   f"({row.eager_ms:.4f} ms)")
    elif all(t.message == NOT_TRIED for t in row.tried):
        row.why = NOT_TRIED
    else:
        row.why = "no variant was correct: " + "; ".join(f"{t.variant}: {t.message}" for t in row.tried)[:400]
    return None


def _attempt(ctx: RegionSearch, rp: RegionPlan, row: RegionRow, variant: str, config: dict[str, int] | None,
             parent: int | None, recorded: dict[tuple, VariantTry], label: str) -> Best | None:
    """One candidate: its recorded try (a resume) or a new evaluation (journaled); a Best when correct."""
    make = lambda: kernel_step(rp.region, variant, ctx.sizes)  # noqa: E731
    got = recorded.pop(_key(variant, config), None)
    if got is not None:
        step = _rebuild(make, config) if got.ok else None
        if got.ok and step is None:  # offered no more (another version): evaluated again
            got = None
        else:
            got = got.model_copy(update={"parent": parent})
            ctx.log(f"  r{row.region} {label}: recorded, "
                    + (f"correct, {got.kernel_ms:.4f} ms" if got.ok else f"not kept: {got.message[:120]}"))
    if got is None:
        got, step = _try(ctx, make, variant, config)
        got.parent = parent
        if ctx.journal is not None:
            ctx.journal.append(RegionTried(region=row.region, tried=got))
        ctx.log(f"  r{row.region} {label}: "
                + (f"correct, {got.kernel_ms:.4f} ms" if got.ok else f"not kept: {got.message[:120]}"))
    row.tried.append(got)
    if not got.ok or step is None or got.kernel_ms is None:
        return None
    return Best(got.kernel_ms, step, len(row.tried) - 1)


def _ask(ctx: RegionSearch, rp: RegionPlan, row: RegionRow, best: Best | None, until: float) -> Best | None:
    """The proposer's candidates for the region (:func:`.model_llm.ask_region`: tried as the variants are, appended
    to ``row.tried``), each journaled once tried; the best of them and ``best``."""
    assert ctx.propose is not None
    before = len(row.tried)
    got = ask_region(ctx.propose, RegionAsk(rp.region, row, None if best is None else (best.ms, best.step), ctx.env,
                                            ctx.sizes, ctx.facts, until),
                     lambda make, label: _try(ctx, make, label, None), ctx.log)
    for t in row.tried[before:]:
        if ctx.journal is not None:
            ctx.journal.append(RegionTried(region=row.region, tried=t))
    if got is None or (best is not None and got[1] is best.step):
        return best
    index = max(i for i in range(before, len(row.tried)) if row.tried[i].ok and row.tried[i].kernel_ms == got[0])
    return Best(got[0], got[1], index)


def _tune(ctx: RegionSearch, rp: RegionPlan, row: RegionRow, best: Best, until: float,
          recorded: dict[tuple, VariantTry]) -> Best:
    """The best kernel at up to ``ctx.tune`` more configurations (:func:`.model_tune.tune_configs`: its own
    configuration's neighbours first) while the region's time lasts; each a child of it in the region's tree."""
    if ctx.tune <= 0 or time.monotonic() >= until:
        return best
    step, parent = best.step, best.index
    tensors = {n: ctx.env[v] for n, v in step.bindings.items()}
    tensors["out"] = ctx.env[step.out.name]
    configs = tune_configs(step.spec, dict(step.config), step.sizes, tensors, ctx.facts or GpuFacts(name="unknown"),
                           ctx.tune, seed=row.region)
    for k, cfg in enumerate(configs, 1):
        if time.monotonic() > until:
            ctx.log(f"  r{row.region} tune: stopped after {k - 1} of {len(configs)} configurations (its time is spent)")
            break
        label = f"tune {k}/{len(configs)} {_cfg(cfg, step.config)}"
        best = _better(best, _attempt(ctx, rp, row, step.variant, cfg, parent, recorded, label))
    return best


def _try(ctx: RegionSearch, make: Callable[[], KernelStep], variant: str, config: dict[str, int] | None
         ) -> tuple[VariantTry, KernelStep | None]:
    """One kernel step (``make()``, at ``config`` when given) of one region on the eager run's values: correct
    (poisoned output, compared with PyTorch's value of the region) and its time alone."""
    try:
        step = make()
        if config is not None:
            step = step.model_copy(update={"config": dict(config)})
        plan = assemble(ctx.eager_plan, {step.region: step})
        runner = PlanRunner(plan, ctx.launcher, poison=float("nan"))
        i = next(k for k, s in enumerate(plan.steps) if isinstance(s, KernelStep))
        mine = dict(ctx.env)
        out = runner.run_step(i, mine, ctx.device)
        c = ctx.compare(out, ctx.env[step.out.name].contiguous(), atol=ctx.atol, rtol=ctx.rtol)
        if not c.ok:
            return VariantTry(variant=variant, config=config, ok=False, message=c.message[:300]), None
        runner.poison = None
        ms = ctx.timer(lambda: runner.run_step(i, mine, ctx.device))
        return VariantTry(variant=variant, config=config, ok=True, kernel_ms=ms), step
    except (NotCovered, Exception) as exc:  # a kernel that fails to build, compile or run: that one only
        return VariantTry(variant=variant, config=config, ok=False,
                          message=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"), None


def _rebuild(make: Callable[[], KernelStep], config: dict[str, int] | None) -> KernelStep | None:
    try:
        step = make()
    except (NotCovered, Exception):  # noqa: BLE001 - not offered here: the caller evaluates it again
        return None
    return step if config is None else step.model_copy(update={"config": dict(config)})


def _better(best: Best | None, got: Best | None) -> Best | None:
    return got if got is not None and (best is None or got.ms < best.ms) else best


def _key(variant: str, config: dict[str, int] | None) -> tuple:
    return variant, None if config is None else tuple(sorted(config.items()))


def _cfg(cfg: dict[str, int], default: dict[str, int]) -> str:
    """What a configuration changes from the default."""
    return " ".join(f"{k}={v}" for k, v in cfg.items() if default.get(k) != v) or "default"
