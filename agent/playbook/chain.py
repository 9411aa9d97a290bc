"""Fused elementwise chains: a reference forward that is a DAG of elementwise ops over ONE input
tensor, translated to straight-line fp32 C for the elementwise template's ``kg_op``.

``translate(model)`` traces the (meta-built: no weights) reference module with ``torch.fx.symbolic_trace`` and
returns a :class:`~.chain_ir.Chain`: an IR of :class:`~.chain_ir.Node` s in topological order (each defines one C
variable ``t<i>``; the input element is ``v``) plus the result operand. ``Chain.statements()``
gives the C body (``float t0 = ...;``), ``Chain.expr()`` the value ``kg_op`` returns. Anything
outside the covered set (reductions, shape ops, parameters or buffers, a second input, casts, an
op :mod:`.chain_calls` does not know) raises :class:`NotCovered` with a one-line reason.

Tracing runs the model's ``forward`` on proxies, as the reference run does on tensors: no other
model code is executed. Every op is computed in fp32 (the template converts bf16/fp16 once on load
and once on store), so a chain is at least as accurate as PyTorch's op-by-op evaluation. NaN
propagates as in PyTorch for relu/clamp/maximum/minimum (``kg_fmax``/``kg_fmin`` in the template).
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook.chain_calls import METHOD_SIGS, REQUIRED, SIGS, Sig, function_table, why_not_covered
from kerngen.agent.playbook.chain_ir import COMPARE_C, INPUT, UNARY_C, Chain, Node, Operand
from kerngen.agent.playbook.not_covered import NotCovered

_FP32_MAX = 3.4028234663852886e38


# ----------------------------------------------------------------------------------------------
def trace_graph(model: Any) -> Any:
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


class Translator:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.functions = function_table()
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
    def bind(sig: Sig, name: str, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
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
                if default is REQUIRED:
                    raise NotCovered(f"{name} without {p} is not covered by the elementwise chain")
                bound[p] = default
        return bound

    # -- one call ---------------------------------------------------------------------------
    def call(self, name: str, sig: Sig, b: dict[str, Any]) -> Operand:
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
            return self.call(kind, SIGS["gelu"], dict(input=args[0], approximate=mod.approximate))
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
            raise NotCovered(why_not_covered(names[kind]))
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
        live = reachable(result)
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
        return live_chain(self.nodes, r)

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
            raise NotCovered(why_not_covered(name))  # torch.max(x), x.max(dim=1): reductions
        sig = METHOD_SIGS.get(name) if n.op == "call_method" else None
        sig = sig or SIGS.get(name)
        if sig is None:
            raise NotCovered(why_not_covered(name))
        self.env[n] = self.call(name, sig, self.bind(sig, name, tuple(n.args), dict(n.kwargs)))

    def _name(self, n: Any) -> tuple[str, bool]:
        """(signature name, in place) of a call_function / call_method node."""
        if n.op == "call_method":
            name = str(n.target)
            if name.endswith("_") and not name.endswith("__") and name[:-1] in SIGS:
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
            sig = SIGS.get(name)
            if sig is not None and (sig.kind == "dropout" or (sig.kind == "identity" and name != "clone")):
                return n.args[0]
        return None

    def _reads_shape_only(self, n: Any) -> bool:
        if n.op not in ("call_function", "call_method"):
            return False
        sig = SIGS.get(self._name(n)[0])
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


def reachable(result: Any) -> set[Any]:
    seen: set[Any] = set()
    stack = [result]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


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


def translate(model: Any) -> Chain:
    """The reference module's forward as a fused elementwise chain, or :class:`NotCovered`."""
    if model is None:
        raise NotCovered("cannot trace the forward: the model did not build on the meta device")
    return Translator(model).run(trace_graph(model))


__all__ = ["Translator", "live_chain", "reachable", "trace_graph", "translate"]
