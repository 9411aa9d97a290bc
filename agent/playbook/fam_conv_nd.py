"""Playbook family ``conv_nd``: one ``nn.Conv3d`` or ``nn.ConvTranspose1d/2d/3d`` module (any stride,
zero padding, dilation, groups, output padding) applied to a forward input, followed by an
elementwise epilogue traced by :mod:`.epilogue` (as ``conv_epi`` does for 1-D and 2-D convolutions).
Everything is a 3-D problem: a 1-D one has D = H = 1, a 2-D one D = 1.

What it claims that nobody covered: KernelBench level 1's 3-D and transposed convolutions, and the
level-2 files whose leading transposed or 3-D conv is followed only by elementwise ops. A conv
followed by a reduction, a norm or a pool is this family's to refuse, with the tracer's reason.

Two variants (:mod:`.build_conv_nd`): ``tf32x3``, the 3xTF32 implicit GEMM on the tensor cores (3-D
gather; a transposed conv as the convolution of its flipped weights, per output phase when strided),
wherever a group has two or more input channels; ``direct``, one thread per output position, everywhere.
"""

from __future__ import annotations

from typing import Any

from kerngen.agent.playbook import build_conv_nd as build
from kerngen.agent.playbook.build_conv_tf32 import VARIANT as TF32, ideas as tf32_ideas
from kerngen.agent.playbook.entry import C, PAR, Entry
from kerngen.agent.playbook.epilogue import Epilogue, trace_epilogue
from kerngen.agent.playbook.fam_conv_epi import check_dtypes, conv_input
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.forward_source import module_of
from kerngen.agent.playbook.match import FamilyMatch, Read, Tensor, param_for
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FAMILY", "LEADS", "recognise"]

NAME = "conv_nd"
# module type -> (spatial dims, transposed)
LEADS = {"Conv3d": (3, False), "ConvTranspose1d": (1, True), "ConvTranspose2d": (2, True),
         "ConvTranspose3d": (3, True)}
_OTHER_CONVS = ("Conv1d", "Conv2d", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                "conv_transpose3d")


def _ints(v: Any, dims: int, what: str) -> tuple[int, ...]:
    if isinstance(v, str):
        raise NotCovered(f"conv {what} {v!r} is not covered by conv_nd")
    t = tuple(int(e) for e in v) if isinstance(v, (tuple, list)) else (int(v),) * dims
    if len(t) != dims:
        raise NotCovered(f"cannot read a {dims}-D conv's {what} from {v!r}")
    return t


