"""Compare one output with its reference: allclose with NaN/Inf agreement, the largest error and
where it is, the relative error ||out - ref|| / ||ref||, and whether unmatched elements were
never written (still poison). Pure torch: runs on CPU in tests, on GPU in the harness; chunk by
chunk, so that comparing a 15 GB output needs no 60 GB of fp64 temporaries, and a reference kept
in host memory (the memory plan of a large problem) is compared on the GPU.

A failed comparison also says where the wrong elements are and how wrong (``pattern``, see
:mod:`.error_pattern`): a second pass over the chunks, paid only by a candidate that failed."""

from __future__ import annotations

import torch
from pydantic import BaseModel

from kerngen.harness.gpu.buffers import Poison, still_poisoned
from kerngen.harness.gpu.error_pattern import describe
from kerngen.harness.results import CheckFailure


# ||out - ref|| / ||ref|| an honest kernel stays under, per output dtype. allclose alone lets a
# precision downgrade through where outputs are small next to atol (softmax rows of 65536 values
# are ~1e-5 each: bf16-rounded outputs pass atol=1e-4 but sit at ~2e-3 relative error).
REL_ERR_LIMITS = {"float32": 1e-5, "float64": 1e-10, "float16": 5e-3, "bfloat16": 1e-2}


# Above these, an output within atol/rtol is WRONG, not imprecise (CheckFailure.mismatch, not
# precision_loss). Rounding every value of an fp32 output to bf16, the coarsest 16-bit format,
# moves it by at most 2**-9 ~ 2e-3 of itself (~1.1e-3 for ||out-ref||/||ref||); fp16 by 2**-12. So
# 1e-2 is five times anything a lower precision inside an fp32/fp64 kernel gives: a kernel 3% off
# (softmax rows of 65536 values ~1.5e-5 each pass atol=1e-4 whatever they hold) has a logic error
# (a scale, a normalisation, a missed term), and the model must be told so, not "lower precision".
# A half-precision output gets five times its own limit: past that no honest rounding lands.
GROSS_REL_ERR = {"float32": 1e-2, "float64": 1e-2, "float16": 2.5e-2, "bfloat16": 5e-2}


def rel_err_limit(dtype: torch.dtype) -> float:
    return REL_ERR_LIMITS.get(str(dtype).removeprefix("torch."), 0.0)


def gross_rel_err(dtype: torch.dtype) -> float:
    """The relative error above which a within-tolerance output is a mismatch (0: none)."""
    return GROSS_REL_ERR.get(str(dtype).removeprefix("torch."), 0.0)


class Comparison(BaseModel):
    ok: bool
    failed: CheckFailure | None = None
    mismatches: int = 0
    max_abs_err: float = 0.0
    index: list[int] = []
    got: float | None = None
    expected: float | None = None
    rel_err: float = 0.0
    message: str = ""
    pattern: str = ""  # where the wrong elements are and how wrong (failures only; see error_pattern)


# elements compared at once: the fp64 copies and masks of a chunk stay near 1 GB whatever the size
# of the output, and a reference kept in host memory comes to the GPU one chunk at a time
CHUNK_ELEMENTS = 1 << 25


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    poison: Poison | None = None,
    name: str = "out",
    chunk: int = CHUNK_ELEMENTS,
    device: torch.device | None = None,
    rel_limit: float | None = None,
) -> Comparison:
    """``out`` against ``ref``, chunk by chunk on ``device`` (default: ``out``'s); either may live
    in host memory. The verdict and message are those of one whole-tensor comparison.
    ``rel_limit``: the limit on ||out-ref||/||ref|| when not the dtype's (a problem checked at
    ``--precision tf32``: :mod:`.precision`)."""
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return Comparison(
            ok=False,
            failed=CheckFailure.shape_mismatch,
            message=f"{name}: {out.dtype} {tuple(out.shape)} != reference {ref.dtype} {tuple(ref.shape)}",
        )
    dev = device if device is not None else out.device
    if not (out.is_floating_point() or out.is_complex()):
        c = _compare_exact(out.to(dev), ref.to(dev), poison, name)
        if not c.ok:
            c.pattern = describe(out, ref, atol=0.0, rtol=0.0, poison=poison, exact=True, name=name, chunk=chunk,
                                 device=dev)
        return c
    acc = _Totals()
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    for lo in range(0, max(out.numel(), 1), max(1, chunk)):
        hi = min(lo + chunk, out.numel())
        acc.add(lo, o_all[lo:hi].to(dev), r_all[lo:hi].to(dev), poison, atol, rtol)
    rel = acc.rel_err()
    shape = tuple(out.shape)
    if acc.nbad == 0:
        limit = rel_err_limit(ref.dtype) if rel_limit is None else rel_limit
        if not (limit and rel > limit):
            return _result(True, None, 0, acc.ok_worst, rel, name, shape, out.numel())
        return _too_far(out, ref, acc, rel, limit, atol, name, chunk, dev)
    failed = CheckFailure.nan_mismatch if acc.nonfinite_disagree else CheckFailure.mismatch
    if acc.unwritten:
        failed = CheckFailure.unwritten_output
    c = _result(False, failed, acc.nbad, acc.bad_worst, rel, name, shape, out.numel())
    c.pattern = describe(out, ref, atol=atol, rtol=rtol, poison=poison, name=name, chunk=chunk, device=dev)
    return c


