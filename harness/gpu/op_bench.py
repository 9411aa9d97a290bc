"""``kerngen bench --op`` and ``kerngen suite``: the exported op's path timed beside its kernel, side by
side in one worker, on the same input sets, with the same timer (:func:`.timing.bench`: L2 flushed
before every repetition, the sets rotated).

- the kernel: the harness's own launcher (:class:`.launcher.PlanRunner`) on outputs and scratch it
  allocated once, as a run times it;
- the op: a ``torch.library`` op registered in the worker exactly as ``kerngen.load``
  registers one (:func:`.op_call.register_op`), called through ``torch.ops`` with the problem's
  tensors, running :class:`.op_call.OpRuntime` and :mod:`.op_runtime`'s cached launch path:
  outputs and scratch from torch's caching allocator on every call, as a user gets them.

The two paths are timed in one series, interleaved rep by rep (kernel, op, op, kernel, ...:
:func:`.timing.bench_side_by_side`), so both see the same clocks. Timed one after the other (even
counterbalanced, kernel, op, op, kernel), a power-capped H200 whose SM clock moved between 1650 and
1815 MHz within the series gave the 3xTF32 matmul_wide an 8.8% "gap" whose fastest reps were equal.
Beside the device times, the host's time per op call (no synchronisation) says whether a short kernel
would be host-bound.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from kerngen.harness.gpu.buffers import torch_dtype
from kerngen.harness.gpu.clocks import ClockMonitor
from kerngen.harness.gpu.evaluate import ROTATE_SETS, fresh_seeds
from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner
from kerngen.harness.gpu.op_call import KernelEntry, OpRuntime, register_op
from kerngen.harness.gpu.op_runtime import CudaBinder, DescriptorCache, KernelRuntime, Slots, write_descriptor
from kerngen.harness.gpu.precision import tolerance_for
from kerngen.harness.gpu.timing import bench_side_by_side
from kerngen.harness.results import OpTiming
from kerngen.harness.spec.plan import ResolvedPlan
from kerngen.harness.spec.spec import KernelSpec

HOST_CALLS = 100  # back-to-back op calls timed on the host (no sync): its time per call
_names = itertools.count()


def time_op_path(state: Any, spec: KernelSpec, plan: ResolvedPlan, cubin: bytes, stream: torch.cuda.Stream,
                 flusher: Any, device_index: int, budget_ms: float, input_sets: int = ROTATE_SETS) -> OpTiming:
    info = state.info
    dev = state.device
    with torch.cuda.stream(stream):
        sets = [_arguments(state, seed) for seed in fresh_seeds(max(1, min(input_sets, ROTATE_SETS)))]
        module = LoadedModule(cubin, sorted({step.kernel for step in plan.launches}))
        runners, held = [], []
        for args in sets:
            tensors = {t.name: a for t, a in zip([*info.inputs, *info.params], args)}
            outs = {o.name: torch.empty(tuple(o.shape), dtype=torch_dtype(o.dtype), device=dev) for o in info.outputs}
            scratch = {s.name: torch.empty((s.size,), dtype=torch_dtype(s.dtype), device=dev) for s in plan.scratch}
            held.append(outs)
            runners.append(PlanRunner(module, plan, {**tensors, **outs, **scratch}, stream))
        op = _register(spec, plan, cubin, info, dev)
        kc, oc = itertools.count(), itertools.count()  # each path rotates through the sets on its own
        matches = _same_output(state, op(*sets[0]), runners[0], held[0])
        kernel, op_t = bench_side_by_side(
            [lambda: runners[next(kc) % len(runners)](), lambda: op(*sets[next(oc) % len(sets)])], stream=stream,
            flusher=flusher, budget_ms=2 * budget_ms, warmup_ms=min(25.0, budget_ms), clocks=ClockMonitor(device_index))
        stream.synchronize()
        began = time.perf_counter()
        for _ in range(HOST_CALLS):
            op(*sets[0])
        host_us = (time.perf_counter() - began) / HOST_CALLS * 1e6
        stream.synchronize()
    return OpTiming(kernel=kernel, op=op_t, gap_pct=100.0 * (op_t.median_ms - kernel.median_ms) / kernel.median_ms,
                    host_us=host_us, matches=matches, rounds=1)


def _arguments(state: Any, seed: int) -> list[torch.Tensor]:
    """The op's arguments on one input set: the problem's tensor inputs, then the model's parameters
    and buffers (the worker's copies), in the order the export names them."""
    info = state.info
    raw = dict(zip(info.args, state.problem.make_inputs(state.device, seed)))
    return [raw[t.name].contiguous() for t in info.inputs] + [state.params[p.name].view for p in info.params]


def _register(spec: KernelSpec, plan: ResolvedPlan, cubin: bytes, info: Any, dev: torch.device) -> Any:
    """A custom op of this kernel, registered as ``kerngen.load`` registers one, admitting the
    problem's own shapes (the plan, already resolved)."""
    names = [t.name for t in [*info.inputs, *info.params]]
    kr = KernelRuntime(spec, plan.config, info.sizes, CudaBinder(spec, lambda _plan, _dev: cubin,
                                                                 DescriptorCache(write_descriptor)))
    shapes = tuple((t.name, tuple(t.shape)) for t in [*info.inputs, *info.params, *info.outputs])
    kr.plans.seed(shapes, plan)
    slots = Slots(tuple(names + [o.name for o in info.outputs] + [s.name for s in plan.scratch]))
    outputs = tuple((tuple(o.shape), torch_dtype(o.dtype)) for o in info.outputs)
    scratch = tuple((s.size, torch_dtype(s.dtype)) for s in plan.scratch)

    def admit(args: tuple) -> KernelEntry:
        got = tuple((tuple(a.shape), str(a.dtype).removeprefix("torch.")) for a in args)
        want = tuple((tuple(t.shape), t.dtype) for t in [*info.inputs, *info.params])
        if got != want:
            raise ValueError(f"the op was registered for {want}, called with {got}")
        _, runner = kr.runner(shapes, dev.index or 0, slots)
        return KernelEntry(runner, outputs, scratch, dev)

    runtime = OpRuntime(admit)

    def fake(*args: Any) -> Any:
        outs = [torch.empty(shape, dtype=dtype, device=args[0].device) for shape, dtype in outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    outs = "Tensor" if len(outputs) == 1 else f"({', '.join(['Tensor'] * len(outputs))})"
    schema = f"({', '.join(f'Tensor a{i}' for i in range(len(names)))}) -> {outs}"
    return register_op(f"kerngen_bench::op{next(_names)}", schema, runtime, fake)


def _same_output(state: Any, got: Any, runner: PlanRunner, outs: dict[str, torch.Tensor]) -> bool:
    """The op's outputs against the kernel's on the same set (within the check's tolerance: a
    kernel with atomics need not repeat bit for bit)."""
    runner()
    tol = tolerance_for(state)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    for g, want in zip(got, outs.values()):
        if g.shape != want.shape or g.dtype != want.dtype:
            return False
        if g.is_floating_point():
            if not torch.allclose(g, want, atol=tol.atol, rtol=tol.rtol, equal_nan=True):
                return False
        elif not torch.equal(g, want):
            return False
    return True


__all__ = ["time_op_path"]
