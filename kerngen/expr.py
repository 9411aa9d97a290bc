"""Safe arithmetic expressions for launch plans (grid, block, shared memory, scalars, sizes).

Parsed with :mod:`ast` and walked over a whitelist: integer and float literals, names,
``+ - * / // % **``, comparisons, ``and or not``, ``a if c else b``, the functions in
:data:`FUNCTIONS`, and tensor facts ``x.shape[i]``, ``x.numel``, ``x.ndim`` where ``x`` is a
bound tensor name (dotted names such as ``conv.weight`` resolve as one name). Nothing is ever
passed to ``eval``.

Two spellings models carry over from C and Python are understood as well: ``ceil(a / b)`` and
``floor(a / b)`` give integers (exact when ``a`` and ``b`` are integers, not rounded through a
float), and ``sizeof(T)`` of a C/CUDA type in :data:`kerngen.c_types.SIZEOF` (``sizeof(float)``,
``sizeof(long long)``, ``sizeof(__half)``, ``sizeof(float4)``...) is replaced by its size in bytes
before the text is parsed, so ``"BLOCK * sizeof(float)"`` is a valid shared-memory size.

An expression comes from a model's answer, so it is bounded in everything it can make the
evaluator do (every failure is an :class:`~kerngen.errors.ExprError` naming it):

- its text: at most :data:`MAX_LEN` characters, its tree at most :data:`MAX_DEPTH` levels deep
  (the parser's own limits, ``RecursionError``, ``MemoryError`` and "too many nested
  parentheses", are caught as well);
- every intermediate value, not only the result: integers stay below ``2**``:data:`MAX_INT_BITS`
  in magnitude (checked before a power is computed, so ``((9**64)**64)**64`` fails at once),
  floats are finite, a complex result (``(-8)**0.5``) is an error, and arithmetic takes numbers
  only (never a shape tuple: ``x.shape * 10**9`` would build a huge tuple);
- exponents (``|e| <=`` :data:`MAX_POW`) and left shifts (``<=`` :data:`MAX_SHIFT`), so that a
  float power stays cheap as well.
"""

from __future__ import annotations

import ast
import re
import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from kerngen.c_types import sizeof_replaced
from kerngen.errors import ExprError

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


def cdiv(a: int, b: int) -> int:  # ceil(a / b) of integers, exact (the expressions' and the builders')
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def _ceil(x: Number) -> int:
    return math.ceil(x)  # a float beyond 2**256 fails the value bound afterwards, inf/nan raise


def _floor(x: Number) -> int:
    return math.floor(x)


FUNCTIONS: dict[str, Callable[..., Number]] = {
    "cdiv": cdiv,
    "ceil_div": cdiv,
    "round_up": _round_up,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "log2": lambda x: int(math.log2(x)) if float(x).is_integer() and x > 0 else math.log2(x),
    "sqrt": math.sqrt,
    "ceil": _ceil,
    "floor": _floor,
}
_EXACT_DIV = {"ceil": cdiv, "floor": operator.floordiv}  # ceil(a / b) of integers, without a float

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

MAX_LEN = 2000  # characters of an expression
MAX_DEPTH = 100  # levels of its syntax tree (each level is a few Python frames when evaluated)
MAX_INT_BITS = 256  # every integer, intermediate ones included, has |v| < 2**256
MAX_POW = MAX_INT_BITS  # |exponent| of ** (the value bound decides first for an integer base > 1)
MAX_SHIFT = 64  # right operand of <<
_MAX_SHOWN = 80  # characters of an expression quoted in a message
_MAX_NAMES = 24  # names listed in an "unknown name" message


def shown(text: object) -> str:
    """An expression as a message quotes it: repr, clipped to one short line."""
    if isinstance(text, int) and text.bit_length() > 1024:  # repr() refuses > 4300 digits
        return f"<an integer of {text.bit_length()} bits>"
    r = repr(text)
    if len(r) <= _MAX_SHOWN:
        return r
    return f"{r[:_MAX_SHOWN - 3]}... ({len(r)} characters)"


