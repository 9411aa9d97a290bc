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
   says why. A progress line per region and per configuration. With ``propose`` (the LLM per region,
   :mod:`.model_llm`), its candidates come after the tune, tried the same way, and the regions no family covers
   that it wants are searched too.
3. The assembled plan checked end to end (:func:`kerngen.harness.model.check.check_plan`) and timed against the
   model in eager mode and under torch.compile, and as an ``nn.Module`` under torch.compile; the record
   (:mod:`.model_run`) lands in the run folder.

The device, the kernel launcher and the timer are injected (a GPU: the CUDA launcher and CUDA-event timer; the
CPU tests: the emulator and a wall clock).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from kerngen.harness.model.bench import Timer, step_times, time_end_to_end
from kerngen.harness.model.check import ModelCheck, check_plan
from kerngen.harness.model.execute import Launcher, PlanRunner
from kerngen.harness.model.module import PlanModule
from kerngen.harness.model.plan import KernelStep
from kerngen.harness.results import GpuFacts

from kerngen.agent.model_llm import RegionAsk, RegionProposer, ask_region
from kerngen.agent.model_run import ModelRun, RegionRow, VariantTry, write_model_run
from kerngen.agent.model_tune import RegionBudget, region_floor, tune_configs, weight
from kerngen.agent.playbook import NotCovered
from kerngen.agent.playbook.model_plan import assemble, kernel_step, plan_model, plan_partition

__all__ = ["replay_model", "search_model"]

BASELINE_WHY = "the eager baseline"
NOT_TRIED = "not tried: the budget ran out"
TUNE = 8  # configurations of a region's best variant tried after its variants


