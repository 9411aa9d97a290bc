"""One call of an exported op, as short as it can be: the arguments' signature (shapes, dtypes,
devices) looks up what was decided for it the first time it was seen (:class:`OpRuntime`), and a
kernel entry (:class:`KernelEntry`) allocates the outputs and scratch from torch's caching allocator
and runs its bound plan (:mod:`.op_runtime`) on torch's current stream.

What to do with a signature never seen is the caller's (``admit``): :mod:`kerngen.results.exported_op`
picks the kernel of the shape bucket that admits it, or the problem's own PyTorch forward; the
worker's ``kerngen bench --op`` admits its one plan. Both register the op the same way
(:func:`register_op`), so the path timed is the path a user calls.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from kerngen.harness.gpu.op_runtime import Runner

Signature = tuple  # ((shape, dtype, device), ...) of the op's arguments
Entry = Callable[[tuple], Any]  # args -> the op's result


def signature(args: Sequence[Any]) -> Signature:
    """``((shape, dtype, device), ...)``; ValueError naming the first argument that is no tensor."""
    try:
        return tuple((t.shape, t.dtype, t.device) for t in args)
    except AttributeError:
        bad = next(i for i, t in enumerate(args) if not hasattr(t, "shape"))
        raise ValueError(f"argument {bad} must be a tensor, got {type(args[bad]).__name__}") from None


class KernelEntry:
    """What one signature runs: a bound plan, the shapes and dtypes of the outputs and of the
    scratch buffers it allocates per call, and the device. A call on the current device costs: the
    layout check of each argument, one ``torch.empty`` per output and scratch buffer, the raw handle
    of torch's current stream, and the runner."""

    __slots__ = ("runner", "outputs", "scratch", "device", "_index", "_allocs", "_single", "_empty", "_cuda_device",
                 "_raw_stream")

    def __init__(self, runner: Runner, outputs: tuple[tuple[tuple[int, ...], Any], ...],
                 scratch: tuple[tuple[int, Any], ...], device: Any) -> None:
        import torch

        self.runner = runner
        self.outputs = outputs  # (shape, torch dtype)
        self.scratch = scratch  # (elements, torch dtype)
        self.device = device  # torch.device
        self._allocs = tuple(outputs) + tuple(((n,), dtype) for n, dtype in scratch)
        self._single = len(outputs) == 1
        self._empty = torch.empty
        self._index = None if device.type != "cuda" else (device.index or 0)  # None: a CPU backend (the tests' emulator)
        if self._index is not None:
            # the raw calls torch.cuda.current_device() and current_stream().cuda_stream make, without their
            # Python layers (a torch without them takes the public ones)
            self._cuda_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
            self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
                lambda index: torch.cuda.current_stream(index).cuda_stream)

    def __call__(self, args: tuple) -> Any:
        dev, empty = self.device, self._empty
        # the harness checked the kernel on contiguous tensors: give it the same layout (no copy when already so)
        bound = [t if t.is_contiguous() else t.contiguous() for t in args]
        n = len(bound)
        bound += [empty(shape, dtype=dtype, device=dev) for shape, dtype in self._allocs]
        index = self._index
        if index is None:
            self.runner(bound, None)
        elif self._cuda_device() == index:
            self.runner(bound, self._raw_stream(index))
        else:
            import cupy
            import torch

            with torch.cuda.device(index), cupy.cuda.Device(index):
                self.runner(bound, self._raw_stream(index))
        return bound[n] if self._single else tuple(bound[n:n + len(self.outputs)])


class OpRuntime:
    """Signature -> entry, decided once by ``admit(args)`` (which may raise: nothing is remembered
    then, and the next call asks again). ``entries`` counts the signatures decided."""

    def __init__(self, admit: Callable[[tuple], Entry]) -> None:
        self._admit = admit
        self._entries: dict[Signature, Entry] = {}
        self._lock = threading.Lock()

    @property
    def entries(self) -> int:
        return len(self._entries)

    def entry(self, args: tuple) -> Entry:
        key = signature(args)
        entry = self._entries.get(key)
        if entry is None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    entry = self._entries[key] = self._admit(args)
        return entry

    def clear(self) -> None:
        """Forget every decision (the caller's rules changed: a new fallback, strict mode)."""
        with self._lock:
            self._entries.clear()

    def replace(self, args: tuple, entry: Entry) -> None:
        """What ``args``' signature runs from now on (an entry that decided after its first call)."""
        with self._lock:
            self._entries[signature(args)] = entry

    def __call__(self, *args: Any) -> Any:
        try:  # signature(args), inlined: this is every call's path
            entry = self._entries.get(tuple([(t.shape, t.dtype, t.device) for t in args]))
        except AttributeError:
            entry = None
        if entry is None:
            entry = self.entry(args)
        return entry(args)


_LIBRARIES: dict[str, Any] = {}  # qualname -> the torch.library.Library holding it (the op lives as long as it does)


def register_op(qualname: str, schema: str, implementation: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """The op ``qualname`` (``"ns::name"``) with ``schema`` (``"(Tensor x) -> Tensor"``), its
    ``implementation`` and a fake implementation (shapes without running anything): what
    torch.compile traces through without a graph break, and what CUDA graphs capture (the
    implementation's launches). Returns ``torch.ops.ns.name.default``.

    Registered with ``torch.library.Library`` (``define`` + ``impl`` for every backend + ``register_fake``)
    rather than ``torch.library.custom_op``: the latter routes every eager call through Python layers
    of its own (its autograd wrapper, the backend lookup) that cost several times the C++ dispatch
    (scripts/op_host_cost.py measures both). The op has no autograd formula: PyTorch's fallback runs it
    when inputs require grad and warns if a backward reaches it (gradients do not flow through it)."""
    import torch

    ns, _, name = qualname.partition("::")
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(f"{name}{schema}")
    lib.impl(name, implementation, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, fake, lib=lib)
    _LIBRARIES[qualname] = lib
    return getattr(getattr(torch.ops, ns), name).default


__all__ = ["Entry", "KernelEntry", "OpRuntime", "register_op", "signature"]
