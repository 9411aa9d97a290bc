"""The tail of a ``conv_tail`` problem: ``x -> nn.Conv2d -> elementwise -> stage -> elementwise -> stage ...``
read from the traced graph (:mod:`.graph`, every node's shape known) into a short typed
sequence of :class:`Stage` s over NCHW fp32 tensors (:class:`Domain` s):

- ``stats``: a norm's (mean, rstd) per (sample, group) (instance norm of a 4-D value: a group per channel;
  group norm);
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

from kerngen.agent.playbook.chain_ir import Chain, Operand
from kerngen.agent.playbook.conv.tail_ir import Domain, Leaf, LeafKind, Reduction, Stage, StageKind, Tail
from kerngen.agent.playbook.graph import Graph, Node, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.pointwise import Translator, const, live_chain
from kerngen.agent.playbook.row_program import REDUCE_OPS

__all__ = ["STAGE_OPS", "trace_tail"]


# ---------------------------------------------------------------------------------------------
_POOLS = {"max_pool2d": Reduction.max, "avg_pool2d": Reduction.mean}
_ADAPTIVE = {"adaptive_avg_pool2d": Reduction.mean, "adaptive_max_pool2d": Reduction.max}
_NORMS = ("instance_norm", "group_norm")
# reductions of the tail this family has no kernel for: its own problems, refused with the op's name
_REFUSED = ("argmax", "argmin", "prod", "var", "std", "norm", "linalg_vector_norm", "softmax", "log_softmax", "cumsum",
            "cumprod", "median", "layer_norm", "batch_norm")
_SHAPE_OPS = ("squeeze", "unsqueeze", "view", "reshape", "flatten", "_unsafe_view")
STAGE_OPS = frozenset((*_POOLS, *_ADAPTIVE, *_NORMS, *REDUCE_OPS, *_REFUSED))


def is_stage(n: Node) -> bool:
    """``n`` is a reduction, a pool or a norm: what makes a conv's graph a tail (not an epilogue)."""
    return n.op in STAGE_OPS and not (n.op in ("min", "max") and n.overload == "other") and not (
        n.op == "batch_norm" and not n["training"])


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return (int(v[0]), int(v[-1])) if len(v) in (1, 2) else (-1, -1)
    return int(v), int(v)


