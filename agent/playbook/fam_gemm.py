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

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any

from kerngen.agent.playbook.build_gemm import gemm_gemv, gemm_rowscale, gemm_tiled
from kerngen.agent.playbook import build_gemm_tf32
from kerngen.agent.playbook.chain import trace_graph
from kerngen.agent.playbook.entry import A, C, CF, M, PAR, Entry
from kerngen.agent.playbook.epilogue import trace_epilogue
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.forward_source import UNKNOWN, kwarg, module_of
from kerngen.agent.playbook.match import FamilyMatch, Read
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook import wgmma_variants  # the Hopper core's hook (issue 35)

__all__ = ["FAMILY"]

CONTRACTIONS = ("matmul", "mm", "bmm", "einsum")
_MATMULS = ("matmul", "mm", "bmm", "__matmul__")
_MASKS = {"triu": "upper", "tril": "lower"}
_NORMS = {"GroupNorm": "statistics over groups of columns", "group_norm": "statistics over groups of columns",
          "LayerNorm": "statistics over each row", "layer_norm": "statistics over each row",
          "InstanceNorm1d": "statistics over each row", "InstanceNorm2d": "statistics over each row",
          "batch_norm": "the functional batch_norm (its statistics are arguments), not traced into the epilogue"}
# nn.BatchNorm1d in eval mode is a per-column affine map: the epilogue tracer takes it (agent/playbook/epilogue.py)
_POOLS = ("MaxPool1d", "AvgPool1d", "AdaptiveAvgPool1d", "AdaptiveMaxPool1d", "max_pool1d", "avg_pool1d")
_REDUCTIONS = ("sum", "mean", "max", "min", "amax", "amin", "logsumexp", "softmax", "log_softmax", "Softmax",
               "LogSoftmax", "norm", "var", "std", "prod", "argmax", "argmin", "cumsum")
_TWO_WAY = ("max", "min")  # torch.max(x, other) is elementwise; torch.max(x, dim) and torch.max(x) reduce


# ---------------------------------------------------------------------------------------------
# why a GEMM problem is refused
def _reduction_text(kind: str, callee: str, node: ast.Call, model: Any) -> str | None:
    """``"sum over dim 1"`` for a reducing call, None for an elementwise one (``torch.min(x, other)``)."""
    mod = module_of(model, callee)
    if mod is not None:  # nn.Softmax(dim=1) and the like
        dim = getattr(mod, "dim", None)
        return f"{kind} over dim {dim}" if isinstance(dim, int) else kind
    pos = 1 if callee.startswith(("torch.", "F.", "nn.")) else 0  # torch.sum(x, 1) / x.sum(1)
    dim = kwarg(node, "dim", pos, model=model)
    if kind in _TWO_WAY and (dim is UNKNOWN or isinstance(dim, float)):
        return None  # the second argument is a tensor (or a number): an elementwise min/max
    if dim is None:
        return f"{kind} over all elements"
    return kind if dim is UNKNOWN else f"{kind} over dim {dim}"


def _refusal(r: Read) -> str | None:
    """The first op after the GEMM (in source order) that makes the forward more than GEMM + elementwise."""
    found = []
    for kind, callee, node in r.kinds:
        where = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if kind in _NORMS:
            found.append((where, f"gemm followed by {kind} ({_NORMS[kind]}): not covered by the playbook yet"))
        elif kind in _POOLS:
            found.append((where, f"gemm followed by {kind} over the columns (a windowed reduction): not covered "
                                 "by the playbook yet"))
        elif kind in _REDUCTIONS:
            text = _reduction_text(kind, callee, node, r.model)
            if text is not None:
                found.append((where, f"gemm followed by a row reduction ({text}): not covered by the playbook yet"))
    return min(found)[1] if found else None


# ---------------------------------------------------------------------------------------------
# nn.Linear + elementwise epilogue
def _shape_expr(name: str, dims: list[int] | range) -> str:
    return " * ".join(f"{name}.shape[{i}]" for i in dims) or "1"


