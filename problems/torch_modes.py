"""The torch settings a reference runs under: true fp32 (no TF32) on CUDA
(:func:`strict_fp32`), every tensor a problem file creates put on one device
(:func:`force_device_mode`), and seeded RNGs whose states are restored afterwards
(:func:`seeded`)."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator

__all__ = ["force_device_mode", "seeded", "strict_fp32"]


def strict_fp32() -> None:
    """fp32 references must be true fp32: no TF32 in cuBLAS or cuDNN. Call before building or
    running a reference on CUDA (cheap; idempotent)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # torch >= 2.9 also has per-backend fp32_precision settings; make them explicit ("ieee"),
    # since cuDNN conv's default there is "tf32" and the legacy flag only resets it to "none".
    for backend in (getattr(torch.backends.cuda, "matmul", None), getattr(torch.backends.cudnn, "conv", None),
                    getattr(torch.backends.cudnn, "rnn", None)):  # fmt: skip
        if backend is not None and hasattr(backend, "fp32_precision"):
            try:
                backend.fp32_precision = "ieee"
            except (RuntimeError, ValueError, AttributeError):  # pragma: no cover - older torch
                pass


def force_device_mode(device: Any):
    """A torch-function mode that puts every tensor a problem file creates on ``device``:
    factory functions (``torch.randn(..., device='cuda')`` included), ``Tensor.cuda()``,
    ``Tensor.cpu()`` and ``Tensor.to(<device>)``. So ``get_inputs`` lands directly on the GPU
    (no host copy of GB inputs), and files that hard-code ``.cuda()`` still describe on meta
    and run on a CPU-only machine."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    dev = torch.device(device)
    constructors = _device_constructors()
    tensor_cuda, tensor_cpu, tensor_to = torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.to

    class _ForceDevice(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in constructors:
                kwargs["device"] = dev
            elif func is tensor_cuda or func is tensor_cpu:
                kwargs.pop("device", None)
                return tensor_to(args[0], dev, **{k: v for k, v in kwargs.items() if k == "non_blocking"})
            elif func is tensor_to:
                args = tuple(
                    dev if i > 0 and isinstance(a, (str, torch.device)) else a for i, a in enumerate(args)
                )
                if "device" in kwargs:
                    kwargs["device"] = dev
            return func(*args, **kwargs)

    return _ForceDevice()


@contextlib.contextmanager
def seeded(seed: int, device: Any) -> Iterator[None]:
    """Seed torch (CPU and the device), ``random`` and numpy; restore their states afterwards."""
    import torch

    dev = torch.device(device)
    devices: list[int] = []
    if dev.type == "cuda":
        devices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    py_state = random.getstate()
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            if np is not None:
                np.random.seed(seed % (2**32))
            yield
    finally:
        random.setstate(py_state)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)
