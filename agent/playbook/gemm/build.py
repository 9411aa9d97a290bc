"""Variant builders of the ``gemm`` family (each ``(match, defaults) -> KernelSpec``): the tiled fp32 GEMM with
a fused epilogue (nn.Linear + elementwise chain, transposed operands, batches, triu/tril masks), the
matrix-vector kernel for N == 1 and the row scaling that ``diag(d) @ M`` is.

The match's facts (made by :mod:`.gemm.gemm`) hold the problem's layout as expressions over the bound tensors'
shapes, so a spec follows the tensors it is resolved against:

- ``kind`` "gemm": ``a``/``b`` (tensor names), ``trans_a``/``trans_b``, ``M N K LDA LDB BATCH SA SB``
  (expressions), ``bias`` (a name or None), ``ep`` (an :class:`~.epilogue.Epilogue` or None), ``mask``
  ("" | "upper" | "lower") and ``diag``, ``what`` (a human description), ``shape`` (batch, M, N, K now);
- ``kind`` "rowscale": ``d`` (the diagonal), ``m`` (the matrix), ``R C`` (expressions).
"""

from __future__ import annotations

from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.epilogue import Epilogue
from kerngen.agent.playbook.family import Facts, FamilyMatch
from kerngen.agent.playbook.render import paren, MAX_SMEM, make_spec, pick, render

__all__ = ["GemmFacts", "as_gemm", "epilogue_vars", "gemm_facts", "gemm_gemv", "gemm_rowscale", "gemm_tiled"]

FAMILY = "gemm"  # the spec names are f"playbook-gemm-{variant}" (Family.spec_name), read back by the proposer


def _name(variant: str) -> str:
    return f"playbook-{FAMILY}-{variant.replace('_', '-')}"


class GemmFacts(Facts):
    """A batched GEMM out = A (M x K) @ B (K x N) as expressions over the bound tensors (``kind`` "gemm"), with a
    bias, an elementwise epilogue and a triangular mask; or a row scaling diag(d) @ m (``kind`` "rowscale")."""

    kind: str
    a: str = ""
    b: str = ""
    trans_a: bool = False
    trans_b: bool = False
    M: str = ""
    N: str = ""
    K: str = ""
    LDA: str = ""
    LDB: str = ""
    BATCH: str = "1"
    SA: str = "0"
    SB: str = "0"
    bias: str | None = None
    ep: Epilogue | None = None
    mask: str = ""
    diag: int = 0
    what: str = ""
    shape: tuple[int, int, int, int] = (1, 1, 1, 1)  # batch, M, N, K now
    d: str = ""  # rowscale
    m: str = ""
    R: str = ""
    C: str = ""
    dtype: str = "float32"  # the gemm16 family's bf16 / fp16 problems
    checks: tuple[str, ...] = ()  # more constraints on the bound tensors (the matmul family's: B's rows are K)



def _facts(m: FamilyMatch, kind: str) -> Any:
    if m.facts.kind != kind:
        raise ValueError(f"this variant computes a {kind}; the problem is a {m.facts.kind}")
    return m.facts


def epilogue_vars(f: Any) -> tuple[dict[str, Any], list[dict[str, str]], str]:
    """Template vars of the fused epilogue, the launch args of its extra tensors, and its formula."""
    ep = f.ep
    if ep is None or ep.empty:
        return dict(statements=(), expr="v", n_ep=0), [], ""
    args = [{"name": p.name} for p in ep.params]
    return dict(statements=ep.statements, expr=ep.expr, n_ep=len(ep.params)), args, ep.formula


def _bias_arg(f: Any) -> list[dict[str, str]]:
    return [{"name": f.bias}] if f.bias else []


def gemm_facts(m: FamilyMatch) -> Any:
    """The facts of a GEMM match (the layout expressions above); ValueError for another kind."""
    return _facts(m, "gemm")


def as_gemm(m: FamilyMatch) -> FamilyMatch:
    """The built-in ``matmul`` family's match (a plain 2-D A (M, K) @ B (K, N) of its two inputs) as a gemm one:
    the matmul family's kernels are this family's (:mod:`.gemm.matmul`)."""
    a, b = m.inputs[0], m.inputs[1]
    M, N, K = f"{a.name}.shape[0]", f"{b.name}.shape[1]", f"{a.name}.shape[1]"
    facts = GemmFacts(kind="gemm", a=a.name, b=b.name, M=M, N=N, K=K, LDA=K, LDB=N, what=f"{a.name} @ {b.name}",
                      shape=(1, a.shape[0], b.shape[1], a.shape[1]), checks=(f"{K} == {b.name}.shape[0]",))
    return FamilyMatch("gemm", m.inputs, m.params, m.outputs, facts, precision=m.precision)