def _linear(r: Read, linears: list) -> FamilyMatch:
    if len(linears) > 1:
        raise NotCovered(f"{len(linears)} nn.Linear calls (a chain of GEMMs): the playbook fuses one GEMM with an "
                         "elementwise epilogue")
    _, callee, node = linears[0]
    mod = module_of(r.model, callee)
    if mod is None:
        raise NotCovered("cannot read the nn.Linear module (the model did not build on the meta device)")
    why = _refusal(r)
    if why:
        raise NotCovered(why)
    arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
    x = next((t for t in r.match.inputs if isinstance(arg, ast.Name) and t.name == arg.id), None)
    if x is None or not x.shape or x.shape[-1] != int(mod.in_features):
        raise NotCovered("the nn.Linear module is not applied directly to a forward input of in_features columns")
    lead = callee.split(".", 1)[1]
    params = {p.name for p in r.match.params}
    weight, bias = f"{lead}.weight", f"{lead}.bias"
    if weight not in params:
        raise NotCovered(f"no parameter {weight} among the model's parameters")
    lead_shape = tuple(x.shape[:-1]) + (int(mod.out_features),)
    try:
        ep = trace_epilogue(r.model, ("Linear",), shapes={t.name: t.shape for t in r.match.inputs},
                            lead_shape=lead_shape, out_shape=r.out.shape, channel_dim=-1)
    except NotCovered as exc:
        raise NotCovered(f"gemm + epilogue: {exc}") from None
    nd = len(x.shape)
    k = f"{x.name}.shape[{nd - 1}]"
    has_bias = bias in params
    what = f"{x.name} @ {weight}^T" + (f" + {bias}" if has_bias else "")
    r.match.facts = dict(kind="gemm", a=x.name, b=weight, trans_a=False, trans_b=True, M=_shape_expr(x.name, range(nd - 1)),
                         N=f"{weight}.shape[0]", K=k, LDA=k, LDB=f"{weight}.shape[1]", BATCH="1", SA="0", SB="0",
                         bias=bias if has_bias else None, ep=ep, mask="", diag=0, what=what,
                         shape=(1, math.prod(x.shape[:-1]), lead_shape[-1], x.shape[-1]))
    r.match.message = f"gemm: {what}" + (f", epilogue {ep.formula}" if not ep.empty else "")
    return r.match


# ---------------------------------------------------------------------------------------------
# contractions read from the traced forward
@dataclass(frozen=True)
class Operand:
    name: str  # a forward input or a parameter
    trans: bool  # its last two dims are swapped before the product
    diag: bool = False  # torch.diag of a vector


def _callee(n: Any) -> str | None:
    """``matmul`` for torch.matmul / x.matmul / the @ operator, ``triu`` for torch.triu / x.triu, ..."""
    if n.op == "call_method":
        return str(n.target)
    if n.op == "call_function":
        if n.target is operator.matmul:
            return "matmul"
        if n.target is operator.mul:
            return "mul"
        if n.target is getattr:
            return "getattr"
        return getattr(n.target, "__name__", None)
    return None


def _int_arg(n: Any, pos: int, key: str, default: int) -> int:
    v = n.args[pos] if len(n.args) > pos else n.kwargs.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise NotCovered(f"{_callee(n)} with a non-constant {key} is not covered")
    return v


def _operand(n: Any, shapes: dict[str, tuple[int, ...]], op: str) -> Operand:
    if n.op in ("placeholder", "get_attr"):
        return Operand(str(n.target), False)
    name = _callee(n)
    base = n.args[0] if n.args else None
    if base is None or getattr(base, "op", None) not in ("placeholder", "get_attr"):
        raise NotCovered(f"an operand of {op} is computed in the forward ({name}): not covered by the gemm family")
    nd = len(shapes[str(base.target)])
    last_two = {nd - 2, nd - 1}
    if name == "getattr" and n.args[1] in ("T", "mT") and (n.args[1] == "mT" or nd == 2):
        return Operand(str(base.target), True)
    if name == "t" and nd == 2:
        return Operand(str(base.target), True)
    if name == "transpose" and {_int_arg(n, 1, "dim0", 0) % nd, _int_arg(n, 2, "dim1", 0) % nd} == last_two:
        return Operand(str(base.target), True)
    if name == "permute":
        dims = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (tuple, list)) else n.args[1:]
        if tuple(d % nd for d in dims) == tuple(range(nd - 2)) + (nd - 1, nd - 2):
            return Operand(str(base.target), True)
    if name == "diag" and nd == 1 and len(n.args) == 1 and not n.kwargs:
        return Operand(str(base.target), False, diag=True)
    raise NotCovered(f"an operand of {op} is computed in the forward ({name} of {base.target}): not covered by the "
                     "gemm family")


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


