"""Playbook families ``conv2d`` (one plain 2-D convolution of one fp32 NCHW input: groups 1, no dilation,
numeric zero padding, nothing after it; direct, implicit-GEMM and 3xTF32 kernels) and ``conv_relu_maxpool``
(conv2d, one relu and one square, unpadded, floor-mode max-pool, fused in one kernel, or the conv + relu on the
tensor cores and then the pool). The conv2d family's kernels are conv_epi's (:mod:`.conv.build_epi`,
:mod:`.conv.build_tf32`, :mod:`.conv.build_wgmma`: a plain conv2d is a conv_epi problem with groups 1, dilation 1
and no epilogue) under its own names, ideas and variant order; conv_relu_maxpool's: :mod:`.conv.build_conv_pool`."""

from __future__ import annotations

from functools import partial
from typing import Callable

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.conv.build_epi import as_conv_epi, conv_epi_direct, conv_epi_igemm
from kerngen.agent.playbook.conv.build_tf32 import CONV2D_IDEAS, CONV2D_SPEC_NAME, conv_epi_tf32x3
from kerngen.agent.playbook.conv import build_conv_pool as tc_pool
from kerngen.agent.playbook.conv import build_s2d as s2d
from kerngen.agent.playbook.conv import build_wgmma as wgmma
from kerngen.agent.playbook.entry import A, C, CF, Entry, M, PAR
from kerngen.agent.playbook.conv.epi import ConvFacts, conv_facts, conv_lead, lead_shape, relu_pool
from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["CONV2D", "CONV_RELU_MAXPOOL"]


def _plain(g: Graph, f: ConvFacts, padding_str: bool) -> bool:
    return f.G == 1 and (f.DH, f.DW) == (1, 1) and f.dims == 2 and not padding_str and len(g.inputs) == 1


def _conv(g: Graph, fused: bool) -> tuple[ConvFacts, tuple[int, ...]] | None:
    n = conv_lead(g, ("conv2d",))
    if n is None or g.live()[0] is not n:
        return None
    f = conv_facts(g, n, "conv2d")
    if not _plain(g, f, isinstance(n["padding"], str)):
        return None  # conv_epi's (groups, dilation, 'same' padding, several inputs)
    x = g.tensor(f.x)
    if g.dtypes in ({"bfloat16"}, {"float16"}):
        return None  # conv16's (asked next: its constraints are conv_epi's and one more)
    if len(x.shape) != 4 or g.dtypes != {"float32"}:
        raise NotCovered("the playbook's conv2d is NCHW fp32 only")
    if f.bias is not None and not g.is_param(f.bias):
        return None
    return f, lead_shape(x, f)


def _conv2d(g: Graph) -> FamilyMatch | None:
    if len(g.live()) != 1:
        return None
    hit = _conv(g, False)
    if hit is None:
        return None
    f, shape = hit
    if g.out.shape != shape:
        raise NotCovered("conv2d output shape does not match the module's geometry")
    return FamilyMatch.of(g, f)


