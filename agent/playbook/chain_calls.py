"""The PyTorch callables and methods an elementwise chain knows: name -> (kind, positional
parameter names, defaults), the table from ``torch.*`` / ``F.*`` / ``torch.special.*`` /
``operator.*`` callables to those names, and why a known-but-refused op (a reduction, a shape op,
a cast) is not covered."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

from kerngen.agent.playbook.chain_ir import COMPARE_C, UNARY_C

# ----------------------------------------------------------------------------------------------
# the PyTorch callables and methods we know: name -> (kind, positional parameter names, defaults)
REQUIRED = object()


@dataclass(frozen=True)
class Sig:
    kind: str
    params: tuple[tuple[str, Any], ...]  # (name, default or REQUIRED), in positional order


def _sig(kind: str, *params: str | tuple[str, Any]) -> Sig:
    return Sig(kind, tuple(p if isinstance(p, tuple) else (p, REQUIRED) for p in params))


_INPLACE = ("inplace", False)
SIGS: dict[str, Sig] = {}
for _name in UNARY_C:
    SIGS[_name] = _sig(_name, "input", _INPLACE)
SIGS.update({
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
    SIGS[_name] = _sig(_name, "input", "other")
METHOD_SIGS = {"where": _sig("where", "input", "condition", "other")}  # x.where(cond, y)

_REDUCTIONS = {"sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "std", "var", "norm", "softmax",
               "log_softmax", "logsumexp", "cumsum", "cumprod", "all", "any", "median", "mode", "topk", "sort"}
_SHAPE_OPS = {"view", "reshape", "permute", "transpose", "flatten", "unflatten", "unsqueeze", "squeeze", "expand",
              "expand_as", "repeat", "cat", "concat", "stack", "split", "chunk", "getitem", "t", "narrow", "size",
              "dim", "numel", "getattr", "roll", "flip", "pad", "gather", "index_select", "movedim"}
_CASTS = {"to", "float", "half", "bfloat16", "double", "type", "type_as", "int", "long", "bool", "short", "char",
          "byte"}


def why_not_covered(name: str) -> str:
    if name in _REDUCTIONS or name in ("max", "min"):
        return f"reduction {name} is not covered by the elementwise chain"
    if name in _SHAPE_OPS:
        return f"shape op {name} is not covered by the elementwise chain"
    if name in _CASTS:
        return f"dtype cast .{name}() is not covered by the elementwise chain"
    return f"op {name} is not covered by the elementwise chain"


def function_table() -> dict[Callable[..., Any], tuple[str, bool]]:
    """Callable (torch.*, F.*, torch.special.*, operator.*) -> (signature name, in place)."""
    import torch
    import torch.nn.functional as F

    table: dict[Callable[..., Any], tuple[str, bool]] = {}
    spaces = (operator, torch.special, torch, F)  # later spaces win a shared callable
    for name in SIGS:
        for space in spaces:
            for attr, inplace in ((name, False), (name + "_", True)):
                fn = getattr(space, attr, None)
                if callable(fn) and not isinstance(fn, type):
                    table[fn] = (name, inplace)
    table[operator.truediv] = ("truediv", False)
    table[operator.neg] = ("neg", False)
    return table


__all__ = ["METHOD_SIGS", "REQUIRED", "SIGS", "Sig", "function_table", "why_not_covered"]
