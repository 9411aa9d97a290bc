"""Playbook family "reduce": one reduction of the input over adjacent dims (sum, mean, prod, max,
min, amax, amin), argmax/argmin (int64, the FIRST index of the extreme value), vector norms
(``torch.norm`` / ``torch.linalg.vector_norm`` with p 1, 2, 'fro', inf, -inf) and the normalize forms
``x / r`` with ``r`` such a reduction kept broadcastable (L1/L2 norms over a dim, the Frobenius norm
of the whole tensor), keepdim or not. Kernels: :mod:`.reduce.build`.

Recognition reads the traced graph: one input, no parameters, every op a reduction or one of the few ops
around one, and one of them a reduction; anything else is another family's problem (None). The graph is
walked from its output as ``[x /] epilogue(reduction(prologue(x)))`` (``F.normalize`` is traced into exactly
that).
A graph of another shape (``x - x.mean(...)``, ``sqrt(mean(x^2) + eps)``: rmsnorm) is not this
family's (None); a reduction with something the kernels do not serve (non-adjacent dims, p=3, a
dtype= cast, a non-fp32 input) raises NotCovered with the reason.
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook.reduce import build as build_reduce
from kerngen.agent.playbook.entry import A, Entry, M, PAR
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Node, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["REDUCE", "ReduceFacts"]

_REDUCTIONS = ("sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "linalg_vector_norm", "norm")
_AROUND = ("abs", "pow", "square", "sqrt", "clamp", "clamp_min", "div", "mul", "add", "expand", "expand_as", "getitem")
# p of a vector norm -> (prologue, combine, epilogue)
_NORMS: dict[Any, tuple[str, str, list]] = {
    2: ("square", "sum", [["sqrt", 0.0]]), "fro": ("square", "sum", [["sqrt", 0.0]]),
    1: ("abs", "sum", []), math.inf: ("abs", "max", []), -math.inf: ("abs", "min", []),
}
_PLAIN = {"sum": "sum", "mean": "sum", "prod": "prod", "amax": "max", "amin": "min", "argmax": "argmax",
          "argmin": "argmin"}


class ReduceFacts(Facts):
    combine: str  # sum, prod, max, min, argmax, argmin
    prologue: str  # none, abs, square
    epilogue: tuple[tuple[str, float], ...]  # scalar steps on the reduced value, in order
    normalize: bool  # x / the reduction
    dims: tuple[int, int]  # the reduced dims, lo..hi
    keepdim: bool
    op: str = ""  # a C-identifier fragment naming it
    formula: str = ""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _peel_epilogue(g: Graph, n: Node) -> tuple[Node | None, list]:
    """Walk down from the value through the epilogue's elementwise steps; (the node below them, the steps in the
    order they run)."""
    steps: list = []
    while n is not None:
        op = n.op
        if op == "sqrt":
            steps.append(["sqrt", 0.0])
        elif op == "pow" and n.overload == "Tensor_Scalar" and n["exponent"] == 0.5:
            steps.append(["sqrt", 0.0])
        elif op in ("add", "mul", "div") and _number(n.get("other")) and isinstance(n["self"], Ref) and \
                n.get("alpha", 1) == 1 and n.get("rounding_mode") is None:
            steps.append([op, float(n["other"])])
        elif op == "clamp_min" and _number(n["min"]):
            steps.append(["clamp_min", float(n["min"])])
        elif op == "clamp" and _number(n["min"]) and n["max"] is None:
            steps.append(["clamp_min", float(n["min"])])
        elif op in ("expand", "expand_as"):  # F.normalize's denominator: broadcasting does the same
            pass
        else:
            return n, steps[::-1]
        n = g.node(n["self"])
    return None, steps[::-1]


def _prologue(g: Graph, ref: Any, x: str) -> str:
    if ref == x:
        return "none"
    n = g.node(ref)
    if n is None:
        raise NotCovered(f"a reduction of {ref} is not covered by the reduce family")
    if n.op == "abs" and n["self"] == x:
        return "abs"
    if (n.op == "square" and n["self"] == x) or (n.op == "pow" and n["self"] == x and n.get("exponent") == 2) or \
            (n.op == "mul" and n["self"] == x and n["other"] == x):
        return "square"
    what = f"{n.op}(x{', ...' if len(n.refs) > 1 or len(n.args) > 1 else ''})" if n.args.get("self") == x else f"{n.op}(...)"
    raise NotCovered(f"a reduction of {what} is not covered by the reduce family (its prologues: abs(x), x^2)")


def _dims(dim: Any, nd: int) -> tuple[int, int]:
    """The reduced dims as (lo, hi), adjacent; every dim when dim is None or empty."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return 0, nd - 1
    ds = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (tuple, list)) else None
    if ds is None or not all(isinstance(d, int) and not isinstance(d, bool) and -nd <= d < nd for d in ds):
        raise NotCovered(f"cannot read the reduced dims from dim={dim!r}")
    ds = sorted({d % nd for d in ds})
    if ds != list(range(ds[0], ds[-1] + 1)):
        raise NotCovered(f"a reduction over the non-adjacent dims {tuple(ds)} is not covered by the reduce family")
    return ds[0], ds[-1]


