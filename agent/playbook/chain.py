"""Fused elementwise chains: a reference forward that is a DAG of elementwise ops over ONE input
tensor, translated to straight-line fp32 C for the elementwise template's ``kg_op``.

``translate(model)`` traces the (CPU-built) reference module with ``torch.fx.symbolic_trace`` and
returns a :class:`Chain`: an IR of :class:`Node` s in topological order (each defines one C
variable ``t<i>``; the input element is ``v``) plus the result operand. ``Chain.statements()``
gives the C body (``float t0 = ...;``), ``Chain.expr()`` the value ``kg_op`` returns. Anything
outside the covered set (reductions, shape ops, parameters or buffers, a second input, casts, an
op the table below does not know) raises :class:`NotCovered` with a one-line reason.

Tracing runs the model's ``forward`` on proxies, as the reference run does on tensors: no other
model code is executed. Every op is computed in fp32 (the template converts bf16/fp16 once on load
and once on store), so a chain is at least as accurate as PyTorch's op-by-op evaluation. NaN
propagates as in PyTorch for relu/clamp/maximum/minimum (``kg_fmax``/``kg_fmin`` in the template).
"""

from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass
from typing import Any, Callable, Union

from .families import NotCovered

Operand = Union[str, float]  # a C variable ("v" = the input element, "t3") or a constant
INPUT = "v"
_FP32_MAX = 3.4028234663852886e38

# ----------------------------------------------------------------------------------------------
# the ops of the IR and their C (fp32). {a} {b} {c}: operands; {p0} {p1}: constant parameters.
UNARY_C: dict[str, str] = {
    "relu": "({a} < 0.f ? 0.f : {a})",  # NaN stays NaN, as torch.relu
    "gelu": "0.5f * {a} * (1.f + erff({a} * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * {a} * (1.f + tanhf(0.79788456080286536f * ({a} + 0.044715f * {a} * {a} * {a})))",
    "sigmoid": "1.f / (1.f + expf(-{a}))",
    "tanh": "tanhf({a})",
    "silu": "{a} / (1.f + expf(-{a}))",
    "mish": "{a} * tanhf(log1pf(expf({a})))",
    "hardsigmoid": "kg_fmin(kg_fmax({a} + 3.f, 0.f), 6.f) * (1.f / 6.f)",
    "hardswish": "{a} * kg_fmin(kg_fmax({a} + 3.f, 0.f), 6.f) * (1.f / 6.f)",
    "selu": "1.05070098735548049f * ({a} > 0.f ? {a} : 1.67326324235437728f * expm1f({a}))",
    "logsigmoid": "fminf({a}, 0.f) - log1pf(expf(-fabsf({a})))",
    "softsign": "{a} / (1.f + fabsf({a}))",
    "neg": "-{a}",
    "abs": "fabsf({a})",
    "exp": "expf({a})",
    "expm1": "expm1f({a})",
    "log": "logf({a})",
    "log1p": "log1pf({a})",
    "sqrt": "sqrtf({a})",
    "rsqrt": "rsqrtf({a})",
    "square": "{a} * {a}",
    "reciprocal": "1.f / {a}",
    "sin": "sinf({a})",
    "cos": "cosf({a})",
    "erf": "erff({a})",
    "floor": "floorf({a})",
    "ceil": "ceilf({a})",
    "trunc": "truncf({a})",
    "round": "rintf({a})",  # half to even, as torch.round
}
PARAM_C: dict[str, str] = {  # unary ops with constant parameters
    "leaky_relu": "({a} > 0.f ? {a} : {a} * {p0})",
    "elu": "({a} > 0.f ? {a} : {p0} * expm1f({a}))",
    "softplus": "({a} * {p0} > {p1} ? {a} : log1pf(expf({a} * {p0})) / {p0})",
    "threshold": "({a} <= {p0} ? {p1} : {a})",
    "clamp": "",  # p0 / p1 may be absent: built by _clamp_c
}
BINARY_C: dict[str, str] = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "pow": "",  # special-cased exponents: _pow_c
    "maximum": "kg_fmax({a}, {b})",
    "minimum": "kg_fmin({a}, {b})",
    "fmax": "fmaxf({a}, {b})",
    "fmin": "fminf({a}, {b})",
}
COMPARE_C: dict[str, str] = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
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
    args = [text[a] if isinstance(a, str) else _num(a) for a in n.args]
    if n.op in _INFIX:
        s = f"{args[0]} {_INFIX[n.op]} {args[1]}"
        return f"({s})" if nested else s
    params = [_num(p) if p is not None else "None" for p in n.params]
    return f"{n.op}({', '.join(args + params)})"