def parse(text: str) -> ast.Expression:
    """Parse once and validate the node types and the depth; evaluation walks the cached tree."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"empty expression {shown(text)}")
    if len(text) > MAX_LEN:
        raise ExprError(f"expression {shown(text)} is longer than {MAX_LEN} characters")
    return _parse(text)


# a tensor named with a numeric part (``net.0.weight``, nn.Sequential's names) is no Python attribute chain:
# its numeric parts are spelled _kg<N>_ for the parser and read back by _dotted
_DOTTED = re.compile(r"\b[A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|\d+))+")
_NUMERIC_PART = re.compile(r"\.(\d+)(?=\.|$)")


def _numeric_parts(source: str) -> str:
    return _DOTTED.sub(lambda m: _NUMERIC_PART.sub(r"._kg\1_", m.group(0)), source)


@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.Expression:
    source = _numeric_parts(sizeof_replaced(text, shown(text)))
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:  # also "too many nested parentheses", null bytes, huge literals
        raise ExprError(f"cannot parse expression {shown(text)}: {_first_line(exc.msg)}") from None
    except ValueError as exc:  # older Pythons: null bytes
        raise ExprError(f"cannot parse expression {shown(text)}: {_first_line(exc)}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"cannot parse expression {shown(text)}: nested too deeply") from None
    if _depth(tree) > MAX_DEPTH:
        raise ExprError(f"expression {shown(text)} is nested more than {MAX_DEPTH} levels deep")
    for node in ast.walk(tree):
        _check_node(node, text)
    return tree


def _depth(tree: ast.AST) -> int:
    """Depth of the tree (at most MAX_DEPTH + 1), without recursion: it may be thousands of
    levels deep."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d <= MAX_DEPTH:  # no need to look further down once past the limit
            stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _first_line(text: object) -> str:
    lines = str(text).splitlines()
    return lines[0][:200] if lines else ""


_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Load,
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)


def _check_node(node: ast.AST, text: str) -> None:
    if not isinstance(node, _ALLOWED):
        hint = " (several values, e.g. a grid's x, y, z, are a list of expressions)" if isinstance(
            node, (ast.Tuple, ast.List)) else ""
        raise ExprError(f"{type(node).__name__} is not allowed in expression {shown(text)}{hint}")
    if isinstance(node, ast.BinOp) and type(node.op) not in _BINOPS:
        raise ExprError(f"operator {type(node.op).__name__} is not allowed in {shown(text)}")
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float)):  # bool is an int
            raise ExprError(f"only numbers are allowed as literals in {shown(text)}")
        _number(node.value, text)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else (_dotted(node.func) or "this call")
            raise ExprError(f"unknown function {shown(called)} in {shown(text)} "
                            f"(allowed: {', '.join(FUNCTIONS)}, and sizeof(T) of a C type)")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"keyword or starred arguments are not allowed in {shown(text)}")
    if isinstance(node, ast.Name) and node.id.startswith("__"):
        raise ExprError(f"name {node.id!r} is not allowed in {shown(text)}")
    if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
        raise ExprError(f"attribute {node.attr!r} is not allowed in {shown(text)}")


