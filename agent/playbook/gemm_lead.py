"""The GEMM a row program follows, found in a traced forward: an ``nn.Linear`` module, ``F.linear(x, W, b)``, or
``x @ W`` / ``x @ W.T`` (``matmul``, ``mm``, ``W.t()``, ``W.transpose(0, 1)``) of a forward input and a
parameter (:class:`GemmCall`), and the facts the GEMM kernel needs (:class:`Lead`)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

__all__ = ["GemmCall", "Lead", "find_gemms", "node_name"]

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
    """One GEMM of the forward: its fx node, the node of its input (None: not a plain operand), its weight
    (``""``: not a parameter), whether the weight is read transposed, its bias parameter, and the nodes that
    only form its weight operand (``W.T``)."""

    node: Any
    x: Any
    weight: str
    trans_b: bool
    bias: str | None
    operand_nodes: tuple[Any, ...] = ()


def node_name(n: Any) -> str | None:
    """The callee of a call_function / call_method node (``matmul`` for the @ operator), else None."""
    if n.op == "call_method":
        return str(n.target)
    if n.op == "call_function":
        return "matmul" if n.target is operator.matmul else getattr(n.target, "__name__", None)
    return None


def _weight(w: Any) -> tuple[str, bool] | None:
    """(parameter, transposed) of a GEMM's second operand: ``W``, ``W.T``, ``W.t()``, ``W.transpose(0, 1)``."""
    if getattr(w, "op", None) == "get_attr":
        return str(w.target), False
    base = w.args[0] if getattr(w, "args", None) else None
    if getattr(base, "op", None) != "get_attr":
        return None
    name = node_name(w)
    if (name == "getattr" and w.args[1] in ("T", "mT")) or (name == "t" and len(w.args) == 1) or \
            (name == "transpose" and tuple(a % 2 for a in w.args[1:]) in ((0, 1), (1, 0))):
        return str(base.target), True
    return None


def find_gemms(nodes: list[Any], model: Any) -> list[GemmCall]:
    """Every GEMM among ``nodes`` (a forward's traced nodes)."""
    out = []
    for n in nodes:
        name = node_name(n)
        if n.op == "call_module" and type(model.get_submodule(str(n.target))).__name__ == "Linear":
            mod = model.get_submodule(str(n.target))
            out.append(GemmCall(n, n.args[0] if n.args else None, f"{n.target}.weight", True,
                                f"{n.target}.bias" if mod.bias is not None else None))
        elif name == "linear" and n.op == "call_function" and len(n.args) >= 2:
            w = _weight(n.args[1])
            b = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
            plain = w is not None and not w[1] and (b is None or getattr(b, "op", None) == "get_attr")
            out.append(GemmCall(n, n.args[0], w[0], True, str(b.target) if b is not None else None)
                       if plain else GemmCall(n, None, "", False, None))
        elif name in _MATMULS and len(n.args) == 2:
            w = _weight(n.args[1])
            extra = (n.args[1],) if w and w[1] else ()
            out.append(GemmCall(n, n.args[0], w[0], w[1], None, extra) if w else GemmCall(n, None, "", False, None))
    return out
