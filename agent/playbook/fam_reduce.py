"""Playbook family "reduce": one reduction of the input over adjacent dims (sum, mean, prod, max,
min, amax, amin), argmax/argmin (int64, the FIRST index of the extreme value), vector norms
(``torch.norm`` / ``torch.linalg.vector_norm`` with p 1, 2, 'fro', inf, -inf) and the normalize forms
``x / r`` with ``r`` such a reduction kept broadcastable (L1/L2 norms over a dim, the Frobenius norm
of the whole tensor), keepdim or not. Kernels: :mod:`.build_reduce`.

Recognition reads the source first, cheaply: one input, no parameters, every call of the forward
in :data:`SOURCE_CALLS` and one of them a reduction; anything else is another family's problem
(None). Then the forward is traced with torch.fx on the meta-built model, so that ``dim=self.dim``,
keepdim and p are values, and walked from its output as ``[x /] epilogue(reduction(prologue(x)))``.
A graph of another shape (``x - x.mean(...)``, ``sqrt(mean(x^2) + eps)``: rmsnorm) is not this
family's (None); a reduction with something the kernels do not serve (non-adjacent dims, p=3, a
dtype= cast, a non-fp32 input) raises NotCovered with the reason.
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook import build_reduce
from kerngen.agent.playbook.chain import trace_graph
from kerngen.agent.playbook.entry import A, Entry, M, PAR
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.match import FamilyMatch, Read
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FAMILY", "REDUCE_CALLS", "SOURCE_CALLS", "recognise"]

# the forward's calls by leaf name, as read from the source
REDUCE_CALLS = ("sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "norm", "vector_norm",
                "normalize")
SOURCE_CALLS = REDUCE_CALLS + ("abs", "pow", "square", "sqrt", "clamp", "clamp_min", "div", "true_divide", "divide",
                               "mul", "multiply", "add", "expand_as")

# graph op names (call_function __name__ or call_method name) -> the one name used below
_ALIASES = {"linalg_vector_norm": "vector_norm", "true_divide": "truediv", "div": "truediv", "divide": "truediv",
            "multiply": "mul"}
# a reduction's positional parameters after the input; the keyword-only ones it may carry
_PARAMS = {name: ("dim", "keepdim") for name in ("sum", "mean", "prod", "max", "min", "amax", "amin", "argmax",
                                                 "argmin")}
_PARAMS.update(norm=("p", "dim", "keepdim", "out", "dtype"), vector_norm=("ord", "dim", "keepdim"))
_KEYWORD_ONLY = ("dtype",)
# p of a vector norm -> (prologue, combine, epilogue)
_NORMS: dict[Any, tuple[str, str, list]] = {
    2: ("square", "sum", [["sqrt", 0.0]]), "fro": ("square", "sum", [["sqrt", 0.0]]),
    1: ("abs", "sum", []), math.inf: ("abs", "max", []), -math.inf: ("abs", "min", []),
}
_PLAIN = {"sum": "sum", "mean": "sum", "prod": "prod", "amax": "max", "amin": "min", "argmax": "argmax",
          "argmin": "argmin"}


def _fx_node(value: Any) -> bool:
    import torch.fx as fx

    return isinstance(value, fx.Node)


def _op(n: Any) -> str:
    if n.op == "call_function":
        name = getattr(n.target, "__name__", "")
    elif n.op == "call_method":
        name = str(n.target)
    else:
        return n.op
    return _ALIASES.get(name, name)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tensor_and_const(n: Any) -> tuple[Any, float] | None:
    """(the node, the constant) of a binary op with one node and one finite number, in either order."""
    if n.kwargs or len(n.args) != 2:
        return None
    a, b = n.args
    if _fx_node(a) and _number(b):
        return a, float(b)
    if _fx_node(b) and _number(a) and _op(n) in ("add", "mul"):
        return b, float(a)
    return None


def _peel_epilogue(n: Any) -> tuple[Any, list]:
    """Walk down from the value through the epilogue's elementwise steps; (the node below them, the
    steps in the order they run)."""
    steps: list = []
    while True:
        op = _op(n)
        args = n.args if n.op in ("call_function", "call_method") else ()
        if op == "sqrt" and len(args) == 1 and not n.kwargs:
            steps.append(["sqrt", 0.0])
        elif op == "pow" and len(args) == 2 and args[1] == 0.5 and not n.kwargs:
            steps.append(["sqrt", 0.0])
        elif op in ("add", "mul", "truediv") and (tc := _tensor_and_const(n)) is not None:
            steps.append(["div" if op == "truediv" else op, tc[1]])
            n = tc[0]
            continue
        elif op in ("clamp_min", "clamp") and args and _clamp_min(n) is not None:
            steps.append(["clamp_min", _clamp_min(n)])
        elif op == "expand_as" and len(args) == 2:  # F.normalize's denominator: broadcasting does the same
            pass
        else:
            return n, steps[::-1]
        n = args[0]


def _clamp_min(n: Any) -> float | None:
    kw = dict(n.kwargs)
    pos = list(n.args[1:])
    lo = kw.pop("min", pos.pop(0) if pos else None)
    hi = kw.pop("max", pos.pop(0) if pos and _op(n) == "clamp" else None)
    return float(lo) if _number(lo) and hi is None and not kw and not pos else None


def _bind(n: Any, red: str) -> dict[str, Any]:
    names = _PARAMS[red]
    args = n.args[1:]
    if len(args) > len(names):
        raise NotCovered(f"{red} with {len(n.args)} positional arguments is not covered by the reduce family")
    bound = dict(zip(names, args))
    for k, v in n.kwargs.items():
        if k in bound or (k not in names and k not in _KEYWORD_ONLY):
            raise NotCovered(f"{red}(..., {k}=...) is not covered by the reduce family")
        bound[k] = v
    if bound.get("out") is not None:
        raise NotCovered(f"{red}(..., out=...) is not covered by the reduce family")
    dtype = bound.get("dtype")
    if dtype is not None and str(dtype) != "torch.float32":
        raise NotCovered(f"{red}(..., dtype={dtype}) is not covered by the reduce family (fp32 only)")
    return bound


def _prologue(n: Any, x: Any) -> str:
    if n is x:
        return "none"
    op, args = _op(n), n.args
    if op == "abs" and args == (x,) and not n.kwargs:
        return "abs"
    squares = (op == "square" and args == (x,)) or (op == "pow" and args == (x, 2)) or (op == "mul" and args == (x, x))
    if squares and not n.kwargs:
        return "square"
    what = f"{op}(x{', ...' if len(args) > 1 else ''})" if args and args[0] is x else f"{op}(...)"
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


def _read_graph(graph: Any, x_shape: tuple[int, ...]) -> dict[str, Any] | None:
    """The reduction's facts, or None when the graph is not ``[x /] epilogue(reduction(prologue(x)))``."""
    nodes = list(graph.nodes)
    xs = [n for n in nodes if n.op == "placeholder"]
    if len(xs) != 1 or any(n.op == "get_attr" for n in nodes):
        return None
    x = xs[0]
    out = next(n for n in nodes if n.op == "output").args[0]
    if not _fx_node(out):
        return None
    if _op(out) == "normalize":
        return _normalize_call(out, x, len(x_shape))
    normalize = False
    value = out
    if _op(out) == "truediv" and len(out.args) == 2 and out.args[0] is x and _fx_node(out.args[1]) \
            and out.kwargs.get("rounding_mode") is None and set(out.kwargs) <= {"rounding_mode", "out"} \
            and out.kwargs.get("out") is None:
        normalize, value = True, out.args[1]
    red_node, epilogue = _peel_epilogue(value)
    which = None  # torch.max/min with a dim: 0 / "values" or 1 / "indices"
    if _op(red_node) in ("getitem", "getattr") and len(red_node.args) == 2 and _fx_node(red_node.args[0]):
        which = red_node.args[1]
        red_node = red_node.args[0]
        if _op(red_node) not in ("max", "min") or which not in (0, 1, "values", "indices"):
            return None
    red = _op(red_node)
    if red not in _PARAMS or not red_node.args:
        return None
    if red in ("max", "min") and (_fx_node(red_node.args[1] if len(red_node.args) > 1 else None)
                                  or "other" in red_node.kwargs):
        return None  # torch.max(x, y): elementwise
    b = _bind(red_node, red)
    prologue = _prologue(red_node.args[0], x)
    nd = len(x_shape)
    if red in ("norm", "vector_norm"):
        prologue, combine, pre_epi = _norm(red, b.get("p" if red == "norm" else "ord", "fro" if red == "norm" else 2),
                                           prologue)
    elif red in ("max", "min"):
        if "dim" in b and b["dim"] is not None:
            if which is None:
                return None  # the (values, indices) pair itself: not one output
            combine = red if which in (0, "values") else f"arg{red}"
        elif which is not None:
            return None
        else:
            combine = red
        pre_epi = []
    else:
        combine, pre_epi = _PLAIN[red], ([["div_len", 0.0]] if red == "mean" else [])
    epilogue = pre_epi + epilogue
    ops = [op for op, _ in epilogue]
    lo, hi = _dims(b.get("dim"), nd)
    if prologue == "square" and "div_len" in ops and "add" in ops and hi == nd - 1:
        return None  # sqrt(mean(x^2) + eps) over the last dim: the rmsnorm family's (over another dim: ours)
    keepdim = b.get("keepdim", False)
    if keepdim not in (True, False):  # 0 and 1 mean the same
        raise NotCovered(f"cannot read keepdim={keepdim!r}")
    keepdim = bool(keepdim)
    arg = combine in build_reduce.ARG_COMBINES
    if arg and (epilogue or normalize or prologue != "none"):
        raise NotCovered(f"{combine} with other ops around it is not covered by the reduce family")
    if normalize and not keepdim and (lo, hi) != (0, nd - 1):
        raise NotCovered("x / a reduction without keepdim=True (broadcast along other dims) is not covered")
    return dict(combine=combine, prologue=prologue, epilogue=epilogue, normalize=normalize, dims=[lo, hi],
                keepdim=keepdim)


