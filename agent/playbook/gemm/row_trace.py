"""A GEMM followed by a row-local tail, read from the traced forward: the GEMM (:class:`~.gemm.lead.Lead`) and
what follows it as a :class:`~.row_program.RowProgram`.

The graph comes from the front end (:mod:`.graph`, every node's shape known); every value after the GEMM keeps
a :class:`Layout`: which dim of its shape runs along the GEMM's rows and which along
a row's columns (all other dims are 1). Elementwise ops go through :class:`~.pointwise.Translator` (the same ops,
constants and NaN rules as every fused chain); parameters and forward inputs they read become extra tensors
indexed by row and/or column (:class:`~.row_program.TensorRef`) where they broadcast along one row. Row ops:
sum / mean / amax / amin / max / min (with a dim) / logsumexp over the columns (or over a size-1 dim: the value
itself), softmax and log_softmax over the columns, group norm / layer norm over the columns, an instance norm
of a row viewed as one channel, an eval-mode batch norm of (rows, columns) (per column: elementwise), max / avg
pool 1-D over the columns, and views that only add or drop size-1 dims. Anything else, or anything
that mixes rows, raises :class:`~.not_covered.NotCovered` with a one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerngen.agent.playbook.gemm.lead import Lead, find_gemms
from kerngen.agent.playbook.graph import Graph, Node, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.pointwise import Translator
from kerngen.agent.playbook.row_program import (REDUCE_OPS, Length, Pool, PoolKind, Reduction, RowNode, RowOp,
                                                RowProgram, TensorRef)

__all__ = ["Layout", "RowTail", "ROW_CALLS", "trace_rows"]

# what makes a graph more than GEMM + elementwise (the gemm family's own problems otherwise)
ROW_CALLS = frozenset({"sum", "mean", "amax", "amin", "logsumexp", "max", "min", "softmax", "log_softmax", "prod",
                       "std", "var", "norm", "linalg_vector_norm", "argmax", "argmin", "cumsum", "cumprod",
                       "group_norm", "layer_norm", "instance_norm", "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d",
                       "adaptive_max_pool1d"})
_VIEWS = ("unsqueeze", "squeeze", "view", "reshape", "_unsafe_view", "flatten", "contiguous", "clone", "detach")


@dataclass(frozen=True)
class RowTail:
    lead: Lead
    program: RowProgram


@dataclass(frozen=True)
class Layout:
    """Which dim of a value's shape runs along the GEMM's rows (``row``) and along a row's columns (``col``,
    ``length`` of them); None: the value does not vary that way."""

    shape: tuple[int, ...]
    row: int | None
    col: int | None
    length: Length | None


@dataclass(frozen=True)
class _Src:
    """A forward input or a parameter (or a view of one that only adds or drops size-1 dims)."""

    name: str
    shape: tuple[int, ...]  # the view's
    base: tuple[int | None, ...]  # per dim of the view: the bound tensor's dim (None: a size-1 dim)
    base_shape: tuple[int, ...]

    def stride(self, dim: int) -> str:
        d = self.base[dim]
        return " * ".join(f"{self.name}.shape[{i}]" for i in range(d + 1, len(self.base_shape))) or "1"

    def size_expr(self, dim: int) -> str:
        return f"{self.name}.shape[{self.base[dim]}]"


def _src(name: str, shape: tuple[int, ...]) -> _Src:
    return _Src(name, shape, tuple(i if s != 1 else None for i, s in enumerate(shape)), shape)


def _map_dims(old: tuple[int, ...], new: tuple[int, ...], what: str) -> dict[int, int]:
    """old dim -> new dim for a view that only adds or drops size-1 dims; NotCovered otherwise."""
    a = [i for i, s in enumerate(old) if s != 1]
    b = [i for i, s in enumerate(new) if s != 1]
    if [old[i] for i in a] != [new[i] for i in b]:
        raise NotCovered(f"{what} reshapes {tuple(old)} to {tuple(new)}: it mixes the rows and columns of the GEMM's "
                         "output, not covered")
    return dict(zip(a, b))


def _one(v: Any, what: str) -> int:
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise NotCovered(f"{what} {tuple(v)} is not one number")
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, int):
        raise NotCovered(f"{what} {v!r} is not a constant integer")
    return v


class _RowTracer(Translator):
    def __init__(self, g: Graph, lead: Lead) -> None:
        super().__init__(g)
        self.lead = lead
        self.rows: list[RowNode] = []
        self.by_var: dict[str, RowNode] = {}
        self.tensors: list[TensorRef] = []
        self.tensor_len: dict[str, Length] = {}
        self.layout: dict[str, Layout] = {}
        self.src: dict[str, _Src] = {}
        self.pairs: set[str] = set()

    # -- IR -----------------------------------------------------------------------------------
    def add(self, op: RowOp, args: tuple, length: Length | None, **kw: Any) -> str:
        var = f"t{len(self.rows)}"
        node = RowNode(var, op, tuple(args), length, **kw)
        self.rows.append(node)
        self.by_var[var] = node
        self.dtypes[var] = node.dtype
        return var

    def emit(self, op: str, args: tuple, params: tuple = (), dtype: str = "float") -> str:
        """An elementwise op (what :class:`Translator` emits): a vector when any operand is one."""
        length = next((ln for a in args if isinstance(a, str) and (ln := self._length(a)) is not None), None)
        return self.add(RowOp.ew, args, length, ew=op, params=tuple(params), dtype=dtype)

    def _length(self, a: str) -> Length | None:
        return self.by_var[a].length if a in self.by_var else self.tensor_len.get(a)

    def tensor_operand(self, ref: TensorRef, length: Length | None) -> str:
        if ref not in self.tensors:
            self.tensors.append(ref)
        op = f"e{self.tensors.index(ref)}"
        if ref.per_column:
            self.tensor_len[op] = length
        return op

    def param_column(self, name: str, length: Length) -> str:
        if not self.g.is_param(name):
            raise NotCovered(f"{name} is not a tensor of the model: not covered")
        return self.tensor_operand(TensorRef(name, None, "1"), length)

    # -- shapes -------------------------------------------------------------------------------
    @staticmethod
    def shape(n: Node) -> tuple[int, ...]:
        if n.shape is None or n.op in ("max", "min") and n.overload == "dim":
            raise NotCovered(f"{n.name} is not one tensor: not covered by the row program")
        return n.shape

    def value(self, r: Any, what: str) -> tuple[str, Layout]:
        if r in self.pairs:
            raise NotCovered(f"{what} of max/min's (values, indices) pair: not covered")
        if r not in self.layout:
            raise NotCovered(f"{what} of a forward input or a parameter (not the GEMM's rows): not covered")
        return self.env[r], self.layout[r]

    def source(self, r: Ref) -> _Src | None:
        """The input or parameter ``r`` (or a view of one), None for a value of the rows."""
        if r not in self.src and self.g.tensor(r) is not None:
            self.src[r] = _src(str(r), self.g.tensor(r).shape)
        return self.src.get(r)

    def broadcast(self, n: Node) -> Layout:
        """The layout of an elementwise node's result; classifies the tensors it reads (their operand for this use)."""
        shape = self.shape(n)
        nd = len(shape)
        row = col = None
        length: Length | None = None
        ins = [r for r in n.refs if r not in self.g.constants]
        for a in ins:
            if a in self.layout:
                la = self.layout[a]
                pad = nd - len(la.shape)
                for mine, theirs in ((row, la.row), (col, la.col)):
                    if theirs is not None and mine not in (None, theirs + pad):
                        raise NotCovered(f"{n.name} combines values along different dims of the GEMM's output: "
                                         "not row-local")
                row = la.row + pad if la.row is not None else row
                if la.col is not None:
                    if length is not None and length.now != la.length.now:
                        raise NotCovered(f"{n.name} combines rows of {length.now} and {la.length.now} columns")
                    col, length = la.col + pad, length or la.length
            elif self.source(a) is None:
                self.value(a, n.name)  # says why
        if row is None:
            raise NotCovered(f"{n.name} is computed from inputs or parameters only: not covered by the row program")
        for a in ins:
            if a not in self.src:
                continue
            s = self.src[a]
            pad = nd - len(s.shape)
            row_i = col_i = None
            for i, size in enumerate(s.shape):
                p = i + pad
                if size == 1:
                    continue
                if p == row and size == self.lead.m:
                    row_i = i
                elif p == col and size == length.now:
                    col_i = i
                elif col is None and p != row:
                    col, col_i, length = p, i, Length(s.size_expr(i), size)
                else:
                    raise NotCovered(f"{s.name} of shape {s.shape} does not broadcast along one row of the GEMM's "
                                     f"output ({n.name}): not covered")
            ref = TensorRef(s.name, s.stride(row_i) if row_i is not None else None,
                            s.stride(col_i) if col_i is not None else None)
            self.env[a] = self.tensor_operand(ref, length)
        return Layout(shape, row, col, length)

    # -- the graph ----------------------------------------------------------------------------
    def step(self, n: Node) -> None:
        name, x = n.op, n.args.get("self", n.args.get("input"))
        if name in _VIEWS:
            self.view(n, x)
        elif name == "getitem" and x in self.pairs:
            if n["index"] != 0:
                raise NotCovered("the indices of max/min over a dim (an arg-reduction) are not covered")
            self.env[n.name], self.layout[n.name] = self.env[x], self.layout[x]
        elif name in ("max", "min") and n.overload == "other":
            self.elementwise(n)  # torch.max(x, y): elementwise
        elif name in REDUCE_OPS:
            dim = n.get("dim")
            if name in ("max", "min") and dim is None:
                raise NotCovered(f"{name} over all elements is not row-local")
            self.reduce(n, REDUCE_OPS[name], x, dim, bool(n.get("keepdim", False)))
            if name in ("max", "min"):
                self.pairs.add(n.name)
        elif name in ("softmax", "log_softmax"):
            if n.get("dtype") is not None:
                raise NotCovered(f"{name} with a dtype is not covered by the row program")
            self.softmax(n, RowOp(name), x, n["dim"])
        elif name == "max_pool1d":
            if _one(n["dilation"], "dilation") != 1:
                raise NotCovered("max_pool1d with dilation or indices is not covered by the row program")
            self.pool(n, PoolKind.max, x, n["kernel_size"], n["stride"], n["padding"], n["ceil_mode"], True)
        elif name == "avg_pool1d":
            self.pool(n, PoolKind.avg, x, n["kernel_size"], n["stride"], n["padding"], n["ceil_mode"],
                      n["count_include_pad"])
        elif name in ("group_norm", "layer_norm", "instance_norm"):
            self.norm(n, x)
        elif name == "batch_norm":
            self.batch_norm(n, x)
        elif name in ROW_CALLS:
            raise NotCovered(f"{name} after the GEMM is not covered by the row program")
        else:
            self.elementwise(n)

    def elementwise(self, n: Node) -> None:
        lay = self.broadcast(n)
        self.visit(n)
        r = self.env[n.name]
        if not isinstance(r, str) or r not in self.by_var:
            raise NotCovered(f"{n.name} is a constant or a parameter, not a value of the GEMM's rows: not covered")
        self.layout[n.name] = lay

    def view(self, n: Node, x: Any) -> None:
        new = self.shape(n)
        if self.source(x) is not None:
            s = self.src[x]
            m = _map_dims(s.shape, new, n.name)
            base = [None] * len(new)
            for i, j in m.items():
                base[j] = s.base[i]
            self.src[n.name] = _Src(s.name, new, tuple(base), s.base_shape)
            return
        var, lay = self.value(x, n.name)
        m = _map_dims(lay.shape, new, n.name)
        self.env[n.name] = var
        self.layout[n.name] = Layout(new, m[lay.row], m[lay.col] if lay.col is not None else None, lay.length)

    @staticmethod
    def _drop(lay: Layout, d: int, keepdim: bool, shape: tuple[int, ...], col: int | None) -> Layout:
        shift = (lambda p: p if p is None or keepdim or p < d else p - 1)  # noqa: E731
        return Layout(shape, shift(lay.row), shift(col), None if col is None else lay.length)

    def reduce(self, n: Any, red: Reduction, x: Any, dim: Any, keepdim: bool) -> None:
        var, lay = self.value(x, f"{red.value}")
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
        if dim is None or isinstance(dim, (tuple, list)) or isinstance(dim, bool) or not isinstance(dim, int):
            raise NotCovered(f"{red.value} over all elements or several dims is not row-local")
        d = dim % len(lay.shape)
        shape = tuple(1 if i == d else s for i, s in enumerate(lay.shape) if i != d or keepdim)
        if d == lay.row:
            raise NotCovered(f"{red.value} over dim {d}, the GEMM's rows: not row-local")
        if d == lay.col:
            self.env[n.name] = self.add(RowOp.reduce, (var,), None, reduction=red)
            self.layout[n.name] = self._drop(lay, d, keepdim, shape, None)
        elif lay.shape[d] == 1:  # one element: the value itself
            self.env[n.name] = var
            self.layout[n.name] = self._drop(lay, d, keepdim, shape, lay.col)
        else:
            raise NotCovered(f"{red.value} over dim {d} of a {lay.shape} value is not along one row")

    def softmax(self, n: Any, op: RowOp, x: Any, dim: Any) -> None:
        var, lay = self.value(x, op.value)
        if not isinstance(dim, int) or isinstance(dim, bool) or dim % len(lay.shape) != lay.col:
            raise NotCovered(f"{op.value} over dim {dim} of a {lay.shape} value is not over the GEMM's columns")
        self.env[n.name] = self.add(op, (var,), lay.length)
        self.layout[n.name] = lay

    def norm(self, n: Node, x: Any) -> None:
        kind = n.op
        var, lay = self.value(x, kind)
        nd, shape = len(lay.shape), lay.shape
        if lay.col is None:
            raise NotCovered(f"{kind} of one value per row is not covered")
        w, b, eps = n["weight"], n["bias"], float(n["eps"])
        if (w is None) != (b is None) and kind != "layer_norm":
            raise NotCovered(f"{kind} with a weight or a bias alone is not covered by the row program")
        if kind == "group_norm":
            if (nd, lay.row, lay.col) != (2, 0, 1):
                raise NotCovered(f"group_norm of a {shape} value: its channels are not the GEMM's columns")
            groups = int(n["num_groups"])
        elif kind == "layer_norm":
            if tuple(n["normalized_shape"]) != (lay.length.now,) or lay.col != nd - 1:
                raise NotCovered(f"layer_norm{tuple(n['normalized_shape'])} of a {shape} value is not over one row")
            groups = 1
        else:  # instance norm of a row viewed as one channel: (rows, 1, ..., columns, ...)
            if not n["use_input_stats"]:
                raise NotCovered(f"{kind} with running statistics is not covered by the row program")
            if nd < 3 or lay.row != 0 or shape[1] != 1 or lay.col < 2:
                raise NotCovered(f"{kind} of a {shape} value: its instances are not the GEMM's rows")
            groups = 1
            if w is not None:
                ops = tuple(self.tensor_operand(TensorRef(str(p), None, None), None) for p in (w, b))
                self.env[n.name] = self.add(RowOp.norm, (var, *ops), lay.length, groups=1, params=(eps,))
                self.layout[n.name] = lay
                return
        if lay.length.now % groups:
            raise NotCovered(f"{kind}: {lay.length.now} columns do not split into {groups} groups")
        ops = (self.param_column(w, lay.length) if w else 1.0, self.param_column(b, lay.length) if b else 0.0)
        self.env[n.name] = self.add(RowOp.norm, (var, *ops), lay.length, groups=groups, params=(eps,))
        self.layout[n.name] = lay

    def batch_norm(self, n: Node, x: Any) -> None:
        var, lay = self.value(x, "batch_norm")
        if n["training"] or n["running_mean"] is None:
            raise NotCovered(f"{n.label} normalises with batch statistics: not row-local")
        rm = self.g.tensor(n["running_mean"])
        if len(lay.shape) != 2 or lay.col != 1 or rm is None or tuple(rm.shape) != (lay.length.now,):
            raise NotCovered(f"{n.label} of a {lay.shape} value: its channels are not the columns")
        col = lambda ref: self.param_column(str(ref), lay.length)  # noqa: E731
        t = self.batch_norm_eval(n, var, col, "the row program")
        self.env[n.name], self.layout[n.name] = t, lay

    def pool(self, n: Node, kind: PoolKind, x: Any, k: Any, stride: Any, pad: Any, ceil: Any, include: Any) -> None:
        var, lay = self.value(x, f"{kind.value}_pool1d")
        if lay.col != len(lay.shape) - 1:
            raise NotCovered(f"a 1-D pool over the last dim of a {lay.shape} value is not over the GEMM's columns")
        if ceil:
            raise NotCovered("a 1-D pool with ceil_mode is not covered by the row program")
        k = _one(k, "kernel_size")
        p = Pool(kind, k, _one(stride, "stride") if stride not in (None, (), []) else k, _one(pad, "padding"),
                 bool(include))
        if p.out_length(lay.length).now < 1 or p.padding * 2 > k:
            raise NotCovered(f"a 1-D pool of {k} over {lay.length.now} columns has no output")
        length = p.out_length(lay.length)
        self.env[n.name] = self.add(RowOp.pool, (var,), length, pool=p)
        self.layout[n.name] = Layout(self.shape(n), lay.row, lay.col, length)


