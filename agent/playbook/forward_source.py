"""Reading a reference's source without running it: its ``Model.forward`` (the calls and binary
operators in it, by dotted callee name, as :mod:`ast` nodes), literal keyword arguments of a call,
the module types its ``__init__`` assigns to ``self``, and which submodule of a (meta-built)
model a ``self.x(...)`` call runs."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

__all__ = ["UNKNOWN", "Forward", "call_kind", "dotted", "init_module_types", "kwarg", "leaf_name", "module_of",
           "read_forward"]


@dataclass
class Forward:
    calls: list[tuple[str, ast.Call]]  # dotted callee name, node
    binops: list[str]
    params: list[str]
    text: str


def dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(dotted(node.func) + "()")
    else:
        parts.append("?")
    return ".".join(reversed(parts))


def read_forward(source: str) -> Forward | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    cls = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            cls = node
    if cls is None:
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(f, ast.FunctionDef) and f.name == "forward" for f in node.body
            ):
                cls = node
    if cls is None:
        return None
    fwd = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if fwd is None:
        return None
    calls = [(dotted(n.func), n) for n in ast.walk(fwd) if isinstance(n, ast.Call)]
    binops = [type(n.op).__name__ for n in ast.walk(fwd) if isinstance(n, ast.BinOp)]
    params = [a.arg for a in fwd.args.args[1:]]
    return Forward(calls, binops, params, ast.get_source_segment(source, fwd) or "")


def kwarg(call: ast.Call, name: str, pos: int | None = None, model: Any = None) -> Any:
    """The literal value of a call's argument (by keyword, else at ``pos``); None when absent;
    UNKNOWN when it is not a literal. With ``model`` (built on the meta device), ``self.attr``
    arguments are read from it when they hold a plain int, float, bool, str or a tuple of them
    (KernelBench passes ``dim`` to ``__init__`` and calls ``torch.sum(x, dim=self.dim)``)."""
    for k in call.keywords:
        if k.arg == name:
            return _value(k.value, model)
    if pos is not None and len(call.args) > pos:
        return _value(call.args[pos], model)
    return None


_PLAIN = (int, float, bool, str)


def _value(node: ast.AST, model: Any) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        pass
    if model is not None and isinstance(node, ast.Attribute) and dotted(node).startswith("self."):
        v = module_of(model, dotted(node))
        if isinstance(v, _PLAIN) or (isinstance(v, (tuple, list)) and all(isinstance(e, _PLAIN) for e in v)):
            return tuple(v) if isinstance(v, list) else v
    return UNKNOWN


class _UnknownType:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _UnknownType()


def leaf_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def module_of(model: Any, callee: str) -> Any:
    """``self.conv`` -> the model's ``conv`` submodule (or None)."""
    if model is None or not callee.startswith("self."):
        return None
    obj = model
    for part in callee.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def call_kind(model: Any, callee: str, init_types: dict[str, str]) -> str:
    """What a call in forward is: a module type name for ``self.x(...)``, else the leaf name."""
    mod = module_of(model, callee)
    if mod is not None:
        return type(mod).__name__
    if callee.startswith("self.") and callee.count(".") == 1:
        return init_types.get(callee.split(".", 1)[1], leaf_name(callee))
    return leaf_name(callee)


def init_module_types(source: str) -> dict[str, str]:
    """``self.conv = nn.Conv2d(...)`` in any __init__ -> {"conv": "Conv2d"}."""
    out: dict[str, str] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out[t.attr] = leaf_name(dotted(node.value.func))
    return out