def _norm(red: str, p: Any, prologue: str) -> tuple[str, str, list]:
    """(prologue, combine, epilogue) of a vector norm of order p."""
    if p not in _NORMS:
        raise NotCovered(f"{red} with p={p!r} is not covered by the reduce family (p 1, 2, 'fro', inf, -inf)")
    if prologue != "none":
        raise NotCovered(f"the {red} of {prologue}(x) is not covered by the reduce family")
    pro, combine, epi = _NORMS[p]
    return pro, combine, [list(s) for s in epi]


def _normalize_call(n: Any, x: Any, nd: int) -> dict[str, Any] | None:
    """F.normalize(x, p, dim, eps) (torch.fx keeps it one call): x / max(norm_p(x, dim), eps)."""
    names = ("p", "dim", "eps", "out")
    if not n.args or n.args[0] is not x or len(n.args) > 1 + len(names) or not set(n.kwargs) <= set(names):
        return None
    b = {"p": 2.0, "dim": 1, "eps": 1e-12, "out": None, **dict(zip(names, n.args[1:])), **n.kwargs}
    if b["out"] is not None or not _number(b["eps"]):
        raise NotCovered("F.normalize with out= or a non-constant eps is not covered by the reduce family")
    prologue, combine, epilogue = _norm("normalize", b["p"], "none")
    lo, hi = _dims(b["dim"], nd)
    return dict(combine=combine, prologue=prologue, epilogue=epilogue + [["clamp_min", float(b["eps"])]],
                normalize=True, dims=[lo, hi], keepdim=True)


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


