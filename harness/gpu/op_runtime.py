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

- the launches' argument tuples (pointers and descriptor addresses filled in): by the addresses of the
  call's tensors (:class:`_CudaRunner`; torch's caching allocator hands a loop the same addresses again).

A call then reads ``data_ptr()`` of its tensors, finds its launches and makes them on torch's current
stream: no host to device copy, no synchronisation, nothing allocated but the outputs and scratch (the
caller takes them from torch's caching allocator). A descriptor missing from the cache is written by a tiny kernel
whose parameters are its 128 bytes (:data:`STORE_SOURCE`); under CUDA graph capture that launch is
captured into the graph and the descriptor kept apart from the eager ones: its bytes exist only once
the graph replays.

Everything that touches the GPU is injected (``build``/``bind`` callables), so the caching is tested
without one (tests/harness/test_op_runtime.py).
"""

from __future__ import annotations

import threading
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

PREPARED_KEPT = 64  # argument tuples one bound plan keeps, by its tensors' addresses (and CUDA streams it wraps)
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

    def values(self) -> list[V]:
        return list(self._items.values())


# ----- TMA descriptors ----------------------------------------------------------------------------
@dataclass(frozen=True)
class MapBox:
    """What a descriptor is of, besides the tensor: the box, the swizzle, and how the tensor is seen
    (``full_width`` off: one k tile per box; ``view``: a shape of the same element count applied first,
    e.g. the 3xTF32 planes, 1-D scratch seen as [planes, rows, cols])."""
    rows: int
    cols: int
    swizzle: int
    full_width: bool = True
    view: tuple[int, ...] | None = None


MapKey = tuple  # (device index, data_ptr, shape, dtype, MapBox)
# (tensor, box, capturing) -> (the 128 bytes in device memory, anything to keep alive)
MapBuilder = Callable[[Any, MapBox, bool], tuple[Any, Any]]


class DescriptorCache:
    """TMA descriptors in device memory, built once per (device, address, shape, dtype, box). Those
    built while a CUDA graph is being captured are kept apart and never dropped (the graph writes and
    reads them on every replay)."""

    def __init__(self, build: MapBuilder, capacity: int = DESCRIPTORS_KEPT) -> None:
        self._build = build
        self._eager: KeyedCache[MapKey, tuple[Any, Any]] = KeyedCache(
            lambda key, tensor: build(tensor, key[4], False), capacity)
        self._captured: dict[MapKey, tuple[Any, Any]] = {}

    @property
    def builds(self) -> int:
        return self._eager.builds + len(self._captured)

    def entry(self, tensor: Any, device: int, box: MapBox, capturing: bool = False) -> tuple[Any, Any]:
        """(the descriptor's device buffer, anything kept alive with it) for ``tensor`` and this box."""
        key = (device, tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, box)
        if capturing and key not in self._eager:
            entry = self._captured.get(key)
            if entry is None:
                entry = self._captured[key] = self._build(tensor, box, True)
            return entry
        return self._eager.get(key, tensor)

    def pointer(self, tensor: Any, device: int, box: MapBox, capturing: bool = False) -> int:
        """The device address of the descriptor of ``tensor`` for this box."""
        return self.entry(tensor, device, box, capturing)[0].data_ptr()


# A tiny kernel writes a descriptor's 128 bytes from its own parameters: on a stream it is an
# ordinary launch (no host memory whose lifetime a graph would have to outlive, no pageable copy),
# and captured into a CUDA graph it is one kernel node whose parameters hold the bytes.
STORE_KERNEL = "kg_store_tensormap"
STORE_SOURCE = (f'extern "C" __global__ void {STORE_KERNEL}(unsigned long long* dst, '
                + ", ".join(f"unsigned long long w{i}" for i in range(16)) + ") {\n"
                + "".join(f"  dst[{i}] = w{i};\n" for i in range(16)) + "}\n")
_STORE: dict[int, Any] = {}  # device index -> the loaded store function
_STORE_CUBIN: dict[str, bytes] = {}  # arch -> cubin


def store_function(device: int) -> Any:
    """The descriptor-writing kernel on ``device`` (compiled with the harness's NVRTC job once per
    arch, loaded once per device: before any capture, when a plan with tensormaps is bound)."""
    fn = _STORE.get(device)
    if fn is None:
        import cupy
        import torch

        from kerngen.harness.compile.compiler import compile_job, job_for
        from kerngen.harness.compile.nvrtc_info import arch_for_capability
        from kerngen.harness.gpu.launcher import LoadedModule

        arch = arch_for_capability(*torch.cuda.get_device_capability(device))
        if arch not in _STORE_CUBIN:
            spec = KernelSpec.model_validate({"name": STORE_KERNEL, "source": STORE_SOURCE, "steps": [
                {"kernel": STORE_KERNEL, "grid": [1], "block": [1], "args": [{"name": "dst"}]}]})
            plan = resolve(spec, sizes={}, tensors={"dst": TensorFacts((16,))})
            _STORE_CUBIN[arch] = compile_job(job_for(spec, plan, arch)).cubin
        with cupy.cuda.Device(device):
            fn = _STORE[device] = LoadedModule(_STORE_CUBIN[arch], [STORE_KERNEL]).functions[STORE_KERNEL]
    return fn


def write_descriptor(tensor: Any, box: MapBox, capturing: bool) -> tuple[Any, Any]:
    """The descriptor of ``tensor`` written to device memory by :data:`STORE_KERNEL` on the current
    stream; outside a capture the stream is then synchronised once, so that the bytes are there for
    any stream from now on. A miss costs this; a hit costs nothing."""
    import struct

    import cupy
    import torch

    from kerngen.harness.gpu import tensormap

    what = f"tensormap of a {tuple(tensor.shape)} tensor"
    lay = tensormap.layout_for(tensor, box.rows, box.cols, box.swizzle, what, full_width=box.full_width, view=box.view)
    data = tensormap.encode(lay, int(tensor.data_ptr()), what)
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    view = tensormap.aligned_buffer(tensor.device)
    stream = torch.cuda.current_stream(tensor.device)
    words = [np.uint64(w) for w in struct.unpack("<16Q", data)]
    store_function(device)((1, 1, 1), (1, 1, 1), (np.uint64(view.data_ptr()), *words),
                           stream=cupy.cuda.ExternalStream(stream.cuda_stream, device))
    if not capturing:
        stream.synchronize()
    return view, None


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


Runner = Callable[[Sequence[Any], Any], None]  # (tensors in slot order, raw CUDA stream handle; None on a CPU backend) -> None
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

    @property
    def prepares(self) -> int:
        """Launch sets made by its bound runners (one per new set of addresses; a loop makes few)."""
        return sum(getattr(r, "prepares", 0) for r in self._runners.values())

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

        with torch.cuda.device(device), cupy.cuda.Device(device):
            module, key = self.module(plan, device)
            if any(a.kind == "tensormap" for step in plan.launches for a in step.args):
                store_function(device)  # loaded now, not first inside a CUDA graph capture
            steps = self.bind_steps(plan, module, key, slots)
        return _CudaRunner(steps, device, self.descriptors)

    def bind_steps(self, plan: ResolvedPlan, module: Any, key: tuple, slots: Slots) -> list[tuple]:
        """The steps of ``plan`` bound to ``module``'s functions (dynamic shared memory opted into
        where a launch needs more than the default): what :class:`_CudaRunner` runs. Inside the
        device's context (``__call__``); the CPU tests give it a stand-in module."""
        from kerngen.harness.gpu.launcher import DEFAULT_SMEM_LIMIT, check_cluster, check_cooperative_fits

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
            if step.cluster > 1:
                check_cluster(fn, step)
            steps.append(_bind_launch(fn, step, index, number))
        return steps


def _bind_launch(fn: Any, step: ResolvedLaunch, index: Mapping[str, int], number: int) -> tuple:
    """``("launch", fn, grid, block, args, fills, maps, smem, cooperative)``: ``args`` with the
    scalars packed and a 0 where a pointer goes; ``fills`` (position, slot) of plain pointers;
    ``maps`` (position, slot, :class:`MapBox`) of TMA descriptors."""
    args: list[Any] = []
    fills: list[tuple[int, int]] = []
    maps: list[tuple[int, int, MapBox]] = []
    for pos, arg in enumerate(step.args):
        if arg.kind in ("tensor", "tensormap"):
            if arg.name not in index:
                raise SpecError(f"step {number}: kernel {step.kernel}: no tensor bound to {arg.name!r}")
            if arg.kind == "tensor":
                fills.append((pos, index[arg.name]))
            else:
                assert arg.box is not None and arg.swizzle is not None
                view = tuple(int(v) for v in arg.view) if arg.view is not None else None
                maps.append((pos, index[arg.name], MapBox(arg.box[0], arg.box[1], arg.swizzle, arg.full_width, view)))
            args.append(np.uint64(0))
        else:
            args.append(_SCALARS[arg.kind](arg.value))
    return ("launch", fn, step.grid, step.block, args, tuple(fills), tuple(maps), step.shared_mem, step.cooperative)


class _CudaRunner:
    """Runs bound steps on the tensors of one call, on a CUDA stream. The launches' argument tuples
    (pointers filled in, TMA descriptors looked up) are built once per set of addresses and kept
    (:data:`PREPARED_KEPT`, oldest dropped first): torch's caching allocator hands the same addresses
    out again, so a loop's calls read ``data_ptr()`` of their tensors, find their launches and make
    them, nothing else. The stream is torch's raw handle (an int; a ``torch.cuda.Stream`` is taken
    too). ``stream_of``, ``memset``, ``capturing`` and ``pack`` are the CUDA leaves (injected by the CPU
    tests and scripts/op_host_cost.py); the defaults are cupy's and torch's."""

    def __init__(self, steps: list[tuple], device: int, descriptors: DescriptorCache,
                 stream_of: Callable[[int, int], Any] | None = None, memset: Callable[..., Any] | None = None,
                 capturing: Callable[[], bool] | None = None, pack: Callable[[Any], Any] | None = None) -> None:
        self.steps, self.device, self.descriptors = steps, device, descriptors
        self.has_maps = any(s[0] == "launch" and s[6] for s in steps)
        self._stream_of = stream_of or _cupy_stream
        self._pack = pack or _cupy_pack()
        self._memset = memset or (_cupy_memset() if any(s[0] == "memset" for s in steps) else None)
        self._capturing = capturing or _torch_capturing
        self._streams: dict[int, Any] = {}
        # addresses -> (launches, descriptor buffers they point to: kept alive as long as the launches)
        self._prepared: dict[tuple, tuple[tuple, list]] = {}
        self._lock = threading.Lock()  # the slow paths' (another thread's call may read meanwhile: dict reads are atomic)
        self.prepares = 0

    def __call__(self, tensors: Sequence[Any], stream: Any) -> None:
        if not isinstance(stream, int):
            stream = stream.cuda_stream
        cs = self._streams.get(stream)
        if cs is None:
            cs = self._stream(stream)
        ptrs = tuple([t.data_ptr() for t in tensors])
        got = self._prepared.get(ptrs)
        launches = got[0] if got is not None else self._prepare(tensors, ptrs)
        for fn, grid, block, args, smem, coop in launches:
            if fn is None:  # a memset: (None, address, value, bytes, 0, False)
                self._memset(grid, block, args, cs.ptr)
            elif coop:  # a cooperative grid was checked to be resident at once when it was bound
                fn(grid, block, args, shared_mem=smem, stream=cs, enable_cooperative_groups=True)
            else:
                fn(grid, block, args, smem, cs)

    def _stream(self, handle: int) -> Any:
        cs = self._stream_of(handle, self.device)
        with self._lock:
            if len(self._streams) >= PREPARED_KEPT:
                self._streams.clear()
            self._streams[handle] = cs
        return cs

    def _prepare(self, tensors: Sequence[Any], ptrs: tuple) -> tuple:
        """The launches at these addresses. Inside a CUDA graph capture a descriptor missing from
        the eager cache is captured (its bytes exist once the graph replays): such launches are
        used for this call only, never kept for eager calls."""
        self.prepares += 1
        capturing = self.has_maps and self._capturing()
        launches: list[tuple] = []
        alive: list[Any] = []
        for step in self.steps:
            if step[0] == "memset":
                _, slot, value = step
                t = tensors[slot]
                launches.append((None, ptrs[slot], value, t.numel() * t.element_size(), 0, False))
                continue
            _, fn, grid, block, template, fills, maps, smem, coop = step
            args = list(template)
            for pos, slot in fills:
                args[pos] = np.uint64(ptrs[slot])
            for pos, slot, box in maps:
                entry = self.descriptors.entry(tensors[slot], self.device, box, capturing)
                alive.append(entry)
                args[pos] = np.uint64(entry[0].data_ptr())
            launches.append((fn, grid, block, tuple(map(self._pack, args)), smem, coop))
        made = tuple(launches)
        if not capturing:
            with self._lock:
                if len(self._prepared) >= PREPARED_KEPT:
                    self._prepared.pop(next(iter(self._prepared)))
                self._prepared[ptrs] = (made, alive)
        return made


def _cupy_stream(handle: int, device: int) -> Any:
    import cupy

    return cupy.cuda.ExternalStream(handle, device)


def _cupy_pack() -> Callable[[Any], Any]:
    """A numpy scalar as cupy passes it to a kernel: cupy turns each argument into a ``CPointer`` to
    its bytes on every launch (for a numpy scalar, a new object per argument per call); a ``CPointer``
    it passes as it is. A launch set's arguments are made so once: ``CNumpyArray`` of a size-one
    array of the scalar, the very bytes cupy passes for a size-one numpy array. A cupy without that
    class gets the scalars (converted per call, as before)."""
    try:
        from cupy.cuda.function import CNumpyArray
    except ImportError:
        return lambda value: value
    return lambda value: CNumpyArray(np.array([value]))


def _cupy_memset() -> Callable[..., Any]:
    import cupy

    return cupy.cuda.runtime.memsetAsync


def _torch_capturing() -> bool:
    import torch

    return torch.cuda.is_current_stream_capturing()


__all__ = ["CudaBinder", "DescriptorCache", "KernelRuntime", "KeyedCache", "MapBox", "PlanCache", "STORE_SOURCE", "Slots",
           "store_function", "write_descriptor"]
