"""The launch path of an exported op: a kernel spec at one configuration, run on the caller's tensors
at every shape its constraints admit, at no measurable cost per call.

What a call needs and does not change between calls is made once and kept, keyed by what it
depends on:

- the resolved launch plan: by the shapes of every tensor the plan binds (:class:`PlanCache`; a
  shape the constraints refuse is remembered as refused too);
- the loaded module: by device and compile options (a new shape whose ``defines`` differ is compiled
  once, with the harness's NVRTC job);
- the bound launches (functions looked up, dynamic shared memory opted into, cooperative grids
  checked, scalars packed, argument slots laid out): by shapes and device (:class:`KernelRuntime`);
- TMA descriptors: by device, data pointer, shape, dtype, box and swizzle (:class:`DescriptorCache`).
  A descriptor is encoded on the host and written to device memory once per key; the same tensor
  (or another one at the same address, as torch's caching allocator hands out) reuses it.

A call then reads ``data_ptr()`` of its tensors and launches on torch's current stream: no host to
device copy, no synchronisation, nothing allocated but the outputs and scratch (the caller takes
them from torch's caching allocator). Under CUDA graph capture a descriptor missing from the cache is
written by a copy captured into the graph (from pinned memory kept alive with it) and kept apart
from the eager ones: its bytes exist only once the graph replays.

Everything that touches the GPU is injected (``build``/``bind`` callables), so the caching is tested
without one (tests/harness/test_op_runtime.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Mapping, Sequence, TypeVar

import numpy as np

from kerngen.errors import SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import ResolvedLaunch, ResolvedPlan, resolve
from kerngen.harness.spec.spec import KernelSpec

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

PLANS_KEPT = 256  # shapes one kernel keeps resolved and bound (a model with more distinct shapes re-resolves)
DESCRIPTORS_KEPT = 4096  # eager TMA descriptors kept (128 bytes of device memory each)
_SCALARS = {"int32": np.int32, "int64": np.int64, "float32": np.float32}


class KeyedCache(Generic[K, V]):
    """Values built once per key by ``build(key, *args)`` (the args: what the builder needs beyond
    the key), least recently used dropped past ``capacity``. ``builds`` counts the builds."""

    def __init__(self, build: Callable[..., V], capacity: int) -> None:
        self._build, self.capacity = build, capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self.builds = 0

    def get(self, key: K, *args: Any) -> V:
        try:
            value = self._items[key]
        except KeyError:
            self.builds += 1
            value = self._items[key] = self._build(key, *args)
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
            return value
        self._items.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


# ----- TMA descriptors ----------------------------------------------------------------------------
MapKey = tuple  # (device index, data_ptr, shape, dtype, box_rows, box_cols, swizzle)
# (tensor, box_rows, box_cols, swizzle, capturing) -> (the 128 bytes in device memory, anything to keep alive)
MapBuilder = Callable[[Any, int, int, int, bool], tuple[Any, Any]]


class DescriptorCache:
    """TMA descriptors in device memory, built once per (device, address, shape, dtype, box,
    swizzle). Those built while a CUDA graph is being captured are kept apart and never dropped
    (the graph writes and reads them on every replay)."""

    def __init__(self, build: MapBuilder, capacity: int = DESCRIPTORS_KEPT) -> None:
        self._build = build
        self._eager: KeyedCache[MapKey, tuple[Any, Any]] = KeyedCache(
            lambda key, tensor: build(tensor, key[4], key[5], key[6], False), capacity)
        self._captured: dict[MapKey, tuple[Any, Any]] = {}

    @property
    def builds(self) -> int:
        return self._eager.builds + len(self._captured)

    def pointer(self, tensor: Any, device: int, rows: int, cols: int, swizzle: int, capturing: bool = False) -> int:
        """The device address of the descriptor of ``tensor`` for this box."""
        key = (device, tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, rows, cols, swizzle)
        if capturing and key not in self._eager:
            entry = self._captured.get(key)
            if entry is None:
                entry = self._captured[key] = self._build(tensor, rows, cols, swizzle, True)
            return entry[0].data_ptr()
        return self._eager.get(key, tensor)[0].data_ptr()


def write_descriptor(tensor: Any, rows: int, cols: int, swizzle: int, capturing: bool) -> tuple[Any, Any]:
    """The descriptor of ``tensor`` written to device memory on the current stream: from pinned
    host memory, then (outside a capture) the stream is synchronised once, so that the bytes are
    there for any stream from now on. A miss costs this; a hit costs nothing."""
    import torch

    from kerngen.harness.gpu import tensormap

    what = f"tensormap of a {tuple(tensor.shape)} tensor"
    data = tensormap.encode(tensormap.layout_for(tensor, rows, cols, swizzle, what), int(tensor.data_ptr()), what)
    view = tensormap.aligned_buffer(tensor.device)
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8).pin_memory()
    view.copy_(host, non_blocking=True)
    if not capturing:
        torch.cuda.current_stream(tensor.device).synchronize()
    return view, host


# ----- plans ----------------------------------------------------------------------------------------
Shapes = tuple  # ((name, shape), ...) of every tensor the plan may bind, in a fixed order


class PlanCache:
    """The resolved plan of ``spec`` at ``config`` for every shape key, resolved once (a refusal,
    the constraint or expression that failed, is remembered and raised again as a SpecError)."""

    def __init__(self, spec: KernelSpec, config: Mapping[str, int], sizes: Mapping[str, int | float],
                 capacity: int = PLANS_KEPT) -> None:
        self.spec, self.config, self.sizes = spec, dict(config), dict(sizes)
        self._cache: KeyedCache[Shapes, ResolvedPlan | SpecError] = KeyedCache(self._resolve, capacity)

    @property
    def builds(self) -> int:
        return self._cache.builds

    def _resolve(self, shapes: Shapes, given: ResolvedPlan | None = None) -> ResolvedPlan | SpecError:
        if given is not None:
            return given
        facts = {name: TensorFacts(tuple(shape)) for name, shape in shapes}
        try:
            return resolve(self.spec, sizes=self.sizes, tensors=facts, config=self.config)
        except SpecError as exc:
            return exc

    def seed(self, shapes: Shapes, plan: ResolvedPlan) -> None:
        """``plan`` for ``shapes`` without resolving (an export's bucket: the plan it was checked with)."""
        self._cache.get(shapes, plan)

    def plan(self, shapes: Shapes) -> ResolvedPlan:
        got = self._cache.get(shapes)
        if isinstance(got, SpecError):
            raise SpecError(str(got))
        return got


# ----- bound launches -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Slots:
    """Where each tensor of a call sits in the list a bound plan runs on: the op's arguments, its
    outputs, then the plan's scratch buffers."""

    names: tuple[str, ...]

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}