# ----------------------------------------------------------------------------------------------
# the PyTorch callables and methods we know: name -> (kind, positional parameter names, defaults)
_REQ = object()


@dataclass(frozen=True)
class _Sig:
    kind: str
    params: tuple[tuple[str, Any], ...]  # (name, default or _REQ), in positional order


def _sig(kind: str, *params: str | tuple[str, Any]) -> _Sig:
    return _Sig(kind, tuple(p if isinstance(p, tuple) else (p, _REQ) for p in params))


_INPLACE = ("inplace", False)
_SIGS: dict[str, _Sig] = {}
for _name in UNARY_C:
    _SIGS[_name] = _sig(_name, "input", _INPLACE)
_SIGS.update({
    "negative": _sig("neg", "input"), "pos": _sig("identity", "input"),
    "expit": _sig("sigmoid", "input"),
    "gelu": _sig("gelu", "input", ("approximate", "none")),
    "leaky_relu": _sig("leaky_relu", "input", ("negative_slope", 0.01), _INPLACE),
    "elu": _sig("elu", "input", ("alpha", 1.0), _INPLACE),
    "softplus": _sig("softplus", "input", ("beta", 1.0), ("threshold", 20.0)),
    "threshold": _sig("threshold", "input", "threshold", "value", _INPLACE),
    "hardtanh": _sig("hardtanh", "input", ("min_val", -1.0), ("max_val", 1.0), _INPLACE),
    "relu6": _sig("relu6", "input", _INPLACE),
    "clamp": _sig("clamp", "input", ("min", None), ("max", None)),
    "clip": _sig("clamp", "input", ("min", None), ("max", None)),
    "clamp_min": _sig("clamp", "input", "min"),
    "clamp_max": _sig("clamp_max", "input", "max"),
    "add": _sig("add", "input", "other", ("alpha", 1)),
    "sub": _sig("sub", "input", "other", ("alpha", 1)),
    "subtract": _sig("sub", "input", "other", ("alpha", 1)),
    "rsub": _sig("rsub", "input", "other", ("alpha", 1)),
    "mul": _sig("mul", "input", "other"), "multiply": _sig("mul", "input", "other"),
    "div": _sig("div", "input", "other", ("rounding_mode", None)),
    "divide": _sig("div", "input", "other", ("rounding_mode", None)),
    "true_divide": _sig("div", "input", "other"), "truediv": _sig("div", "input", "other"),
    "pow": _sig("pow", "input", "exponent"),
    "maximum": _sig("maximum", "input", "other"), "minimum": _sig("minimum", "input", "other"),
    "fmax": _sig("fmax", "input", "other"), "fmin": _sig("fmin", "input", "other"),
    "max": _sig("max", "input", ("other", None)), "min": _sig("min", "input", ("other", None)),
    "where": _sig("where", "condition", "input", "other"),
    "zeros_like": _sig("zeros_like", "input"), "ones_like": _sig("ones_like", "input"),
    "full_like": _sig("full_like", "input", "fill_value"),
    "clone": _sig("identity", "input", ("memory_format", None)),
    "contiguous": _sig("identity", "input", ("memory_format", None)),
    "detach": _sig("identity", "input"),
    "dropout": _sig("dropout", "input", ("p", 0.5), ("training", True), _INPLACE),
})
for _name in COMPARE_C:
    _SIGS[_name] = _sig(_name, "input", "other")