def recognise(r: Read) -> FamilyMatch | None:
    names = r.names
    if len(r.match.inputs) != 1 or r.match.params or not any(k in REDUCE_CALLS for k in names) \
            or not all(k in SOURCE_CALLS for k in names):
        return None
    x = r.match.x
    if not x.shape:
        raise NotCovered("a reduction of a 0-d tensor is not covered by the reduce family")
    if r.model is None:
        raise NotCovered("reading a reduction needs the model built on the meta device (to trace its forward)")
    facts = _read_graph(trace_graph(r.model), x.shape)
    if facts is None:
        return None
    if x.dtype != "float32":
        raise NotCovered(f"the reduce family is fp32 only (input {x.dtype})")
    lo, hi = facts["dims"]
    if math.prod(x.shape[lo:hi + 1]) == 0:
        raise NotCovered("a reduction over an empty dim is not covered by the reduce family")
    arg = facts["combine"] in build_reduce.ARG_COMBINES
    want = x.shape if facts["normalize"] else _reduced_shape(x.shape, lo, hi, facts["keepdim"])
    out = r.out
    if out.shape != want or out.dtype != ("int64" if arg else "float32"):
        raise NotCovered(f"the output is {out.dtype} {out.shape}; the reduction read from the forward gives "
                         f"{'int64' if arg else 'float32'} {want}")
    ops = [op for op, _ in facts["epilogue"]]
    core = ["mean"] if facts["combine"] == "sum" and ops[:1] == ["div_len"] else [facts["combine"]] + ops[:1]
    parts = ([facts["prologue"]] if facts["prologue"] != "none" else []) + core + ops[1:]
    parts += ["normalize"] if facts["normalize"] else []
    facts.update(op="_".join(parts), formula=_formula(facts))
    r.match.facts = facts
    return r.match


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

FAMILY: Family | None = Family(
    name="reduce",
    recognise=recognise,
    variants={"rows": build_reduce.rows, "cols": build_reduce.cols, "split": build_reduce.split},
    ideas=IDEAS,
    spec_names=dict(build_reduce.SPEC_PREFIXES),
)