Runner = Callable[[Sequence[Any], Any], None]  # (tensors in slot order, torch stream) -> None
# (plan, device index, slots) -> a runner
Binder = Callable[[ResolvedPlan, int, Slots], Runner]


class KernelRuntime:
    """One kernel (spec at one configuration) on every shape and device it meets: plans and bound
    runners built once per (shapes, device) by the injected ``bind``."""

    def __init__(self, spec: KernelSpec, config: Mapping[str, int], sizes: Mapping[str, int | float],
                 bind: Binder, capacity: int = PLANS_KEPT) -> None:
        self.plans = PlanCache(spec, config, sizes, capacity)
        self._bind = bind
        self._runners: KeyedCache[tuple, Runner] = KeyedCache(
            lambda key, plan, slots: bind(plan, key[1], slots), capacity)

    @property
    def binds(self) -> int:
        return self._runners.builds

    def runner(self, shapes: Shapes, device: int, slots: Slots) -> tuple[ResolvedPlan, Runner]:
        """The plan at ``shapes`` (SpecError: not admitted) and its runner on ``device``."""
        plan = self.plans.plan(shapes)
        return plan, self._runners.get((shapes, device, slots.names), plan, slots)


class CudaBinder:
    """Binds plans for CUDA: modules loaded once per (device, compile options) from ``cubin(plan,
    device)``, descriptors from a shared :class:`DescriptorCache`."""

    def __init__(self, spec: KernelSpec, cubin: Callable[[ResolvedPlan, int], bytes],
                 descriptors: DescriptorCache) -> None:
        self.spec, self._cubin, self.descriptors = spec, cubin, descriptors
        self._modules: dict[tuple, Any] = {}
        self._smem: dict[tuple, int] = {}  # (device, options, kernel) -> dynamic shared memory opted into

    def module(self, plan: ResolvedPlan, device: int) -> tuple[Any, tuple]:
        """The module of ``plan`` on ``device``: the compile options follow from its tunables and
        defines (the spec and the device's arch being fixed)."""
        from kerngen.harness.gpu.launcher import LoadedModule

        key = (device, tuple(sorted(plan.config.items())), tuple(sorted(plan.defines.items())))
        if key not in self._modules:
            kernels = list(dict.fromkeys(launch.kernel for launch in plan.launches))
            self._modules[key] = LoadedModule(self._cubin(plan, device), kernels)
        return self._modules[key], key

    def __call__(self, plan: ResolvedPlan, device: int, slots: Slots) -> Runner:
        import cupy
        import torch

        from kerngen.harness.gpu.launcher import DEFAULT_SMEM_LIMIT, check_cooperative_fits

        with torch.cuda.device(device), cupy.cuda.Device(device):
            module, key = self.module(plan, device)
            index = slots.index()
            steps: list[tuple] = []
            for number, step in enumerate(plan.steps):
                if not isinstance(step, ResolvedLaunch):
                    steps.append(("memset", index[step.tensor], step.value))
                    continue
                fn = module.functions[step.kernel]
                opted = self._smem.get((*key, step.kernel), 0)
                if step.shared_mem > max(opted, DEFAULT_SMEM_LIMIT):
                    module.function(step.kernel, step.shared_mem)  # the attribute, once per larger need
                    self._smem[(*key, step.kernel)] = step.shared_mem
                if step.cooperative:
                    check_cooperative_fits(fn, step)
                steps.append(_bind_launch(fn, step, index, number))
        return _CudaRunner(steps, device, self.descriptors)