def _gemv_serves(f: Any) -> bool:
    """The matrix-vector kernel takes N == 1 of this layout: a row-major A, no mask."""
    return not f.trans_a and not f.mask


# ---------------------------------------------------------------------------------------------
def gemm_tiled(m: FamilyMatch, defaults: dict[str, int], name: str = _name("tiled")) -> KernelSpec:
    f = _facts(m, "gemm")
    M, N, K, batch = paren(f.M), paren(f.N), paren(f.K), paren(f.BATCH)
    ep_vars, ep_args, formula = epilogue_vars(f)
    mask = f.mask or ""
    kernel = "gemm_tiled"
    src = render("gemm_tiled.cu.j2", kernel=kernel, has_bias=bool(f.bias), mask=mask, **ep_vars)
    base = dict(BM=128, BN=128, BK=16, TM=8, TN=8, GROUP_M=8, STAGES=2, CP_ASYNC=0, MIN_BLOCKS=1)
    tunables = dict(BM=[32, 64, 128, 256], BN=[32, 64, 128, 256], BK=[8, 16, 32], TM=[4, 8], TN=[4, 8],
                    GROUP_M=[1, 4, 8, 16], STAGES=[2, 3, 4], CP_ASYNC=[0, 1], MIN_BLOCKS=[1, 2])
    k_contiguous = not f.trans_a or f.trans_b  # an operand whose rows run along k
    if k_contiguous:  # transposing it into a k-major tile keeps the inner loop the classic outer product
        base["SMEM_T"] = 1
        tunables["SMEM_T"] = [0, 1]
    # skipping zero k ranges assumes triangular inputs: a tunable, off by default, and pinned to 0 without a
    # triangle (so that the idea that sets it renders nothing there instead of the parent again)
    base["TRI_SKIP"] = 0
    tunables["TRI_SKIP"] = [0, 1]
    tri_skip_ok = bool(mask) and f.diag == 0
    d = pick(defaults, base)

    vec_a, vec_b = f"{paren(f.LDA)} % 4 == 0", f"{paren(f.LDB)} % 4 == 0"
    nt = "((BM // TM) * (BN // TN))"
    a_tile = "BK * (BM + 4)" if f.trans_a else "(BK * (BM + 4) if SMEM_T else BM * (BK + 4))"
    b_tile = "(BK * (BN + 4) if SMEM_T else BN * (BK + 4))" if f.trans_b else "BK * (BN + 4)"
    smem = f"4 * STAGES * ({a_tile} + {b_tile})"
    # registers a thread needs, roughly: accumulators, one k step's fragments (4 k of one operand when a tile is
    # k-contiguous), the next tile's quads in flight (register pipeline only), addressing
    frag = "(TM + TN if SMEM_T else 4 * max(TM, TN) + 4)" if k_contiguous else "(TM + TN)"
    a_staged = "(1 - CP_ASYNC)" if f.trans_a else "(1 - CP_ASYNC * (1 - SMEM_T))"  # through registers
    b_staged = "(1 - CP_ASYNC * (1 - SMEM_T))" if f.trans_b else "(1 - CP_ASYNC)"
    regs = (f"(TM * TN + {frag} + 4 * ({a_staged} * ((BM * BK // 4) // {nt}) + {b_staged} * ((BN * BK // 4) // {nt}))"
            " + 32)")
    ring = "CP_ASYNC == 1 and SMEM_T == 0" if k_contiguous else "CP_ASYNC == 1"  # every tile by cp.async
    defines: dict[str, str | int] = dict(
        M_=M, N_=N, K_=K, LDA=paren(f.LDA), LDB=paren(f.LDB), SA=paren(f.SA), SB=paren(f.SB),
        TRANS_A=int(f.trans_a), TRANS_B=int(f.trans_b), VEC_A=vec_a, VEC_B=vec_b, VEC_C=f"{N} % 4 == 0",
        EVEN=f"{M} % BM == 0 and {N} % BN == 0 and {K} % BK == 0", DIAG=int(f.diag))
    constraints = [
        f"{M} >= 1 and {N} >= 1", f"{M} < 2**31 and {N} < 2**31 and {K} < 2**31",
        "BM % TM == 0", "BN % TN == 0", "TM % 4 == 0", "TN % 4 == 0",
        f"{nt} >= 32", f"{nt} <= 1024", f"{nt} * MIN_BLOCKS <= 2048",
        f"(BM * BK // 4) % {nt} == 0", f"(BN * BK // 4) % {nt} == 0",
        f"{smem} <= {MAX_SMEM}", f"{smem} * MIN_BLOCKS <= {MAX_SMEM}",
        f"{regs} <= 255", f"{regs} * {nt} * MIN_BLOCKS <= 65536",
        f"STAGES == 2 or ({ring})",  # a tile transposed through registers: a double buffer
        *([] if tri_skip_ok else ["TRI_SKIP == 0"]),
        *([f"{N} > 1"] if _gemv_serves(f) else []),  # one column: the matrix-vector kernel's (a tile wastes N side)
        f"CP_ASYNC == 0 or ({vec_a} and {vec_b})",  # 16-byte copies need 16-byte aligned rows
        f"cdiv({M}, BM) * cdiv({N}, BN) < 2**31", f"{batch} <= 65535", *f.checks,
    ]
    args = [{"name": f.a}, {"name": f.b}] + _bias_arg(f) + ep_args + [{"name": "out"}]
    epi = f", then {formula} in registers" if formula else ""
    masked = f", {mask} triangle kept ({'triu' if mask == 'upper' else 'tril'})" if mask else ""
    return make_spec(
        name,
        f"fp32 GEMM {f.what}{epi}{masked}: BM x BN block tile, TM x TN FFMA register tile per thread (no TF32), "
        "operand tiles in shared memory in their global layout (coalesced float4 loads, transposes as compile-time "
        "flags), register or cp.async pipeline, grouped block order for L2, predicated edges",
        src, tunables, d, defines=defines, constraints=constraints,
        steps=[dict(kernel=kernel, grid=[f"cdiv({M}, BM) * cdiv({N}, BN)", 1, batch], block=[nt],
                    shared_mem=smem, args=args)],
    )