def search_model(problem: Any, run_dir: Path, *, device: Any, launcher: Launcher, timer: Timer,
                 minutes: float = 5.0, compile: bool = True, log: Callable[[str], None] = print,
                 facts: GpuFacts | None = None, tune: int = TUNE, propose: RegionProposer | None = None) -> ModelRun:
    """``propose``: more candidates per region beside the playbook's (the LLM per region, :mod:`.model_llm`),
    also for the regions no family covers that it wants."""
    import torch

    from kerngen.harness.gpu.compare import compare
    from kerngen.problems.info import default_tolerance

    began = time.monotonic()
    planning = plan_model(problem)
    part = planning.partition
    sizes = {k: v for k, v in (getattr(problem.info, "sizes", None) or {}).items()}
    eager_plan = plan_partition(part, sizes, planning.plan.problem, planning.plan.problem_sha256,
                                pytorch={r.index: BASELINE_WHY for r in part.regions}).plan
    dev = torch.device(device)
    model = problem.build_model(dev, 0)
    inputs = problem.make_inputs(dev, 0)
    values = problem.bindings(model, inputs, [])
    base = PlanRunner(eager_plan, launcher)
    with torch.no_grad():
        times = step_times(base, values, timer)
        _, env = base(values, keep=True)
    total = sum(times) or 1e-9
    eager_ms = {r.index: sum(t for s, t in zip(eager_plan.steps, times) if s.region == r.index) for r in part.regions}
    views_ms = sum(t for s, t in zip(eager_plan.steps, times) if s.region is None)
    rows = {rp.region.index: RegionRow(region=rp.region.index, nodes=list(rp.region.nodes),
                                       family=rp.region.match.family if rp.region.match else None,
                                       eager_ms=eager_ms[rp.region.index], share=eager_ms[rp.region.index] / total,
                                       why=rp.why) for rp in planning.regions}
    log(f"eager steps: {total:.4f} ms over {len(part.regions)} regions; "
        f"{len(planning.kernels)} covered by a family ({100 * sum(rows[r.region.index].share for r in planning.kernels):.1f}%"
        " of the time)")
    atol, rtol = default_tolerance(problem.info.dtype)
    if facts is None and dev.type == "cuda":
        facts = GpuFacts(name=torch.cuda.get_device_name(dev))
    searched = planning.kernels + [rp for rp in planning.fallbacks
                                   if propose is not None and propose.wants(rp.region, rows[rp.region.index].share)]
    weights: dict[int, float] = {}
    with torch.no_grad():
        for rp in searched:
            row = rows[rp.region.index]
            fl = region_floor(base, row.region, env, dev, facts, str(problem.info.dtype))
            row.floor_ms = fl.ms
            row.weight = weights[row.region] = weight(row.share, row.eager_ms, fl)
    # the budget is the search's: planning (the regions' offers) and the eager baseline come before it, as a
    # folder's first problem's baseline does (a large model's planning would otherwise eat a short budget)
    budget = RegionBudget(weights, 60.0 * minutes)
    try_one = lambda step, label, config=None: _try(step, label, config, eager_plan, env, dev, launcher, timer,  # noqa: E731
                                                    compare, atol, rtol)
    chosen: dict[int, KernelStep] = {}
    for n, rp in enumerate(sorted(searched, key=lambda rp: -weights[rp.region.index]), 1):
        row = rows[rp.region.index]
        began_r = time.monotonic()
        until = budget.deadline(row.region)
        row.budget_s = max(0.0, until - began_r)
        log(f"[{n}/{len(searched)}] r{row.region} {row.family or 'no family'}: {100 * row.share:.1f}% of eager, floor "
            f"{_floor(row.floor_ms)}, weight {row.weight:.3f}, {row.budget_s:.1f} s")
        best: tuple[float, KernelStep] | None = None
        for k, variant in enumerate(rp.offered):
            # every region's first variant is tried while the whole budget lasts; the others in its own share
            if budget.over or (k and time.monotonic() > until):
                row.tried.append(VariantTry(variant=variant, ok=False, message=NOT_TRIED))
                continue
            got = try_one(lambda v=variant: kernel_step(rp.region, v, sizes), variant)
            row.tried.append(got[0])
            log(f"  r{row.region} {variant}: " + (f"correct, {got[0].kernel_ms:.4f} ms" if got[0].ok
                                                   else f"not kept: {got[0].message}"))
            if got[0].ok and (best is None or got[0].kernel_ms < best[0]):
                best = (got[0].kernel_ms, got[1])
        if best is not None and tune > 0 and time.monotonic() < until:
            best = _tune(row, best, tune, try_one, until, sizes, env, facts, log)
        if propose is not None:
            best = ask_region(propose, RegionAsk(rp.region, row, best, env, sizes, facts, until), try_one, log)
        if best is not None and best[0] < row.eager_ms:
            chosen[row.region] = best[1]
            row.chosen, row.variant, row.kernel_ms, row.why = "kernel", best[1].variant, best[0], ""
            row.config = dict(best[1].config)
        elif best is not None:
            row.kernel_ms = best[0]
            row.why = f"its best kernel ({best[1].variant}, {best[0]:.4f} ms) is slower than PyTorch ({row.eager_ms:.4f} ms)"
        elif all(t.message == NOT_TRIED for t in row.tried):
            row.why = NOT_TRIED
        else:
            row.why = "no variant was correct: " + "; ".join(f"{t.variant}: {t.message}" for t in row.tried)[:400]
        log(f"r{row.region} {row.family} ({100 * row.share:.1f}% of eager): "
            + (f"kernel {row.variant} {row.kernel_ms:.4f} ms vs PyTorch {row.eager_ms:.4f} ms" if row.chosen == "kernel"
               else f"PyTorch: {row.why}"))
    plan = assemble(eager_plan, chosen)
    check = check_plan(problem, plan, launcher, dev)
    log(f"end to end: {'correct' if check.ok else 'NOT correct'}: {check.message}")
    run = ModelRun(id=run_dir.name, problem=planning.plan.problem, problem_path=str(Path(problem.path).resolve()),
                   problem_sha256=problem.sha256, device=_device_name(dev),
                   started=datetime.now(timezone.utc).isoformat(timespec="seconds"), plan=plan,
                   regions=[rows[r.index] for r in part.regions], views_ms=views_ms, check=check)
    if check.ok:
        module = PlanModule(plan, model, launcher)
        run.timing = time_end_to_end(model, inputs, module, timer, compile=compile)
        t = run.timing
        log(_timing_line(t))
    run.elapsed_s = time.monotonic() - began
    run.stopped = "done" if not budget.over else "the budget ran out (regions not tried say so)"
    write_model_run(run, run_dir)
    return run


