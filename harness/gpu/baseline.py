"""PyTorch's own times for a problem, measured exactly like a candidate (same stream, same
rotation over input sets, L2 flushed before each repetition), plus the roofline floor and the
flags that warn about problems not worth optimizing (degenerate, launch-bound).

Two baselines: true fp32 (TF32 off everywhere, what the check compares with at the default
precision) and PyTorch's defaults (cuDNN convolutions in TF32: what a user's PyTorch runs;
:func:`kerngen.problems.torch_modes.pytorch_defaults`). The second is timed only where it computes
something else: when the model's outputs at the defaults are bitwise those of true fp32 (no
convolution or TF32 matmul in it), the first one's times stand for both."""

from __future__ import annotations

import logging

import torch

from kerngen.harness.gpu.check import ProblemState
from kerngen.harness.gpu.clocks import ClockMonitor
from kerngen.harness.gpu.evaluate import ROTATE_SETS, fresh_seeds
from kerngen.harness.results import Baseline, GpuFacts, Timing
from kerngen.harness.gpu.integrity import digest, new_key
from kerngen.harness.gpu.precision import tolerance_for
from kerngen.harness.gpu.roofline import roof
from kerngen.problems.torch_modes import pytorch_defaults, set_precision, strict_fp32
from kerngen.harness.gpu.timing import L2Flusher, bench

log = logging.getLogger(__name__)

# Under these the op is dominated by launch overhead, and a speedup says little about kernels.
LAUNCH_BOUND_FLOOR_MS = 0.01
LAUNCH_BOUND_EAGER_MS = 0.03


def measure_baseline(
    state: ProblemState,
    stream: torch.cuda.Stream,
    flusher: L2Flusher,
    facts: GpuFacts,
    device_index: int,
    budget_ms: float = 300.0,
    with_compile: bool = True,
    input_sets: int = ROTATE_SETS,
) -> Baseline:
    """PyTorch eager and torch.compile timed over ``input_sets`` rotating input sets (fewer than
    three for a problem whose memory plan holds fewer), the floor, the degeneracy check."""
    from kerngen.problems.degenerate import check_seed_dependence

    info = state.info
    with torch.cuda.stream(stream):
        # first, while nothing else is held: it runs the reference on two input sets of its own
        report = check_seed_dependence(state.problem, device=state.device)
        sets = [state.problem.make_inputs(state.device, s) for s in fresh_seeds(max(1, input_sets))]
        strict_fp32()  # "vs PyTorch (true fp32)", whatever the problem's precision
        eager = _time_module(state.model, sets, stream, flusher, device_index, budget_ms)
        compiled, compile_error = None, ""
        if with_compile:
            compiled, compile_error = _time_compiled(state.model, sets, stream, flusher, device_index, budget_ms)
        precision = state.problem.ref.precision
        with pytorch_defaults(precision) as label:
            same = _same_outputs(state.model, sets[0])
            eager_d, compiled_d = eager, compiled
            if not same:
                eager_d = _time_module(state.model, sets, stream, flusher, device_index, budget_ms)
                if with_compile and compiled is not None:
                    compiled_d, _ = _time_compiled(state.model, sets, stream, flusher, device_index, budget_ms)
        set_precision(precision)  # the reference's settings again
        del sets
    floor = roof(info.flops, info.min_bytes, info.dtype, facts, precision)  # TF32's full rate at --precision tf32
    return Baseline(
        problem=info.name,
        gpu=facts.name,
        eager=eager,
        compiled=compiled,
        compile_error=compile_error,
        eager_defaults=eager_d,
        compiled_defaults=compiled_d,
        defaults_label=label,
        defaults_same=same,
        floor_ms=floor.ms,
        floor_bound=floor.bound,
        floor_basis=floor.basis,
        floor_measured_ms=floor.measured_ms,
        flops=info.flops,
        min_bytes=info.min_bytes,
        degenerate=report.degenerate,
        degenerate_reason=report.reason,
        launch_bound=(floor.ms is not None and floor.ms < LAUNCH_BOUND_FLOOR_MS) or eager.median_ms < LAUNCH_BOUND_EAGER_MS,
        tolerance=tolerance_for(state),  # what every check of this problem applies (measured at --precision tf32)
    )


def _same_outputs(model, inputs) -> bool:
    """The model's outputs under the settings in force (PyTorch's defaults) are bitwise those in
    true fp32: compared by digest, one output held at a time."""
    def run() -> list[int]:  # on copies: a KernelBench reference may work in place
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        return [digest(o, key) for o in _as_list(model(*args))]

    with torch.no_grad():
        key = new_key()
        at_defaults = run()
        with pytorch_defaults(None):  # nested: restored to the defaults on exit
            strict_fp32()
            strict = run()
    return at_defaults == strict


def _as_list(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _time_module(module, sets, stream, flusher, device_index, budget_ms) -> Timing:
    state = {"k": 0}

    def call() -> None:
        module(*sets[state["k"] % len(sets)])
        state["k"] += 1

    with torch.no_grad():
        return bench(call, stream=stream, flusher=flusher, budget_ms=budget_ms, clocks=ClockMonitor(device_index))


def _time_compiled(model, sets, stream, flusher, device_index, budget_ms) -> tuple[Timing | None, str]:
    # torch.compile failing (no compiler, unsupported op) is data for the report, not a crash
    import torch._dynamo

    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            for inputs in sets:
                compiled(*inputs)
        stream.synchronize()
    except (RuntimeError, torch._dynamo.exc.TorchDynamoException, AssertionError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("torch.compile failed: %s", first)
        return None, f"{type(exc).__name__}: {first}"
    return _time_module(compiled, sets, stream, flusher, device_index, budget_ms), ""