def _too_far(out: torch.Tensor, ref: torch.Tensor, acc: "_Totals", rel: float, limit: float, atol: float,
             name: str, chunk: int, dev: torch.device) -> Comparison:
    """Every element within atol/rtol, but ||out-ref||/||ref|| over the dtype's limit: a mismatch
    past :data:`GROSS_REL_ERR` (a logic error hidden by atol), else precision_loss. The pattern
    calls an element wrong when it is off by more than the limit (of itself, or of the output's
    RMS for elements near zero): for precision loss that is nearly all of them, by a little."""
    dtype = str(ref.dtype).removeprefix("torch.")
    gross = max(gross_rel_err(ref.dtype), 2 * limit)  # a widened limit (tf32) stays below "wrong"
    shape = tuple(out.shape)
    rms = (acc.den2 / max(out.numel(), 1)) ** 0.5
    pattern = describe(out, ref, atol=limit * rms, rtol=limit, name=name, chunk=chunk, device=dev)
    if gross and rel > gross:
        c = _result(False, CheckFailure.mismatch, 0, acc.ok_worst, rel, name, shape, out.numel())
        c.message = (f"{name}: values wrong by {rel:.2%} (||out-ref||/||ref|| = {rel:.3g} > {gross:g} for {dtype}): "
                     f"a logic error, not rounding; they pass atol={atol:g} only because they are small")
    else:
        c = _result(False, CheckFailure.precision_loss, 0, acc.ok_worst, rel, name, shape, out.numel())
        c.message = (f"{name}: within atol/rtol but ||out-ref||/||ref|| = {rel:.3g} exceeds {limit:g} for "
                     f"{dtype} (lower precision inside?)")
    c.pattern = pattern
    return c


class _Totals:
    """What a whole-tensor comparison needs, summed over chunks: mismatches, the worst element
    (among all when everything matches, among the mismatches otherwise), the two norms."""

    def __init__(self) -> None:
        self.nbad = 0
        self.nonfinite_disagree = False
        self.unwritten = False
        self.num2 = 0.0  # ||out - ref||^2 over elements finite in both
        self.den2 = 0.0  # ||ref||^2 over the same
        self.ok_worst: tuple[float, int, float, float] = (-1.0, 0, 0.0, 0.0)  # (err, flat index, got, expected)
        self.bad_worst: tuple[float, int, float, float] = (-1.0, 0, 0.0, 0.0)

    def add(self, lo: int, out: torch.Tensor, ref: torch.Tensor, poison: Poison | None,
            atol: float, rtol: float) -> None:
        o, r = out.double(), ref.double()
        bad = ~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
        diff = (o - r).abs()
        finite = torch.isfinite(o) & torch.isfinite(r)
        fo, fr = (o, r) if bool(finite.all()) else (torch.where(finite, o, 0.0), torch.where(finite, r, 0.0))
        self.num2 += float(torch.linalg.vector_norm(fo - fr)) ** 2
        self.den2 += float(torch.linalg.vector_norm(fr)) ** 2
        self.ok_worst = _worse(self.ok_worst, torch.where(finite, diff, torch.zeros_like(diff)), lo, o, r)
        nbad = int(bad.sum())
        if nbad:
            self.nbad += nbad
            self.nonfinite_disagree |= bool((bad & ~finite).any())
            if poison is not None and bool((still_poisoned(out, poison, lo) & bad).any()):
                self.unwritten = True
            worst = torch.where(bad, torch.nan_to_num(diff, nan=float("inf")), torch.zeros_like(diff))
            self.bad_worst = _worse(self.bad_worst, worst, lo, o, r)

    def rel_err(self) -> float:
        num, den = self.num2 ** 0.5, self.den2 ** 0.5
        return num / den if den > 0 else num


def _worse(best: tuple[float, int, float, float], worst: torch.Tensor, lo: int, o: torch.Tensor,
           r: torch.Tensor) -> tuple[float, int, float, float]:
    if worst.numel() == 0:
        return best
    i = int(torch.argmax(worst))
    err = float(worst[i])
    # strictly greater: the first occurrence wins, as torch.argmax over the whole tensor would
    return (err, lo + i, float(o[i]), float(r[i])) if err > best[0] else best


def _compare_exact(out, ref, poison, name) -> Comparison:
    bad = out != ref
    nbad = int(bad.sum())
    if nbad == 0:
        return Comparison(ok=True, message=f"{name}: exact match")
    failed = CheckFailure.mismatch
    if poison is not None and bool((still_poisoned(out, poison) & bad).any()):
        failed = CheckFailure.unwritten_output
    flat = bad.reshape(-1)
    i = int(torch.argmax(flat.to(torch.uint8)))
    worst = (1.0, i, float(out.reshape(-1)[i]), float(ref.reshape(-1)[i]))
    return _result(False, failed, nbad, worst, 1.0, name, tuple(out.shape), out.numel())


def _result(ok, failed, nbad, worst: tuple[float, int, float, float], rel, name, shape, numel) -> Comparison:
    max_err, flat, got, expected = worst if numel else (0.0, 0, None, None)  # empty: no element to name
    max_err = max(max_err, 0.0)
    index = list(_unravel(flat, shape)) if numel else []
    where = f"{name}[{', '.join(map(str, index))}]"
    if ok:
        msg = f"{name}: max abs err {max_err:.3g} at {where}, rel err {rel:.3g}"
    else:
        msg = (
            f"{name}: {nbad} of {numel} elements differ ({failed.value}); worst at {where}: "
            f"got {got:.6g}, expected {expected:.6g}; rel err {rel:.3g}"
        )
    return Comparison(
        ok=ok, failed=failed, mismatches=nbad, max_abs_err=max_err, index=index,
        got=got, expected=expected, rel_err=rel, message=msg,
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim)
        flat //= dim
    return tuple(reversed(out))
