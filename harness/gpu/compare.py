"""Compare one output with its reference: allclose with NaN/Inf agreement, the largest error and
where it is, the relative error ||out - ref|| / ||ref||, and whether unmatched elements were
never written (still poison). Pure torch: runs on CPU in tests, on GPU in the harness."""

from __future__ import annotations

import torch
from pydantic import BaseModel

from kerngen.harness.gpu.buffers import still_poisoned
from kerngen.harness.results import CheckFailure


# ||out - ref|| / ||ref|| an honest kernel stays under, per output dtype. allclose alone lets a
# precision downgrade through where outputs are small next to atol (softmax rows of 65536 values
# are ~1e-5 each: bf16-rounded outputs pass atol=1e-4 but sit at ~2e-3 relative error).
REL_ERR_LIMITS = {"float32": 1e-5, "float64": 1e-10, "float16": 5e-3, "bfloat16": 1e-2}


def rel_err_limit(dtype: torch.dtype) -> float:
    return REL_ERR_LIMITS.get(str(dtype).removeprefix("torch."), 0.0)


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


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    poison: torch.Tensor | None = None,
    name: str = "out",
) -> Comparison:
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return Comparison(
            ok=False,
            failed=CheckFailure.shape_mismatch,
            message=f"{name}: {out.dtype} {tuple(out.shape)} != reference {ref.dtype} {tuple(ref.shape)}",
        )
    if not (out.is_floating_point() or out.is_complex()):
        return _compare_exact(out, ref, poison, name)
    o, r = out.double(), ref.double()
    close = torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
    bad = ~close
    nbad = int(bad.sum())
    diff = (o - r).abs()
    finite_both = torch.isfinite(o) & torch.isfinite(r)
    rel = _rel_err(o, r, finite_both)
    if nbad == 0:
        worst = torch.where(finite_both, diff, torch.zeros_like(diff))
        limit = rel_err_limit(ref.dtype)
        if limit and rel > limit:
            c = _result(False, CheckFailure.precision_loss, 0, worst, o, r, rel, name)
            c.message = (f"{name}: within atol/rtol but ||out-ref||/||ref|| = {rel:.3g} exceeds {limit:g} for "
                         f"{str(ref.dtype).removeprefix('torch.')} (lower precision inside?)")
            return c
        return _result(True, None, 0, worst, o, r, rel, name)
    nonfinite_disagree = bad & ~(finite_both)
    failed = CheckFailure.nan_mismatch if bool(nonfinite_disagree.any()) else CheckFailure.mismatch
    if poison is not None and bool((still_poisoned(out, poison) & bad).any()):
        failed = CheckFailure.unwritten_output
    worst = torch.where(bad, torch.nan_to_num(diff, nan=float("inf")), torch.zeros_like(diff))
    return _result(False, failed, nbad, worst, o, r, rel, name)


def _compare_exact(out, ref, poison, name) -> Comparison:
    bad = out != ref
    nbad = int(bad.sum())
    if nbad == 0:
        return Comparison(ok=True, message=f"{name}: exact match")
    failed = CheckFailure.mismatch
    if poison is not None and bool((still_poisoned(out, poison) & bad).any()):
        failed = CheckFailure.unwritten_output
    diff = bad.to(torch.float64)
    return _result(False, failed, nbad, diff, out.double(), ref.double(), 1.0, name)


def _rel_err(o: torch.Tensor, r: torch.Tensor, finite: torch.Tensor) -> float:
    if not bool(finite.all()):
        o, r = torch.where(finite, o, 0.0), torch.where(finite, r, 0.0)
    denom = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / denom if denom > 0 else num


def _result(ok, failed, nbad, worst, o, r, rel, name) -> Comparison:
    flat = int(torch.argmax(worst.reshape(-1)))
    index = list(_unravel(flat, tuple(o.shape)))
    got, expected = float(o.reshape(-1)[flat]), float(r.reshape(-1)[flat])
    max_err = float(worst.reshape(-1)[flat])
    where = f"{name}[{', '.join(map(str, index))}]"
    if ok:
        msg = f"{name}: max abs err {max_err:.3g} at {where}, rel err {rel:.3g}"
    else:
        msg = (
            f"{name}: {nbad} of {o.numel()} elements differ ({failed.value}); worst at {where}: "
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