class _TailTranslator(Translator):
    """The chain translator over values of several domains: each node's value is an operand over leaves and
    lives in one domain; stage ops create domains and stages."""

    where = "conv_tail"

    def __init__(self, g: Graph, d0: Domain) -> None:
        super().__init__(g)
        self.leaves: list[Leaf] = []
        self.domains: list[Domain] = [d0]
        self.dom: dict[str, int] = {}
        self.dead: set[str] = set()
        self.pairs: set[str] = set()  # min/max with a dim: (values, indices)
        self.anchors: dict[int, Operand] = {}  # domain -> what its producer stores in its buffer
        self.drafts: list[dict[str, Any]] = []  # the stages so far (their prologues as operands)
        self.node: Node | None = None
        self.cur: int | None = None

    # -- leaves and operands ----------------------------------------------------------------
    def q(self, leaf: Leaf) -> str:
        if leaf not in self.leaves:
            self.leaves.append(leaf)
        return f"q{self.leaves.index(leaf)}"

    def ref(self, r: Ref) -> Operand:
        if self.g.node(r) is not None:
            if r in self.dead:
                raise NotCovered(f"{self.node.op} reads {r}, a value computed before the stage that consumes it: "
                                 "not covered by conv_tail")
            if r in self.pairs:
                raise NotCovered(f"{self.node.op} reads the (values, indices) pair of {r}: not covered")
            return self.env[r]
        if r in self.g.constants:
            return const(self.g.constants[r], str(r), self.where)
        if self.g.is_input(r):
            raise NotCovered(f"the tail reads the forward input {str(r)!r} beside the convolution's output: "
                             "not covered by conv_tail")
        t = self.g.tensor(r)
        if t is None:
            raise NotCovered(f"the tail reads {str(r)!r}, which is neither a parameter nor a one-element constant: "
                             "not covered by conv_tail")
        return self._param(str(r), t.shape)

    def _param(self, name: str, shape: tuple[int, ...]) -> Operand:
        if self.cur is None:
            raise NotCovered(f"{self.node.op} reads parameter {name!r} but not the convolution's output")
        dom = self.domains[self.cur]
        out = tuple(self.node.shape or ())
        if math.prod(shape) == 1:
            return self.q(Leaf(LeafKind.scalar, name))
        padded = (1,) * (len(out) - len(shape)) + shape if len(shape) <= len(out) else None
        channel_axis = len(out) >= 2 and out[0] == dom.values[0] and out[1] == dom.values[1]
        if padded is not None and channel_axis and padded[1] == out[1] and all(
                s == 1 for i, s in enumerate(padded) if i != 1):
            return self.q(Leaf(LeafKind.channel, name))
        raise NotCovered(f"parameter {name!r} of shape {shape} does not broadcast per channel over the "
                         f"{'x'.join(map(str, out))} value it meets: not covered by conv_tail")

    # -- the graph --------------------------------------------------------------------------
    def _domain_of(self, n: Node) -> int | None:
        found = {self.dom[r] for r in n.refs if r in self.dom}
        if len(found) > 1:
            raise NotCovered(f"{n.op} combines tensors of the tail of different shapes: not covered by conv_tail")
        return found.pop() if found else None

    def visit(self, n: Node) -> None:
        self.node = n
        self.cur = self._domain_of(n)
        if n.op in REDUCE_OPS and not (n.op in ("min", "max") and n.overload == "other"):
            return self._reduction(n)
        if n.op in _POOLS:
            return self._pool(n, _POOLS[n.op])
        if n.op in _ADAPTIVE:
            return self._adaptive(n, _ADAPTIVE[n.op])
        if n.op in _NORMS:
            return self._norm(n)
        if n.op in _REFUSED and is_stage(n):
            raise NotCovered(f"{n.op} after the convolution is not covered by conv_tail (reductions: min, max, "
                             "sum, mean, logsumexp; pools; group and instance norms)")
        if n.op == "getitem":
            return self._item(n)
        if n.op in _SHAPE_OPS:
            return self._reshape(n)
        if self.cur is None:
            raise NotCovered(f"{n.op} does not read the convolution's output: not covered by conv_tail")
        if math.prod(n.shape or ()) != self.domains[self.cur].numel:
            raise NotCovered(f"{n.op} broadcasts a tail value to a larger shape: not covered by conv_tail")
        super().visit(n)
        self.dom[n.name] = self.cur

    def _input(self, n: Node, what: str) -> Ref:
        x = n.args.get("self", n.args.get("input"))
        if not isinstance(x, Ref) or x not in self.dom:
            raise NotCovered(f"{what} does not read a value of the convolution's tail: not covered by conv_tail")
        return x

    def _canonical(self, x: Ref, what: str, rank: int | None = None) -> tuple[int, ...]:
        """``x``'s shape, which must be its domain's (N, C, spatial...) view."""
        shape, dom = tuple(self.g.shape(x) or ()), self.domains[self.dom[x]]
        n, c, h, w = dom.values
        ok = len(shape) >= 2 and shape[:2] == (n, c) and math.prod(shape[2:]) == h * w
        if not ok or (rank is not None and (len(shape) != rank or shape[2:] != (h, w))):
            raise NotCovered(f"{what} of a {'x'.join(map(str, shape))} view of the tail is not covered by conv_tail")
        return shape

    def _consume(self, x: Ref) -> Operand:
        """The operand a stage reads for node ``x``: its domain is materialised at its first consumer."""
        self.ref(x)  # dead values and pairs are refused here
        d = self.dom[x]
        if d != len(self.domains) - 1:
            raise NotCovered(f"{self.node.op} reads a value from before an earlier stage: the tail's stages do "
                             "not form a chain (not covered by conv_tail)")
        if d not in self.anchors:
            self.anchors[d] = self.env[x]
            self.env[x] = self.q(Leaf(LeafKind.buffer, d))
            self._recompute(x, d)
        return self.env[x]

    def _recompute(self, x: Ref, d: int) -> None:
        """Once ``x`` is domain ``d``'s buffer, the values of ``d`` computed from it so far are computed
        again from the buffer; the others (computed before it, or from such a value) are dead."""
        later: list[str] = []
        for m, dm in self.dom.items():
            if dm == d and m != x and any(a == x or a in later for a in self.g.node(m).refs):
                later.append(m)
        self.dead |= {m for m, dm in self.dom.items() if dm == d and m != x and m not in later}
        node, cur = self.node, self.cur
        for m in later:
            try:
                self.visit(self.g.node(m))
            except NotCovered:  # it reads a dead value: dead too (refused only where something reads it)
                self.dead.add(m)
        self.node, self.cur = node, cur

    def _new_domain(self, n: Node, dom: Domain, draft: dict[str, Any], pair_out: bool = False) -> None:
        self.domains.append(dom)
        d = len(self.domains) - 1
        draft["dst"] = d
        self.drafts.append(draft)
        self.env[n.name] = self.q(Leaf(LeafKind.result, d))
        self.dom[n.name] = d
        if pair_out:
            self.pairs.add(n.name)

    # -- stages -----------------------------------------------------------------------------
    def _reduction(self, n: Node) -> None:
        name = n.op
        x = self._input(n, name)
        dim = n.get("dim")
        if dim is None or (isinstance(dim, (list, tuple)) and not dim) or n.get("dtype") is not None:
            what = "with a dtype" if n.get("dtype") is not None else "over every dim"
            raise NotCovered(f"{name} {what} is not covered by conv_tail")
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        shape = self._canonical(x, name)
        rank = len(shape)
        axes = {d % rank for d in dims}
        op = REDUCE_OPS[name]
        src = self.domains[self.dom[x]]
        if axes == {1}:
            kind, per_sample = StageKind.channels, False
            dom = Domain(src.n, "1", src.h, src.w, (src.values[0], 1, *src.values[2:]))
        elif axes and axes in (set(range(2, rank)), set(range(1, rank))) and op != Reduction.logsumexp:
            kind, per_sample = StageKind.segment, axes == set(range(1, rank))
            dom = Domain(src.n, "1" if per_sample else src.c, "1", "1",
                         (src.values[0], 1 if per_sample else src.values[1], 1, 1))
        else:
            raise NotCovered(f"{name} over dims {sorted(axes)} of a {'x'.join(map(str, shape))} tensor is not covered "
                             "by conv_tail (dim 1, the spatial dims or all but the batch)")
        pro = self._consume(x)
        self._new_domain(n, dom, dict(kind=kind, src=self.dom[x], pro=pro, op=op, per_sample=per_sample),
                         pair_out=name in ("min", "max"))

    def _pool(self, n: Node, op: Reduction) -> None:
        what = f"{op.value} pooling"
        x = self._input(n, what)
        if n.get("ceil_mode") or _pair(n.get("dilation") or 1) != (1, 1) or n.get("divisor_override") is not None:
            raise NotCovered(f"{what} with ceil_mode, dilation, return_indices or divisor_override is not covered "
                             "by conv_tail")
        k = _pair(n["kernel_size"])
        s = _pair(n["stride"]) if n.get("stride") not in (None, (), []) else k
        p = _pair(n.get("padding") or 0)
        self._canonical(x, what, rank=4)
        src = self.domains[self.dom[x]]
        oh, ow = (src.values[2] + 2 * p[0] - k[0]) // s[0] + 1, (src.values[3] + 2 * p[1] - k[1]) // s[1] + 1
        if oh < 1 or ow < 1 or 2 * p[0] > k[0] or 2 * p[1] > k[1]:
            raise NotCovered(f"{what} {k} over {src.values[2]}x{src.values[3]} gives no output: not covered")
        dom = Domain(src.n, src.c, f"(({src.h}) + {2 * p[0] - k[0]}) // {s[0]} + 1",
                     f"(({src.w}) + {2 * p[1] - k[1]}) // {s[1]} + 1", (*src.values[:2], oh, ow))
        pro = self._consume(x)
        self._new_domain(n, dom, dict(kind=StageKind.window, src=self.dom[x], pro=pro, op=op, kernel=k, stride=s,
                                      padding=p, count_include_pad=bool(n.get("count_include_pad", True))))

    def _adaptive(self, n: Node, op: Reduction) -> None:
        what = f"adaptive {op.value} pooling"
        x = self._input(n, what)
        size = n["output_size"]
        if list(size) not in ([1], [1, 1]):
            raise NotCovered(f"{what} to {size!r} (not 1) is not covered by conv_tail")
        self._canonical(x, what, rank=4)
        src = self.domains[self.dom[x]]
        pro = self._consume(x)
        self._new_domain(n, Domain(src.n, src.c, "1", "1", (*src.values[:2], 1, 1)),
                         dict(kind=StageKind.segment, src=self.dom[x], pro=pro, op=op, per_sample=False))

    def _norm(self, n: Node) -> None:
        what = n.label
        x = self._input(n, what)
        self._canonical(x, what, rank=4 if n.op == "instance_norm" else None)
        src = self.domains[self.dom[x]]
        channels = src.values[1]
        if n.op == "instance_norm" and not n["use_input_stats"]:
            raise NotCovered("instance norm with running statistics (eval mode) is not covered by conv_tail")
        groups = int(n["num_groups"]) if n.op == "group_norm" else channels
        pro = self._consume(x)
        index = sum(1 for d in self.drafts if d["kind"] == StageKind.stats)
        self.drafts.append(dict(kind=StageKind.stats, src=self.dom[x], pro=pro, stats=index, groups=groups,
                                eps=float(n["eps"])))
        self.cur = self.dom[x]
        t = self.emit("mul", (self.emit("sub", (pro, self.q(Leaf(LeafKind.mean, index)))),
                              self.q(Leaf(LeafKind.rstd, index))))
        t = self.affine(n, t, lambda p: self.q(Leaf(LeafKind.channel, str(p))), "conv_tail")
        self.env[n.name] = t
        self.dom[n.name] = self.dom[x]

    def _item(self, n: Node) -> None:
        src, key = n["input"], n["index"]
        if src not in self.pairs or key != 0:
            raise NotCovered(f"{n.name}[{key!r}] (indices of a reduction, or a shape) is not covered by conv_tail")
        self.env[n.name] = self.env[src]
        self.dom[n.name] = self.dom[src]

    def _reshape(self, n: Node) -> None:
        x = self._input(n, n.op)
        before = tuple(s for s in (self.g.shape(x) or ()) if s != 1)
        after = tuple(s for s in (n.shape or ()) if s != 1)
        if before != after:
            raise NotCovered(f"{n.op} from {self.g.shape(x)} to {n.shape} (not only size-1 dims) is not covered by "
                             "conv_tail")
        self.env[n.name] = self.ref(x)
        self.dom[n.name] = self.dom[x]

    # -- the whole forward ------------------------------------------------------------------
    def trace(self, conv: Node) -> Tail | None:
        live = self.g.live()
        self.env[conv.name] = self.q(Leaf(LeafKind.lead))
        self.dom[conv.name] = 0
        for n in live:
            if n is not conv:
                self.visit(n)
        if not self.drafts:
            return None  # elementwise only: conv_epi's
        self.node = self.g.node(self.g.output)
        result = self.g.output
        final = self.ref(result)
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


def trace_tail(g: Graph, conv: Node, d0: Domain) -> Tail | None:
    """The graph after ``conv`` as a :class:`Tail`; None when it has no stage (an elementwise epilogue:
    conv_epi's); or :class:`NotCovered`."""
    return _TailTranslator(g, d0).trace(conv)
