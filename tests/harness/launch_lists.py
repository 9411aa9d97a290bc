"""What the harness's launcher (:class:`kerngen.harness.gpu.launcher.PlanRunner`) and the exported op's
path (:meth:`CudaBinder.bind_steps` + ``_CudaRunner``, as ``kerngen.load`` and ``kerngen suite`` register it)
would launch for one resolved plan, without a GPU: a stand-in module records the dynamic shared memory each
kernel is opted into, tensors are stand-ins with fixed addresses, TMA descriptors are recorded by what they
describe (address, shape, dtype, box, swizzle, full width, view) instead of being encoded. Both lists come
out in one normal form, so that ``harness_launches(...) == op_launches(...)`` says the two paths make the
same launches with the same arguments on the same tensors. Shared by tests/harness/test_op_launches.py and
the GPU test of the same question (tests/harness/test_gpu_op_regions.py)."""

from __future__ import annotations

import sys
import types

import itertools
import math
from typing import Any, Iterator

import numpy as np
import torch

from kerngen.harness.gpu import launcher, tensormap
from kerngen.harness.gpu.buffers import torch_dtype
from kerngen.harness.gpu.op_runtime import CudaBinder, DescriptorCache, Slots, _CudaRunner
from kerngen.harness.spec.plan import ResolvedPlan, resolve
from kerngen.harness.tune.prune import enumerate_configs


class FakeTensor:
    """A contiguous CUDA tensor as the launch paths see it: shape, dtype, address (1 << 36 apart)."""

    _addresses = itertools.count(1)

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.shape, self.dtype = torch.Size(shape), dtype
        self.device = torch.device("cuda", 0)
        self._ptr = 0x7F0000000000 + next(self._addresses) * (1 << 36)

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def is_contiguous(self) -> bool:
        return True


class _Buffer:
    def __init__(self, ptr: int) -> None:
        self._ptr = ptr

    def data_ptr(self) -> int:
        return self._ptr


class FakeModule:
    """A loaded module: its functions are their names; ``attr`` the dynamic shared memory each is opted into."""

    def __init__(self, kernels: list[str]) -> None:
        self.functions = {k: k for k in kernels}
        self.attr: dict[str, int] = {}

    def function(self, name: str, shared_mem: int) -> str:
        if shared_mem > launcher.DEFAULT_SMEM_LIMIT:
            self.attr[name] = shared_mem
        return self.functions[name]


class _Maps:
    """Descriptor buffers handed out at fresh addresses, each remembered by what it describes."""

    def __init__(self, base: int) -> None:
        self._next = itertools.count(base)
        self.described: dict[int, tuple] = {}

    def make(self, t: Any, rows: int, cols: int, swizzle: int, full_width: bool, view: Any) -> _Buffer:
        buf = _Buffer(next(self._next) * 256)
        self.described[buf.data_ptr()] = ("map", t.data_ptr(), tuple(t.shape), str(t.dtype), rows, cols, swizzle,
                                          bool(full_width), tuple(view) if view is not None else None)
        return buf


def _normal(kernel: str, grid, block, smem: int, coop: bool, args, maps: _Maps, module: FakeModule) -> tuple:
    shown = tuple(maps.described.get(int(a), ("ptr", int(a))) if isinstance(a, np.uint64) else (a.dtype.name, a.item())
                  for a in args)
    # the launch fails unless the kernel was opted into at least its dynamic shared memory
    opted = module.attr.get(kernel, launcher.DEFAULT_SMEM_LIMIT)
    return ("launch", kernel, tuple(grid), tuple(block), smem, bool(coop), shown, smem <= opted)


def harness_runner(plan: ResolvedPlan, tensors: dict[str, Any], monkeypatch: Any) -> tuple[Any, _Maps, FakeModule]:
    """:class:`launcher.PlanRunner` for ``plan`` on ``tensors`` (stand-in module, descriptors and stream)."""
    maps = _Maps(0x100000)
    monkeypatch.setattr(tensormap, "device_map", lambda t, rows, cols, swizzle, what="", *, full_width=True,
                        view=None: maps.make(t, rows, cols, swizzle, full_width, view))
    module = FakeModule(sorted({s.kernel for s in plan.launches}))
    # the runner's only use of cupy here is the stream wrapper: a stand-in, so that CI's CPU install (no cupy) runs it
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(ExternalStream=lambda handle, *device: types.SimpleNamespace(ptr=handle))))
    runner = launcher.PlanRunner(module, plan, tensors, type("Stream", (), {"cuda_stream": 77})())  # type: ignore[arg-type]
    return runner, maps, module


