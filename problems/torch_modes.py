"""The torch settings a reference runs under: true fp32 (no TF32) on CUDA
(:func:`strict_fp32`), or PyTorch's TF32 settings for a problem checked at ``--precision tf32``
(:func:`set_precision`), or PyTorch's defaults for the second baseline (:func:`pytorch_defaults`);
every tensor a problem file creates put on one device (:func:`force_device_mode`), and seeded RNGs
whose states are restored afterwards (:func:`seeded`)."""

from __future__ import annotations

import contextlib
import os
import random
from enum import Enum
from typing import Any, Iterator

__all__ = ["DEFAULTS_LABEL", "Precision", "TF32_LABEL", "force_device_mode", "precision_mode", "precision_of",
           "pytorch_defaults", "seeded", "set_precision", "strict_fp32"]


class Precision(str, Enum):
    """What a fp32 problem's kernels are checked against (``--precision``)."""

    fp32 = "fp32"  # true fp32: references with TF32 off everywhere, atol = rtol = 1e-4 (the default)
    tf32 = "tf32"  # PyTorch's TF32 settings (matmul and conv), tolerance measured (kerngen.harness.gpu.precision)


def precision_of(value: "Precision | str | None") -> Precision:
    """``None`` (a record from before the field) is true fp32."""
    return Precision(value) if value is not None else Precision.fp32


def strict_fp32() -> None:
    """fp32 references must be true fp32: no TF32 in cuBLAS or cuDNN. Call before building or
    running a reference on CUDA (cheap; idempotent)."""
    _set_tf32(False, False)


def set_precision(precision: "Precision | str | None") -> None:
    """The reference settings of ``precision``: :func:`strict_fp32`, or TF32 in cuBLAS and cuDNN
    (``torch.set_float32_matmul_precision("high")`` and ``allow_tf32``)."""
    on = precision_of(precision) is Precision.tf32
    _set_tf32(on, on)


# the labels of the second baseline, wherever a speedup is printed
DEFAULTS_LABEL = "PyTorch defaults (TF32 conv)"
TF32_LABEL = "PyTorch TF32 (conv and matmul)"


@contextlib.contextmanager
def pytorch_defaults(precision: "Precision | str | None" = None) -> Iterator[str]:
    """PyTorch's default settings while the block runs (cuDNN convolutions in TF32, matmuls as a
    fresh process has them: fp32 unless ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``); for a problem
    checked at ``tf32``, TF32 in matmuls too. Yields the label; the settings before are restored."""
    tf32 = precision_of(precision) is Precision.tf32
    matmul = tf32 or os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "") == "1"
    with _restored():
        _set_tf32(matmul, True)
        yield TF32_LABEL if tf32 else DEFAULTS_LABEL


@contextlib.contextmanager
def precision_mode(precision: "Precision | str | None") -> Iterator[None]:
    """The reference settings of ``precision`` (:func:`set_precision`) while the block runs; the
    settings before are restored (an exported op checks a new shape so, inside a user's process)."""
    with _restored():
        set_precision(precision)
        yield


@contextlib.contextmanager
def _restored() -> Iterator[None]:
    import torch

    before = _tf32_state()
    try:
        yield
    finally:
        _set_tf32(before[0], before[1])
        torch.set_float32_matmul_precision(before[2])


def _tf32_state() -> tuple[bool, bool, str]:
    import torch

    return (bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32),
            torch.get_float32_matmul_precision())


def _set_tf32(matmul: bool, conv: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = conv
    torch.set_float32_matmul_precision("high" if matmul else "highest")
    # torch >= 2.9 also has per-backend fp32_precision settings; make them explicit ("ieee" or
    # "tf32"), since cuDNN conv's default there is "tf32" and the legacy flag only resets it to "none".
    for backend, on in ((getattr(torch.backends.cuda, "matmul", None), matmul),
                        (getattr(torch.backends.cudnn, "conv", None), conv),
                        (getattr(torch.backends.cudnn, "rnn", None), conv)):  # fmt: skip
        if backend is not None and hasattr(backend, "fp32_precision"):
            try:
                backend.fp32_precision = "tf32" if on else "ieee"
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
