"""Fused epilogues: a reference forward that is ``x -> one leading module (nn.Linear, nn.Conv2d, ...) ->
an elementwise chain``, translated to fp32 C statements that a GEMM or convolution template applies to
each output element in registers before its store.

``trace_epilogue(graph, lead, channel_dim=...)`` reads the traced graph (:mod:`.graph`) after the lead node
through the one pointwise translator (:mod:`.pointwise`) and returns an :class:`Epilogue`: C statements over
``float v`` (the leading module's output element, its own bias included) and over extra tensors the chain
reads, as ``ep0``, ``ep1``, ... in order of first use:

- a model parameter or buffer broadcast along the output's channel dim (a conv's ``bias`` of shape
  (C, 1, 1), a per-column scale of shape (N,)): ``ep<i>[ch]``; the template defines ``const int ch``;
- a one-element parameter: ``ep<i>[0]``;
- a forward input of the output's shape (a residual): ``ep<i>[idx]``; the template defines
  ``const long long idx``, the flat output offset.

An eval-mode batch norm in the chain (the reference runs in eval mode) is its per-channel affine
map: ``(v - running_mean[ch]) * rsqrt(running_var[ch] + eps) * weight[ch] + bias[ch]``, the four
tensors read per channel by their dotted names.

Templates include ``_epilogue.cuh.j2`` for the helpers the statements call (``kg_fmax``,
``kg_fmin``, NaN-propagating like torch.maximum/minimum/clamp/relu). Anything else in the forward
(reductions, shape ops, a second use of the module's input, parameters that broadcast otherwise)
raises :class:`NotCovered` with a one-line reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from kerngen.agent.playbook.chain_ir import INPUT, Chain, Operand
from kerngen.agent.playbook.graph import Graph, Node as GNode, Ref
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.pointwise import Translator, live_chain

__all__ = ["EpIndex", "EpParam", "Epilogue", "classify", "trace_constant_tail", "trace_epilogue"]


class EpIndex(str, Enum):
    """How a kernel indexes an extra tensor of the epilogue."""

    channel = "channel"  # one value per output channel (conv) or column (GEMM): ep[ch]
    scalar = "scalar"  # one value: ep[0]
    full = "full"  # the output's own shape: ep[idx]


_VIEWS = ("view", "reshape", "unsqueeze", "squeeze", "flatten", "_unsafe_view")
_SUBSCRIPT = {EpIndex.channel: "[ch]", EpIndex.scalar: "[0]", EpIndex.full: "[idx]"}


@dataclass(frozen=True)
class EpParam:
    name: str  # the bindable tensor: a parameter's dotted name ("bias", "gn.weight") or a forward input ("y")
    index: EpIndex

    def operand(self, i: int) -> str:
        return f"ep{i}{_SUBSCRIPT[self.index]}"


@dataclass(frozen=True)
class Epilogue:
    lead: str  # dotted name of the leading module ("gemm", "conv")
    chain: Chain  # over INPUT = the leading module's output element
    params: tuple[EpParam, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(self.chain.statements())

    @property
    def expr(self) -> str:
        return self.chain.expr()

    @property
    def empty(self) -> bool:
        return not self.chain.nodes and self.chain.result == INPUT

    @property
    def formula(self) -> str:
        text = self.chain.formula()
        for i, p in enumerate(self.params):
            text = text.replace(p.operand(i), p.name)
        return text

    @property
    def slug(self) -> str:
        return "" if self.empty else self.chain.slug()


def _strip_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


def classify(shape: tuple[int, ...], lead_shape: tuple[int, ...], channel_dim: int) -> EpIndex | None:
    """How a tensor of ``shape`` broadcasts against the lead's output (``lead_shape``) without
    enlarging it: a scalar, one value per channel (``channel_dim`` of the output), the output's own
    shape; None otherwise."""
    if len(shape) > len(lead_shape):
        if _strip_ones(shape[: len(shape) - len(lead_shape)]):
            return None
        shape = shape[len(shape) - len(lead_shape):]
    if math.prod(shape) == 1:
        return EpIndex.scalar
    if tuple(shape) == tuple(lead_shape):
        return EpIndex.full
    padded = (1,) * (len(lead_shape) - len(shape)) + tuple(shape)
    ch = channel_dim % len(lead_shape)
    if all(s == 1 for i, s in enumerate(padded) if i != ch) and padded[ch] == lead_shape[ch]:
        return EpIndex.channel
    return None


class _EpilogueTranslator(Translator):
    def __init__(self, g: Graph, lead: GNode, channel_dim: int) -> None:
        super().__init__(g)
        self.lead = lead
        self.lead_shape = tuple(lead.shape or ())
        self.channel_dim = channel_dim
        self.params: list[EpParam] = []

    def extra(self, name: str, shape: tuple[int, ...], what: str) -> Operand:
        index = classify(shape, self.lead_shape, self.channel_dim)
        if index is None:
            raise NotCovered(f"the epilogue reads {what} {name!r} of shape {tuple(shape)}, which does not broadcast "
                             f"per channel over the {'x'.join(map(str, self.lead_shape))} output: not covered")
        return self.use(EpParam(name, index))

    def use(self, p: EpParam) -> Operand:
        """The operand of ``p`` (ep0, ep1, ... in order of first use; a tensor read twice is one operand)."""
        if p not in self.params:
            self.params.append(p)
        return p.operand(self.params.index(p))

    def leaf(self, ref: Ref) -> Operand:
        t = self.g.tensor(ref)
        if t is None:
            return super().leaf(ref)
        return self.extra(str(ref), t.shape, "input" if self.g.is_input(ref) else "parameter")

    def channel(self, name: str) -> Operand:
        return self.use(EpParam(name, EpIndex.channel))

    def visit(self, n: GNode) -> None:
        """An eval-mode batch norm is a per-channel affine map of its running statistics (the reference runs
        in eval mode); a parameter viewed with size-1 dims added or dropped is that parameter broadcast as the
        view's shape; every other node as the plain chain has it."""
        src = n.args.get("self")
        if n.op in _VIEWS and isinstance(src, Ref) and self.g.is_param(src) and n.shape is not None and \
                [d for d in n.shape if d != 1] == [d for d in self.g.tensor(src).shape if d != 1]:
            self.env[n.name] = self.extra(str(src), n.shape, "parameter")
            return
        if n.op != "batch_norm":
            return super().visit(n)
        what = n.label
        if n["training"] or n["running_mean"] is None:
            raise NotCovered(f"{what} normalises with batch statistics: not an epilogue")
        x = self.tensor(n["input"], "batch_norm")
        c = self.lead_shape[self.channel_dim]
        stats = self.g.tensor(n["running_mean"])
        if stats is None or tuple(stats.shape) != (c,) or not (self.channel_dim % len(self.lead_shape) == 1
                                                               or len(self.lead_shape) == 2):
            raise NotCovered(f"{what}'s statistics do not run along the output's channels: not covered")
        t = self.batch_norm_eval(n, x, self.channel, "the epilogue")
        self.env[n.name] = t


