"""The IR of a fused elementwise chain and its C: each :class:`Node` defines one fp32 C variable
(``t<i>``; the input element is ``v``) from operands and constant parameters; a :class:`Chain`
gives the C body (``Chain.statements()``), the value ``kg_op`` returns (``Chain.expr()``) and a
readable formula. :mod:`.chain` builds one from a traced reference forward."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Union

from kerngen.agent.playbook.ops import BINARY_C, COMPARE_C, PARAM_C, UNARY_C

Operand = Union[str, float]  # a C variable ("v" = the input element, "t3") or a constant
INPUT = "v"

OTHER_OPS = ("where",)  # where(cond, a, b): cond is a comparison
ALL_OPS = tuple(UNARY_C) + tuple(PARAM_C) + tuple(BINARY_C) + tuple(COMPARE_C) + OTHER_OPS

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", **COMPARE_C}


@dataclass(frozen=True)
class Node:
    """One op of the chain: ``var = op(args; params)``."""

    var: str  # the C variable it defines ("t0", ...)
    op: str  # one of ALL_OPS
    args: tuple[Operand, ...]  # variables or constants
    params: tuple[float | None, ...] = ()  # constant parameters (slope, bounds, ...); None: absent
    dtype: str = "float"  # "float", or "bool" for comparisons


@dataclass(frozen=True)
class Chain:
    nodes: tuple[Node, ...]
    result: Operand

    def _dtypes(self) -> dict[str, str]:
        return {n.var: n.dtype for n in self.nodes}

    def statements(self) -> list[str]:
        """The C body: one ``float tK = ...;`` (or ``bool``) per node, in order."""
        dt = self._dtypes()
        return [f"{n.dtype} {n.var} = {_node_c(n, dt)};" for n in self.nodes]

    def expr(self) -> str:
        """The C value ``kg_op`` returns."""
        return _operand_c(self.result, self._dtypes())

    def formula(self, limit: int = 120) -> str:
        """Readable, e.g. ``gelu(x) * sigmoid(x)`` (shortened past ``limit`` characters)."""
        text: dict[str, str] = {INPUT: "x"}
        for n in self.nodes:
            text[n.var] = _shorten(_node_formula(n, text, nested=True), limit)
        if isinstance(self.result, str):
            out = text[self.result]
            node = next((n for n in self.nodes if n.var == self.result), None)
            if node is not None:
                out = _node_formula(node, text, nested=False)
            return _shorten(out, limit)
        return _num(self.result)

    def slug(self, most: int = 4) -> str:
        """A C-identifier fragment naming the ops, e.g. ``gelu_sigmoid_mul``."""
        ops = [n.op for n in self.nodes]
        if not ops:
            return "identity" if self.result == INPUT else "const"
        return "_".join(ops[:most]) + (f"_and{len(ops) - most}" if len(ops) > most else "")

    def facts(self) -> dict[str, Any]:
        """The elementwise family's facts for this chain (see builders.elementwise_vec)."""
        return dict(op=self.slug(), expr=self.expr(), body=self.statements(), formula=self.formula(), chain=self)


# ----------------------------------------------------------------------------------------------
# C text
def _lit(value: float) -> str:
    """A float literal of the fp32 value PyTorch uses for a Python constant (opmath = float)."""
    if math.isinf(value):  # no INFINITY without headers: the bits
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    f32 = struct.unpack("f", struct.pack("f", value))[0]
    s = "%.9g" % f32
    if not any(ch in s for ch in ".e"):
        s += ".0"
    s += "f"
    return f"({s})" if s.startswith("-") else s


def _operand_c(a: Operand, dtypes: dict[str, str], want: str = "float") -> str:
    if not isinstance(a, str):
        return _lit(a)
    if dtypes.get(a, "float") == "bool" and want == "float":
        return f"({a} ? 1.f : 0.f)"  # torch promotes bool to the other operand's float type
    return a


def _pow_c(a: str, b: Operand, b_c: str) -> str:
    # the exponents torch's pow kernel special-cases, written the same way
    special = {2.0: f"{a} * {a}", 3.0: f"{a} * {a} * {a}", 1.0: a, 0.0: "1.f", 0.5: f"sqrtf({a})",
               -0.5: f"rsqrtf({a})", -1.0: f"1.f / {a}", -2.0: f"1.f / ({a} * {a})"}
    if not isinstance(b, str) and float(b) in special:
        return special[float(b)]
    return f"powf({a}, {b_c})"


def _clamp_c(a: str, lo: float | None, hi: float | None) -> str:
    out = a
    if lo is not None:
        out = f"kg_fmax({out}, {_lit(lo)})"
    if hi is not None:
        out = f"kg_fmin({out}, {_lit(hi)})"
    return out


def _node_c(n: Node, dtypes: dict[str, str]) -> str:
    if n.op in COMPARE_C:
        a, b = (_operand_c(x, dtypes) for x in n.args)
        return f"({a} {COMPARE_C[n.op]} {b})"
    if n.op == "where":
        c = _operand_c(n.args[0], dtypes, want="bool")
        a, b = (_operand_c(x, dtypes) for x in n.args[1:])
        return f"({c} ? {a} : {b})"
    if n.op in BINARY_C:
        a, b = (_operand_c(x, dtypes) for x in n.args)
        if n.op == "pow":
            return _pow_c(a, n.args[1], b)
        return BINARY_C[n.op].format(a=a, b=b)
    a = _operand_c(n.args[0], dtypes)
    if n.op == "clamp":
        return _clamp_c(a, *n.params)
    params = {f"p{i}": _lit(p) for i, p in enumerate(n.params) if p is not None}
    table = PARAM_C if n.op in PARAM_C else UNARY_C
    return table[n.op].format(a=a, **params)


# ----------------------------------------------------------------------------------------------
# readable text
def _num(value: float) -> str:
    return "%g" % value


def _shorten(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _node_formula(n: Node, text: dict[str, str], nested: bool) -> str:
    args = [text.get(a, a) if isinstance(a, str) else _num(a) for a in n.args]  # ep0[ch]: an epilogue's tensor
    if n.op in _INFIX:
        s = f"{args[0]} {_INFIX[n.op]} {args[1]}"
        return f"({s})" if nested else s
    params = [_num(p) if p is not None else "None" for p in n.params]
    return f"{n.op}({', '.join(args + params)})"


__all__ = ["ALL_OPS", "BINARY_C", "COMPARE_C", "Chain", "INPUT", "Node", "OTHER_OPS", "Operand", "PARAM_C", "UNARY_C"]
