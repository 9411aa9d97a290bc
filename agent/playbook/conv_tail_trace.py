"""The tail of a ``conv_tail`` problem: ``x -> nn.Conv2d -> elementwise -> stage -> elementwise -> stage ...``
traced with torch.fx (every node's shape from ``ShapeProp`` on the meta-built model) into a short typed
sequence of :class:`Stage` s over NCHW fp32 tensors (:class:`Domain` s):

- ``stats``: a norm's (mean, rstd) per (sample, group) (InstanceNorm2d: a group per channel; GroupNorm);
  the norm itself is elementwise given them: ``(x - mean) * rstd * weight[c] + bias[c]``, applied by the
  next stage's prologue;
- ``channels``: min / max / sum / mean / logsumexp over dim 1 (keepdim or not): a new domain (N, 1, H, W);
- ``window``: 2-D max or average pooling (stride, zero padding): a new domain (N, C, OH, OW);
- ``segment``: a reduction of each (sample, channel) plane (mean over H, W; adaptive pooling to 1) or of
  each sample (dims 1..): a new domain (N, C, 1, 1) or (N, 1, 1, 1);
- ``map``: the last domain's elementwise expression, stored to the output.

Elementwise ops between stages are :class:`~.chain_ir.Chain` s over *leaves* ``q0``, ``q1``, ... (a
:class:`Leaf` each: the conv's output element, a reduction's result, a materialised tensor's element, a
parameter per channel or a one-element one, a norm's statistics): each kernel defines the leaves its
chains read. A domain is materialised once (a scratch buffer): at its first consumer (a norm's statistics
or a reduction), as the value that consumer reads (its *anchor*); what follows in the domain is
recomputed from it. A value of a domain computed before its anchor and read after it, a value of an
earlier domain read after a later stage, a second forward input: not covered, each with its reason.
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook.chain import Translator, live_chain, reachable
from kerngen.agent.playbook.chain_ir import Chain, Operand
from kerngen.agent.playbook.conv_tail_ir import Domain, Leaf, LeafKind, Reduce, Stage, StageKind, Tail
from kerngen.agent.playbook.epilogue import tensor_constant
from kerngen.agent.playbook.match import pair
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["is_stage_op", "trace_tail"]


# ---------------------------------------------------------------------------------------------
_POOL_MODULES = {"MaxPool2d": Reduce.max, "AvgPool2d": Reduce.mean}
_ADAPTIVE_MODULES = {"AdaptiveAvgPool2d": Reduce.mean, "AdaptiveMaxPool2d": Reduce.max}
_NORM_MODULES = ("InstanceNorm2d", "GroupNorm")
_REDUCTIONS = {"min": Reduce.min, "amin": Reduce.min, "max": Reduce.max, "amax": Reduce.max, "sum": Reduce.sum,
               "mean": Reduce.mean, "logsumexp": Reduce.logsumexp}
_POOL_FUNCTIONS = {"max_pool2d": Reduce.max, "avg_pool2d": Reduce.mean}
_ADAPTIVE_FUNCTIONS = {"adaptive_avg_pool2d": Reduce.mean, "adaptive_max_pool2d": Reduce.max}
# reductions of the tail this family has no kernel for: its own problems, refused with the op's name
_REFUSED = ("argmax", "argmin", "prod", "var", "std", "norm", "softmax", "log_softmax", "cumsum", "cumprod", "median",
            "group_norm", "instance_norm")
_SHAPE_OPS = ("squeeze", "unsqueeze", "view", "reshape", "flatten")
# functional signatures after the input (positional order, defaults)
_MAX_POOL_ARGS = (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1), ("ceil_mode", False),
                  ("return_indices", False))
_AVG_POOL_ARGS = (("kernel_size", None), ("stride", None), ("padding", 0), ("ceil_mode", False),
                  ("count_include_pad", True), ("divisor_override", None))


def _name(n: Any) -> str:
    return str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))


def _label(n: Any) -> str:
    return str(n.target) if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _is_binary_minmax(n: Any) -> bool:
    import torch.fx as fx

    return len(n.args) == 2 and not n.kwargs and isinstance(n.args[1], fx.Node)


def is_stage_op(model: Any, n: Any) -> bool:
    """``n`` is a reduction, a pool or a norm: what makes a conv's forward a tail (not an epilogue)."""
    if n.op == "call_module":
        kind = type(model.get_submodule(str(n.target))).__name__
        return kind in _POOL_MODULES or kind in _ADAPTIVE_MODULES or kind in _NORM_MODULES
    if n.op not in ("call_function", "call_method"):
        return False
    name = _name(n)
    if name in ("min", "max"):
        return not _is_binary_minmax(n)
    return name in _REDUCTIONS or name in _POOL_FUNCTIONS or name in _ADAPTIVE_FUNCTIONS or name in _REFUSED


