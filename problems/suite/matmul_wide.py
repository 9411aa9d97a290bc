"""Matrix multiplication C = A @ B whose inputs span a wide dynamic range (10 orders of magnitude).

The suite's ``matmul`` draws A and B from N(0, 1): every element of a row has about the same size,
so a kernel that splits or quantises its operands in a way that only works for such data (a split
into fp16 halves, whose exponent range is narrow; one fixed-point scale per row or per tile, as in
int8 slicing schemes; a lower-precision product) can pass it. Here:

- row i of A is multiplied by 10**r_i, r_i uniform in [-3, 0]: outputs of one matrix differ by
  three orders of magnitude, so the elementwise check (|out - ref| <= atol + rtol * |ref|) is
  relative, not absolute, in the large rows;
- column j of B is multiplied by 10**c_j, c_j uniform in [-0.5, 0.5];
- column k of A is multiplied by 10**v_k and row k of B by 10**-v_k, v_k uniform in [-3, 3]: the
  products A[i, k] * B[k, j] keep the sizes they have in matmul (the scales cancel), but along a row of A
  the elements span 10**6 times their normal spread. A kernel that loses the small elements of a
  row (a per-row or per-tile exponent, an fp16 split that underflows) drops products that matter.

Why not wider: the check's atol is 1e-4, and a correct fp32 kernel's error grows with the size
of its outputs. The largest outputs here are ~5 (10**0.5 times the N(0, 1) problem's O(1), in its
tails); a serial fp32 chain (every product and add rounded) against the blocked reference uses
at most ~4% of the tolerance at K = 4096 (tests/agent/test_tf32.py), while a plain TF32 product is
off by ~3e-4 of itself and fails. Rows scaled by 1e-3 are checked only grossly (their outputs are
~1e-3, atol dominates): the large rows carry the check, and ||out - ref|| / ||ref|| <= 1e-5 weighs
them most.
"""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (4096, 4096, 4096)
SHAPE_NAMES = ("M", "N", "K")
SHAPE_ARITY = (1, 3)
SHAPE_DOC = "MxNxK: A (M, K) @ B (K, N) -> C (M, N); a single N means NxNxN"
DTYPE = torch.float32
_ROW_EXP = (-3.0, 0.0)  # A's rows scaled by 10**U(_ROW_EXP)
_COL_EXP = (-0.5, 0.5)  # B's columns scaled by 10**U(_COL_EXP)
_INNER_EXP = 3.0  # A's column k by 10**v_k, B's row k by 10**-v_k, v_k uniform in [-_INNER_EXP, _INNER_EXP]
KERNGEN_META = {
    "description": "C = A @ B with A (M, K), B (K, N), row-major, inputs over a wide dynamic range: A's rows "
    "scaled by 10**U(-3, 0), B's columns by 10**U(-0.5, 0.5), and A's column k / B's row k by 10**+-U(-3, 3) "
    "(cancelling in the products). Catches kernels that pass on N(0, 1) data only: fp16 splits, per-row or "
    "per-tile fixed-point scales, TF32 products; the largest outputs are ~5, so fp32 is checkable at 1e-4",
    "flops": "2*M*N*K",
}


def canonical_shape(shape):
    return tuple(shape) * 3 if len(shape) == 1 else tuple(shape)


def shape_of_inputs(shapes):
    """SHAPE from the inputs' shapes (an exported op's fallback at another shape): A (M, K), B (K, N)."""
    (m, k), (_, n) = shapes
    return (m, n, k)


class Model(nn.Module):
    """Single matrix multiplication."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def _exp10(n, lo, hi):
    """n factors 10**u, u uniform in [lo, hi] (computed in float64, returned in DTYPE)."""
    u = torch.rand(n, dtype=torch.float64) * (hi - lo) + lo
    return torch.pow(10.0, u).to(DTYPE)


def get_inputs():
    M, N, K = canonical_shape(SHAPE)
    base = K ** -0.25  # as in matmul: C is O(1) before the row and column scales
    inner = _exp10(K, -_INNER_EXP, _INNER_EXP)
    A = torch.randn(M, K, dtype=DTYPE) * base * _exp10(M, *_ROW_EXP)[:, None] * inner[None, :]
    B = torch.randn(K, N, dtype=DTYPE) * base / inner[:, None] * _exp10(N, *_COL_EXP)[None, :]
    return [A, B]


def get_init_inputs():
    return []