_METHOD_SIGS = {"where": _sig("where", "input", "condition", "other")}  # x.where(cond, y)

_REDUCTIONS = {"sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "std", "var", "norm", "softmax",
               "log_softmax", "logsumexp", "cumsum", "cumprod", "all", "any", "median", "mode", "topk", "sort"}
_SHAPE_OPS = {"view", "reshape", "permute", "transpose", "flatten", "unflatten", "unsqueeze", "squeeze", "expand",
              "expand_as", "repeat", "cat", "concat", "stack", "split", "chunk", "getitem", "t", "narrow", "size",
              "dim", "numel", "getattr", "roll", "flip", "pad", "gather", "index_select", "movedim"}
_CASTS = {"to", "float", "half", "bfloat16", "double", "type", "type_as", "int", "long", "bool", "short", "char",
          "byte"}


def _why(name: str) -> str:
    if name in _REDUCTIONS or name in ("max", "min"):
        return f"reduction {name} is not covered by the elementwise chain"
    if name in _SHAPE_OPS:
        return f"shape op {name} is not covered by the elementwise chain"
    if name in _CASTS:
        return f"dtype cast .{name}() is not covered by the elementwise chain"
    return f"op {name} is not covered by the elementwise chain"


def _function_table() -> dict[Callable[..., Any], tuple[str, bool]]:
    """Callable (torch.*, F.*, torch.special.*, operator.*) -> (signature name, in place)."""
    import torch
    import torch.nn.functional as F

    table: dict[Callable[..., Any], tuple[str, bool]] = {}
    spaces = (operator, torch.special, torch, F)  # later spaces win a shared callable
    for name in _SIGS:
        for space in spaces:
            for attr, inplace in ((name, False), (name + "_", True)):
                fn = getattr(space, attr, None)
                if callable(fn) and not isinstance(fn, type):
                    table[fn] = (name, inplace)
    table[operator.truediv] = ("truediv", False)
    table[operator.neg] = ("neg", False)
    return table


# ----------------------------------------------------------------------------------------------
def _trace(model: Any) -> Any:
    import torch.fx as fx

    try:
        return fx.symbolic_trace(model).graph
    # what user code under symbolic tracing raises: control flow on a proxy (TraceError), proxies
    # handed to non-torch code (TypeError), len()/iteration (RuntimeError), attribute lookups...
    except (fx.proxy.TraceError, TypeError, RuntimeError, NotImplementedError, AttributeError, ValueError,
            KeyError, IndexError) as exc:
        first = " ".join(str(exc).split())[:160]
        raise NotCovered(f"cannot trace the forward with torch.fx ({type(exc).__name__}: {first})") from None