def gemm_gemv(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = _facts(m, "gemm")
    if not _gemv_serves(f):
        raise ValueError("the matrix-vector kernel reads a row-major A without a mask")
    M, N, K, batch = paren(f.M), paren(f.N), paren(f.K), paren(f.BATCH)
    ep_vars, ep_args, formula = epilogue_vars(f)
    kernel = "gemm_gemv"
    src = render("gemm_gemv.cu.j2", kernel=kernel, has_bias=bool(f.bias), dtype="float32", **ep_vars)
    k_now = f.shape[3]
    long_rows = k_now >= 8192  # a block per row keeps enough bytes in flight; short rows: a warp each
    d = pick(defaults, dict(BLOCK=512 if long_rows else 256, TPR=512 if long_rows else 32, UNROLL=4, CACHE_HINT=0))
    vec = f"{paren(f.LDA)} % 4 == 0 and {K} % 4 == 0 and {paren(f.SB)} % 4 == 0"
    epi = f", then {formula}" if formula else ""
    return make_spec(
        _name("gemv"),
        f"fp32 matrix-vector product {f.what}{epi}: TPR threads per row, UNROLL 16-byte loads of A in flight "
        "per thread, float4 partial sums, warp-shuffle (+ shared memory) reduction per row",
        src,
        dict(BLOCK=[128, 256, 512, 1024], TPR=[32, 64, 128, 256, 512, 1024], UNROLL=[1, 2, 4, 8], CACHE_HINT=[0, 1]),
        d,
        defines=dict(M_=M, K_=K, LDA=paren(f.LDA), SA=paren(f.SA), SB=paren(f.SB), VEC=vec),
        constraints=[f"{N} == 1", f"{M} >= 1", "BLOCK % TPR == 0", f"cdiv({M}, BLOCK // TPR) < 2**31",
                     f"{batch} <= 65535"],
        steps=[dict(kernel=kernel, grid=[f"cdiv({M}, BLOCK // TPR)", batch], block=["BLOCK"],
                    args=[{"name": f.a}, {"name": f.b}] + _bias_arg(f) + ep_args + [{"name": "out"}])],
    )


def gemm_rowscale(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = _facts(m, "rowscale")
    R, C = paren(f.R), paren(f.C)
    kernel = "gemm_rowscale"
    src = render("gemm_rowscale.cu.j2", kernel=kernel)
    d = pick(defaults, dict(BLOCK=256, UNROLL=4, CACHE_HINT=0))
    vec = f"{C} % 4 == 0"
    return make_spec(
        _name("rowscale"),
        f"diag({f.d}) @ {f.m} as a row scaling out[r][c] = {f.d}[r] * {f.m}[r][c]: one pass, UNROLL "
        "16-byte loads in flight per thread, the diagonal read once per row",
        src,
        dict(BLOCK=[128, 256, 512, 1024], UNROLL=[1, 2, 4, 8], CACHE_HINT=[0, 1]),
        d,
        defines=dict(R_=R, C_=C, VEC=vec, CHUNK=f"BLOCK * UNROLL * (4 if {vec} else 1)"),
        constraints=[f"{R} >= 1 and {C} >= 1", f"cdiv({C}, BLOCK) < 2**31"],
        steps=[dict(kernel=kernel, grid=["cdiv(C_, CHUNK)", "min(R_, 65535)"], block=["BLOCK"],
                    args=[{"name": f.d}, {"name": f.m}, {"name": "out"}])],
    )