def _shape(n: Any) -> tuple[int, ...]:
    meta = n.meta.get("tensor_meta")
    if isinstance(meta, (tuple, list)) and not hasattr(meta, "shape"):  # min/max with a dim: (values, indices)
        meta = meta[0]
    if meta is None or not hasattr(meta, "shape"):
        raise NotCovered(f"no shape for {_label(n)} (shape propagation gave none): not covered")
    return tuple(int(s) for s in meta.shape)


def _bind(n: Any, params: tuple[tuple[str, Any], ...], what: str) -> dict[str, Any]:
    """``n``'s arguments after its input, by name (defaults filled in)."""
    names = [p for p, _ in params]
    rest = n.args[1:]
    if len(rest) > len(names) or any(k not in names and k != "input" for k in n.kwargs):
        raise NotCovered(f"{what} with these arguments is not covered by conv_tail")
    out = {p: d for p, d in params}
    out.update(zip(names, rest))
    out.update({k: v for k, v in n.kwargs.items() if k != "input"})
    return out


class _TailTranslator(Translator):
    """The chain translator over values of several domains: each fx node's value is an operand over
    leaves and lives in one domain; stage ops create domains and stages."""

    def __init__(self, model: Any, gm: Any, d0: Domain) -> None:
        super().__init__(model)
        self.gm = gm
        self.leaves: list[Leaf] = []
        self.domains: list[Domain] = [d0]
        self.dom: dict[Any, int] = {}
        self.dead: set[Any] = set()
        self.pairs: set[Any] = set()  # min/max with a dim: (values, indices)
        self.anchors: dict[int, Operand] = {}  # domain -> what its producer stores in its buffer
        self.drafts: list[dict[str, Any]] = []  # the stages so far (their prologues as operands)
        self.node: Any = None
        self.cur: int | None = None

    # -- leaves and operands ----------------------------------------------------------------
    def leaf(self, leaf: Leaf) -> str:
        if leaf not in self.leaves:
            self.leaves.append(leaf)
        return f"q{self.leaves.index(leaf)}"

    def operand(self, value: Any, what: str) -> Operand:
        import torch.fx as fx

        if isinstance(value, fx.Node):
            return self._node_operand(value)
        return super().operand(value, what)

    def tensor(self, value: Any, what: str, want: str = "float") -> Operand:
        import torch.fx as fx

        if not isinstance(value, fx.Node):
            return super().tensor(value, what, want)
        a = self._node_operand(value)
        if self.dtype(a) != want:
            raise NotCovered(f"{what} of a {self.dtype(a)} value is not covered by conv_tail")
        return a

    def _node_operand(self, node: Any) -> Operand:
        if node.op == "get_attr":
            return self._attr(node)
        if node.op == "placeholder":
            raise NotCovered(f"the tail reads the forward input {node.target!r} beside the convolution's output: "
                             "not covered by conv_tail")
        if node in self.dead:
            raise NotCovered(f"{_label(self.node)} reads {_label(node)}, a value computed before the stage that "
                             "consumes it: not covered by conv_tail")
        if node in self.pairs:
            raise NotCovered(f"{_label(self.node)} reads the (values, indices) pair of {_label(node)}: not covered")
        return self.env[node]

    def _attr(self, node: Any) -> Operand:
        """A parameter (per channel or one element, against the reading node's shape) or a one-element
        tensor constant made in forward (``torch.tensor(0.5)``: a literal)."""
        target = str(node.target)
        const = tensor_constant(self.gm, target)
        if const is not None:
            return const
        try:
            shape = tuple(self.model.get_parameter(target).shape)
        except AttributeError:
            raise NotCovered(f"the tail reads {target!r}, which is neither a parameter nor a one-element constant: "
                             "not covered by conv_tail") from None
        return self._param(target, shape)

    def _param(self, name: str, shape: tuple[int, ...]) -> Operand:
        if self.cur is None:
            raise NotCovered(f"{_label(self.node)} reads parameter {name!r} but not the convolution's output")
        dom = self.domains[self.cur]
        out = _shape(self.node)
        if math.prod(shape) == 1:
            return self.leaf(Leaf(LeafKind.scalar, name))
        padded = (1,) * (len(out) - len(shape)) + shape if len(shape) <= len(out) else None
        channel_axis = len(out) >= 2 and out[0] == dom.values[0] and out[1] == dom.values[1]
        if padded is not None and channel_axis and padded[1] == out[1] and all(
                s == 1 for i, s in enumerate(padded) if i != 1):
            return self.leaf(Leaf(LeafKind.channel, name))
        raise NotCovered(f"parameter {name!r} of shape {shape} does not broadcast per channel over the "
                         f"{'x'.join(map(str, out))} value it meets: not covered by conv_tail")

    # -- the graph --------------------------------------------------------------------------
    def _domain_of(self, n: Any) -> int | None:
        found = {self.dom[m] for m in n.all_input_nodes if m in self.dom}
        if len(found) > 1:
            raise NotCovered(f"{_label(n)} combines tensors of the tail of different shapes: not covered by conv_tail")
        return found.pop() if found else None

    def visit(self, n: Any) -> None:
        self.node = n
        self.cur = self._domain_of(n)
        if n.op == "call_module":
            kind = type(self.model.get_submodule(str(n.target))).__name__
            if kind in _POOL_MODULES or kind in _ADAPTIVE_MODULES or kind in _NORM_MODULES:
                return self._module_stage(n, kind)
        elif n.op in ("call_function", "call_method"):
            name = _name(n)
            if name in _REDUCTIONS and not (name in ("min", "max") and _is_binary_minmax(n)):
                return self._reduction(n, name)
            if name in _POOL_FUNCTIONS:
                return self._pool(n, _POOL_FUNCTIONS[name], dict(_bind(n, _MAX_POOL_ARGS if name == "max_pool2d"
                                                                       else _AVG_POOL_ARGS, name)))
            if name in _ADAPTIVE_FUNCTIONS:
                return self._adaptive(n, _ADAPTIVE_FUNCTIONS[name], _bind(n, (("output_size", None),), name))
            if name in _REFUSED:
                raise NotCovered(f"{name} after the convolution is not covered by conv_tail (reductions: min, max, "
                                 "sum, mean, logsumexp; pools; the nn.GroupNorm/InstanceNorm2d modules)")
            if name in ("getitem", "getattr"):
                return self._item(n)
            if name in _SHAPE_OPS:
                return self._reshape(n, name)
        if self.cur is None:
            raise NotCovered(f"{_label(n)} does not read the convolution's output: not covered by conv_tail")
        if math.prod(_shape(n)) != self.domains[self.cur].numel:
            raise NotCovered(f"{_label(n)} broadcasts a tail value to a larger shape: not covered by conv_tail")
        super().visit(n)
        self.dom[n] = self.cur

    def _input(self, n: Any, what: str) -> Any:
        import torch.fx as fx

        x = n.args[0] if n.args else n.kwargs.get("input")
        if not isinstance(x, fx.Node) or x not in self.dom:
            raise NotCovered(f"{what} does not read a value of the convolution's tail: not covered by conv_tail")
        return x

    def _canonical(self, x: Any, what: str, rank: int | None = None) -> tuple[int, ...]:
        """``x``'s shape, which must be its domain's (N, C, spatial...) view."""
        shape, dom = _shape(x), self.domains[self.dom[x]]
        n, c, h, w = dom.values
        ok = len(shape) >= 2 and shape[:2] == (n, c) and math.prod(shape[2:]) == h * w
        if not ok or (rank is not None and (len(shape) != rank or shape[2:] != (h, w))):
            raise NotCovered(f"{what} of a {'x'.join(map(str, shape))} view of the tail is not covered by conv_tail")
        return shape

    def _consume(self, x: Any) -> Operand:
        """The operand a stage reads for node ``x``: its domain is materialised at its first consumer."""
        self._node_operand(x)  # dead values and pairs are refused here
        d = self.dom[x]
        if d != len(self.domains) - 1:
            raise NotCovered(f"{_label(self.node)} reads a value from before an earlier stage: the tail's stages do "
                             "not form a chain (not covered by conv_tail)")
        if d not in self.anchors:
            self.anchors[d] = self.env[x]
            self.env[x] = self.leaf(Leaf(LeafKind.buffer, d))
            self._recompute(x, d)
        return self.env[x]

    def _recompute(self, x: Any, d: int) -> None:
        """Once ``x`` is domain ``d``'s buffer, the values of ``d`` computed from it so far are computed
        again from the buffer; the others (computed before it, or from such a value) are dead."""
        later: list[Any] = []
        for m, dm in self.dom.items():
            if dm == d and m is not x and any(a is x or a in later for a in m.all_input_nodes):
                later.append(m)
        self.dead |= {m for m, dm in self.dom.items() if dm == d and m is not x and m not in later}
        node, cur = self.node, self.cur
        for m in later:
            try:
                self.visit(m)
            except NotCovered:  # it reads a dead value: dead too (refused only where something reads it)
                self.dead.add(m)
        self.node, self.cur = node, cur

    def _new_domain(self, n: Any, dom: Domain, draft: dict[str, Any], pair_out: bool = False) -> None:
        self.domains.append(dom)
        d = len(self.domains) - 1
        draft["dst"] = d
        self.drafts.append(draft)
        self.env[n] = self.leaf(Leaf(LeafKind.result, d))
        self.dom[n] = d
        if pair_out:
            self.pairs.add(n)

    # -- stages -----------------------------------------------------------------------------
    def _reduction(self, n: Any, name: str) -> None:
        x = self._input(n, name)
        b = _bind(n, (("dim", None), ("keepdim", False), ("dtype", None)), name)
        if b["dim"] is None or b["dtype"] is not None:
            what = "over every dim" if b["dim"] is None else "with a dtype"
            raise NotCovered(f"{name} {what} is not covered by conv_tail")
        dims = b["dim"] if isinstance(b["dim"], (tuple, list)) else (b["dim"],)
        shape = self._canonical(x, name)
        rank = len(shape)
        if not all(isinstance(d, int) for d in dims):
            raise NotCovered(f"{name} over dims {dims!r} is not covered by conv_tail")
        axes = {d % rank for d in dims}
        op = _REDUCTIONS[name]
        src = self.domains[self.dom[x]]
        if axes == {1}:
            kind, per_sample = StageKind.channels, False
            dom = Domain(src.n, "1", src.h, src.w, (src.values[0], 1, *src.values[2:]))
        elif axes and axes in (set(range(2, rank)), set(range(1, rank))) and op != Reduce.logsumexp:
            kind, per_sample = StageKind.segment, axes == set(range(1, rank))
            dom = Domain(src.n, "1" if per_sample else src.c, "1", "1",
                         (src.values[0], 1 if per_sample else src.values[1], 1, 1))
        else:
            raise NotCovered(f"{name} over dims {sorted(axes)} of a {'x'.join(map(str, shape))} tensor is not covered "
                             "by conv_tail (dim 1, the spatial dims or all but the batch)")
        pro = self._consume(x)
        self._new_domain(n, dom, dict(kind=kind, src=self.dom[x], pro=pro, op=op, per_sample=per_sample),
                         pair_out=name in ("min", "max"))

    def _module_stage(self, n: Any, kind: str) -> None:
        mod = self.model.get_submodule(str(n.target))
        if len(n.args) != 1 or n.kwargs:
            raise NotCovered(f"module {n.target} ({kind}) with {len(n.args)} arguments is not covered by conv_tail")
        if kind in _POOL_MODULES:
            b = dict(kernel_size=mod.kernel_size, stride=mod.stride, padding=mod.padding, ceil_mode=mod.ceil_mode,
                     dilation=getattr(mod, "dilation", 1), return_indices=getattr(mod, "return_indices", False),
                     count_include_pad=getattr(mod, "count_include_pad", True),
                     divisor_override=getattr(mod, "divisor_override", None))
            return self._pool(n, _POOL_MODULES[kind], b)
        if kind in _ADAPTIVE_MODULES:
            if getattr(mod, "return_indices", False):
                raise NotCovered(f"{kind} with return_indices is not covered by conv_tail")
            return self._adaptive(n, _ADAPTIVE_MODULES[kind], dict(output_size=mod.output_size))
        return self._norm(n, kind, mod)

    def _pool(self, n: Any, op: Reduce, b: dict[str, Any]) -> None:
        what = f"{op.value} pooling"
        x = self._input(n, what)
        if b.get("ceil_mode") or pair(b.get("dilation") or 1) != (1, 1) or b.get("return_indices") or b.get(
                "divisor_override") is not None:
            raise NotCovered(f"{what} with ceil_mode, dilation, return_indices or divisor_override is not covered "
                             "by conv_tail")
        k = pair(b["kernel_size"])
        s = pair(b["stride"]) if b.get("stride") not in (None, (), []) else k
        p = pair(b.get("padding") or 0)
        self._canonical(x, what, rank=4)
        src = self.domains[self.dom[x]]
        oh, ow = (src.values[2] + 2 * p[0] - k[0]) // s[0] + 1, (src.values[3] + 2 * p[1] - k[1]) // s[1] + 1
        if oh < 1 or ow < 1 or 2 * p[0] > k[0] or 2 * p[1] > k[1]:
            raise NotCovered(f"{what} {k} over {src.values[2]}x{src.values[3]} gives no output: not covered")
        dom = Domain(src.n, src.c, f"(({src.h}) + {2 * p[0] - k[0]}) // {s[0]} + 1",
                     f"(({src.w}) + {2 * p[1] - k[1]}) // {s[1]} + 1", (*src.values[:2], oh, ow))
        pro = self._consume(x)
        self._new_domain(n, dom, dict(kind=StageKind.window, src=self.dom[x], pro=pro, op=op, kernel=k, stride=s,
                                      padding=p, count_include_pad=bool(b.get("count_include_pad", True))))

    def _adaptive(self, n: Any, op: Reduce, b: dict[str, Any]) -> None:
        what = f"adaptive {op.value} pooling"
        x = self._input(n, what)
        size = b["output_size"]
        if size not in (1, (1, 1), [1, 1]):
            raise NotCovered(f"{what} to {size!r} (not 1) is not covered by conv_tail")
        self._canonical(x, what, rank=4)
        src = self.domains[self.dom[x]]
        pro = self._consume(x)
        self._new_domain(n, Domain(src.n, src.c, "1", "1", (*src.values[:2], 1, 1)),
                         dict(kind=StageKind.segment, src=self.dom[x], pro=pro, op=op, per_sample=False))

    def _norm(self, n: Any, kind: str, mod: Any) -> None:
        x = self._input(n, kind)
        self._canonical(x, kind, rank=4 if kind == "InstanceNorm2d" else None)
        src = self.domains[self.dom[x]]
        channels = int(getattr(mod, "num_channels", getattr(mod, "num_features", 0)))
        if channels != src.values[1]:
            raise NotCovered(f"{kind} of {channels} channels over a tail value of {src.values[1]}")
        if kind == "InstanceNorm2d" and mod.track_running_stats and not mod.training:
            raise NotCovered("InstanceNorm2d with running statistics (eval mode) is not covered by conv_tail")
        groups = int(mod.num_groups) if kind == "GroupNorm" else channels
        pro = self._consume(x)
        index = sum(1 for d in self.drafts if d["kind"] == StageKind.stats)
        self.drafts.append(dict(kind=StageKind.stats, src=self.dom[x], pro=pro, stats=index, groups=groups,
                                eps=float(mod.eps)))
        self.cur = self.dom[x]
        t = self.emit("mul", (self.emit("sub", (pro, self.leaf(Leaf(LeafKind.mean, index)))),
                              self.leaf(Leaf(LeafKind.rstd, index))))
        if mod.affine:
            target = str(n.target)
            t = self.emit("add", (self.emit("mul", (t, self.leaf(Leaf(LeafKind.channel, f"{target}.weight")))),
                                  self.leaf(Leaf(LeafKind.channel, f"{target}.bias"))))
        self.env[n] = t
        self.dom[n] = self.dom[x]

    def _item(self, n: Any) -> None:
        src = n.args[0] if n.args else None
        key = n.args[1] if len(n.args) > 1 else None
        if src not in self.pairs or key not in (0, "values"):
            raise NotCovered(f"{_label(n)}[{key!r}] (indices of a reduction, or a shape) is not covered by conv_tail")
        self.env[n] = self.env[src]
        self.dom[n] = self.dom[src]

    def _reshape(self, n: Any, name: str) -> None:
        x = self._input(n, name)
        before = tuple(s for s in _shape(x) if s != 1)
        after = tuple(s for s in _shape(n) if s != 1)
        if before != after:
            raise NotCovered(f"{name} from {_shape(x)} to {_shape(n)} (not only size-1 dims) is not covered by "
                             "conv_tail")
        self.env[n] = self._node_operand(x)
        self.dom[n] = self.dom[x]

    # -- the whole forward ------------------------------------------------------------------
    def trace(self, graph: Any, conv: Any) -> Tail | None:
        import torch.fx as fx

        nodes = list(graph.nodes)
        out = next((n for n in nodes if n.op == "output"), None)
        result = out.args[0] if out is not None else None
        if not isinstance(result, fx.Node):
            raise NotCovered("the forward does not return one tensor (a tuple, a list or a constant)")
        live = reachable(result)
        self.check_inplace(nodes)
        self.env[conv] = self.leaf(Leaf(LeafKind.lead))
        self.dom[conv] = 0
        for n in nodes:
            if n in live and n.op not in ("placeholder", "get_attr", "output") and n is not conv:
                self.visit(n)
        if not self.drafts:
            return None  # elementwise only: conv_epi's
        self.node = result
        final = self._node_operand(result)
        if self.dtype(final) != "float":
            raise NotCovered("the forward returns a boolean tensor: not covered by conv_tail")
        last = len(self.domains) - 1
        if self.dom[result] != last:
            raise NotCovered("the forward returns a value from before its last stage: not covered by conv_tail")
        return self._tail(final, last)

    def _chain(self, operand: Operand) -> Chain:
        return live_chain(self.nodes, operand)

    def _tail(self, final: Operand, last: int) -> Tail:
        stages = []
        for d in self.drafts:
            dst = d.get("dst")
            kw = {k: v for k, v in d.items() if k not in ("pro", "dst")}
            if dst is None:
                stages.append(Stage(pro=self._chain(d["pro"]), **kw))
                continue
            stored = self.anchors.get(dst, final)
            stages.append(Stage(pro=self._chain(d["pro"]), dst=dst, epi=self._chain(stored), store=dst in self.anchors,
                                **kw))
        if last in self.anchors:
            stages.append(Stage(StageKind.map, src=last, pro=self._chain(final)))
        return Tail(tuple(self.leaves), tuple(self.domains), self._chain(self.anchors[0]), tuple(stages))


def trace_tail(model: Any, gm: Any, conv: Any, d0: Domain) -> Tail | None:
    """The forward after ``conv`` (an fx node of ``gm``, the traced model, shapes propagated) as a
    :class:`Tail`; None when it has no stage (an elementwise epilogue: conv_epi's); or :class:`NotCovered`."""
    return _TailTranslator(model, gm, d0).trace(gm.graph, conv)
