"""Playbook family ``gemm``: fp32 GEMMs the built-in ``matmul`` family does not take.

- ``nn.Linear`` followed by an elementwise chain (KernelBench level 2's Gemm_* / Matmul_* files): ``x @ W^T + b``
  with the chain fused into the store (:mod:`.epilogue` traces it); B is the weight, read transposed.
- contractions read from the traced forward (level 1): ``torch.bmm``, an n-D tensor times a matrix (the leading
  dims flattened into M), ``einsum`` of one contracted index, transposed operands (``.T``, ``.mT``, ``.t()``,
  ``transpose``/``permute`` of the last two dims: the kernel reads the operand's strides, nothing is
  materialised), ``triu``/``tril`` of a product (a masked epilogue), matrix-vector products (N == 1);
- ``diag(d) @ M`` and ``d.unsqueeze(1) * M``: a row scaling, served by its own small kernel.

A plain 2-D ``A @ B`` of two inputs with N > 1 stays with the built-in ``matmul`` family (None here). A GEMM
followed by a row reduction, a normalisation or a pool is the ``gemm_rows`` family's (asked first); what of it
reaches this family (two GEMMs, a product of two inputs) raises :class:`NotCovered` saying which op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kerngen.agent.playbook.gemm.build import GemmFacts, gemm_gemv, gemm_rowscale, gemm_tiled
from kerngen.agent.playbook.gemm import build_tf32 as build_gemm_tf32, wgmma
from kerngen.agent.playbook.entry import A, C, CF, M, PAR, Entry
from kerngen.agent.playbook.epilogue import trace_constant_tail, trace_epilogue
from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Node, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import Kind, dim_text, kind_of
from kerngen.agent.playbook.leads import Lead

__all__ = ["GEMM", "GemmFacts", "operand_of", "read_gemm"]

CONTRACTIONS = ("linear", "matmul", "mm", "bmm", "einsum")
_MATMULS = ("matmul", "mm", "bmm")
_MASKS = {"triu": "upper", "tril": "lower"}
_NORMS = {"group_norm": "statistics over groups of columns", "layer_norm": "statistics over each row",
          "instance_norm": "statistics over each row"}
_POOLS = ("max_pool1d", "avg_pool1d", "adaptive_avg_pool1d", "adaptive_max_pool1d")
_FOLLOWED = ("a matrix product followed by other ops: the gemm family fuses an elementwise epilogue after an "
             "nn.Linear module, or one of constants alone after a batched or transposed product")


# ---------------------------------------------------------------------------------------------
# why a GEMM problem is refused
def _refusal(g: Graph) -> str | None:
    """The first op after the GEMM that makes the graph more than GEMM + elementwise."""
    for n in g.live():
        if n.op in _NORMS:
            return f"gemm followed by {n.op} ({_NORMS[n.op]}): not covered by the playbook yet"
        if n.op == "batch_norm" and n["training"]:
            return "gemm followed by batch_norm with batch statistics: not covered by the playbook yet"
        if n.op in _POOLS:
            return f"gemm followed by {n.op} over the columns (a windowed reduction): not covered by the playbook yet"
        if kind_of(n.op) in (Kind.reduction, Kind.softmax, Kind.scan) and not (n.op in ("max", "min")
                                                                                 and n.overload == "other"):
            dim = n.get("dim")
            text = f"{n.op} over all elements" if dim in (None, []) else f"{n.op} over dim {dim_text(dim)}"
            return f"gemm followed by a row reduction ({text}): not covered by the playbook yet"
    return None


# ---------------------------------------------------------------------------------------------
# nn.Linear + elementwise epilogue
def _shape_expr(name: str, dims: list[int] | range | tuple[int, ...]) -> str:
    return " * ".join(f"{name}.shape[{i}]" for i in dims) or "1"


def _linear(g: Graph, linears: list[Node]) -> FamilyMatch:
    if len(linears) > 1:
        raise NotCovered(f"{len(linears)} nn.Linear calls (a chain of GEMMs): the playbook fuses one GEMM with an "
                         "elementwise epilogue")
    n = linears[0]
    why = _refusal(g)
    if why:
        raise NotCovered(why)
    x, w = g.tensor(n["input"]), g.tensor(n["weight"])
    if x is None or not g.is_input(x.name) or not x.shape or w is None or x.shape[-1] != w.shape[-1]:
        raise NotCovered("the nn.Linear module is not applied directly to a forward input of in_features columns")
    weight, bias = w.name, n["bias"]
    if not g.is_param(weight):
        raise NotCovered(f"no parameter {weight} among the model's parameters")
    if bias is not None and not g.is_param(bias):
        raise NotCovered(f"the linear's bias {bias!r} is not a parameter of the model: not covered")
    lead_shape = tuple(x.shape[:-1]) + (w.shape[0],)
    try:
        ep = trace_epilogue(g, n, channel_dim=-1)
    except NotCovered as exc:
        raise NotCovered(f"gemm + epilogue: {exc}") from None
    nd = len(x.shape)
    k = f"{x.name}.shape[{nd - 1}]"
    what = f"{x.name} @ {weight}^T" + (f" + {bias}" if bias else "")
    facts = GemmFacts(kind="gemm", a=x.name, b=weight, trans_a=False, trans_b=True, M=_shape_expr(x.name, range(nd - 1)),
                      N=f"{weight}.shape[0]", K=k, LDA=k, LDB=f"{weight}.shape[1]", BATCH="1", SA="0", SB="0",
                      bias=bias, ep=ep, mask="", diag=0, what=what,
                      shape=(1, math.prod(x.shape[:-1]), lead_shape[-1], x.shape[-1]))
    return FamilyMatch.of(g, facts, f"gemm: {what}" + (f", epilogue {ep.formula}" if not ep.empty else ""))


# ---------------------------------------------------------------------------------------------
# contractions
@dataclass(frozen=True)
class Operand:
    name: str  # a forward input or a parameter
    trans: bool  # its last two dims are swapped before the product
    diag: bool = False  # torch.diag of a vector


def operand_of(g: Graph, ref: Any, op: str) -> Operand:
    """A product's operand: a tensor of the graph, its transpose (``.T``, ``.t()``, ``transpose`` or ``permute``
    of the last two dims) or ``diag`` of a vector; NotCovered for anything computed."""
    if isinstance(ref, Ref) and g.tensor(ref) is not None:
        return Operand(str(ref), False)
    n = g.node(ref) if isinstance(ref, Ref) else None
    base = n.args.get("self") if n is not None else None
    if n is None or not isinstance(base, Ref) or g.tensor(base) is None:
        what = f" ({n.op})" if n is not None else ""
        raise NotCovered(f"an operand of {op} is computed in the forward{what}: not covered by the gemm family")
    nd = len(g.tensor(base).shape)
    last_two = {nd - 2, nd - 1}
    if (n.op == "numpy_T" and nd == 2) or (n.op == "t" and nd == 2) or n.op == "mT":
        return Operand(str(base), True)
    if n.op == "transpose" and {n["dim0"] % nd, n["dim1"] % nd} == last_two:
        return Operand(str(base), True)
    if n.op == "permute" and tuple(d % nd for d in n["dims"]) == tuple(range(nd - 2)) + (nd - 1, nd - 2):
        return Operand(str(base), True)
    if n.op == "diag" and nd == 1 and n["diagonal"] == 0:
        return Operand(str(base), False, diag=True)
    raise NotCovered(f"an operand of {op} is computed in the forward ({n.op} of {base}): not covered by the gemm "
                     "family")


@dataclass(frozen=True)
class Layout:
    """Which stored dims of A and B are batch, M, K, N (None: N == 1 for a vector B)."""

    a_batch: tuple[int, ...]
    m_dims: tuple[int, ...]
    k_a: int
    b_batch: tuple[int, ...]
    k_b: int
    n_dim: int | None


def _matmul_layout(op: str, a: Operand, b: Operand, na: int, nb: int) -> Layout:
    if (op == "mm" and (na, nb) != (2, 2)) or (op == "bmm" and (na, nb) != (3, 3)) or na < 2:
        raise NotCovered(f"{op} of a {na}-D and a {nb}-D tensor is not covered by the gemm family")
    if a.trans:
        a_batch, m_dims, k_a = tuple(range(na - 2)), (na - 1,), na - 2
    elif nb <= 2:  # B is one matrix: the leading dims of a row-major A are just more rows
        a_batch, m_dims, k_a = (), tuple(range(na - 1)), na - 1
    else:
        a_batch, m_dims, k_a = tuple(range(na - 2)), (na - 2,), na - 1
    if nb == 1:
        return Layout(a_batch, m_dims, k_a, (), 0, None)
    if b.trans:
        return Layout(a_batch, m_dims, k_a, tuple(range(nb - 2)), nb - 1, nb - 2)
    return Layout(a_batch, m_dims, k_a, tuple(range(nb - 2)), nb - 2, nb - 1)


def _einsum_layout(eq: Any, na: int, nb: int) -> tuple[Layout, bool, bool]:
    if not isinstance(eq, str) or "->" not in eq or "." in eq:
        raise NotCovered("einsum without an explicit '->' output (or with '...') is not covered")
    lhs, out = eq.replace(" ", "").split("->")
    subs = lhs.split(",")
    if len(subs) != 2:
        raise NotCovered("einsum of other than two operands is not covered")
    sa, sb = subs
    if len(sa) != na or len(sb) != nb or any(len(set(s)) != len(s) for s in (sa, sb, out)):
        raise NotCovered(f"einsum {eq!r}: repeated indices or subscripts that do not match the operands")
    ks = [c for c in sa if c in sb and c not in out]
    batch = "".join(c for c in out if c in sa and c in sb)
    ms = "".join(c for c in out if c in sa and c not in sb)
    ns = "".join(c for c in out if c in sb and c not in sa)
    if len(ks) != 1 or len(ns) != 1 or out != batch + ms + ns or len(sa) != len(batch + ms) + 1 or \
            len(sb) != len(batch) + 2 or not ms:
        raise NotCovered(f"einsum {eq!r} is not one matrix product (batch, rows, one contracted index, one column)")
    k = ks[0]
    if sa == batch + ms + k:
        trans_a = False
    elif sa == batch + k + ms and len(ms) == 1:
        trans_a = True
    else:
        raise NotCovered(f"einsum {eq!r}: the first operand's dims are not (batch, rows, k) or (batch, k, row)")
    if sb not in (batch + k + ns, batch + ns + k):
        raise NotCovered(f"einsum {eq!r}: the second operand's dims are not (batch, k, n) or (batch, n, k)")
    trans_b = sb == batch + ns + k
    nbt = len(batch)
    m_dims = tuple(sa.index(c) for c in ms)
    # a row-major A with several row indices after the batch ones: they flatten into M (contiguous)
    lay = Layout(tuple(range(nbt)), m_dims if not trans_a else (nbt + 1,), sa.index(k), tuple(range(nbt)),
                 sb.index(k), sb.index(ns))
    return lay, trans_a, trans_b


def _shapes(g: Graph) -> dict[str, tuple[int, ...]]:
    return {t.name: t.shape for t in (*g.inputs, *g.params)}


def _gemm_facts(g: Graph, op: str, a: Operand, b: Operand, lay: Layout, mask: str, diag: int) -> GemmFacts:
    shapes = _shapes(g)
    sa, sb = shapes[a.name], shapes[b.name]
    if sa[lay.k_a] != sb[lay.k_b]:
        raise NotCovered(f"{op} operands do not contract: {a.name} {sa}, {b.name} {sb}")
    ab, bb = [sa[i] for i in lay.a_batch], [sb[i] for i in lay.b_batch]
    if ab and bb and ab != bb:
        raise NotCovered(f"{op} with broadcast batch dims ({a.name} {sa}, {b.name} {sb}) is not covered")
    n_now = sb[lay.n_dim] if lay.n_dim is not None else 1
    want = tuple(ab or bb) + tuple(sa[i] for i in lay.m_dims) + ((n_now,) if lay.n_dim is not None else ())
    if tuple(g.out.shape) != want:
        raise NotCovered(f"{op} output {g.out.shape} is not the product's shape {want}")
    M, K = _shape_expr(a.name, lay.m_dims), f"{a.name}.shape[{lay.k_a}]"
    N = f"{b.name}.shape[{lay.n_dim}]" if lay.n_dim is not None else "1"
    batch = _shape_expr(a.name, lay.a_batch) if ab else _shape_expr(b.name, lay.b_batch)
    what = f"{a.name}{'^T' if a.trans else ''} @ {b.name}{'^T' if b.trans else ''}"
    if ab or bb:
        what += f" (batch of {math.prod(ab or bb)}{'' if ab and bb else ', one operand shared'})"
    elif len(lay.m_dims) > 1:
        what += f" ({a.name}'s leading dims as {math.prod(sa[i] for i in lay.m_dims)} rows)"
    return GemmFacts(kind="gemm", a=a.name, b=b.name, trans_a=a.trans, trans_b=b.trans, M=M, N=N, K=K,
                     LDA=f"{a.name}.shape[{len(sa) - 1}]", LDB=f"{b.name}.shape[{len(sb) - 1}]" if len(sb) > 1 else "1",
                     BATCH=batch, SA=f"({M}) * ({K})" if ab else "0", SB=f"({K}) * ({N})" if bb else "0",
                     bias=None, ep=None, mask=mask, diag=diag, what=what,
                     shape=(math.prod(ab or bb), math.prod(sa[i] for i in lay.m_dims), n_now, sa[lay.k_a]))


def _rowscale_match(g: Graph, d: str, mat: str) -> FamilyMatch:
    shapes = _shapes(g)
    sd, sm = shapes[d], shapes[mat]
    if len(sd) != 1 or len(sm) != 2 or sd[0] != sm[0] or tuple(g.out.shape) != tuple(sm):
        raise NotCovered(f"diag({d}) @ {mat}: shapes {sd} and {sm} do not scale rows")
    facts = GemmFacts(kind="rowscale", d=d, m=mat, R=f"{mat}.shape[0]", C=f"{mat}.shape[1]")
    return FamilyMatch.of(g, facts, f"row scaling: diag({d}) @ {mat}")


def _contraction(g: Graph, keep_plain: bool = False) -> FamilyMatch | None:
    res = g.node(g.output)
    mask, diag = "", 0
    if res is not None and res.op in _MASKS:
        mask, diag = _MASKS[res.op], int(res["diagonal"])
        res = g.node(res["self"])
    op = res.op if res is not None else None
    ep = None
    if op not in _MATMULS + ("einsum",) and not mask and not _refusal(g):
        res, ep = _constant_epilogue(g)
        op = res.op if res is not None else None
    if op not in _MATMULS + ("einsum",):
        raise NotCovered(_refusal(g) or _FOLLOWED)
    shapes = _shapes(g)
    if op == "einsum":
        ops = res["tensors"]
        if len(ops) != 2 or any(g.tensor(o) is None for o in ops):
            raise NotCovered("einsum of other than two input tensors is not covered")
        a, b = Operand(str(ops[0]), False), Operand(str(ops[1]), False)
        lay, ta, tb = _einsum_layout(res["equation"], len(shapes[a.name]), len(shapes[b.name]))
        a, b = Operand(a.name, ta), Operand(b.name, tb)
    else:
        a = operand_of(g, res["self"], op)
        b = operand_of(g, res.args.get("other", res.args.get("mat2")), op)
        if b.diag:
            raise NotCovered(f"{op} with diag() as its second operand (a column scaling) is not covered")
        if a.diag:
            if mask or b.trans:
                raise NotCovered(f"diag({a.name}) @ a transposed or masked matrix is not covered")
            return _rowscale_match(g, a.name, b.name)
        lay = _matmul_layout(op, a, b, len(shapes[a.name]), len(shapes[b.name]))
    facts = _gemm_facts(g, op, a, b, lay, mask, diag)
    if ep is not None:
        facts = facts.model_copy(update={"ep": ep})
    inputs = {t.name for t in g.inputs}
    plain = (op != "einsum" and not mask and not a.trans and not b.trans and len(shapes[a.name]) == 2
             and len(shapes[b.name]) == 2 and facts.shape[2] != 1 and {a.name, b.name} <= inputs
             and len(inputs) == 2)
    if plain and ep is not None:
        raise NotCovered(_FOLLOWED)  # a plain A @ B then ops stays the matmul family's and a region after it
    if plain and not keep_plain:
        return None  # plain 2-D A @ B: the built-in matmul family's
    return FamilyMatch.of(g, facts, f"gemm: {facts.what}" + (f", {mask} triangle" if mask else "")
                          + (f", epilogue {ep.formula}" if ep is not None else ""))


def _constant_epilogue(g: Graph) -> tuple[Node | None, Any]:
    """The product and its epilogue where the graph is one product followed by elementwise ops of constants alone
    (``(q @ k^T) * scale``: the first region of a decomposed attention); (None, None) otherwise."""
    products = [n for n in g.live() if n.op in _MATMULS + ("einsum",)]
    if len(products) != 1:
        return None, None
    try:
        return products[0], trace_constant_tail(g, products[0])
    except NotCovered:
        return None, None


def _is_column_of(g: Graph, ref: Any, d: str) -> bool:
    """``d.unsqueeze(1)``, ``d[:, None]``, ``d.view(-1, 1)`` / ``reshape(-1, 1)`` of the vector ``d``."""
    n = g.node(ref) if isinstance(ref, Ref) else None
    if n is None or n.args.get("self") != d:
        return False
    if n.op == "unsqueeze":
        return n["dim"] in (1, -1)
    return n.op in ("view", "reshape", "_unsafe_view") and n.shape is not None and len(n.shape) == 2 and n.shape[1] == 1


def _rowscale(g: Graph) -> FamilyMatch | None:
    """``d.unsqueeze(1) * M`` (diag(d) @ M written as a broadcast): mine; anything else: None."""
    ins = g.inputs
    if len(ins) != 2 or sorted(len(t.shape) for t in ins) != [1, 2] or len(g.out.shape) != 2:
        return None
    res = g.node(g.output)
    if res is None or res.op != "mul" or len(g.live()) != 2:
        return None
    d = next(t.name for t in ins if len(t.shape) == 1)
    mat = next(t.name for t in ins if len(t.shape) == 2)
    x, y = res["self"], res["other"]
    for col, other in ((x, y), (y, x)):
        if _is_column_of(g, col, d) and other == mat:
            if g.dtypes != {"float32"}:
                raise NotCovered("the playbook's gemm family is fp32 only")
            return _rowscale_match(g, d, mat)
    return None


# ---------------------------------------------------------------------------------------------
def read_gemm(g: Graph, *, keep_plain: bool = False) -> FamilyMatch | None:
    """The gemm facts of a GEMM (+ elementwise epilogue) graph whatever its dtype, None for another graph (the
    16-bit family, :mod:`.gemm.gemm16`, reads its problems through it); ``keep_plain``: a plain 2-D A @ B of two
    inputs too (at fp32 the built-in matmul family's)."""
    live = g.live()
    products = [n for n in live if n.op in CONTRACTIONS]
    if not products or any(kind_of(n.op) == Kind.conv for n in live):
        return None  # a convolution's problem: the conv families say what they cover
    linears = [n for n in products if n.op == "linear"]
    if len(products) > 1 and not linears:
        raise NotCovered(f"{len(products)} matrix products (a chain of GEMMs): the playbook's gemm family computes one")
    return _linear(g, linears) if linears else _contraction(g, keep_plain)


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    if not any(n.op in CONTRACTIONS for n in live):
        return _rowscale(g)
    if any(kind_of(n.op) == Kind.conv for n in live):
        return None  # a convolution's problem: the conv families say what they cover
    if g.dtypes != {"float32"}:
        raise NotCovered(f"the playbook's gemm family is fp32 only (no TF32, no 16-bit inputs); got "
                         f"{', '.join(sorted(g.dtypes))}")
    return read_gemm(g)


_AFTER_TILED = frozenset({"tiled"})
IDEAS = (
    Entry("gemm-tiled", "Register-blocked fp32 GEMM with true FFMA accumulation and the epilogue fused into the "
          "store: BM x BN block tile, TM x TN outputs per thread, operand tiles kept in shared memory in their "
          "global layout so that every load (plain or transposed operand) is a coalesced 16-byte copy, next tile "
          "prefetched into registers while this one is multiplied, grouped block order for L2, predicated edges "
          "only where the shape needs them.", C,
          "FFMA-bound: ~85-95% of cuBLAS fp32; the epilogue costs nothing beyond the store (no extra pass over "
          "the output as eager PyTorch makes per op)", "tiled", ({}, {"BM": 64, "BN": 128}), round0=True),
    Entry("gemm-gemv", "Matrix-vector product (N == 1) as a streaming reduction: TPR threads per row, several "
          "independent 16-byte loads of A in flight per thread, float4 partial sums, warp-shuffle tree per row.", M,
          "memory-bound: ~85-90% of DRAM bandwidth (a tiled GEMM wastes the tile's N side)", "gemv",
          ({}, {"UNROLL": 8}), round0=True),
    Entry("gemm-rowscale", "diag(d) @ M is a row scaling: one pass over M with 16-byte loads and stores, d[r] read "
          "once per row; never build the diagonal matrix or run a GEMM.", M,
          "~90% of copy bandwidth instead of an N^3 product", "rowscale", ({}, {"UNROLL": 8, "BLOCK": 128}),
          round0=True),
    Entry("gemm-cp-async", "Replace the register double buffer by a STAGES-deep cp.async ring: 16-byte copies "
          "straight into shared memory (zero-filled at the edges), so the loads of the next tiles never occupy "
          "registers and more of them are in flight; k-contiguous tiles stay k-contiguous (a copy cannot "
          "transpose), read 4 k at a time.", A, "5-20% when the parent waits on global loads",
          "tiled", ({"CP_ASYNC": 1, "STAGES": 3, "SMEM_T": 0}, {"CP_ASYNC": 1, "STAGES": 4, "SMEM_T": 0},
                    {"CP_ASYNC": 1, "STAGES": 3, "BK": 32, "SMEM_T": 0}),
          after=_AFTER_TILED),
    Entry("gemm-tile-shape", "Re-shape the block tile: a larger one (128 x 256) re-uses each loaded element more, "
          "a smaller one (64 x 64) gives more blocks for small M or N (skinny problems leave SMs idle).", PAR,
          "0-15%", "tiled", ({"BM": 64, "BN": 64}, {"BM": 128, "BN": 256}, {"BM": 64, "BN": 128, "TM": 4}),
          after=_AFTER_TILED),
    Entry("gemm-k-step", "A deeper k step (BK 32) halves the barriers per FFMA; a shallower one (BK 8) halves the "
          "shared memory so that more blocks fit per SM.", A, "0-10%", "tiled", ({"BK": 32}, {"BK": 8}),
          after=_AFTER_TILED),
    Entry("gemm-occupancy", "Two blocks per SM: __launch_bounds__(NT, 2) caps a thread at 128 registers so that one "
          "block's barrier and shared loads are hidden by the other's FFMAs (the 128 x 128 tile with 8 x 8 outputs "
          "a thread fits without spills in the nn.Linear layout), or a 4 x 8 register tile with more threads.", PAR,
          "0-15%; costs spills where the cap is too tight (the compiler reports them)", "tiled",
          ({"MIN_BLOCKS": 2}, {"TM": 4, "TN": 8, "MIN_BLOCKS": 2}, {"TM": 8, "TN": 4, "MIN_BLOCKS": 2, "BM": 64}),
          after=_AFTER_TILED),
    Entry("gemm-l2", "Tune the grouped launch order (GROUP_M) so that the blocks in flight share A and B tiles in "
          "L2.", M, "0-5%", "tiled", ({"GROUP_M": 4}, {"GROUP_M": 16}), after=_AFTER_TILED),
    Entry("gemm-tri-skip", "For triu/tril of a product of triangular matrices, run each block's k loop only over "
          "the range where both operands can be non-zero (upper: k from the block's first row to its last "
          "column). Correct only when the inputs really are triangular, as the problem states.", CF,
          "~3x fewer FFMAs for triangular inputs (N^3/6 instead of N^3/2 after skipping masked blocks)",
          "tiled", ({"TRI_SKIP": 1}, {"TRI_SKIP": 1, "BM": 64, "BN": 64}), after=_AFTER_TILED),
    Entry("gemv-ilp", "More bytes in flight per thread in the matrix-vector kernel (UNROLL 8) and evict-first "
          "loads of A so that the streamed matrix does not evict the vector from L2.", A, "0-10%", "gemv",
          ({"UNROLL": 8, "CACHE_HINT": 1}, {"CACHE_HINT": 1}), after=frozenset({"gemv"})),
    Entry("gemv-rows", "Re-balance threads per row against rows per block: a warp per row for short rows, a block "
          "for long ones.", PAR, "0-20%", "gemv",
          ({"TPR": 256, "BLOCK": 256}, {"TPR": 1024, "BLOCK": 1024}, {"TPR": 32, "BLOCK": 256}),
          after=frozenset({"gemv"})),
    Entry("rowscale-stream", "Streaming cache hints (evict-first loads and stores) and more loads in flight per "
          "thread for the row scaling.", M, "0-5%", "rowscale", ({"CACHE_HINT": 1}, {"UNROLL": 8, "CACHE_HINT": 1}),
          after=frozenset({"rowscale"})),
)

GEMM = Family(name="gemm", leads=frozenset({Lead.contraction, Lead.map}), recognise=_recognise,
              constraints=("one matrix product or diag(d) @ M", "of graph tensors (transposes read in place)",
                           "elementwise after it"),
              variants={"tiled": gemm_tiled, build_gemm_tf32.VARIANT: build_gemm_tf32.gemm_tf32x3,
                        "gemv": gemm_gemv, "rowscale": gemm_rowscale,
                        wgmma.VARIANT: wgmma.gemm_wgmma},  # Hopper only (coverage)
              ideas=wgmma.GEMM_IDEAS + IDEAS + build_gemm_tf32.GEMM_IDEAS)  # wgmma first in round 0
