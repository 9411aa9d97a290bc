"""Playbook family ``conv_nd``: one 3-D or transposed 1-D/2-D/3-D convolution (any stride, zero padding,
dilation, groups, output padding) of a forward input, followed by an elementwise epilogue traced by
:mod:`.epilogue` (as ``conv_epi`` does for 1-D and 2-D convolutions). Everything is a 3-D problem: a 1-D one
has D = H = 1, a 2-D one D = 1. A conv followed by a reduction, a norm or a pool is this family's to refuse,
with the tracer's reason (the partitioner then cuts the graph after the conv).

Three variants (:mod:`.conv.build_nd`): ``tf32x3``, the 3xTF32 implicit GEMM on the tensor cores (3-D
gather; a transposed conv as the convolution of its flipped weights, per output phase when strided),
wherever a group has two or more input channels; ``direct``, one thread per output position, everywhere;
``wgmma`` (Hopper only), the implicit GEMM on the wgmma core (:mod:`.conv.build_wgmma`) of a 3-D conv or a
transposed one of stride 1.
"""

from __future__ import annotations

from kerngen.agent.playbook.conv import build_nd as build
from kerngen.agent.playbook.conv.build_tf32 import VARIANT as TF32, ideas as tf32_ideas
from kerngen.agent.playbook.conv.build_wgmma import VARIANT as WGMMA, ideas as wgmma_ideas
from kerngen.agent.playbook.entry import C, PAR, Entry
from kerngen.agent.playbook.epilogue import Epilogue, trace_epilogue
from kerngen.agent.playbook.conv.epi import check_dtypes, conv_input, conv_lead, geometry, kind_of
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.render import three

__all__ = ["CONV_ND", "ConvNdFacts", "out_size"]

NAME = "conv_nd"
LEADS = ("conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


class ConvNdFacts(Facts):
    """A 3-D or transposed convolution as a 3-D one (per-dim tuples, outermost spatial dim first)."""

    dims: int
    transposed: bool
    C: int
    OC: int
    G: int
    K: tuple[int, int, int]
    S: tuple[int, int, int]
    P: tuple[int, int, int]
    D: tuple[int, int, int]
    OP: tuple[int, int, int]
    kind: str  # the nn module type, for descriptions: "ConvTranspose3d"
    x: str
    weight: str
    bias: str | None = None
    epilogue: Epilogue
    formula: str = ""


def out_size(i: int, k: int, s: int, p: int, d: int, op: int, transposed: bool) -> int:
    """One spatial output size, as torch computes it."""
    if transposed:
        return (i - 1) * s - 2 * p + d * (k - 1) + op + 1
    return (i + 2 * p - d * (k - 1) - 1) // s + 1


def _recognise(g: Graph) -> FamilyMatch | None:
    n = conv_lead(g, LEADS)
    if n is None:
        return None
    kind = kind_of(n)
    geo = geometry(g, n)
    if geo["padding_str"]:
        raise NotCovered(f"conv padding {n['padding']!r} is not covered by conv_nd")
    x = conv_input(g, n, NAME)
    spatial = three(tuple(x.shape[2:]), 1)
    k, s, p, d, op = (three(geo[a], f) for a, f in (("K", 1), ("S", 1), ("P", 0), ("D", 1), ("OP", 0)))
    out = tuple(out_size(i, *a, geo["transposed"]) for i, *a in zip(spatial, k, s, p, d, op))
    if min(out) < 1:
        raise NotCovered("the convolution's output is empty at this input size")
    try:
        ep = trace_epilogue(g, n, channel_dim=1)
    except NotCovered as exc:
        raise NotCovered(f"{kind} followed by what conv_nd cannot fuse as an elementwise epilogue: {exc}") from None
    bias = n["bias"]
    if bias is not None and not g.is_param(bias):
        raise NotCovered(f"the conv's bias {bias!r} is not a parameter of the model: not covered by conv_nd")
    check_dtypes(g, [n["weight"]] + ([bias] if bias else []) + [q.name for q in ep.params], NAME)
    facts = ConvNdFacts(dims=geo["dims"], transposed=geo["transposed"], C=geo["C"], OC=geo["OC"], G=geo["G"], K=k, S=s,
                        P=p, D=d, OP=op, kind=kind, x=x.name, weight=n["weight"], bias=bias, epilogue=ep,
                        formula=ep.formula or "none")
    return FamilyMatch.of(g, facts)


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
IDEAS: tuple[Entry, ...] = wgmma_ideas(  # Hopper only (coverage), first in round 0 there
    "cnd", "Run the fp32 3-D or stride-1 transposed convolution (its weights swapped and flipped) with its fused "
           "epilogue at fp32 accuracy (3xTF32) ", "the 3xTF32 conv on Hopper's full tensor-core path instead of "
           "mma.sync; not yet measured on a GPU", tf32=True) + tf32_ideas(
    "cnd", " (a transposed convolution as the convolution of its weights swapped to [OC][C] and flipped along "
           "every axis; with a stride, one such convolution per output phase o mod s over the taps that reach "
           "it); the conv bias and the elementwise epilogue are applied to the accumulators before the only "
           "store") + _DIRECT

CONV_ND = Family(name=NAME, leads=frozenset({Lead.conv}), recognise=_recognise,
                 constraints=("one conv3d or transposed conv", "of a forward input", "elementwise after it"),
                 variants={"direct": build.conv_nd_direct, TF32: build.conv_nd_tf32x3,
                           WGMMA: build.conv_nd_wgmma},  # wgmma: Hopper only (coverage)
                 ideas=IDEAS)
