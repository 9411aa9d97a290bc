"""Time a model plan: each step alone (for the per-region table: share of eager time, kernel against PyTorch) and
the whole forward end to end beside the original model in eager mode and under torch.compile, in one process.

On a GPU every figure is :func:`kerngen.harness.gpu.timing.bench`'s median (CUDA events, the L2 flushed before
each call, warm-up and repetitions from a time budget); the CPU tests inject their own timer.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from pydantic import BaseModel

from kerngen.harness.model.execute import PlanRunner

__all__ = ["EndToEnd", "Timer", "cuda_timer", "step_times", "time_end_to_end"]

Timer = Callable[[Callable[[], Any]], float]  # a callable's median time, ms


def cuda_timer(device: Any, budget_ms: float = 100.0) -> Timer:
    """CUDA events on the current stream, the L2 flushed before each call, the median (ms)."""
    import torch

    from kerngen.harness.gpu.timing import L2Flusher, bench

    flusher = L2Flusher(device)

    def timer(fn: Callable[[], Any]) -> float:
        with torch.no_grad():
            return bench(fn, stream=torch.cuda.current_stream(device), flusher=flusher, budget_ms=budget_ms,
                         keep_samples=False).median_ms

    return timer


def step_times(runner: PlanRunner, values: Mapping[str, Any], timer: Timer) -> list[float]:
    """Each step's time (ms) alone, on the values one whole run of the plan makes."""
    _, env = runner(values, keep=True)
    device = next(iter(values.values())).device
    return [timer(lambda i=i: runner.run_step(i, env, device)) for i in range(len(runner.plan.steps))]


class EndToEnd(BaseModel):
    """One forward, ms (median): the model in eager mode, under torch.compile, the plan, the plan under
    torch.compile (None: not measured, ``notes`` says why)."""

    eager_ms: float
    compile_ms: float | None = None
    kerngen_ms: float
    kerngen_compile_ms: float | None = None
    notes: list[str] = []

    @property
    def best_ms(self) -> float:
        return min(x for x in (self.kerngen_ms, self.kerngen_compile_ms) if x is not None)


def time_end_to_end(model: Any, inputs: list, plan_module: Any, timer: Timer, compile: bool = True) -> EndToEnd:
    """``model(*inputs)`` eager and compiled against ``plan_module(*inputs)`` eager and compiled, one process."""
    import torch

    notes: list[str] = []
    with torch.no_grad():
        eager = timer(lambda: model(*inputs))
        ours = timer(lambda: plan_module(*inputs))
        compiled = ours_compiled = None
        if compile:
            for which, mod in (("torch.compile", model), ("kerngen + torch.compile", plan_module)):
                try:
                    fn = torch.compile(mod)
                    fn(*inputs)
                    t = timer(lambda fn=fn: fn(*inputs))
                except Exception as exc:  # a compile failure is a figure not measured, said why
                    notes.append(f"{which} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
                    continue
                if which == "torch.compile":
                    compiled = t
                else:
                    ours_compiled = t
    return EndToEnd(eager_ms=eager, compile_ms=compiled, kerngen_ms=ours, kerngen_compile_ms=ours_compiled,
                    notes=notes)
