"""Playbook family ``conv_tail``: one 2-D convolution of a forward input, an elementwise epilogue,
then what conv_epi cannot fuse: reductions over the channels (min, max, sum, mean, logsumexp), 2-D max or
average pooling, global pooling (mean over H and W, adaptive pooling to 1), sums over all but the batch,
InstanceNorm2d and GroupNorm, with elementwise ops between them (a residual of an earlier value of the
same shape included), traced by :mod:`.conv.tail_trace` into typed stages.

The plan (:mod:`.conv.build_tail`): conv_epi's kernel with the epilogue up to the first stage into a
scratch tensor, then one kernel per stage; a norm is a statistics kernel and is applied in the next
kernel's prologue. A forward whose ops after the conv are all elementwise is conv_epi's (None), as are
conv + relu + max-pool (the built-in fused kernel's) and forwards with another convolution.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kerngen.agent.playbook.conv import build_tail as build
from kerngen.agent.playbook.chain_ir import INPUT, Chain, Node
from kerngen.agent.playbook.conv.tail_ir import Domain, LeafKind, Tail
from kerngen.agent.playbook.conv.tail_trace import is_stage, trace_tail
from kerngen.agent.playbook.entry import CF, PAR, A, C, Entry, M, P
from kerngen.agent.playbook.epilogue import Epilogue, EpIndex, EpParam
from kerngen.agent.playbook.conv.epi import conv_facts, conv_lead, lead_shape, relu_pool
from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["CONV_TAIL"]

NAME = "conv_tail"


def _rename(chain: Chain, names: dict[str, str]) -> Chain:
    def ren(a: Any) -> Any:
        return names.get(a, a) if isinstance(a, str) else a

    return Chain(tuple(Node(n.var, n.op, tuple(ren(a) for a in n.args), n.params, n.dtype) for n in chain.nodes),
                 ren(chain.result))


def _conv_epilogue(tail: Tail, lead: str) -> Epilogue:
    """The tail's conv chain as conv_epi's epilogue: the lead leaf is ``v``, parameters ``ep<i>[ch]`` / ``[0]``."""
    names: dict[str, str] = {}
    params: list[EpParam] = []
    for i in tail.leaves_of(tail.conv):
        leaf = tail.leaves[i]
        if leaf.kind == LeafKind.lead:
            names[f"q{i}"] = INPUT
        elif leaf.kind in (LeafKind.channel, LeafKind.scalar):
            p = EpParam(str(leaf.ref), EpIndex.channel if leaf.kind == LeafKind.channel else EpIndex.scalar)
            names[f"q{i}"] = p.operand(len(params))
            params.append(p)
        else:  # the trace materialises domain 0 before any statistics or buffer exists
            raise NotCovered(f"the convolution's epilogue reads {leaf.kind.value}: not covered by conv_tail")
    return Epilogue(lead, _rename(tail.conv, names), tuple(params))


def _recognise(g: Graph) -> FamilyMatch | None:
    conv = conv_lead(g, ("conv1d", "conv2d"))
    if conv is None or conv.op != "conv2d" or relu_pool(g) or not any(is_stage(n) for n in g.live()):
        return None
    f = conv_facts(g, conv, NAME)
    x = g.tensor(f.x)
    shape = lead_shape(x, f)
    oh = f"(({x.name}.shape[2]) + {2 * f.PH - f.DH * (f.KH - 1) - 1}) // {f.SH} + 1"
    ow = f"(({x.name}.shape[3]) + {2 * f.PW - f.DW * (f.KW - 1) - 1}) // {f.SW} + 1"
    d0 = Domain(f"{x.name}.shape[0]", f"{f.weight}.shape[0]", oh, ow, tuple(shape))
    tail = trace_tail(g, conv, d0)
    if tail is None:
        return None
    ep = _conv_epilogue(tail, conv.module or conv.name)
    used = [f.weight] + ([f.bias] if f.bias else []) + [str(leaf.ref) for leaf in tail.leaves
                                                        if leaf.kind in (LeafKind.channel, LeafKind.scalar)]
    bound = {t.name: t for t in g.params}
    missing = [n for n in used if n not in bound]
    if missing:
        raise NotCovered(f"the tail reads {missing[0]!r}, which is not a bound parameter: not covered by conv_tail")
    dtypes = set(g.dtypes) | {bound[n].dtype for n in used}
    if dtypes != {"float32"}:
        raise NotCovered(f"conv_tail computes in fp32 only ({', '.join(sorted(dtypes - {'float32'}))} is not covered)")
    return FamilyMatch.of(g, f.model_copy(update=dict(epilogue=ep, tail=tail, formula=tail.summary())))


# ---------------------------------------------------------------------------------------------
_TAIL_BLOCKS = ({"TAIL_BLOCK": 128}, {"TAIL_BLOCK": 512}, {"TAIL_BLOCK": 1024})
IDEAS: tuple[Entry, ...] = (
    Entry("ctail-wgmma", "The convolution with its elementwise prefix on Hopper's wgmma core at fp32 accuracy "
          "(3xTF32: pre-passes write x channels-last and the weights K-major, split into big + small tf32 planes; a "
          "producer warpgroup gathers the im2col k tiles with zero-filling cp.async into swizzled shared memory while "
          "TMA brings the weights' tiles; two consumer warpgroups on wgmma), into scratch; the same tail kernels "
          "after it.", P, "the convolution, which dominates, on the tensor cores at their full Hopper rate; not yet "
          "measured on a GPU", "wgmma", ({}, {"GROUP_M": 16}), round0=True),
    Entry("ctail-wgmma-tile", "Re-shape the wgmma convolution's tile or its copy width (VEC): a narrower channel "
          "tile for groups of few channels, two m64 blocks a consumer, wider copies for the producer.", PAR,
          "0-20% of the convolution", "wgmma", ({"BN": 64}, {"BN": 64, "WGM": 2, "STAGES": 2}, {"VEC": 4}),
          after=frozenset({"wgmma"})),
    Entry("ctail-igemm", "Convolution as an implicit GEMM with the elementwise ops before the first reduction, "
          "pool or norm fused into its epilogue, stored once to a scratch tensor; then one small kernel per "
          "stage of the tail: a norm's statistics a block per (sample, group) with exact Chan merges, a "
          "reduction over the channels a thread per position, a pool window a thread per output, a plane "
          "or sample reduction a block per segment; a norm is applied in the next kernel's prologue, the "
          "elementwise ops after a stage in its epilogue, so no elementwise pass stands alone.", C,
          "the convolution dominates (FFMA-bound like conv_epi); the tail costs one or two reads of the "
          "conv's output", "igemm", ({}, {"BK": 32, "STAGES": 2, "MIN_BLOCKS": 2}), round0=True),
    Entry("ctail-direct", "Direct convolution (input patch and weights staged in shared memory, several output "
          "channels and positions a thread) with the elementwise prefix fused, into scratch; the same tail "
          "kernels after it.", C, "competitive with the implicit GEMM for few input channels (C = 8)",
          "direct", ({},), round0=True),
    Entry("ctail-depthwise", "Depthwise convolution (a plane per block, the padded patch in shared memory) with "
          "the elementwise prefix fused, then the tail kernels.", M, "memory-bound convolution; the tail "
          "adds one read of its output", "depthwise", ({},), round0=True),
    Entry("ctail-tail-blocks", "Re-size the tail kernels' blocks: smaller blocks give more resident blocks and a "
          "better balance where segments or outputs are few, larger ones fewer, longer-lived threads where "
          "they are many.", PAR, "0-10% of the tail's time", "igemm", _TAIL_BLOCKS),
    Entry("ctail-tail-blocks-direct", "Re-size the tail kernels' blocks after the direct convolution.", PAR,
          "0-10% of the tail's time", "direct", _TAIL_BLOCKS, after=frozenset({"direct"})),
    Entry("ctail-tail-threads", "More threads instead of more loads a thread in the tail (TAIL_ILP 1, larger "
          "blocks): where a stage has few outputs (a logsumexp or min over the channels of a small image, few "
          "norm groups) more warps hide the latency that one thread's batch of loads would.", A,
          "0-15% of the tail's time when it is latency-bound", "igemm",
          ({"TAIL_ILP": 1, "TAIL_BLOCK": 1024}, {"TAIL_ILP": 1, "TAIL_BLOCK": 512})),
    Entry("ctail-conv-tile", "Re-shape the implicit GEMM tile of the convolution: a taller block re-uses each "
          "weight tile over more positions, a narrower one or two blocks an SM gives more blocks.", PAR,
          "0-15% of the convolution", "igemm", ({"BM": 256}, {"BM": 64, "MIN_BLOCKS": 2}),
          after=frozenset({"igemm"})),
    Entry("ctail-conv-depth", "Deepen the convolution's cp.async pipeline (STAGES) or lengthen its k-step so that "
          "the gathers of later tiles overlap more FFMAs.", A, "0-10% when the conv waits on loads", "igemm",
          ({"STAGES": 3}, {"BK": 32, "STAGES": 3}), after=frozenset({"igemm"})),
    Entry("ctail-direct-cols", "Give the direct convolution's threads more columns (PTX) so that every weight "
          "broadcast from shared memory feeds more FFMAs.", C, "5-20% of the convolution", "direct",
          ({"PTX": 2}, {"PTX": 4, "TW": 16}), after=frozenset({"direct"})),
    Entry("ctail-exact-stats", "Per-element statistics in the norm kernels (TAIL_ILP 1: every value its own "
          "Chan merge instead of a two-pass register batch): the most accurate order when a group's values sit "
          "far from zero; everything stays fp32 with accurate expf/logf/tanhf (no fast math).", P,
          "accuracy margin against the 1e-4 check; 0-5% slower", "igemm", ({"TAIL_ILP": 1},),
          after=frozenset({"igemm"})),
    Entry("ctail-tail-flat", "One output a thread in the tail kernels and small blocks (TAIL_ILP 1): no loop "
          "over a thread's outputs, so every window and epilogue is straight-line code with one bounds check.",
          CF, "0-5%", "igemm", ({"TAIL_ILP": 1, "TAIL_BLOCK": 128}, {"TAIL_ILP": 1, "TAIL_BLOCK": 256}),
          after=frozenset({"igemm"})),
)

CONV_TAIL = Family(
    name=NAME, leads=frozenset({Lead.conv}), recognise=_recognise,
    constraints=("one conv2d", "of a forward input", "a reduction, pool or norm after it"),
    variants={v: partial(build.conv_tail_spec, v) for v in build.VARIANT_NAMES},
    ideas=IDEAS,
    spec_names={v: build.SPEC_PREFIX + v for v in build.VARIANT_NAMES},
)