def harness_launches(plan: ResolvedPlan, tensors: dict[str, Any], monkeypatch: Any) -> list[tuple]:
    """The launches and memsets of :class:`launcher.PlanRunner` for ``plan`` on ``tensors``, in order."""
    runner, maps, module = harness_runner(plan, tensors, monkeypatch)
    out = []
    for call in runner._calls:
        if call[0] == "memset":
            out.append(("memset", call[1], int(call[2]), call[3]))
        else:
            _, fn, grid, block, args, smem, coop = call
            out.append(_normal(fn, grid, block, smem, coop, args, maps, module))
    return out


def op_launches(spec: Any, plan: ResolvedPlan, info: Any, tensors: dict[str, Any]) -> list[tuple]:
    """The launches and memsets the op path makes for ``plan`` on ``tensors``: slots laid out as
    :func:`kerngen.harness.gpu.op_bench._register` lays them out (the op's arguments, its outputs, the
    plan's scratch), steps bound by :meth:`CudaBinder.bind_steps`, one call of the ``_CudaRunner``."""
    maps = _Maps(0x900000)
    binder = CudaBinder(spec, lambda _plan, _dev: b"",
                        DescriptorCache(lambda t, box, _capturing: (maps.make(t, box.rows, box.cols, box.swizzle,
                                                                              box.full_width, box.view), None)))
    slots = Slots(tuple([t.name for t in [*info.inputs, *info.params, *info.outputs]] + [s.name for s in plan.scratch]))
    module = FakeModule(list(dict.fromkeys(s.kernel for s in plan.launches)))
    key = (0, tuple(sorted(plan.config.items())), tuple(sorted(plan.defines.items())))
    made: list[tuple] = []
    steps = []
    for step in binder.bind_steps(plan, module, key, slots):
        if step[0] == "launch":  # the function: one that records its launch
            kernel = step[1]
            step = (step[0], lambda grid, block, args, smem=0, stream=None, enable_cooperative_groups=False, k=kernel:
                    made.append(_normal(k, grid, block, smem, enable_cooperative_groups, args, maps, module)),
                    *step[2:])
        steps.append(step)
    runner = _CudaRunner(steps, 0, binder.descriptors, stream_of=lambda handle, _dev: type("CS", (), {"ptr": handle})(),
                         memset=lambda ptr, value, nbytes, _stream: made.append(("memset", ptr, int(value), nbytes)),
                         capturing=lambda: False, pack=lambda value: value)
    runner([tensors[n] for n in slots.names], 77)
    return made


def fake_tensors(info: Any, plan: ResolvedPlan) -> dict[str, FakeTensor]:
    """A stand-in for every tensor the plan may bind: the problem's and the plan's scratch."""
    out = {t.name: FakeTensor(tuple(t.shape), torch_dtype(t.dtype)) for t in [*info.inputs, *info.params, *info.outputs]}
    out.update({s.name: FakeTensor((s.size,), torch_dtype(s.dtype)) for s in plan.scratch})
    return out


def offered_plans(problem: Any, per_variant: int) -> Iterator[tuple[str, Any, ResolvedPlan]]:
    """(variant, spec, plan) for every variant the playbook offers ``problem``, at up to ``per_variant``
    configurations that resolve (the default one first)."""
    from kerngen.agent.playbook import PlaybookProposer

    info = problem.info
    offer = PlaybookProposer(problem).offer
    for vo in offer.offered if offer is not None else []:
        seen: list[dict] = []
        for cfg in itertools.chain([{}], enumerate_configs(vo.spec, seed=0, limit=40)):
            if len(seen) >= per_variant:
                break
            try:
                plan = resolve(vo.spec, sizes=dict(info.sizes), tensors=info.tensor_facts(), config=cfg)
            except Exception:  # noqa: BLE001 - a configuration the constraints refuse launches nothing
                continue
            if plan.config not in seen:
                seen.append(plan.config)
                yield vo.variant, vo.spec, plan
