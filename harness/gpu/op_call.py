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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class KernelEntry:
    """What one signature runs: a bound plan, the shapes and dtypes of the outputs and of the
    scratch buffers it allocates per call, and the device."""

    runner: Runner
    outputs: tuple[tuple[tuple[int, ...], Any], ...]  # (shape, torch dtype)
    scratch: tuple[tuple[int, Any], ...]  # (elements, torch dtype)
    device: Any  # torch.device

    def __call__(self, args: tuple) -> Any:
        import torch

        dev = self.device
        # the harness checked the kernel on contiguous tensors: give it the same layout (no copy when already so)
        tensors = [t if t.is_contiguous() else t.contiguous() for t in args]
        outs = [torch.empty(shape, dtype=dtype, device=dev) for shape, dtype in self.outputs]
        scratch = [torch.empty((n,), dtype=dtype, device=dev) for n, dtype in self.scratch]
        bound = [*tensors, *outs, *scratch]
        if dev.type != "cuda":  # a CPU backend: the tests' emulator
            self.runner(bound, None)
        elif dev.index == torch.cuda.current_device():
            self.runner(bound, torch.cuda.current_stream(dev))
        else:
            import cupy

            with torch.cuda.device(dev), cupy.cuda.Device(dev.index):
                self.runner(bound, torch.cuda.current_stream(dev))
        return outs[0] if len(outs) == 1 else tuple(outs)


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
        return self.entry(args)(args)


def register_op(qualname: str, schema: str, implementation: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """``torch.library.custom_op(qualname)`` with ``schema``, ``implementation`` and a fake
    implementation (shapes without running anything): what torch.compile traces through without a
    graph break, and what CUDA graphs capture (the implementation's launches)."""
    import torch

    op = torch.library.custom_op(qualname, implementation, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


__all__ = ["Entry", "KernelEntry", "OpRuntime", "register_op", "signature"]