def trace_epilogue(g: Graph, lead: GNode, *, channel_dim: int) -> Epilogue:
    """The graph as ``lead -> elementwise chain`` (see the module's doc), or :class:`NotCovered`.

    ``lead``: the convolution or GEMM node, applied to an input of the graph; ``channel_dim``: the dim of its
    output that a per-channel parameter runs along (1 for convolutions, -1 for a GEMM's columns). The output
    must be the lead's shape: an epilogue never broadcasts the output larger."""
    kind = lead.label
    out_shape, lead_shape = tuple(g.out.shape), tuple(lead.shape or ())
    if out_shape != lead_shape:
        raise NotCovered(f"the output ({'x'.join(map(str, out_shape))}) is not the shape of the leading module's "
                         f"output ({'x'.join(map(str, lead_shape))}): the ops after it are not elementwise")
    src = lead.args.get("input")
    if not isinstance(src, Ref) or not g.is_input(src):
        raise NotCovered(f"the {kind} is not applied directly to a forward input")
    live = g.live()
    if lead not in live:
        raise NotCovered(f"the forward's result does not depend on its {kind}")
    t = _EpilogueTranslator(g, lead, channel_dim)
    t.env[lead.name] = INPUT
    used = {r for n in live if n is not lead for r in n.refs} | {g.output}
    if src in used:
        raise NotCovered(f"the epilogue reads the {kind}'s input again: not covered")
    for i in g.inputs:  # the other inputs first, in the forward's order (their operands ep0, ep1, ...)
        if i.name in used:
            t.env[i.name] = t.extra(i.name, i.shape, "input")
    for n in live:
        if n is not lead:
            t.visit(n)
    r = t.ref(g.output)
    if t.dtype(r) != "float":
        raise NotCovered("the forward returns a boolean tensor: not covered by the epilogue")
    return Epilogue(lead.module or lead.name, live_chain(t.nodes, r), tuple(t.params))


def trace_constant_tail(g: Graph, lead: GNode) -> Epilogue:
    """The nodes after ``lead`` (a product) up to the graph's output as an elementwise chain of ``lead``'s value and
    constants alone (``(q @ k^T) * scale``), or :class:`NotCovered`: a tail that reads a tensor of the graph (an
    input, a parameter, a value computed before ``lead``) is not this."""
    live = g.live()
    if lead not in live or tuple(g.out.shape) != tuple(lead.shape or ()):
        raise NotCovered(f"the ops after the {lead.label} are not an elementwise chain of its output")
    tail = live[live.index(lead) + 1:]
    mine = {lead.name, *(n.name for n in tail)}
    for n in tail:
        other = next((r for r in n.refs if r not in mine and r not in g.constants), None)
        if other is not None:
            raise NotCovered(f"the epilogue after the {lead.label} reads {other!r}: only constants are fused there")
    t = _EpilogueTranslator(g, lead, -1)
    t.env[lead.name] = INPUT
    for n in tail:
        t.visit(n)
    r = t.ref(g.output)
    if t.params or t.dtype(r) != "float":
        raise NotCovered(f"the ops after the {lead.label} are not an elementwise chain of its output")
    return Epilogue(lead.module or lead.name, live_chain(t.nodes, r), ())