def _const(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotCovered(f"{what}: argument {value!r} is not covered by the elementwise chain")
    v = float(value)
    if not math.isfinite(v):
        raise NotCovered(f"{what}: constant {value!r} is not finite; not covered by the elementwise chain")
    if abs(v) > _FP32_MAX:
        raise NotCovered(f"{what}: constant {value!r} is outside the fp32 range")
    return v


class _Translator:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.functions = _function_table()
        self.env: dict[Any, Operand] = {}
        self.nodes: list[Node] = []
        self.dtypes: dict[str, str] = {}
        self.placeholders = 0

    # -- helpers ----------------------------------------------------------------------------
    def emit(self, op: str, args: tuple[Operand, ...], params: tuple[float | None, ...] = (),
             dtype: str = "float") -> str:
        var = f"t{len(self.nodes)}"
        self.nodes.append(Node(var, op, args, params, dtype))
        self.dtypes[var] = dtype
        return var

    def dtype(self, a: Operand) -> str:
        return self.dtypes.get(a, "float") if isinstance(a, str) else "float"

    def operand(self, value: Any, what: str) -> Operand:
        import torch.fx as fx

        if isinstance(value, fx.Node):
            return self.env[value]  # every reachable node was translated before its users
        return _const(value, what)

    def tensor(self, value: Any, what: str, want: str = "float") -> Operand:
        import torch.fx as fx

        if not isinstance(value, fx.Node):
            raise NotCovered(f"{what} of a constant is not covered by the elementwise chain")
        a = self.env[value]
        if self.dtype(a) != want:
            raise NotCovered(f"{what} of a {self.dtype(a)} value is not covered by the elementwise chain")
        return a

    # -- binding ----------------------------------------------------------------------------
    @staticmethod
    def bind(sig: _Sig, name: str, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        names = [p for p, _ in sig.params]
        if len(args) > len(names):
            raise NotCovered(f"{name} with {len(args)} positional arguments is not covered by the elementwise chain")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise NotCovered(f"{name}(..., {k}=...) is not covered by the elementwise chain")
            bound[k] = v
        for p, default in sig.params:
            if p not in bound:
                if default is _REQ:
                    raise NotCovered(f"{name} without {p} is not covered by the elementwise chain")
                bound[p] = default
        return bound

    # -- one call ---------------------------------------------------------------------------
    def call(self, name: str, sig: _Sig, b: dict[str, Any]) -> Operand:
        kind = sig.kind
        if b.get("inplace") not in (None, False, True):
            raise NotCovered(f"{name}: inplace={b['inplace']!r} is not covered by the elementwise chain")
        if kind == "gelu":
            approx = b["approximate"]
            if approx not in ("none", "tanh"):
                raise NotCovered(f"gelu(approximate={approx!r}) is not covered by the elementwise chain")
            return self.emit("gelu_tanh" if approx == "tanh" else "gelu", (self.tensor(b["input"], name),))
        if kind in UNARY_C:
            return self.emit(kind, (self.tensor(b["input"], name),))
        if kind == "identity":
            if b.get("memory_format") is not None:
                raise NotCovered(f"{name}(memory_format=...) is not covered by the elementwise chain")
            return self.tensor(b["input"], name)
        if kind in ("leaky_relu", "elu"):
            p = b["negative_slope"] if kind == "leaky_relu" else b["alpha"]
            return self.emit(kind, (self.tensor(b["input"], name),), (_const(p, name),))
        if kind == "softplus":
            return self.emit(kind, (self.tensor(b["input"], name),), (_const(b["beta"], name), _const(b["threshold"], name)))
        if kind == "threshold":
            return self.emit(kind, (self.tensor(b["input"], name),), (_const(b["threshold"], name), _const(b["value"], name)))
        if kind in ("hardtanh", "relu6", "clamp", "clamp_max"):
            return self._clamp(kind, name, b)
        if kind in ("add", "sub", "rsub"):
            return self._add(kind, name, b)
        if kind in ("mul", "div", "pow", "maximum", "minimum", "fmax", "fmin"):
            if kind == "div" and b.get("rounding_mode") is not None:
                raise NotCovered(f"div(rounding_mode={b['rounding_mode']!r}) is not covered by the elementwise chain")
            return self._binary(kind, name, b["input"], b["other"] if "other" in b else b["exponent"])
        if kind in ("max", "min"):  # the elementwise form only (visit() refused the reductions)
            return self._binary("maximum" if kind == "max" else "minimum", name, b["input"], b["other"])
        if kind in COMPARE_C:
            a, c = self.operand(b["input"], name), self.operand(b["other"], name)
            self._floats(name, a, c)
            return self.emit(kind, (a, c), dtype="bool")
        if kind == "where":
            cond = self.tensor(b["condition"], "where's condition", want="bool")
            a, c = self.operand(b["input"], name), self.operand(b["other"], name)
            self._floats(name, a, c)
            return self.emit("where", (cond, a, c))
        if kind in ("zeros_like", "ones_like", "full_like"):
            self.tensor(b["input"], name)
            return {"zeros_like": 0.0, "ones_like": 1.0}.get(kind) if kind != "full_like" else _const(b["fill_value"], name)
        if kind == "dropout":
            if b["training"] and _const(b["p"], name) != 0.0:
                raise NotCovered("dropout in training mode is not covered by the elementwise chain")
            return self.tensor(b["input"], name)
        raise AssertionError(f"signature kind {kind} has no translation")  # a table bug, not user input

    def _floats(self, name: str, *ops: Operand) -> None:
        for a in ops:
            if self.dtype(a) != "float":
                raise NotCovered(f"{name} of a boolean value is not covered by the elementwise chain")

    def _arith(self, name: str, a: Operand, c: Operand) -> None:
        # a boolean operand counts as 0/1 next to a number; bool (op) bool is a logical op in torch
        if self.dtype(a) == "bool" and self.dtype(c) == "bool":
            raise NotCovered(f"{name} of two boolean values is not covered by the elementwise chain")

    def _binary(self, kind: str, name: str, x: Any, y: Any) -> Operand:
        a, c = self.operand(x, name), self.operand(y, name)
        if kind in ("maximum", "minimum", "fmax", "fmin", "pow"):
            self._floats(name, a, c)
        self._arith(name, a, c)
        return self.emit(kind, (a, c))

    def _add(self, kind: str, name: str, b: dict[str, Any]) -> Operand:
        a, c = self.operand(b["input"], name), self.operand(b["other"], name)
        self._arith(name, a, c)
        alpha = _const(b["alpha"], name)
        if kind == "rsub":  # rsub(x, y, alpha) = y - alpha * x
            a, c = c, a
            kind = "sub"
        if alpha != 1.0:
            c = alpha * c if not isinstance(c, str) else self.emit("mul", (c, alpha))
        return self.emit(kind, (a, c))

    def _clamp(self, kind: str, name: str, b: dict[str, Any]) -> Operand:
        a = self.tensor(b["input"], name)
        if kind == "hardtanh":
            lo, hi = b["min_val"], b["max_val"]
        elif kind == "relu6":
            lo, hi = 0.0, 6.0
        elif kind == "clamp_max":
            lo, hi = None, b["max"]
        else:
            lo, hi = b["min"], b.get("max")
        if lo is None and hi is None:
            raise NotCovered(f"{name} without bounds is not covered by the elementwise chain")
        bounds = tuple(None if v is None else _const(v, f"{name}'s bound") for v in (lo, hi))
        return self.emit("clamp", (a,), bounds)

    # -- modules ----------------------------------------------------------------------------
    def module(self, target: str, args: tuple, kwargs: dict[str, Any]) -> Operand:
        import torch.nn as nn

        mod = self.model.get_submodule(target)
        kind = type(mod).__name__
        if any(True for _ in mod.parameters()) or any(True for _ in mod.buffers()):
            raise NotCovered(f"module {target} ({kind}) has parameters or buffers: not covered by the elementwise chain")
        if len(args) != 1 or kwargs:
            raise NotCovered(f"module {target} ({kind}) with {len(args)} arguments is not covered by the elementwise chain")
        x = self.tensor(args[0], kind)
        simple = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu", nn.Mish: "mish",
                  nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish", nn.SELU: "selu",
                  nn.LogSigmoid: "logsigmoid", nn.Softsign: "softsign"}
        if type(mod) in simple:
            return self.emit(simple[type(mod)], (x,))
        if isinstance(mod, nn.Identity):
            return x
        if isinstance(mod, nn.GELU):
            return self.call(kind, _SIGS["gelu"], dict(input=args[0], approximate=mod.approximate))
        if isinstance(mod, nn.LeakyReLU):
            return self.emit("leaky_relu", (x,), (_const(mod.negative_slope, kind),))
        if isinstance(mod, nn.ELU):
            return self.emit("elu", (x,), (_const(mod.alpha, kind),))
        if isinstance(mod, nn.Softplus):
            return self.emit("softplus", (x,), (_const(mod.beta, kind), _const(mod.threshold, kind)))
        if isinstance(mod, nn.Threshold):
            return self.emit("threshold", (x,), (_const(mod.threshold, kind), _const(mod.value, kind)))
        if isinstance(mod, nn.Hardtanh):  # ReLU6 too
            return self.emit("clamp", (x,), (_const(mod.min_val, kind), _const(mod.max_val, kind)))
        if isinstance(mod, nn.Dropout):
            if mod.training and mod.p != 0.0:
                raise NotCovered("dropout in training mode is not covered by the elementwise chain")
            return x
        names = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Flatten": "flatten", "Unflatten": "unflatten"}
        if kind in names:
            raise NotCovered(_why(names[kind]))
        raise NotCovered(f"module {target} ({kind}) is not covered by the elementwise chain")

    # -- the graph --------------------------------------------------------------------------
    def run(self, graph: Any) -> Chain:
        import torch.fx as fx

        nodes = list(graph.nodes)
        out = next((n for n in nodes if n.op == "output"), None)
        if out is None:
            raise NotCovered("the traced forward has no output")
        result = out.args[0]
        if not isinstance(result, fx.Node):
            raise NotCovered("the forward does not return one tensor (a tuple, a list or a constant)")
        live = _reachable(result)
        self.check_inplace(nodes)
        for n in nodes:
            if n.op == "placeholder":
                self.placeholders += 1
                if self.placeholders > 1:
                    raise NotCovered(f"forward takes a second input {n.target!r}: the elementwise chain covers "
                                     "one input tensor")
                self.env[n] = INPUT
            if n in live and n.op != "placeholder":
                self.visit(n)
        r = self.env[result]
        if self.dtype(r) != "float":
            raise NotCovered("the forward returns a boolean tensor: not covered by the elementwise chain")
        return _live(self.nodes, r)

    def visit(self, n: Any) -> None:
        import torch.fx as fx

        if n.op == "get_attr":
            raise NotCovered(f"the forward reads the model's parameter or buffer {n.target!r}: "
                             "not covered by the elementwise chain")
        if n.op == "call_module":
            self.env[n] = self.module(str(n.target), tuple(n.args), dict(n.kwargs))
            return
        name, _ = self._name(n)
        if name in ("max", "min") and (len(n.args) != 2 or n.kwargs or not isinstance(n.args[1], fx.Node)):
            raise NotCovered(_why(name))  # torch.max(x), x.max(dim=1): reductions
        sig = _METHOD_SIGS.get(name) if n.op == "call_method" else None
        sig = sig or _SIGS.get(name)
        if sig is None:
            raise NotCovered(_why(name))
        self.env[n] = self.call(name, sig, self.bind(sig, name, tuple(n.args), dict(n.kwargs)))

    def _name(self, n: Any) -> tuple[str, bool]:
        """(signature name, in place) of a call_function / call_method node."""
        if n.op == "call_method":
            name = str(n.target)
            if name.endswith("_") and not name.endswith("__") and name[:-1] in _SIGS:
                return name[:-1], True
            return name, False
        try:
            hit = self.functions.get(n.target)
        except TypeError:  # an unhashable callable
            hit = None
        if hit is None:
            return getattr(n.target, "__name__", str(n.target)), False
        return hit

    def _inplace(self, n: Any) -> bool:
        if n.op == "call_module":
            return bool(getattr(self.model.get_submodule(str(n.target)), "inplace", False))
        if n.op == "call_method":
            name = str(n.target)
        elif n.op == "call_function":
            _, hit = self._name(n)
            name = getattr(n.target, "__name__", "")
            if hit:
                return True
        else:
            return False
        return (name.endswith("_") and not name.endswith("__")) or n.kwargs.get("inplace") is True

    def _alias_of(self, n: Any) -> Any:
        """The tensor node ``n`` returns a view of (in-place ops, x.detach(), nn.Identity...), or None."""
        import torch.fx as fx
        import torch.nn as nn

        if not n.args or not isinstance(n.args[0], fx.Node):
            return None
        if self._inplace(n):
            return n.args[0]
        if n.op == "call_module":
            mod = self.model.get_submodule(str(n.target))
            return n.args[0] if isinstance(mod, (nn.Identity, nn.Dropout)) else None
        if n.op in ("call_function", "call_method"):
            name, _ = self._name(n)
            sig = _SIGS.get(name)
            if sig is not None and (sig.kind == "dropout" or (sig.kind == "identity" and name != "clone")):
                return n.args[0]
        return None

    def _reads_shape_only(self, n: Any) -> bool:
        if n.op not in ("call_function", "call_method"):
            return False
        sig = _SIGS.get(self._name(n)[0])
        return sig is not None and sig.kind in ("zeros_like", "ones_like", "full_like")

    def check_inplace(self, nodes: list[Any]) -> None:
        """An in-place op is translated as a plain op, which is right only when nothing reads the
        tensor it overwrites after it, other than through its result (or views of its result)."""
        order = {n: i for i, n in enumerate(nodes)}
        base = {n: b for n in nodes if (b := self._alias_of(n)) is not None}  # n is a view of b

        def chain_of(n: Any) -> list[Any]:  # n, the tensor it views, the tensor that one views...
            out = [n]
            while out[-1] in base:
                out.append(base[out[-1]])
            return out

        for n in nodes:
            if n not in base or not self._inplace(n):
                continue
            storage = chain_of(n)[-1]
            for m in nodes:
                chain = chain_of(m)
                if chain[-1] is not storage or n in chain:  # another storage, or a view of n's result
                    continue
                if any(order[u] > order[n] and u not in base and not self._reads_shape_only(u) for u in m.users):
                    raise NotCovered(f"in-place {_label(n)} on a value the forward reads again afterwards is "
                                     "not covered by the elementwise chain")
                if any(order[u] > order[n] and u in base and n not in chain_of(u) for u in m.users
                       if u is not n and self._inplace(u)):
                    raise NotCovered(f"in-place {_label(n)} on a value the forward changes again afterwards is "
                                     "not covered by the elementwise chain")


def _label(n: Any) -> str:
    return str(n.target) if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _reachable(result: Any) -> set[Any]:
    seen: set[Any] = set()
    stack = [result]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def _live(nodes: list[Node], result: Operand) -> Chain:
    """The chain of the nodes the result depends on, renumbered t0, t1, ... in order."""
    by_var = {n.var: n for n in nodes}
    need: set[str] = set()
    stack = [result] if isinstance(result, str) else []
    while stack:
        v = stack.pop()
        if v in need or v not in by_var:
            continue
        need.add(v)
        stack.extend(a for a in by_var[v].args if isinstance(a, str))
    kept = [n for n in nodes if n.var in need]
    rename = {n.var: f"t{i}" for i, n in enumerate(kept)}
    ren = lambda a: rename.get(a, a) if isinstance(a, str) else a  # noqa: E731
    kept = [Node(rename[n.var], n.op, tuple(ren(a) for a in n.args), n.params, n.dtype) for n in kept]
    return Chain(tuple(kept), ren(result))


def translate(model: Any) -> Chain:
    """The reference module's forward as a fused elementwise chain, or :class:`NotCovered`."""
    if model is None:
        raise NotCovered("cannot trace the forward: the model did not build on the CPU")
    return _Translator(model).run(_trace(model))


__all__ = ["ALL_OPS", "Chain", "INPUT", "Node", "translate"]