# ---------------------------------------------------------------------------------------------
def trace_rows(g: Graph) -> RowTail | None:
    """The graph as GEMM + row program; None when it is not one GEMM of a graph input and a parameter followed
    by a row op (the gemm family's problem, or another family's); :class:`NotCovered` when it is but the tail is
    not covered."""
    live = g.live()
    gemms = find_gemms(g, live)
    if len(gemms) != 1 or not (isinstance(gemms[0].x, Ref) and g.is_input(gemms[0].x)) or not gemms[0].weight:
        return None
    if not any(n.op in ROW_CALLS and not (n.op in ("max", "min") and n.overload == "other") for n in live):
        return None
    gc = gemms[0]
    xs, ws = g.tensor(gc.x).shape, g.tensor(gc.weight).shape
    if len(xs) != 2 or len(ws) != 2 or xs[1] != ws[1 if gc.trans_b else 0]:
        raise NotCovered("the GEMM is not a 2-D input times a weight matrix: not covered by the row program")
    lead = Lead(str(gc.x), gc.weight, gc.trans_b, gc.bias, xs[0], ws[0 if gc.trans_b else 1], xs[1])
    if lead.m < 2 or lead.n < 2:
        raise NotCovered("a GEMM of one row or one column is not covered by the row program")
    t = _RowTracer(g, lead)
    t.env[gc.node.name] = t.add(RowOp.source, (), Length(lead.n_expr, lead.n))
    t.layout[gc.node.name] = Layout((lead.m, lead.n), 0, 1, Length(lead.n_expr, lead.n))
    skip = {gc.node.name, *gc.operand_nodes}  # the GEMM, and W.T as its operand
    for n in live:
        if n.name not in skip:
            t.step(n)
    var, lay = t.value(g.output, "the forward's result")
    if lay.row is None:
        raise NotCovered("the forward's result does not run along the GEMM's rows")
    elementwise = all(r.op in (RowOp.source, RowOp.ew) for r in t.rows)
    if elementwise and (lay.shape, lay.row, lay.col) == ((lead.m, lead.n), 0, 1):
        return None  # elementwise only (torch.min(x, y) looked like a reduction): the gemm family's epilogue
    stride = lambda d: " * ".join(f"out.shape[{i}]" for i in range(d + 1, len(lay.shape))) or "1"  # noqa: E731
    out_ref = TensorRef("out", stride(lay.row), stride(lay.col) if lay.col is not None else None)
    return RowTail(lead, RowProgram(tuple(t.rows), tuple(t.tensors), var, out_ref))