def _three(t: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    """A 1-D or 2-D geometry as 3-D: the missing leading dims are of size 1 (``fill`` for them)."""
    return (fill,) * (3 - len(t)) + t  # type: ignore[return-value]


def _geometry(kind: str, mod: Any) -> dict[str, Any]:
    if getattr(mod, "padding_mode", "zeros") != "zeros":
        raise NotCovered(f"conv padding_mode {mod.padding_mode!r} (not zeros) is not covered by conv_nd")
    dims, transposed = LEADS[kind]
    k, s = _ints(mod.kernel_size, dims, "kernel_size"), _ints(mod.stride, dims, "stride")
    p, d = _ints(mod.padding, dims, "padding"), _ints(mod.dilation, dims, "dilation")
    op = _ints(getattr(mod, "output_padding", 0), dims, "output_padding") if transposed else (0,) * dims
    return dict(dims=dims, transposed=transposed, C=int(mod.in_channels), OC=int(mod.out_channels),
                G=int(mod.groups), K=_three(k, 1), S=_three(s, 1), P=_three(p, 0), D=_three(d, 1), OP=_three(op, 0))


def out_size(i: int, k: int, s: int, p: int, d: int, op: int, transposed: bool) -> int:
    """One spatial output size, as torch computes it."""
    if transposed:
        return (i - 1) * s - 2 * p + d * (k - 1) + op + 1
    return (i + 2 * p - d * (k - 1) - 1) // s + 1


def _lead_shape(x: Tensor, g: dict[str, Any]) -> tuple[int, ...]:
    if len(x.shape) != g["dims"] + 2:
        raise NotCovered(f"a {g['dims']}-D conv over a {len(x.shape)}-D input is not covered by conv_nd")
    spatial = _three(tuple(x.shape[2:]), 1)
    out = tuple(out_size(i, *a, g["transposed"]) for i, *a in zip(spatial, g["K"], g["S"], g["P"], g["D"], g["OP"]))
    if min(out) < 1:
        raise NotCovered("the convolution's output is empty at this input size")
    return (x.shape[0], g["OC"], *out[3 - g["dims"]:])


def recognise(r: Read) -> FamilyMatch | None:
    convs = [(k, c, n) for k, c, n in r.kinds if k in LEADS]
    if not convs:
        return None
    if len(convs) != 1 or any(k in _OTHER_CONVS for k in r.names):
        raise NotCovered("the playbook covers one convolution module applied to one input (conv_nd)")
    kind, callee, node = convs[0]
    mod = module_of(r.model, callee)
    if mod is None:
        raise NotCovered(f"cannot read the {kind} module's geometry (no meta model)")
    geo = _geometry(kind, mod)
    x = conv_input(r, node, NAME)
    shape = _lead_shape(x, geo)
    try:
        ep: Epilogue = trace_epilogue(r.model, (kind,), shapes={t.name: t.shape for t in r.match.inputs},
                                      lead_shape=shape, out_shape=r.out.shape, channel_dim=1)
    except NotCovered as exc:
        raise NotCovered(f"{kind} followed by what conv_nd cannot fuse as an elementwise epilogue: {exc}") from None
    weight = param_for(r.match.params, ep.lead, "weight")
    bias = param_for(r.match.params, ep.lead, "bias")
    if weight is None:
        raise NotCovered(f"no parameter {ep.lead}.weight among the model's parameters")
    tensors = {t.name for t in r.match.inputs + r.match.params}
    loose = [p.name for p in ep.params if p.name not in tensors]
    if loose:
        raise NotCovered(f"the epilogue reads {loose[0]!r}, which is not a tensor: not covered by conv_nd")
    check_dtypes(r, [weight.name] + ([bias.name] if bias else []) + [p.name for p in ep.params], NAME)
    r.match.facts = dict(geo, kind=kind, x=x.name, weight=weight.name, bias=bias.name if bias else None,
                         epilogue=ep, formula=ep.formula or "none")
    return r.match


_DIRECT: tuple[Entry, ...] = (
    Entry("cnd-direct", "Direct 3-D convolution (a transposed one as the gather of its adjoint: an output "
          "position reads the input positions (o + p - k*d) / s that divide exactly) with the conv bias and the "
          "elementwise epilogue fused: one thread per output position and OCT output channels of one group, "
          "consecutive threads on consecutive output columns (coalesced stores), each input value loaded once "
          "for the OCT channels, weights read through the read-only cache (the same for a whole warp).", C,
          "correct everywhere; FFMA and load bound, below cuDNN's implicit GEMM at large channel counts",
          "direct", ({}, {"OCT": 4}), round0=True),
    Entry("cnd-more-oc", "Register-block over more output channels per thread (OCT 8): each input value loaded "
          "feeds more FFMAs.", C, "5-30% when the parent is load bound", "direct", ({"OCT": 8}, {"OCT": 2}),
          after=frozenset({"direct"})),
    Entry("cnd-block", "Re-size the thread block (128 or 512 threads): more blocks for small outputs, fewer "
          "and fuller ones for large.", PAR, "0-10%", "direct", ({"BLOCK": 128}, {"BLOCK": 512}),
          after=frozenset({"direct"})),
)

# the 3xTF32 implicit GEMM of conv2d and conv_epi, 3-D, flipped and phased: a 3-D convolution, a transposed one
# of stride 1 (the convolution of its flipped weights), or a strided transposed one (one such convolution per
# output phase). Its ideas come first, so round 0 times it first: it was 1.8-5.2x faster than the direct
# kernel on all 13 level-1 files of stride 1 where both were timed (H100, session 10), and the direct kernel
# of a large one can spend a small budget alone (KernelBench 68: 813 ms a call, 21 s to check and time; the
# GEMM never ran)
IDEAS: tuple[Entry, ...] = tf32_ideas(
    "cnd", " (a transposed convolution as the convolution of its weights swapped to [OC][C] and flipped along "
           "every axis; with a stride, one such convolution per output phase o mod s over the taps that reach "
           "it); the conv bias and the elementwise epilogue are applied to the accumulators before the only "
           "store") + _DIRECT

FAMILY = Family(name=NAME, recognise=recognise, variants={"direct": build.conv_nd_direct, TF32: build.conv_nd_tf32x3},
                ideas=IDEAS)