def _number(value: Any, text: object) -> Number:
    """``value`` if it is a number within the bounds, else :class:`ExprError`."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise ExprError(f"a value in {shown(text)} is out of range (|v| >= 2**{MAX_INT_BITS})")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ExprError(f"a value in {shown(text)} is not a finite number ({value})")
        return value
    if isinstance(value, complex):
        raise ExprError(f"expression {shown(text)} has a complex value")
    raise ExprError(f"expression {shown(text)} uses a {_kind(value)} where a number is needed")


def _kind(value: Any) -> str:
    if isinstance(value, TensorFacts):
        return "tensor"
    if isinstance(value, tuple):
        return "shape"
    return type(value).__name__


def evaluate(text: str | int | float, env: Mapping[str, Any]) -> Number:
    """Evaluate ``text`` with names from ``env`` (numbers or :class:`TensorFacts`)."""
    if isinstance(text, (bool, int, float)):
        return _number(text, text)
    if not isinstance(text, str) or not 0 < len(text) <= MAX_LEN:
        parse(text)  # raises the error that names what is wrong with it
    code = _compiled(text)
    try:
        value = code(env)
    except ExprError:
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:  # 1/0, float(2**256)**9, sqrt(-1), min()
        raise ExprError(f"cannot evaluate {shown(text)}: {_first_line(exc)}") from None
    except (RecursionError, MemoryError):  # not reached within MAX_DEPTH; kept as a last guard
        raise ExprError(f"cannot evaluate {shown(text)}: too deep or too large") from None
    if isinstance(value, (TensorFacts, tuple)):
        raise ExprError(f"expression {shown(text)} is a tensor or shape, not a number")
    return _number(value, text)


def evaluate_int(text: str | int, env: Mapping[str, Any]) -> int:
    value = evaluate(text, env)
    if isinstance(value, float):
        if not value.is_integer():
            raise ExprError(f"expression {shown(text)} gave {value}, expected an integer")
        value = _number(int(value), text)  # finite, so int() cannot overflow
    return int(value)


def evaluate_bool(text: str, env: Mapping[str, Any]) -> bool:
    return bool(evaluate(text, env))


def names_in(text: str) -> set[str]:
    """Top-level names an expression reads (dotted names joined), for validation."""
    tree = parse(text)
    found: set[str] = set()
    funcs = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None:
                head, _, last = dotted.rpartition(".")
                found.add(head if last in _TENSOR_ATTRS and head else dotted)
        elif isinstance(node, ast.Name) and id(node) not in funcs:
            found.add(node.id)
    # a dotted name also walks its leading Name; keep the longest spelling only
    return {n for n in found if not any(o != n and o.startswith(n + ".") for o in found)}


def dotted_name(node: ast.AST) -> str | None:
    """The dotted name an attribute chain of a parsed expression spells (``conv.weight``, ``net.0.weight``)."""
    return _dotted(node)


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        attr = node.attr
        parts.append(attr[3:-1] if attr.startswith("_kg") and attr.endswith("_") and attr[3:-1].isdigit() else attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


# ----- compiled evaluation --------------------------------------------------------------------
# Each validated tree is turned once (per text: the cache below) into nested closures, one per
# node, that take the names and give the value. The planner evaluates the same few hundred texts
# millions of times (every configuration of a tuning space, every constraint): walking the tree
# with a NodeVisitor each time was most of the time of static pruning. Every arithmetic result
# still goes through _number, so no intermediate value leaves the bounds.
Env = Mapping[str, Any]
Code = Callable[[Env], Any]


@lru_cache(maxsize=4096)
def _compiled(text: str) -> Code:
    return _Compiler(text).build(parse(text).body)


def _known(env: Env) -> str:
    """What the expression could have named (a few dozen at most: a message stays short)."""
    names = sorted(str(n) for n in env)
    if not names:
        return "no names are bound here: only numbers, operators and functions"
    more = f", ... ({len(names)} in all)" if len(names) > _MAX_NAMES else ""
    return f"known names: {', '.join(names[:_MAX_NAMES])}{more}"


class _Compiler:
    """Builds the closures of a tree that :func:`parse` validated (depth included)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def num(self, value: Any) -> Number:
        return _number(value, self.text)

    def unknown(self, name: str, env: Env) -> ExprError:
        return ExprError(f"unknown name {name!r} in expression {shown(self.text)} ({_known(env)})")

    def build(self, node: ast.AST) -> Code:
        method = getattr(self, f"build_{type(node).__name__}", None)
        if method is None:  # pragma: no cover - guarded by parse()
            raise ExprError(f"{type(node).__name__} is not allowed in {shown(self.text)}")
        return method(node)

    def build_Constant(self, node: ast.Constant) -> Code:
        value = node.value
        return lambda env: value

    def build_Name(self, node: ast.Name) -> Code:
        name = node.id

        def lookup(env: Env) -> Any:
            try:
                return env[name]
            except KeyError:
                raise self.unknown(name, env) from None
        return lookup

    def build_Attribute(self, node: ast.Attribute) -> Code:
        dotted, attr = _dotted(node), node.attr
        base = self.build(node.value) if attr in _TENSOR_ATTRS else None

        def attribute(env: Env) -> Any:
            if dotted is not None and dotted in env:
                return env[dotted]
            if base is not None:
                value = base(env)
                if isinstance(value, TensorFacts):
                    got = getattr(value, attr)
                    return tuple(got) if attr == "shape" else got
            raise self.unknown(dotted if dotted is not None else attr, env)
        return attribute

    def build_Subscript(self, node: ast.Subscript) -> Code:
        base, index = self.build(node.value), self.build(node.slice)

        def subscript(env: Env) -> Any:
            b, i = base(env), index(env)
            if not isinstance(b, tuple) or isinstance(i, bool) or not isinstance(i, int):
                raise ExprError(f"only shape[i] may be indexed, in {shown(self.text)}")
            try:
                return b[i]
            except IndexError:
                raise ExprError(f"shape index {i} out of range in {shown(self.text)}") from None
        return subscript

    def build_BinOp(self, node: ast.BinOp) -> Code:
        left, right, op, num, text = self.build(node.left), self.build(node.right), _BINOPS[type(node.op)], \
            self.num, self.text
        if isinstance(node.op, ast.Pow):
            def power(env: Env) -> Any:
                a, b = num(left(env)), num(right(env))
                if abs(b) > MAX_POW:
                    raise ExprError(f"exponent too large in {shown(text)} (|exponent| <= {MAX_POW})")
                if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
                    # |a| ** b >= 2 ** ((bits - 1) * b): refuse before computing it
                    if (abs(a).bit_length() - 1) * b >= MAX_INT_BITS:
                        raise ExprError(f"a value in {shown(text)} is out of range (|v| >= 2**{MAX_INT_BITS})")
                return num(op(a, b))
            return power
        if isinstance(node.op, ast.LShift):
            def shift(env: Env) -> Any:
                a, b = num(left(env)), num(right(env))
                if b > MAX_SHIFT:
                    raise ExprError(f"shift too large in {shown(text)} (at most {MAX_SHIFT})")
                return num(op(a, b))
            return shift
        left, right = self.numeric(node.left, left), self.numeric(node.right, right)

        def binop(env: Env) -> Any:
            value = op(left(env), right(env))
            if type(value) is int and value.bit_length() <= MAX_INT_BITS:  # the common case, inline
                return value
            return num(value)
        return binop

    def numeric(self, node: ast.AST, code: Code) -> Code:
        """``code`` where ``node`` can only give a number within the bounds (a literal, arithmetic,
        a call: each checked where it is made), else ``code`` followed by the check: a name may
        be bound to a tensor or a shape, a comparison gives a bool."""
        if isinstance(node, (ast.Constant, ast.BinOp, ast.Call)) or (
                isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not)):
            return code
        num = self.num

        def checked(env: Env) -> Any:
            value = code(env)
            return value if type(value) is int and value.bit_length() <= MAX_INT_BITS else num(value)
        return checked

    def build_UnaryOp(self, node: ast.UnaryOp) -> Code:
        operand, num = self.build(node.operand), self.num
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if isinstance(node.op, ast.USub):
            return lambda env: -num(operand(env))
        if isinstance(node.op, ast.UAdd):
            return lambda env: +num(operand(env))
        raise ExprError(f"operator {type(node.op).__name__} is not allowed in {shown(self.text)}")

    def build_BoolOp(self, node: ast.BoolOp) -> Code:
        values = [self.build(v) for v in node.values]  # every operand is evaluated (no short circuit)
        if isinstance(node.op, ast.And):
            return lambda env: all([v(env) for v in values])
        return lambda env: any([v(env) for v in values])

    def build_Compare(self, node: ast.Compare) -> Code:
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise ExprError(f"comparison {type(op).__name__} is not allowed in {shown(self.text)}")
        first = self.build(node.left)
        rest = [(_CMPOPS[type(op)], self.build(comp)) for op, comp in zip(node.ops, node.comparators)]
        if len(rest) == 1:
            (op, second), = rest
            return lambda env: bool(op(first(env), second(env)))

        def compare(env: Env) -> bool:
            left = first(env)
            for op, comp in rest:
                right = comp(env)
                if not op(left, right):
                    return False
                left = right
            return True
        return compare

    def build_IfExp(self, node: ast.IfExp) -> Code:
        test, body, orelse = self.build(node.test), self.build(node.body), self.build(node.orelse)
        return lambda env: body(env) if test(env) else orelse(env)

    def build_Call(self, node: ast.Call) -> Code:
        name = node.func.id  # type: ignore[union-attr]
        fn, num = FUNCTIONS[name], self.num
        args = [self.build(a) for a in node.args]
        exact = None
        if name in _EXACT_DIV and len(node.args) == 1:
            arg = node.args[0]
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Div):
                exact = (_EXACT_DIV[name], self.build(arg.left), self.build(arg.right))

        def call(env: Env) -> Any:
            if exact is not None:
                div, top, bottom = exact
                a, b = num(top(env)), num(bottom(env))
                if isinstance(a, int) and isinstance(b, int):  # ceil(N / 256): exact, however large N is
                    return num(div(a, b))
            values = [a(env) for a in args]
            if name in ("min", "max") and len(values) == 1 and isinstance(values[0], tuple):
                values = list(values[0])  # min(x.shape): the shape's elements
            return num(fn(*[num(v) for v in values]))
        return call
