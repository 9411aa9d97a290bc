"""The GEMM a row program follows, found in a traced graph: ``nn.Linear`` / ``F.linear(x, W, b)``, or
``x @ W`` / ``x @ W.T`` (``matmul``, ``mm``, ``W.t()``, ``W.transpose(0, 1)``) of a forward input and a
parameter (:class:`GemmCall`), and the facts the GEMM kernel needs (:class:`Lead`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerngen.agent.playbook.graph import Graph, Node, Ref

__all__ = ["GemmCall", "Lead", "find_gemms"]

_MATMULS = ("matmul", "mm")


@dataclass(frozen=True)
class Lead:
    """The GEMM: ``x (M x K) @ W^T`` (``trans_b``: W stored [N][K], as nn.Linear's) or ``x @ W`` (W [K][N])."""

    x: str
    weight: str
    trans_b: bool
    bias: str | None
    m: int
    n: int
    k: int

    @property
    def n_expr(self) -> str:
        return f"{self.weight}.shape[{0 if self.trans_b else 1}]"

    @property
    def what(self) -> str:
        return f"{self.x} @ {self.weight}{'^T' if self.trans_b else ''}" + (f" + {self.bias}" if self.bias else "")


@dataclass(frozen=True)
class GemmCall:
    """One GEMM of the graph: its node, the tensor it multiplies (None: not a plain operand), its weight
    (``""``: not a parameter), whether the weight is read transposed, its bias parameter, and the nodes that
    only form its weight operand (``W.T``)."""

    node: Node
    x: Any
    weight: str
    trans_b: bool
    bias: str | None
    operand_nodes: tuple[str, ...] = ()


def _weight(g: Graph, w: Any) -> tuple[str, bool, tuple[str, ...]] | None:
    """(parameter, transposed, the nodes that only form it) of a GEMM's second operand: ``W``, ``W.T``, ``W.t()``,
    ``W.transpose(0, 1)``."""
    if isinstance(w, Ref) and g.is_param(w):
        return str(w), False, ()
    n = g.node(w) if isinstance(w, Ref) else None
    base = n.args.get("self") if n is not None else None
    if n is None or not (isinstance(base, Ref) and g.is_param(base)) or len(g.tensor(base).shape) != 2:
        return None
    if n.op in ("numpy_T", "t", "mT") or (n.op == "transpose" and {n["dim0"] % 2, n["dim1"] % 2} == {0, 1}):
        return str(base), True, (n.name,)
    return None


def find_gemms(g: Graph, nodes: list[Node]) -> list[GemmCall]:
    """Every GEMM among ``nodes`` (the graph's live nodes)."""
    out = []
    for n in nodes:
        if n.op == "linear":
            w = _weight(g, n["weight"])
            b = n["bias"]
            plain = w is not None and not w[1] and (b is None or g.is_param(b))
            out.append(GemmCall(n, n["input"], w[0], True, b) if plain else GemmCall(n, None, "", False, None))
        elif n.op in _MATMULS:
            w = _weight(g, n.args.get("other", n.args.get("mat2")))
            out.append(GemmCall(n, n["self"], w[0], w[1], None, w[2]) if w else GemmCall(n, None, "", False, None))
    return out