def _relu_pool(g: Graph) -> FamilyMatch | None:
    if not relu_pool(g):
        return None
    hit = _conv(g, True)
    if hit is None:
        return None
    f, (n, oc, oh, ow) = hit
    pool = next(m for m in g.live() if m.op == "max_pool2d")
    k, s, p, d = (tuple(pool[a]) if pool[a] else () for a in ("kernel_size", "stride", "padding", "dilation"))
    s = s or k
    if len(set(k)) != 1 or len(set(s)) != 1 or set(p) - {0} or set(d) - {1} or pool["ceil_mode"]:
        raise NotCovered("the playbook fuses square, unpadded, floor-mode max-pools only")
    pk, ps = k[0], s[0]
    if g.out.shape != (n, oc, (oh - pk) // ps + 1, (ow - pk) // ps + 1):
        raise NotCovered("conv+relu+maxpool output shape does not match the modules' geometry")
    return FamilyMatch.of(g, f.model_copy(update=dict(PK=pk, PS=ps)))


_CONV2D_IDEAS = (
    Entry("conv-direct", "Direct convolution: a TH x TW output tile for OCB output channels per block, the "
          "zero-padded input patch in shared memory split by stride phase (conflict-free reads for any "
          "stride), weights in shared memory as [c][kh][kw][oc] read as float4 broadcasts, OCT x PTY "
          "outputs per thread in registers.", C,
          "FFMA-bound inner loop with ~8 shared loads per 64 FFMAs", "direct",
          ({}, {"TW": 16, "TH": 16, "PTY": 8, "OCB": 32, "OCT": 8}), round0=True),
    Entry("conv-igemm", "Implicit GEMM: treat the conv as C[M=N*OH*OW][OC] = A[M][K=C*KH*KW] x B[K][OC], gather "
          "the im2col tile of A straight from x into shared memory with zero-filling 4-byte cp.async (no "
          "branches for the padding), pack the weights once per call to [K][OC], stream them with 16-byte "
          "cp.async through a multi-stage pipeline, and run an SGEMM-style TM x TN FFMA register tile.", C,
          "FFMA-bound like a tuned SGEMM: ~50-70% of the fp32 peak, 1.5-2x a direct conv at small C",
          "igemm", ({}, {"BM": 64, "TN": 6, "STAGES": 2}, {"BK": 32, "STAGES": 2, "MIN_BLOCKS": 2}), round0=True),
    Entry("igemm-depth", "Re-balance the cp.async pipeline: its depth (STAGES) against shared memory and blocks "
          "per SM, and a longer k-step (BK 32) so that the gathers of later tiles overlap more FFMAs.", A,
          "0-10% when the parent waits on loads or is short of resident blocks", "igemm",
          ({"STAGES": 3}, {"BK": 32, "STAGES": 3}), after=frozenset({"igemm"})),
    Entry("igemm-tile", "Re-shape the tile: a taller block (BM 256) re-uses each weight tile over more positions; "
          "a wider register tile (TN 12) raises FFMAs per shared load.", PAR, "0-15%", "igemm",
          ({"BM": 256, "TM": 8, "TN": 12}, {"TM": 4, "TN": 12, "MIN_BLOCKS": 2}),
          after=frozenset({"igemm"})),
    Entry("conv-more-oc", "Register-block over more output channels per block (OCB up to all of them): the "
          "staged input patch is reused by more channels and fewer blocks re-stage it.", C,
          "fewer shared-memory fills per FLOP; 5-15%", "direct",
          ({"TW": 28, "TH": 8, "PTY": 4, "OCB": 96, "OCT": 16}, {"TW": 32, "TH": 8, "PTY": 4, "OCB": 96, "OCT": 16}),
          after=frozenset({"direct"})),
    Entry("conv-tile-fit", "Fit the output tile to the output size (e.g. 14 or 28 columns for 55) so that no "
          "lanes idle on the right edge.", CF, "up to ~15% fewer wasted lanes", "direct",
          ({"TW": 14}, {"TW": 28, "TH": 4}), after=frozenset({"direct"})),
    Entry("conv-all-channels", "Stage all input channels at once (one barrier pair per tile instead of one per "
          "channel).", A, "fewer barriers; costs shared memory and occupancy", "direct",
          ({"CCH": 3},), after=frozenset({"direct"})),
)
_CRP_IDEAS = (
    Entry("crp-fused", "Fuse conv + relu + max-pool: each thread keeps the PK x PK conv outputs under one "
          "pooled output for OCT channels in registers and writes max(relu) once; input rows reused across "
          "taps from registers; input patch and weights in shared memory.", M,
          "the conv output never reaches DRAM (4x fewer bytes written), one launch instead of three",
          "fused", ({}, {"OCB": 32, "OCT": 8}), round0=True),
    Entry("crp-shape", "Re-shape the block: fewer pooled positions and more channels per thread (or the "
          "reverse) to balance register reuse against the number of blocks.", PAR, "5-15%",
          "fused", ({"PTW": 16, "PTH": 4, "OCB": 64, "OCT": 8}, {"PTW": 8, "PTH": 8, "OCB": 32, "OCT": 8},
                    {"OCT": 4}), after=frozenset({"fused"})),
)

def _on_conv_epi(build: Callable[..., KernelSpec], name: str, m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """conv_epi's ``build`` of the plain conv2d ``m``, its spec named ``name``."""
    return build(as_conv_epi(m), defaults, name)


def _igemm(m: FamilyMatch, defaults: dict[str, int], name: str) -> KernelSpec:
    """conv_epi's implicit GEMM at this family's former default tile where the channels split by it (96 first, the
    tuned optimum at the suite's shape, then 64 before 128), so that those convs compile as they did."""
    bn = next((v for v in (96, 64, 128, 48) if m.facts.OC % v == 0), 0)
    return conv_epi_igemm(m, {**({"BN": bn, "TN": 12 if bn % 12 == 0 else 8} if bn else {}), **defaults}, name)


_CONV2D_NAMES = {"direct": "playbook-conv2d-direct", "igemm": "playbook-conv2d-igemm", "tf32x3": CONV2D_SPEC_NAME,
                 wgmma.VARIANT: wgmma.CONV2D_SPEC_NAME, s2d.VARIANT: s2d.S2D_SPEC_NAMES["conv2d"]}
_CONV2D_BUILDERS = {"direct": partial(conv_epi_direct, plain=True), "igemm": _igemm, "tf32x3": conv_epi_tf32x3,
                    wgmma.VARIANT: wgmma.conv_epi_wgmma, s2d.VARIANT: s2d.conv_epi_s2d}  # wgmma*: Hopper only
CONV2D = Family(name="conv2d", leads=frozenset({Lead.conv}), recognise=_conv2d,
                constraints=("one conv2d", "nothing else", "of the one forward input", "groups 1", "no dilation",
                             "numeric zero padding"),
                variants={v: partial(_on_conv_epi, b, _CONV2D_NAMES[v]) for v, b in _CONV2D_BUILDERS.items()},
                # space-to-depth first in round 0 (the suite's: 0.38 ms against the gathered wgmma's 0.66, H200)
                ideas=s2d.CONV2D_S2D_IDEAS + wgmma.CONV2D_IDEAS + _CONV2D_IDEAS + CONV2D_IDEAS,
                spec_names=_CONV2D_NAMES)
CONV_RELU_MAXPOOL = Family(name="conv_relu_maxpool", leads=frozenset({Lead.conv}), recognise=_relu_pool,
                           constraints=("one conv2d", "one relu", "one max_pool2d", "nothing else",
                                        "of the one forward input", "groups 1", "no dilation"),
                           # fused first (the default spec); the tensor-core ones: conv_epi's kernel, then pool's
                           variants={"fused": tc_pool.conv_relu_pool, tc_pool.WGMMA_POOL: tc_pool.conv_pool_wgmma,
                                     tc_pool.TF32X3_POOL: tc_pool.conv_pool_tf32x3},
                           ideas=tc_pool.IDEAS[:1] + _CRP_IDEAS + tc_pool.IDEAS[1:],  # wgmma first in round 0
                           spec_names={"fused": "playbook-conv-relu-maxpool"})