def _gemm_facts(r: Read, op: str, a: Operand, b: Operand, lay: Layout, mask: str, diag: int) -> dict[str, Any]:
    shapes = {t.name: t.shape for t in r.match.inputs + r.match.params}
    sa, sb = shapes[a.name], shapes[b.name]
    if sa[lay.k_a] != sb[lay.k_b]:
        raise NotCovered(f"{op} operands do not contract: {a.name} {sa}, {b.name} {sb}")
    ab, bb = [sa[i] for i in lay.a_batch], [sb[i] for i in lay.b_batch]
    if ab and bb and ab != bb:
        raise NotCovered(f"{op} with broadcast batch dims ({a.name} {sa}, {b.name} {sb}) is not covered")
    n_now = sb[lay.n_dim] if lay.n_dim is not None else 1
    want = tuple(ab or bb) + tuple(sa[i] for i in lay.m_dims) + ((n_now,) if lay.n_dim is not None else ())
    if tuple(r.out.shape) != want:
        raise NotCovered(f"{op} output {r.out.shape} is not the product's shape {want}")
    M, K = _shape_expr(a.name, lay.m_dims), f"{a.name}.shape[{lay.k_a}]"
    N = f"{b.name}.shape[{lay.n_dim}]" if lay.n_dim is not None else "1"
    batch = _shape_expr(a.name, lay.a_batch) if ab else _shape_expr(b.name, lay.b_batch)
    what = f"{a.name}{'^T' if a.trans else ''} @ {b.name}{'^T' if b.trans else ''}"
    if ab or bb:
        what += f" (batch of {math.prod(ab or bb)}{'' if ab and bb else ', one operand shared'})"
    elif len(lay.m_dims) > 1:
        what += f" ({a.name}'s leading dims as {math.prod(sa[i] for i in lay.m_dims)} rows)"
    return dict(kind="gemm", a=a.name, b=b.name, trans_a=a.trans, trans_b=b.trans, M=M, N=N, K=K,
                LDA=f"{a.name}.shape[{len(sa) - 1}]", LDB=f"{b.name}.shape[{len(sb) - 1}]" if len(sb) > 1 else "1",
                BATCH=batch, SA=f"({M}) * ({K})" if ab else "0", SB=f"({K}) * ({N})" if bb else "0",
                bias=None, ep=None, mask=mask, diag=diag, what=what,
                shape=(math.prod(ab or bb), math.prod(sa[i] for i in lay.m_dims), n_now, sa[lay.k_a]))


def _rowscale_facts(r: Read, d: str, mat: str) -> dict[str, Any]:
    shapes = {t.name: t.shape for t in r.match.inputs + r.match.params}
    sd, sm = shapes[d], shapes[mat]
    if len(sd) != 1 or len(sm) != 2 or sd[0] != sm[0] or tuple(r.out.shape) != tuple(sm):
        raise NotCovered(f"diag({d}) @ {mat}: shapes {sd} and {sm} do not scale rows")
    return dict(kind="rowscale", d=d, m=mat, R=f"{mat}.shape[0]", C=f"{mat}.shape[1]")


def _graph(r: Read) -> Any | None:
    if r.model is None:
        return None
    try:
        return trace_graph(r.model)
    except NotCovered:
        return None


def _contraction(r: Read, keep_plain: bool = False) -> FamilyMatch | None:
    g = _graph(r)
    if g is None:
        return None  # nothing to read the operands from: the built-in matmul family says what it can
    nodes = list(g.nodes)
    res = next(n for n in nodes if n.op == "output").args[0]
    mask, diag = "", 0
    if getattr(res, "op", None) in ("call_function", "call_method") and _callee(res) in _MASKS:
        mask, diag = _MASKS[_callee(res)], _int_arg(res, 1, "diagonal", 0)
        res = res.args[0]
    op = _callee(res) if hasattr(res, "op") else None
    if op not in _MATMULS + ("einsum",):
        raise NotCovered(_refusal(r) or "a matrix product followed by other ops: the gemm family fuses an "
                                        "elementwise epilogue after an nn.Linear module only")
    shapes = {t.name: t.shape for t in r.match.inputs + r.match.params}
    if op == "einsum":
        eq, ops = res.args[0], res.args[1:]
        if len(ops) == 1 and isinstance(ops[0], (tuple, list)):
            ops = tuple(ops[0])
        if len(ops) != 2 or any(getattr(o, "op", None) not in ("placeholder", "get_attr") for o in ops):
            raise NotCovered("einsum of other than two input tensors is not covered")
        a, b = Operand(str(ops[0].target), False), Operand(str(ops[1].target), False)
        lay, ta, tb = _einsum_layout(eq, len(shapes[a.name]), len(shapes[b.name]))
        a, b = Operand(a.name, ta), Operand(b.name, tb)
    else:
        a, b = (_operand(n, shapes, op) for n in res.args[:2])
        if b.diag:
            raise NotCovered(f"{op} with diag() as its second operand (a column scaling) is not covered")
        if a.diag:
            if mask or b.trans:
                raise NotCovered(f"diag({a.name}) @ a transposed or masked matrix is not covered")
            r.match.facts = _rowscale_facts(r, a.name, b.name)
            r.match.message = f"row scaling: diag({a.name}) @ {b.name}"
            return r.match
        lay = _matmul_layout(op, a, b, len(shapes[a.name]), len(shapes[b.name]))
    facts = _gemm_facts(r, op, a, b, lay, mask, diag)
    inputs = {t.name for t in r.match.inputs}
    plain = (op != "einsum" and not mask and not a.trans and not b.trans and len(shapes[a.name]) == 2
             and len(shapes[b.name]) == 2 and facts["shape"][2] != 1 and {a.name, b.name} <= inputs
             and len(inputs) == 2)
    if plain and not keep_plain:
        return None  # plain 2-D A @ B: the built-in matmul family's
    r.match.facts = facts
    r.match.message = f"gemm: {facts['what']}" + (f", {mask} triangle" if mask else "")
    return r.match