def _norm(red: str, p: Any, prologue: str) -> tuple[str, str, list]:
    """(prologue, combine, epilogue) of a vector norm of order p."""
    if p not in _NORMS:
        raise NotCovered(f"{red} with p={p!r} is not covered by the reduce family (p 1, 2, 'fro', inf, -inf)")
    if prologue != "none":
        raise NotCovered(f"the {red} of {prologue}(x) is not covered by the reduce family")
    pro, combine, epi = _NORMS[p]
    return pro, combine, [list(s) for s in epi]


def _read(g: Graph, x: str, nd: int) -> dict[str, Any] | None:
    """The reduction's facts, or None when the graph is not ``[x /] epilogue(reduction(prologue(x)))``."""
    out = g.node(g.output)
    if out is None:
        return None
    normalize, value = False, out
    if out.op == "div" and out["self"] == x and isinstance(out["other"], Ref) and g.node(out["other"]) is not None \
            and out.get("rounding_mode") is None:
        normalize, value = True, g.node(out["other"])
    red_node, epilogue = _peel_epilogue(g, value)
    which = None  # max/min with a dim: 0 (values) or 1 (indices)
    if red_node is not None and red_node.op == "getitem":
        which, red_node = red_node["index"], g.node(red_node["input"])
        if red_node is None or red_node.op not in ("max", "min") or which not in (0, 1):
            return None
    if red_node is None or red_node.op not in _REDUCTIONS or (red_node.op in ("max", "min")
                                                              and red_node.overload == "other"):
        return None
    red = red_node.op
    if red_node.get("dtype") is not None and str(red_node["dtype"]) != "torch.float32":
        raise NotCovered(f"{red}(..., dtype={red_node['dtype']}) is not covered by the reduce family (fp32 only)")
    prologue = _prologue(g, red_node["self"], x)
    if red in ("norm", "linalg_vector_norm"):
        p = red_node.get("ord", red_node.get("p", 2))
        prologue, combine, pre_epi = _norm(red, 2 if p is None else p, prologue)
    elif red in ("max", "min"):
        if red_node.overload == "dim":
            if which is None:
                return None  # the (values, indices) pair itself: not one output
            combine = red if which == 0 else f"arg{red}"
        elif which is not None:
            return None
        else:
            combine = red
        pre_epi = []
    else:
        combine, pre_epi = _PLAIN[red], ([["div_len", 0.0]] if red == "mean" else [])
    epilogue = pre_epi + epilogue
    ops = [op for op, _ in epilogue]
    lo, hi = _dims(red_node.get("dim"), nd)
    if prologue == "square" and "div_len" in ops and "add" in ops and hi == nd - 1:
        return None  # sqrt(mean(x^2) + eps) over the last dim: the rmsnorm family's (over another dim: ours)
    keepdim = bool(red_node.get("keepdim", False))
    arg = combine in build_reduce.ARG_COMBINES
    if arg and (epilogue or normalize or prologue != "none"):
        raise NotCovered(f"{combine} with other ops around it is not covered by the reduce family")
    if normalize and not keepdim and (lo, hi) != (0, nd - 1):
        raise NotCovered("x / a reduction without keepdim=True (broadcast along other dims) is not covered")
    return dict(combine=combine, prologue=prologue, epilogue=epilogue, normalize=normalize, dims=(lo, hi),
                keepdim=keepdim)


