"""Safe arithmetic expressions for launch plans (grid, block, shared memory, scalars, sizes).

Parsed with :mod:`ast` and walked over a whitelist: integer and float literals, names,
``+ - * / // % **``, comparisons, ``and or not``, ``a if c else b``, the functions in
:data:`FUNCTIONS`, and tensor facts ``x.shape[i]``, ``x.numel``, ``x.ndim`` where ``x`` is a
bound tensor name (dotted names such as ``conv.weight`` resolve as one name). Nothing is ever
passed to ``eval``.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from .errors import ExprError

Number = int | float


@dataclass(frozen=True)
class TensorFacts:
    """What an expression may read of a tensor: its shape (and so numel and ndim)."""

    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


FUNCTIONS: dict[str, Callable[..., Number]] = {
    "cdiv": _cdiv,
    "ceil_div": _cdiv,
    "round_up": _round_up,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "log2": lambda x: int(math.log2(x)) if float(x).is_integer() and x > 0 else math.log2(x),
    "sqrt": math.sqrt,
}

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_TENSOR_ATTRS = ("shape", "numel", "ndim")
_MAX_LEN = 2000
_MAX_POW = 64


@lru_cache(maxsize=4096)
def parse(text: str) -> ast.Expression:
    """Parse once and validate the node types; evaluation walks the cached tree."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"empty expression {text!r}")
    if len(text) > _MAX_LEN:
        raise ExprError(f"expression longer than {_MAX_LEN} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        _check_node(node, text)
    return tree


_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Load,
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)


def _check_node(node: ast.AST, text: str) -> None:
    if not isinstance(node, _ALLOWED):
        raise ExprError(f"{type(node).__name__} is not allowed in expression {text!r}")
    if isinstance(node, ast.BinOp) and type(node.op) not in _BINOPS:
        raise ExprError(f"operator {type(node.op).__name__} is not allowed in {text!r}")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
        raise ExprError(f"only numbers are allowed as literals in {text!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExprError(f"unknown function in {text!r} (allowed: {', '.join(FUNCTIONS)})")
        if node.keywords:
            raise ExprError(f"keyword arguments are not allowed in {text!r}")
    if isinstance(node, ast.Name) and node.id.startswith("__"):
        raise ExprError(f"name {node.id!r} is not allowed in {text!r}")


def evaluate(text: str | int | float, env: Mapping[str, Any]) -> Number:
    """Evaluate ``text`` with names from ``env`` (numbers or :class:`TensorFacts`)."""
    if isinstance(text, bool):
        return int(text)
    if isinstance(text, (int, float)):
        return text
    tree = parse(text)
    try:
        value = _Eval(env, text).visit(tree.body)
    except ExprError:
        raise
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as exc:
        raise ExprError(f"cannot evaluate {text!r}: {exc}") from None
    if isinstance(value, TensorFacts) or isinstance(value, tuple):
        raise ExprError(f"expression {text!r} is a tensor or shape, not a number")
    return value


def evaluate_int(text: str | int, env: Mapping[str, Any]) -> int:
    value = evaluate(text, env)
    if isinstance(value, float):
        if not value.is_integer():
            raise ExprError(f"expression {text!r} gave {value}, expected an integer")
        value = int(value)
    return int(value)


def evaluate_bool(text: str, env: Mapping[str, Any]) -> bool:
    return bool(evaluate(text, env))


def names_in(text: str) -> set[str]:
    """Top-level names an expression reads (dotted names joined), for validation."""
    tree = parse(text)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None:
                head, _, last = dotted.rpartition(".")
                found.add(head if last in _TENSOR_ATTRS and head else dotted)
        elif isinstance(node, ast.Name) and not _is_func_name(tree, node):
            found.add(node.id)
    # a dotted name also walks its leading Name; keep the longest spelling only
    return {n for n in found if not any(o != n and o.startswith(n + ".") for o in found)}


def _is_func_name(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _Eval(ast.NodeVisitor):
    def __init__(self, env: Mapping[str, Any], text: str) -> None:
        self.env = env
        self.text = text

    def generic_visit(self, node: ast.AST) -> Any:  # pragma: no cover - guarded by parse()
        raise ExprError(f"{type(node).__name__} is not allowed in {self.text!r}")

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        return self._lookup(node.id)

    def _lookup(self, name: str) -> Any:
        if name not in self.env:
            raise ExprError(f"unknown name {name!r} in expression {self.text!r}")
        return self.env[name]

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        dotted = _dotted(node)
        if dotted is not None and dotted in self.env:
            return self.env[dotted]
        if node.attr in _TENSOR_ATTRS:
            base = self.visit(node.value)
            if isinstance(base, TensorFacts):
                value = getattr(base, node.attr)
                return tuple(value) if node.attr == "shape" else value
        raise ExprError(f"unknown name {dotted or node.attr!r} in expression {self.text!r}")

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        base = self.visit(node.value)
        index = self.visit(node.slice)
        if not isinstance(base, tuple) or not isinstance(index, int):
            raise ExprError(f"only shape[i] may be indexed, in {self.text!r}")
        try:
            return base[index]
        except IndexError:
            raise ExprError(f"shape index {index} out of range in {self.text!r}") from None

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POW:
            raise ExprError(f"exponent too large in {self.text!r}")
        if isinstance(node.op, ast.LShift) and right > _MAX_POW:
            raise ExprError(f"shift too large in {self.text!r}")
        return _BINOPS[type(node.op)](left, right)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
        raise ExprError(f"operator {type(node.op).__name__} is not allowed in {self.text!r}")

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.visit(v) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        for op, comp in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                raise ExprError(f"comparison {type(op).__name__} is not allowed in {self.text!r}")
            right = self.visit(comp)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_Call(self, node: ast.Call) -> Any:
        func = FUNCTIONS[node.func.id]  # type: ignore[union-attr]
        return func(*[self.visit(a) for a in node.args])