def _is_column_of(n: Any, d: str) -> bool:
    """``d.unsqueeze(1)``, ``d[:, None]``, ``d.view(-1, 1)`` / ``reshape(-1, 1)`` of the vector ``d``."""
    base = n.args[0] if getattr(n, "args", None) else None
    if getattr(base, "op", None) != "placeholder" or str(base.target) != d:
        return False
    name = _callee(n)
    if name == "unsqueeze":
        return len(n.args) == 2 and n.args[1] in (1, -1)
    if name == "getitem":
        return n.args[1] == (slice(None, None, None), None)
    if name in ("view", "reshape"):
        return tuple(n.args[1:]) in ((-1, 1),) or (len(n.args) == 2 and tuple(n.args[1]) == (-1, 1))
    return False


def _rowscale(r: Read) -> FamilyMatch | None:
    """``d.unsqueeze(1) * M`` (diag(d) @ M written as a broadcast): mine; anything else: None."""
    ins = r.match.inputs
    if len(ins) != 2 or sorted(len(t.shape) for t in ins) != [1, 2] or len(r.out.shape) != 2:
        return None
    g = _graph(r)
    if g is None:
        return None
    res = next(n for n in g.nodes if n.op == "output").args[0]
    if _callee(res) not in ("mul", "mul_") or len(res.args) != 2:
        return None
    d = next(t.name for t in ins if len(t.shape) == 1)
    mat = next(t.name for t in ins if len(t.shape) == 2)
    x, y = res.args
    for col, other in ((x, y), (y, x)):
        if _is_column_of(col, d) and getattr(other, "op", None) == "placeholder" and str(other.target) == mat:
            if r.dtypes != {"float32"}:
                raise NotCovered("the playbook's gemm family is fp32 only")
            r.match.facts = _rowscale_facts(r, d, mat)
            r.match.message = f"row scaling: diag({d}) @ {mat}"
            return r.match
    return None


# ---------------------------------------------------------------------------------------------
def _linears(r: Read) -> list:
    return [(k, c, n) for k, c, n in r.kinds if k == "Linear"]


def _gemm_like(r: Read) -> bool:
    """nn.Linear, a contraction call or the @ operator in the forward, and no convolution."""
    names = set(r.names)
    return (bool(_linears(r) or names & set(CONTRACTIONS) or "MatMult" in r.fwd.binops)
            and not any(k.startswith(("Conv", "conv")) for k in names))


def read_gemm(r: Read, *, keep_plain: bool = False) -> FamilyMatch | None:
    """The gemm facts of a GEMM (+ elementwise epilogue) forward whatever its dtype, None for another forward
    (the 16-bit family, :mod:`.fam_gemm16`, reads its problems through it); ``keep_plain``: a plain 2-D A @ B of
    two inputs too (at fp32 the built-in matmul family's)."""
    if not _gemm_like(r):
        return None
    linears = _linears(r)
    return _linear(r, linears) if linears else _contraction(r, keep_plain)


def recognise(r: Read) -> FamilyMatch | None:
    names = set(r.names)
    if not _linears(r) and not (names & set(CONTRACTIONS)) and "MatMult" not in r.fwd.binops:
        return _rowscale(r)
    if not _gemm_like(r):
        return None  # a convolution's problem: the conv families say what they cover
    if r.dtypes != {"float32"}:
        raise NotCovered(f"the playbook's gemm family is fp32 only (no TF32, no 16-bit inputs); got "
                         f"{', '.join(sorted(r.dtypes))}")
    return read_gemm(r)


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

FAMILY = Family(name="gemm", recognise=recognise,
                variants={"tiled": gemm_tiled, build_gemm_tf32.VARIANT: build_gemm_tf32.gemm_tf32x3,
                          "gemv": gemm_gemv, "rowscale": gemm_rowscale,
                          wgmma_variants.VARIANT: wgmma_variants.gemm_wgmma},  # hook: Hopper only (coverage)
                ideas=wgmma_variants.GEMM_IDEAS + IDEAS + build_gemm_tf32.IDEAS)  # hook: wgmma first in round 0