def _reduced_shape(shape: tuple[int, ...], lo: int, hi: int, keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if lo <= i <= hi else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if not lo <= i <= hi)


def _formula(f: dict[str, Any]) -> str:
    lo, hi = f["dims"]
    where = f"dim {lo}" if lo == hi else f"dims {lo}..{hi}"
    steps = list(f["epilogue"])
    mean = f["combine"] == "sum" and steps[:1] == [["div_len", 0.0]]  # read back as written
    value = {"none": "x", "abs": "|x|", "square": "x^2"}[f["prologue"]]
    text = f"{'mean' if mean else f['combine']}({value}, {where})"
    for op, c in steps[1 if mean else 0:]:
        text = {"div_len": f"{text} / n", "sqrt": f"sqrt({text})", "add": f"({text} + {c:g})",
                "mul": f"({text} * {c:g})", "div": f"({text} / {c:g})", "clamp_min": f"max({text}, {c:g})"}[op]
    return f"x / {text}" if f["normalize"] else text


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    if len(g.inputs) != 1 or g.params or not any(n.op in _REDUCTIONS for n in live) or \
            not all(n.op in _REDUCTIONS + _AROUND for n in live):
        return None
    x = g.inputs[0]
    if not x.shape:
        raise NotCovered("a reduction of a 0-d tensor is not covered by the reduce family")
    facts = _read(g, x.name, len(x.shape))
    if facts is None:
        return None
    if x.dtype != "float32":
        raise NotCovered(f"the reduce family is fp32 only (input {x.dtype})")
    lo, hi = facts["dims"]
    if math.prod(x.shape[lo:hi + 1]) == 0:
        raise NotCovered("a reduction over an empty dim is not covered by the reduce family")
    arg = facts["combine"] in build_reduce.ARG_COMBINES
    want = x.shape if facts["normalize"] else _reduced_shape(x.shape, lo, hi, facts["keepdim"])
    out = g.out
    if out.shape != want or out.dtype != ("int64" if arg else "float32"):
        raise NotCovered(f"the output is {out.dtype} {out.shape}; the reduction read from the forward gives "
                         f"{'int64' if arg else 'float32'} {want}")
    ops = [op for op, _ in facts["epilogue"]]
    core = ["mean"] if facts["combine"] == "sum" and ops[:1] == ["div_len"] else [facts["combine"]] + ops[:1]
    parts = ([facts["prologue"]] if facts["prologue"] != "none" else []) + core + ops[1:]
    parts += ["normalize"] if facts["normalize"] else []
    facts.update(op="_".join(parts), formula=_formula(facts), epilogue=tuple((o, c) for o, c in facts["epilogue"]))
    return FamilyMatch.of(g, ReduceFacts(**facts))