def replay_model(run: ModelRun, problem: Any, run_dir: Path, *, device: Any, launcher: Launcher, timer: Timer,
                 compile: bool = True, log: Callable[[str], None] = print) -> ModelRun:
    """A model run's plan again on this device (another GPU): checked end to end against ``problem`` (whose sha256
    must be the run's), timed against the model in eager mode and under torch.compile; a new record in
    ``run_dir`` (its regions' figures are the recorded run's: the plan is not searched again)."""
    import torch

    from kerngen.errors import KerngenError

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
        t = new.timing
        log(_timing_line(t))
    new.elapsed_s = time.monotonic() - began
    new.stopped = f"replay of {run.id} on this device"
    write_model_run(new, run_dir)
    return new


def _try(make: Callable[[], KernelStep], variant: str, config: dict[str, int] | None, eager_plan: Any, env: dict,
         dev: Any, launcher: Launcher, timer: Timer, compare: Any, atol: float, rtol: float
         ) -> tuple[VariantTry, KernelStep | None]:
    """One kernel step (``make()``, at ``config`` when given) of one region on the eager run's values: correct
    (poisoned output, compared with PyTorch's value of the region) and its time alone."""
    try:
        step = make()
        if config is not None:
            step = step.model_copy(update={"config": dict(config)})
        plan = assemble(eager_plan, {step.region: step})
        runner = PlanRunner(plan, launcher, poison=float("nan"))
        i = next(k for k, s in enumerate(plan.steps) if isinstance(s, KernelStep))
        mine = dict(env)
        out = runner.run_step(i, mine, dev)
        c = compare(out, env[step.out.name].contiguous(), atol=atol, rtol=rtol)
        if not c.ok:
            return VariantTry(variant=variant, config=config, ok=False, message=c.message[:300]), None
        runner.poison = None
        ms = timer(lambda: runner.run_step(i, mine, dev))
        return VariantTry(variant=variant, config=config, ok=True, kernel_ms=ms), step
    except (NotCovered, Exception) as exc:  # a kernel that fails to build, compile or run: that one only
        return VariantTry(variant=variant, config=config, ok=False,
                          message=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"), None


def _tune(row: RegionRow, best: tuple[float, KernelStep], count: int, try_one: Callable, until: float,
          sizes: dict, env: dict, facts: GpuFacts | None, log: Callable[[str], None]) -> tuple[float, KernelStep]:
    """The best variant at up to ``count`` more configurations (:func:`.model_tune.tune_configs`) while the
    region's time lasts; the fastest correct one kept."""
    step = best[1]
    tensors = {n: env[v] for n, v in step.bindings.items()}
    tensors["out"] = env[step.out.name]
    configs = tune_configs(step.spec, dict(step.config), step.sizes, tensors, facts or GpuFacts(name="unknown"),
                           count, seed=row.region)
    for k, cfg in enumerate(configs, 1):
        if time.monotonic() > until:
            log(f"  r{row.region} tune: stopped after {k - 1} of {len(configs)} configurations (its time is spent)")
            break
        got = try_one(lambda: step, step.variant, cfg)
        row.tried.append(got[0])
        if got[0].ok and got[0].kernel_ms < best[0]:
            best = (got[0].kernel_ms, got[1])
        log(f"  r{row.region} tune {k}/{len(configs)} {_cfg(cfg, step.config)}: "
            + (f"{got[0].kernel_ms:.4f} ms" if got[0].ok else f"not kept: {got[0].message[:120]}")
            + f" (best {best[0]:.4f} ms)")
    return best


def _cfg(cfg: dict[str, int], default: dict[str, int]) -> str:
    """What a configuration changes from the default."""
    return " ".join(f"{k}={v}" for k, v in cfg.items() if default.get(k) != v) or "default"


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
