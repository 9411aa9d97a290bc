"""The tolerance a check applies: the problem's own (true fp32: atol = rtol = 1e-4 and the dtype's
limit on ``||out - ref|| / ||ref||``), or, for a problem checked at ``--precision tf32``, one derived
from measurement.

At ``tf32`` the reference runs with PyTorch's TF32 settings (:func:`kerngen.problems.torch_modes.set_precision`),
and how far that result lies from the truth is measured once per problem on the GPU: on one input set
of the problem, PyTorch's TF32 output against the model run in fp64 (inputs and parameters in fp64;
a model that cannot run in fp64 is measured against its true fp32 output, and the tolerance says so).
For every fp32 output:

- ``atol`` = max(the problem's atol, MARGIN x the largest absolute deviation measured),
- the limit on ``||out - ref|| / ||ref||`` = max(fp32's 1e-5, MARGIN x the measured one),
- ``rtol`` stays the problem's.

MARGIN is 4: a kernel whose rounding is like PyTorch's TF32 (1xTF32) lies from the TF32 reference up
to twice as far as either lies from the truth (their errors add), and the check draws fresh seeds
whose errors vary (another factor of 2). So 1xTF32 and bf16x3-style kernels pass at ``tf32``, while a
kernel off by more than four times PyTorch's own TF32 error does not; at the default (true fp32) the
problem's tolerance is applied unchanged, and a 1xTF32 kernel fails it (``precision_loss``).
Outputs of other dtypes (bf16, fp16) keep their tolerance: TF32 does not touch them.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Callable

import torch

from kerngen.harness.gpu.compare import REL_ERR_LIMITS
from kerngen.harness.results import TF32_MARGIN, Tolerance  # the record: it travels in a Baseline
from kerngen.problems.torch_modes import Precision, precision_of, set_precision, strict_fp32

MEASURE_SEED = 7


def default_tolerance(info: Any) -> Tolerance:
    return Tolerance(atol=info.atol, rtol=info.rtol)


def tf32_tolerance(info: Any, tf32_outputs: list[torch.Tensor], truth: list[torch.Tensor], against: str) -> Tolerance:
    """The tolerance of :mod:`this module's <.precision>` rule from PyTorch's TF32 outputs and the truth (pure)."""
    worst_abs, worst_rel = 0.0, 0.0
    for got, want in zip(tf32_outputs, truth):
        if got.dtype != torch.float32 or got.numel() == 0:
            continue
        diff = got.double() - want.to(got.device).double()
        finite = torch.isfinite(diff)
        diff = torch.where(finite, diff, torch.zeros_like(diff))
        worst_abs = max(worst_abs, float(diff.abs().max()))
        norm = float(torch.where(finite, want.to(got.device).double(), torch.zeros_like(diff)).norm())
        if norm > 0:
            worst_rel = max(worst_rel, float(diff.norm()) / norm)
    return Tolerance(
        precision=Precision.tf32, atol=max(float(info.atol), TF32_MARGIN * worst_abs), rtol=float(info.rtol),
        rel_limits={"float32": max(REL_ERR_LIMITS["float32"], TF32_MARGIN * worst_rel)},
        measured_abs=worst_abs, measured_rel=worst_rel, against=against)


def measure_tf32(problem: Any, model: Any, device: Any, seed: int = MEASURE_SEED) -> Tolerance:
    """PyTorch's TF32 output against fp64 on one input set of ``problem`` (see the module docstring).
    Leaves the TF32 settings on (the reference's, at this precision)."""
    inputs = problem.make_inputs(device, seed)
    with torch.no_grad():
        set_precision(Precision.tf32)
        tf32 = [o.detach() for o in problem.run_reference(model, inputs)]
        truth, against = _truth(problem, model, inputs)
    set_precision(Precision.tf32)
    return tf32_tolerance(problem.info, tf32, truth, against)


def _truth(problem: Any, model: Any, inputs: list) -> tuple[list[torch.Tensor], str]:
    """The model's outputs in fp64, or in true fp32 when it does not run in fp64 (a forward that
    makes fp32 tensors of its own)."""
    strict_fp32()  # not problem.run_reference: it would set the problem's own precision (TF32) again
    try:
        model64 = copy.deepcopy(model).double()
        args64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        return _outputs(model64, args64), "fp64"
    except (RuntimeError, TypeError, ValueError) as exc:
        first = " ".join(str(exc).split())[:80]
        return _outputs(model, inputs), f"true fp32 (the model does not run in fp64: {first})"


def _outputs(model: Any, args: list) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*args)
    return [o.detach() for o in (out if isinstance(out, (list, tuple)) else [out])]


_MEASURED: "weakref.WeakKeyDictionary[Any, Tolerance]" = weakref.WeakKeyDictionary()


def tolerance_for(state: Any, measure: Callable[[Any, Any, Any], Tolerance] = measure_tf32) -> Tolerance:
    """The tolerance of a worker's problem state (:class:`~.check.ProblemState`): the problem's own,
    or at ``tf32`` the measured one (measured once per state: the worker's prepare step asks first)."""
    if precision_of(state.problem.ref.precision) is Precision.fp32:
        return default_tolerance(state.info)
    tol = _MEASURED.get(state)
    if tol is None:
        tol = _MEASURED[state] = measure(state.problem, state.model, state.device)
    return tol


__all__ = ["TF32_MARGIN", "Tolerance", "default_tolerance", "measure_tf32", "tf32_tolerance", "tolerance_for"]
