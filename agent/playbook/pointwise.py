"""Pointwise nodes of a traced graph (:mod:`.graph`) as the chain IR (:mod:`.chain_ir`): the one translator every
family's fused elementwise work goes through (a plain chain, a GEMM's or a convolution's epilogue, the row
program after a GEMM, the stages after a convolution, a loss's terms).

A :class:`Translator` walks nodes in order and gives each a chain operand (``env[node name]``): a new IR node
for a pointwise op (:data:`.ops.OPS`), its operand for an identity (clone, eval-mode dropout, a cast to the
same dtype), a constant for ``zeros_like`` and friends. What a tensor that is not a translated node stands for
(the element being computed, a parameter broadcast along a channel, ...) is the subclass's call
(:meth:`Translator.leaf`); anything else raises :class:`NotCovered` with a one-line reason that names the
op. Every op is computed in fp32 with the formulas of :mod:`.ops`; arguments are read by their ATen schema
names, so ``F.relu6``, ``nn.ReLU6`` and ``torch.clamp(x, 0, 6)`` are the same node.

:func:`translate` is the plain chain: a graph of pointwise ops over one input tensor (the ``elementwise``
family's problems).
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook.chain_ir import INPUT, Chain, Node, Operand
from kerngen.agent.playbook.graph import Graph, Node as GNode, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.ops import COMPARE_C, OPS, UNARY_C, Kind, kind_of, why

__all__ = ["Translator", "const", "live_chain", "translate"]

_FP32_MAX = 3.4028234663852886e38
CHAIN = "the elementwise chain"


def const(value: Any, what: str, where: str = CHAIN) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotCovered(f"{what}: argument {value!r} is not covered by {where}")
    v = float(value)
    if math.isnan(v):
        raise NotCovered(f"{what}: constant {value!r} is not a number; not covered by {where}")
    if math.isfinite(v) and abs(v) > _FP32_MAX:
        raise NotCovered(f"{what}: constant {value!r} is outside the fp32 range")
    return v


def _first(n: GNode) -> Any:
    return n.args.get("self", n.args.get("input"))


class Translator:
    where = CHAIN

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.env: dict[str, Operand] = {}
        self.nodes: list[Node] = []
        self.dtypes: dict[str, str] = {}

    # -- IR -------------------------------------------------------------------------------------
    def emit(self, op: str, args: tuple[Operand, ...], params: tuple[float | None, ...] = (),
             dtype: str = "float") -> str:
        var = f"t{len(self.nodes)}"
        self.nodes.append(Node(var, op, args, params, dtype))
        self.dtypes[var] = dtype
        return var

    def dtype(self, a: Operand) -> str:
        return self.dtypes.get(a, "float") if isinstance(a, str) else "float"

    # -- operands -------------------------------------------------------------------------------
    def leaf(self, ref: Ref) -> Operand:
        """The operand of a tensor that is not a translated node (an input, a parameter): the subclass's."""
        if self.g.is_param(ref):
            raise NotCovered(f"the forward reads the model's parameter or buffer {str(ref)!r}: not covered by "
                             f"{self.where}")
        raise NotCovered(f"the forward reads {str(ref)!r} here: not covered by {self.where}")

    def ref(self, ref: Ref) -> Operand:
        if ref in self.env:
            return self.env[ref]
        if ref in self.g.constants:
            return const(self.g.constants[ref], str(ref), self.where)
        self.env[ref] = self.leaf(ref)
        return self.env[ref]

    def operand(self, value: Any, what: str) -> Operand:
        if isinstance(value, Ref):
            return self.ref(value)
        return const(value, what, self.where)

    def tensor(self, value: Any, what: str, want: str = "float") -> Operand:
        if not isinstance(value, Ref):
            raise NotCovered(f"{what} of a constant is not covered by {self.where}")
        a = self.ref(value)
        if self.dtype(a) != want:
            raise NotCovered(f"{what} of a {self.dtype(a)} value is not covered by {self.where}")
        return a

    def _floats(self, name: str, *ops: Operand) -> None:
        for a in ops:
            if self.dtype(a) != "float":
                raise NotCovered(f"{name} of a boolean value is not covered by {self.where}")

    def _arith(self, name: str, a: Operand, c: Operand) -> None:
        # a boolean operand counts as 0/1 next to a number; bool (op) bool is a logical op in torch
        if self.dtype(a) == "bool" and self.dtype(c) == "bool":
            raise NotCovered(f"{name} of two boolean values is not covered by {self.where}")

    def affine(self, n: GNode, t: Operand, param: Any, where: str) -> Operand:
        """``t * weight + bias`` of a norm node (both or neither); ``param(name)``: a parameter's operand."""
        w, b = n["weight"], n["bias"]
        if w is not None and b is not None:
            return self.emit("add", (self.emit("mul", (t, param(w))), param(b)))
        if w is not None or b is not None:
            raise NotCovered(f"{n.label} with a weight or a bias alone is not covered by {where}")
        return t

    def batch_norm_eval(self, n: GNode, x: Operand, param: Any, where: str) -> Operand:
        """An eval-mode batch norm, in fp32 as PyTorch's kernel: (x - mean) / sqrt(var + eps) * weight + bias."""
        t = self.emit("mul", (self.emit("sub", (x, param(n["running_mean"]))),
                              self.emit("rsqrt", (self.emit("add", (param(n["running_var"]), float(n["eps"]))),))))
        return self.affine(n, t, param, where)

    # -- one node -------------------------------------------------------------------------------
    def visit(self, n: GNode) -> None:
        """``env[n.name]``: the node's operand, or :class:`NotCovered`."""
        self.env[n.name] = self.pointwise(n)

    def pointwise(self, n: GNode) -> Operand:
        kind, name = kind_of(n.op), n.op
        if kind == Kind.identity:
            return self._identity(n)
        if kind == Kind.constant:
            self.tensor(_first(n), name)
            return {"zeros_like": 0.0, "ones_like": 1.0}.get(name) if name != "full_like" else const(
                n["fill_value"], name, self.where)
        if name in ("max", "min") and n.overload == "other":  # torch.max(x, y): elementwise
            return self._binary("maximum" if name == "max" else "minimum", name, n["self"], n["other"])
        if kind != Kind.pointwise:
            raise NotCovered(why(name, self.where))
        ir = OPS[name].ir
        if name == "gelu":
            approx = n["approximate"]
            if approx not in ("none", "tanh"):
                raise NotCovered(f"gelu(approximate={approx!r}) is not covered by {self.where}")
            return self.emit("gelu_tanh" if approx == "tanh" else "gelu", (self.tensor(n["self"], name),))
        if ir in UNARY_C:
            return self.emit(ir, (self.tensor(_first(n), name),))
        if name == "leaky_relu":
            return self.emit(ir, (self.tensor(n["self"], name),), (const(n["negative_slope"], name, self.where),))
        if name == "elu":
            if n["scale"] != 1 or n["input_scale"] != 1:
                raise NotCovered(f"elu with scale or input_scale other than 1 is not covered by {self.where}")
            return self.emit(ir, (self.tensor(n["self"], name),), (const(n["alpha"], name, self.where),))
        if name == "softplus":
            return self.emit(ir, (self.tensor(n["self"], name),),
                             (const(n["beta"], name, self.where), const(n["threshold"], name, self.where)))
        if name == "threshold":
            return self.emit(ir, (self.tensor(n["self"], name),),
                             (const(n["threshold"], name, self.where), const(n["value"], name, self.where)))
        if ir == "clamp":
            return self._clamp(n)
        if name in ("add", "sub", "subtract", "rsub"):
            return self._add(n)
        if name == "pow":
            return self._binary("pow", name, n["self"], n["exponent"])
        if ir in ("mul", "div", "maximum", "minimum", "fmax", "fmin"):
            if ir == "div" and n.get("rounding_mode") is not None:
                raise NotCovered(f"div(rounding_mode={n['rounding_mode']!r}) is not covered by {self.where}")
            return self._binary(ir, name, n["self"], n["other"])
        if name in COMPARE_C:
            a, c = self.operand(n["self"], name), self.operand(n["other"], name)
            self._floats(name, a, c)
            return self.emit(name, (a, c), dtype="bool")
        if name == "where":
            cond = self.tensor(n["condition"], "where's condition", want="bool")
            a, c = self.operand(n["self"], name), self.operand(n["other"], name)
            self._floats(name, a, c)
            return self.emit("where", (cond, a, c))
        if name == "masked_fill":
            cond = self.tensor(n["mask"], "masked_fill's mask", want="bool")
            a, c = self.operand(n["value"], name), self.operand(n["self"], name)
            self._floats(name, a, c)
            return self.emit("where", (cond, a, c))
        raise AssertionError(f"op {name} of the table has no translation")  # a table bug, not user input

    def _identity(self, n: GNode) -> Operand:
        name = n.op
        if name == "dropout" and n["train"] and const(n["p"], name, self.where) != 0.0:
            raise NotCovered(f"dropout in training mode is not covered by {self.where}")
        x = _first(n)
        if name in ("_to_copy", "to", "type_as") and n.dtype != self.g.dtype(x):
            raise NotCovered(why(name, self.where))
        if name in ("clone", "contiguous") and n.get("memory_format") not in (None,) and \
                "preserve" not in str(n.get("memory_format")) and "contiguous" not in str(n.get("memory_format")):
            raise NotCovered(f"{name}(memory_format=...) is not covered by {self.where}")
        return self.tensor(x, name)

    def _binary(self, ir: str, name: str, x: Any, y: Any) -> Operand:
        a, c = self.operand(x, name), self.operand(y, name)
        if ir in ("maximum", "minimum", "fmax", "fmin", "pow"):
            self._floats(name, a, c)
        self._arith(name, a, c)
        return self.emit(ir, (a, c))

    def _add(self, n: GNode) -> Operand:
        name = n.op
        a, c = self.operand(n["self"], name), self.operand(n["other"], name)
        self._arith(name, a, c)
        alpha = const(n.get("alpha", 1), name, self.where)
        kind = "add" if name == "add" else "sub"
        if name == "rsub":  # rsub(x, y, alpha) = y - alpha * x
            a, c = c, a
        if alpha != 1.0:
            c = alpha * c if not isinstance(c, str) else self.emit("mul", (c, alpha))
        return self.emit(kind, (a, c))

    def _clamp(self, n: GNode) -> Operand:
        name = n.op
        a = self.tensor(_first(n), name)
        if name == "hardtanh":
            lo, hi = n["min_val"], n["max_val"]
        elif name == "relu6":
            lo, hi = 0.0, 6.0
        elif name == "clamp_max":
            lo, hi = None, n["max"]
        elif name == "clamp_min":
            lo, hi = n["min"], None
        else:
            lo, hi = n["min"], n["max"]
        if isinstance(lo, Ref) or isinstance(hi, Ref):
            raise NotCovered(f"{name} with tensor bounds is not covered by {self.where}")
        if lo is None and hi is None:
            raise NotCovered(f"{name} without bounds is not covered by {self.where}")
        bounds = tuple(None if v is None else const(v, f"{name}'s bound", self.where) for v in (lo, hi))
        return self.emit("clamp", (a,), bounds)


def live_chain(nodes: list[Node], result: Operand) -> Chain:
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


class _Plain(Translator):
    def leaf(self, ref: Ref) -> Operand:
        if self.g.is_input(ref):
            raise NotCovered(f"forward takes a second input {str(ref)!r}: the elementwise chain covers one input "
                             "tensor")
        return super().leaf(ref)


def translate(g: Graph) -> Chain:
    """The graph as a fused elementwise chain over its one input (``v``), or :class:`NotCovered`."""
    t = _Plain(g)
    live = g.live()
    used = {r for n in live for r in n.refs} | {g.output}
    x = next((i for i in g.inputs if i.name in used), g.inputs[0])
    t.env[x.name] = INPUT
    for n in live:
        t.visit(n)
    r = t.ref(g.output)
    if t.dtype(r) != "float":
        raise NotCovered("the forward returns a boolean tensor: not covered by the elementwise chain")
    return live_chain(t.nodes, r)