IDEAS: tuple[Entry, ...] = (
    Entry("red-rows", "Reduced dim contiguous: TPR threads per output row (a sub-warp for short rows, a whole block "
          "for long ones), 16-byte loads after peeling the row's unaligned head, UNROLL independent accumulator chains "
          "a thread, a warp-shuffle tree; normalize forms divide the row in a second loop with its first part "
          "kept in shared memory.", M, "one read of the input (normalize: one more, mostly on chip, and one "
          "write): ~85-90% of the DRAM bandwidth", "rows", ({}, {"UNROLL": 8}), round0=True),
    Entry("red-cols", "Reduced dim strided (inner dims after it): threads along the contiguous inner dims so every "
          "warp reads whole lines (16-byte loads when the inner size is a multiple of 4), TY threads splitting "
          "the reduced dim with UNROLL positions in flight, their partials merged in shared memory.", M,
          "coalesced single pass: ~80-90% of the DRAM bandwidth", "cols", ({}, {"TY": 16}), round0=True),
    Entry("red-split", "Few outputs over a huge reduced dim: cut every row into NCH chunks so that the whole GPU "
          "reads; a block per chunk writes its partial to scratch and a second launch merges a row's partials in "
          "a fixed order (deterministic, no atomics), then writes the result or divides its chunk by it.", PAR,
          "fills all SMs when there are fewer rows than SMs; the second launch costs a few microseconds",
          "split", ({}, {"NCH": 4096}), round0=True),
    Entry("red-rows-group", "Re-size the row groups: fewer threads per row and several rows a block (more rows in "
          "flight), or a whole 1024-thread block per row (more bytes in flight per row).", PAR, "0-15%", "rows",
          ({"TPR": 32, "BLOCK": 256}, {"TPR": 256, "BLOCK": 256}, {"TPR": 1024, "BLOCK": 1024}),
          after=frozenset({"rows"})),
    Entry("red-rows-ilp", "More or fewer independent 16-byte loads in flight a thread (UNROLL) against registers and "
          "occupancy.", A, "0-5%", "rows", ({"UNROLL": 8}, {"UNROLL": 2}), after=frozenset({"rows"})),
    Entry("red-rows-cache", "Normalize forms: keep more (or none) of the row in shared memory between the two loops: "
          "the on-chip part is not re-read from L2, and a large cache leaves one block a SM so that the rest of "
          "the rows in flight stay in L2.", M, "0-20% on long rows", "rows",
          ({"CACHE_KB": 200, "TPR": 1024, "BLOCK": 1024}, {"CACHE_KB": 64, "TPR": 512, "BLOCK": 512}),
          after=frozenset({"rows"})),
    Entry("red-stream", "Evict-first loads and stores (ld.global.cs / st.global.cs) where the data is not read "
          "again, so that it does not displace useful lines in L2.", M, "0-3%", "rows", ({"HINT": 1},),
          after=frozenset({"rows"})),
    Entry("red-cols-shape", "Re-shape the block: wider along the inner dims (longer contiguous runs per warp) or "
          "taller along the reduced dim (more partials, fewer positions a thread).", PAR, "0-15%", "cols",
          ({"TX": 64, "TY": 4}, {"TX": 16, "TY": 16}, {"TX": 32, "TY": 32}), after=frozenset({"cols"})),
    Entry("red-cols-ilp", "More or fewer reduced positions in flight a thread (UNROLL); 16-byte loads where the inner "
          "size allows.", A, "0-10%", "cols", ({"UNROLL": 8}, {"UNROLL": 2}, {"VEC": 1}, {"HINT": 1}),
          after=frozenset({"cols"})),
    Entry("red-split-chunks", "Re-balance the split: more chunks a row (more blocks, shorter chunks) or fewer (less "
          "merging), more loads in flight a thread, evict-first streaming.", A, "0-10%", "split",
          ({"NCH": 512}, {"NCH": 2048}, {"UNROLL": 8}, {"BLOCK": 512}, {"HINT": 1}), after=frozenset({"split"})),
)

REDUCE = Family(
    name="reduce", leads=frozenset({Lead.reduce}), recognise=_recognise,
    constraints=("one reduction over adjacent dims", "of the one forward input", "abs or x^2 before it",
                 "scalar steps after it", "x / it (normalize)"),
    variants={"rows": build_reduce.rows, "cols": build_reduce.cols, "split": build_reduce.split},
    ideas=IDEAS,
    spec_names=dict(build_reduce.SPEC_PREFIXES),
)
