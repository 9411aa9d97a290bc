"""A model plan checked end to end against the problem's own forward, with the harness's rules: several weight
seeds (the problem's model built and perturbed from each) and fresh input sets per seed, every kernel output and
scratch buffer poisoned before its kernel runs (the poison cycled: NaN, then a huge finite value), the inputs and
parameters verified unchanged after the plan ran, the output compared by the harness's comparison
(:func:`kerngen.harness.gpu.compare.compare`: fp32 at atol/rtol 1e-4 and ||out-ref||/||ref|| <= 1e-5, bf16/fp16
1e-2). A plan is reported correct only when every set passed and every kernel step ran.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kerngen.harness.model.execute import Launcher, PlanRunner
from kerngen.harness.model.plan import ModelPlan

__all__ = ["ModelCheck", "POISONS", "check_plan"]

POISONS = (float("nan"), 3.0e38)


class ModelCheck(BaseModel):
    ok: bool
    sets: int = 0  # input sets that passed
    max_abs_err: float = 0.0
    rel_err: float = 0.0
    kernel_calls: int = 0
    message: str = ""


def check_plan(problem: Any, plan: ModelPlan, launcher: Launcher, device: Any = "cpu", *, weight_seeds: tuple[int, ...]
               = (0, 1), input_sets: int = 2, atol: float | None = None, rtol: float | None = None) -> ModelCheck:
    """``plan`` against ``problem``'s forward (see the module's text); never raises for a wrong plan."""
    import torch

    from kerngen.harness.gpu.compare import compare
    from kerngen.problems.info import default_tolerance

    dev = torch.device(device)
    d_atol, d_rtol = default_tolerance(problem.info.dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    worst, rel, passed, calls = 0.0, 0.0, 0, 0
    for w, wseed in enumerate(weight_seeds):
        model = problem.build_model(dev, seed=wseed)
        for k in range(input_sets):
            inputs = problem.make_inputs(dev, seed=1000 * (w + 1) + k)
            ref = problem.run_reference(model, inputs)[0]
            values = {n: t for n, t in problem.bindings(model, inputs, []).items()}
            before = {n: t.clone() for n, t in values.items()}
            runner = PlanRunner(plan, launcher, poison=POISONS[(w * input_sets + k) % len(POISONS)])
            where = f"weight seed {wseed}, input set {k}"
            try:
                with torch.no_grad():
                    out = runner(values)
            except Exception as exc:  # a kernel that crashed or a plan that cannot run: not correct
                return ModelCheck(ok=False, sets=passed, kernel_calls=calls,
                                  message=f"{where}: the plan failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            calls += runner.kernel_calls
            if len(plan.kernel_steps) and runner.kernel_calls != len(plan.kernel_steps):
                return ModelCheck(ok=False, sets=passed, message=f"{where}: {runner.kernel_calls} of "
                                  f"{len(plan.kernel_steps)} kernel steps ran")
            changed = next((n for n, t in values.items() if not _same(t, before[n])), None)
            if changed is not None:
                return ModelCheck(ok=False, sets=passed, kernel_calls=calls,
                                  message=f"{where}: the plan changed {changed!r} (an input or parameter)")
            if any(out.data_ptr() == t.data_ptr() for t in values.values()):
                return ModelCheck(ok=False, sets=passed, kernel_calls=calls,
                                  message=f"{where}: the output is an input's or a parameter's memory")
            c = compare(out.contiguous(), ref.contiguous(), atol=atol, rtol=rtol)
            worst, rel = max(worst, c.max_abs_err), max(rel, c.rel_err)
            if not c.ok:
                return ModelCheck(ok=False, sets=passed, max_abs_err=worst, rel_err=rel, kernel_calls=calls,
                                  message=f"{where}: {c.message}")
            passed += 1
    return ModelCheck(ok=True, sets=passed, max_abs_err=worst, rel_err=rel, kernel_calls=calls,
                      message=f"{passed} input sets over {len(weight_seeds)} weight seeds agree with the forward "
                              f"(max abs error {worst:.3g}, ||out-ref||/||ref|| {rel:.3g})")


def _same(a: Any, b: Any) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(
        torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)) and torch.equal(a.isnan(), b.isnan())))