def _bind_launch(fn: Any, step: ResolvedLaunch, index: Mapping[str, int], number: int) -> tuple:
    """``("launch", fn, grid, block, args, fills, maps, smem, cooperative)``: ``args`` with the
    scalars packed and a 0 where a pointer goes; ``fills`` (position, slot) of plain pointers;
    ``maps`` (position, slot, box_rows, box_cols, swizzle) of TMA descriptors."""
    args: list[Any] = []
    fills: list[tuple[int, int]] = []
    maps: list[tuple[int, int, int, int, int]] = []
    for pos, arg in enumerate(step.args):
        if arg.kind in ("tensor", "tensormap"):
            if arg.name not in index:
                raise SpecError(f"step {number}: kernel {step.kernel}: no tensor bound to {arg.name!r}")
            if arg.kind == "tensor":
                fills.append((pos, index[arg.name]))
            else:
                assert arg.box is not None and arg.swizzle is not None
                maps.append((pos, index[arg.name], arg.box[0], arg.box[1], arg.swizzle))
            args.append(np.uint64(0))
        else:
            args.append(_SCALARS[arg.kind](arg.value))
    return ("launch", fn, step.grid, step.block, args, tuple(fills), tuple(maps), step.shared_mem, step.cooperative)


class _CudaRunner:
    """Runs bound steps on the tensors of one call, on torch's stream: pointers read, descriptors
    looked up, kernels launched with cupy. Nothing else."""

    def __init__(self, steps: list[tuple], device: int, descriptors: DescriptorCache) -> None:
        self.steps, self.device, self.descriptors = steps, device, descriptors
        self.has_maps = any(s[0] == "launch" and s[6] for s in steps)
        self._streams: dict[int, Any] = {}

    def _cupy_stream(self, stream: Any) -> Any:
        handle = stream.cuda_stream
        cs = self._streams.get(handle)
        if cs is None:
            import cupy

            cs = self._streams[handle] = cupy.cuda.ExternalStream(handle, self.device)
        return cs

    def __call__(self, tensors: Sequence[Any], stream: Any) -> None:
        import cupy
        import torch

        cs = self._cupy_stream(stream)
        capturing = self.has_maps and torch.cuda.is_current_stream_capturing()
        ptrs = [t.data_ptr() for t in tensors]
        for step in self.steps:
            if step[0] == "memset":
                _, slot, value = step
                t = tensors[slot]
                cupy.cuda.runtime.memsetAsync(ptrs[slot], value, t.numel() * t.element_size(), cs.ptr)
                continue
            _, fn, grid, block, template, fills, maps, smem, coop = step
            args = list(template)
            for pos, slot in fills:
                args[pos] = np.uint64(ptrs[slot])
            for pos, slot, rows, cols, swizzle in maps:
                args[pos] = np.uint64(self.descriptors.pointer(tensors[slot], self.device, rows, cols, swizzle,
                                                               capturing))
            # a cooperative grid was checked to be resident at once when it was bound
            fn(grid, block, tuple(args), shared_mem=smem, stream=cs, enable_cooperative_groups=coop)


__all__ = ["CudaBinder", "DescriptorCache", "KernelRuntime", "KeyedCache", "PlanCache", "Slots", "write_descriptor"]
