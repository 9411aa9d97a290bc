"""Fused epilogues: a reference forward that is ``x -> one leading module (nn.Linear, nn.Conv2d, ...) ->
an elementwise chain``, translated to fp32 C statements that a GEMM or convolution template applies to
each output element in registers before its store.

``trace_epilogue(model, lead=("Linear",), shapes=..., lead_shape=..., out_shape=...)`` traces the
meta-built model with torch.fx (as :mod:`.chain` does for plain chains) and returns an
:class:`Epilogue`: C statements over ``float v`` (the leading module's output element, its own bias
included) and over extra tensors the chain reads, as ``ep0``, ``ep1``, ... in order of first use:

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
from typing import Any, Mapping

from kerngen.agent.playbook.chain import Translator, live_chain, reachable, trace_graph
from kerngen.agent.playbook.chain_ir import INPUT, Chain, Operand
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["EpIndex", "EpParam", "Epilogue", "tensor_constant", "trace_epilogue"]


class EpIndex(str, Enum):
    """How a kernel indexes an extra tensor of the epilogue."""

    channel = "channel"  # one value per output channel (conv) or column (GEMM): ep[ch]
    scalar = "scalar"  # one value: ep[0]
    full = "full"  # the output's own shape: ep[idx]


_SUBSCRIPT = {EpIndex.channel: "[ch]", EpIndex.scalar: "[0]", EpIndex.full: "[idx]"}
_BATCH_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")


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
    def __init__(self, model: Any, lead: tuple[str, ...], shapes: Mapping[str, tuple[int, ...]],
                 lead_shape: tuple[int, ...], channel_dim: int) -> None:
        super().__init__(model)
        self.lead_kinds = lead
        self.shapes = shapes
        self.lead_shape = lead_shape
        self.channel_dim = channel_dim
        self.params: list[EpParam] = []
        self.lead_name = ""

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

    def module(self, target: str, args: tuple, kwargs: dict[str, Any]) -> Operand:
        """An eval-mode batch norm is a per-channel affine map of its running statistics (the
        reference runs the model in eval mode); every other module as the plain chain has it."""
        mod = self.model.get_submodule(target)
        if type(mod).__name__ not in _BATCH_NORMS:
            return super().module(target, args, kwargs)
        if mod.training or not mod.track_running_stats or mod.running_mean is None:
            raise NotCovered(f"{target} ({type(mod).__name__}) normalises with batch statistics: not an epilogue")
        if len(args) != 1 or kwargs:
            raise NotCovered(f"module {target} with {len(args)} arguments is not covered by the epilogue")
        x = self.tensor(args[0], type(mod).__name__)
        n = self.lead_shape[self.channel_dim]
        if tuple(mod.running_mean.shape) != (n,) or not (self.channel_dim % len(self.lead_shape) == 1
                                                          or len(self.lead_shape) == 2):
            raise NotCovered(f"{target}'s {tuple(mod.running_mean.shape)} statistics do not run along the output's "
                             "channels: not covered")
        mean = self.channel(f"{target}.running_mean")
        var = self.channel(f"{target}.running_var")
        # (x - mean) / sqrt(var + eps) * weight + bias, in fp32 as PyTorch's eval-mode kernel
        t = self.emit("mul", (self.emit("sub", (x, mean)), self.emit("rsqrt", (self.emit("add", (var, float(mod.eps))),))))
        if mod.affine:
            t = self.emit("add", (self.emit("mul", (t, self.channel(f"{target}.weight"))), self.channel(f"{target}.bias")))
        return t

    def channel(self, name: str) -> Operand:
        return self.use(EpParam(name, EpIndex.channel))

    def _lead_node(self, nodes: list[Any]) -> Any:
        for n in nodes:
            if n.op == "call_module" and type(self.model.get_submodule(str(n.target))).__name__ in self.lead_kinds:
                return n
        raise NotCovered(f"the forward does not start with an {' / '.join(self.lead_kinds)} module")

    def run(self, graph: Any) -> Chain:
        import torch.fx as fx

        nodes = list(graph.nodes)
        out = next((n for n in nodes if n.op == "output"), None)
        result = out.args[0] if out is not None else None
        if not isinstance(result, fx.Node):
            raise NotCovered("the forward does not return one tensor (a tuple, a list or a constant)")
        lead = self._lead_node(nodes)
        self.lead_name = str(lead.target)
        kind = type(self.model.get_submodule(self.lead_name)).__name__
        src = lead.args[0] if len(lead.args) == 1 and not lead.kwargs else None
        if not isinstance(src, fx.Node) or src.op != "placeholder":
            raise NotCovered(f"the {kind} module is not applied directly to a forward input")
        live = reachable(result)
        if lead not in live:
            raise NotCovered(f"the forward's result does not depend on its {kind} module")
        self.check_inplace(nodes)
        for n in nodes:
            if n not in live or n is src:
                continue
            if n is not lead and src in n.all_input_nodes:
                raise NotCovered(f"the epilogue reads the {kind} module's input again: not covered")
            if n.op == "placeholder":
                shape = tuple(self.shapes.get(str(n.target), ()))
                self.env[n] = self.extra(str(n.target), shape, "input")
            elif n is lead:
                self.env[n] = INPUT
            elif n.op == "get_attr":
                target = str(n.target)
                const = tensor_constant(self.model, target)
                if const is not None:  # torch.tensor(0.5) made in forward: a literal
                    self.env[n] = const
                    continue
                if not _is_param(self.model, target):  # a buffer or a tensor made in forward: no tensor to bind
                    raise NotCovered(f"the epilogue reads {target!r}, which is not a parameter of the model: not covered")
                self.env[n] = self.extra(target, tuple(self.model.get_parameter(target).shape), "parameter")
            else:
                self.visit(n)
        r = self.env[result]
        if self.dtype(r) != "float":
            raise NotCovered("the forward returns a boolean tensor: not covered by the epilogue")
        return live_chain(self.nodes, r)


def tensor_constant(model: Any, target: str) -> float | None:
    """The value of a one-element tensor the forward makes (``torch.tensor(0.5)``: torch.fx sets it on
    the traced module as ``_tensor_constant<i>``, a real tensor beside the meta parameters), or None for
    anything else (parameters, buffers, larger or non-numeric tensors)."""
    import torch

    value = model
    for part in target.split("."):
        value = getattr(value, part, None)
    if (not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter) or value.device.type == "meta"
            or value.numel() != 1 or not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64))):
        return None
    return float(value.reshape(-1)[0].item())


def _is_param(model: Any, target: str) -> bool:
    try:
        model.get_parameter(target)
    except AttributeError:
        return False
    return True


def trace_epilogue(model: Any, lead: tuple[str, ...], *, shapes: Mapping[str, tuple[int, ...]],
                   lead_shape: tuple[int, ...], out_shape: tuple[int, ...], channel_dim: int) -> Epilogue:
    """The forward as ``lead module -> elementwise chain`` (see the module's doc), or :class:`NotCovered`.

    ``shapes``: the forward inputs' shapes by name; ``lead_shape``: the leading module's output shape;
    ``out_shape``: the forward's output shape (must equal ``lead_shape``: an epilogue never
    broadcasts the output larger); ``channel_dim``: the dim of the lead's output that a per-channel
    parameter runs along (1 for convolutions, -1 for a GEMM's columns)."""
    if model is None:
        raise NotCovered("cannot trace the forward: the model did not build on the meta device")
    if tuple(out_shape) != tuple(lead_shape):
        raise NotCovered(f"the output ({'x'.join(map(str, out_shape))}) is not the shape of the leading module's "
                         f"output ({'x'.join(map(str, lead_shape))}): the ops after it are not elementwise")
    t = _EpilogueTranslator(model, lead, shapes, tuple(lead_shape), channel_dim)
    chain = t.run(trace_graph(model))
    return Epilogue(t.lead_name, chain, tuple(t.params))
