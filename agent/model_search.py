"""``kerngen generate MODEL.py`` on the offline playbook (issue 34): the model's forward as a plan, a kernel per
region where one is correct and faster than PyTorch, checked and timed end to end.

1. The eager baseline: the plan with every region as PyTorch, each step timed alone: a region's share of the
   eager time.
2. The regions a family covers, largest share first (the possible gain is not known before a kernel is timed, so
   the share ranks them), each offered variant at its real shapes in turn while the budget lasts: its kernel
   step run on the eager run's own intermediate values (outputs poisoned), compared with PyTorch's value of the
   region (the harness's comparison and tolerance), timed alone. The fastest correct variant is kept when it
   beats the region's PyTorch time; else the region stays PyTorch, and the table says why.
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

from kerngen.agent.model_run import ModelRun, RegionRow, VariantTry, write_model_run
from kerngen.agent.playbook import NotCovered
from kerngen.agent.playbook.model_plan import assemble, kernel_step, plan_model, plan_partition

__all__ = ["search_model"]

BASELINE_WHY = "the eager baseline"
NOT_TRIED = "not tried: the budget ran out"


def search_model(problem: Any, run_dir: Path, *, device: Any, launcher: Launcher, timer: Timer,
                 minutes: float = 5.0, compile: bool = True, log: Callable[[str], None] = print) -> ModelRun:
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
    # the budget is the search's: planning (the regions' offers) and the eager baseline come before it, as a
    # folder's first problem's baseline does (a large model's planning would otherwise eat a short budget)
    deadline = time.monotonic() + 60.0 * minutes
    chosen: dict[int, KernelStep] = {}
    for rp in sorted(planning.kernels, key=lambda rp: -rows[rp.region.index].share):
        row = rows[rp.region.index]
        best: tuple[float, KernelStep] | None = None
        for variant in rp.offered:
            if time.monotonic() > deadline:
                row.tried.append(VariantTry(variant=variant, ok=False, message=NOT_TRIED))
                continue
            got = _try(rp.region, variant, sizes, eager_plan, env, dev, launcher, timer, compare, atol, rtol)
            row.tried.append(got[0])
            log(f"  r{row.region} {variant}: " + (f"correct, {got[0].kernel_ms:.4f} ms" if got[0].ok
                                                   else f"not kept: {got[0].message}"))
            if got[0].ok and (best is None or got[0].kernel_ms < best[0]):
                best = (got[0].kernel_ms, got[1])
        if best is not None and best[0] < row.eager_ms:
            chosen[row.region] = best[1]
            row.chosen, row.variant, row.kernel_ms, row.why = "kernel", best[1].variant, best[0], ""
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
        log(f"eager {t.eager_ms:.4f} ms, torch.compile {_ms(t.compile_ms)}, kerngen {t.kerngen_ms:.4f} ms, "
            f"kerngen + compile {_ms(t.kerngen_compile_ms)}")
    run.elapsed_s = time.monotonic() - began
    run.stopped = "done" if time.monotonic() <= deadline else "the budget ran out (regions not tried say so)"
    write_model_run(run, run_dir)
    return run


def _try(region: Any, variant: str, sizes: dict, eager_plan: Any, env: dict, dev: Any, launcher: Launcher,
         timer: Timer, compare: Any, atol: float, rtol: float) -> tuple[VariantTry, KernelStep | None]:
    """One variant of one region on the eager run's values: correct (poisoned output, compared with PyTorch's
    value of the region) and its time alone."""
    try:
        step = kernel_step(region, variant, sizes)
        plan = assemble(eager_plan, {region.index: step})
        runner = PlanRunner(plan, launcher, poison=float("nan"))
        i = next(k for k, s in enumerate(plan.steps) if isinstance(s, KernelStep))
        mine = dict(env)
        out = runner.run_step(i, mine, dev)
        c = compare(out, env[step.out.name].contiguous(), atol=atol, rtol=rtol)
        if not c.ok:
            return VariantTry(variant=variant, ok=False, message=c.message[:300]), None
        runner.poison = None
        return VariantTry(variant=variant, ok=True, kernel_ms=timer(lambda: runner.run_step(i, mine, dev))), step
    except (NotCovered, Exception) as exc:  # a kernel that fails to build, compile or run: that variant only
        return VariantTry(variant=variant, ok=False, message=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"), None


def _ms(v: float | None) -> str:
    return f"{v:.4f} ms" if v is not None else "not measured"


def _device_name(dev: Any) -> str:
    import torch

    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (emulated kernels: times say nothing)"


ModelCheck  # re-exported for callers reading a run's check
