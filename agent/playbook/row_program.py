"""The row program: what a GEMM's output rows go through after the GEMM, as a small typed IR.

Every op of the program is local to one row of the GEMM's output (one batch element: the N columns of
``x @ W^T``) or to one value per row. A :class:`RowNode` defines one C variable (``t<i>``) that is either a
*vector* (one value per column of the row, ``length`` columns) or a *scalar* (one value per row,
``length`` None). The ops (:class:`RowOp`):

- ``source``: the GEMM's output row (its fused elementwise epilogue included);
- ``ew``: one elementwise op of :mod:`.chain_ir` (``ew`` names it) over vectors, scalars, constants and
  extra tensors (:class:`TensorRef`, operands ``e<i>``); a vector if any operand is one;
- ``reduce``: a vector to one value per row (:class:`Reduction`; a reduction over a size-1 dim is no node: the
  value itself);
- ``softmax`` / ``log_softmax``: a vector to a vector (over the row);
- ``norm``: group norm over ``groups`` groups of consecutive columns (instance and layer norm are one
  group), ``eps``, optional affine tensors (operands 2 and 3, or absent);
- ``pool``: a 1-D max or average pool over the columns (:class:`Pool`): a vector of another length.

:mod:`.gemm.row_trace` builds a program from a traced forward; :mod:`.row_codegen` compiles it to straight-line
CUDA-C for the row kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

__all__ = ["REDUCE_OPS", "Length", "Pool", "PoolKind", "Reduction", "RowNode", "RowOp", "RowProgram", "RowOperand",
           "TensorRef"]

RowOperand = Union[str, float]  # "t3" (a node), "e0" (an extra tensor) or a constant


class RowOp(str, Enum):
    source = "source"
    ew = "ew"
    reduce = "reduce"
    softmax = "softmax"
    log_softmax = "log_softmax"
    norm = "norm"
    pool = "pool"


class Reduction(str, Enum):
    sum = "sum"
    mean = "mean"
    max = "max"
    min = "min"
    logsumexp = "logsumexp"


# the ATen reductions the row program and conv_tail's stages compute (max / min with a dim: their values)
REDUCE_OPS = {"sum": Reduction.sum, "mean": Reduction.mean, "amax": Reduction.max, "amin": Reduction.min,
              "max": Reduction.max, "min": Reduction.min, "logsumexp": Reduction.logsumexp}


class PoolKind(str, Enum):
    max = "max"
    avg = "avg"


@dataclass(frozen=True)
class Length:
    """A row's length: an expression over the bound tensors' shapes (the plan's language) and its value now."""

    expr: str
    now: int


@dataclass(frozen=True)
class Pool:
    kind: PoolKind
    kernel: int
    stride: int
    padding: int = 0
    count_include_pad: bool = True  # avg only: padded positions count in the divisor

    def out_length(self, n: Length) -> Length:
        return Length(f"(({n.expr}) + {2 * self.padding - self.kernel}) // {self.stride} + 1",
                      (n.now + 2 * self.padding - self.kernel) // self.stride + 1)


@dataclass(frozen=True)
class TensorRef:
    """An extra tensor the program reads (a parameter by its dotted name, a forward input, ``out``): per row
    (``row_stride``, an expression, elements between rows) and/or per column (``col_stride``); neither: its
    one element."""

    name: str
    row_stride: str | None
    col_stride: str | None

    @property
    def per_column(self) -> bool:
        return self.col_stride is not None


@dataclass(frozen=True)
class RowNode:
    var: str
    op: RowOp
    args: tuple[RowOperand, ...] = ()
    length: Length | None = None  # None: one value per row
    ew: str = ""  # the chain_ir op of an ``ew`` node
    params: tuple[float | None, ...] = ()  # the ew op's constant parameters; (eps,) of a norm
    dtype: str = "float"  # "bool" for comparisons
    reduction: Reduction | None = None
    groups: int = 0  # a norm's groups
    pool: Pool | None = None

    @property
    def vector(self) -> bool:
        return self.length is not None


@dataclass(frozen=True)
class RowProgram:
    nodes: tuple[RowNode, ...]  # in topological order; nodes[0] is the source
    tensors: tuple[TensorRef, ...]  # operand e<i> is tensors[i]
    result: str  # the var the forward returns
    out: TensorRef  # where a row of the result goes (out's row and column strides)

    def node(self, var: str) -> RowNode:
        return next(n for n in self.nodes if n.var == var)

    @property
    def source(self) -> RowNode:
        return self.nodes[0]

    def steps(self) -> tuple[str, ...]:
        """The row ops in order, e.g. ``("group_norm/16", "reduce:max")`` (elementwise ops left out)."""
        out = []
        for n in self.nodes:
            if n.op == RowOp.reduce:
                out.append(f"reduce:{n.reduction.value}")
            elif n.op == RowOp.norm:
                out.append(f"norm/{n.groups}")
            elif n.op == RowOp.pool:
                out.append(f"{n.pool.kind.value}_pool/{n.pool.kernel}")
            elif n.op in (RowOp.softmax, RowOp.log_softmax):
                out.append(n.op.value)
        return tuple(out)

    def formula(self, limit: int = 160) -> str:
        """Readable, e.g. ``sum((x / 2)) * 1.5``: x is the GEMM's row."""
        text: dict[str, str] = {}
        for n in self.nodes:
            args = [text.get(a, self.tensors[int(a[1:])].name if a.startswith("e") else a)
                    if isinstance(a, str) else "%g" % a for a in n.args]
            if n.op == RowOp.source:
                text[n.var] = "x"
            elif n.op == RowOp.ew:
                extra = ["%g" % p for p in n.params if p is not None]
                text[n.var] = f"{n.ew}({', '.join(args + extra)})"
            elif n.op == RowOp.reduce:
                text[n.var] = f"{n.reduction.value}({args[0]})"
            elif n.op == RowOp.norm:
                text[n.var] = f"group_norm({', '.join(args)}; groups={n.groups})"
            elif n.op == RowOp.pool:
                text[n.var] = f"{n.pool.kind.value}_pool({args[0]}, {n.pool.kernel}, {n.pool.stride})"
            else:
                text[n.var] = f"{n.op.value}({args[0]})"
        s = text[self.result]
        return s if len(s) <= limit else s[: limit - 3] + "..."
