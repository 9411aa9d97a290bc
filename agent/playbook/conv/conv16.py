"""Playbook family ``conv16``: the convolutions of ``conv_epi`` (conv1d / conv2d, groups, dilation, zero padding, an
elementwise epilogue: bias, BN, activations, residual inputs, scales) when every tensor is bf16, or every one fp16.
Its variants are the Hopper GEMM core's convolutions in bf16/fp16 (wgmma, fp32 accumulation, the epilogue in fp32
before one rounding at the store): the implicit GEMM (:func:`.conv.build_wgmma.conv16_wgmma`) and, for groups 1
without dilation, the space-to-depth one (:func:`.conv.build_s2d.conv16_s2d`, first in round 0: the suite's conv2d
in bf16 took 0.17 ms against 0.40, H200, 2026-11-29). So it is offered on sm_90 only; elsewhere nothing serves
16-bit convolutions, and the offer says why.

The facts are conv_epi's (:func:`.conv.epi.read_conv_epi`) plus ``dtype``. Asked after ``conv2d`` and
``conv_relu_maxpool`` (which leave 16-bit problems) and before ``conv_epi`` (fp32 only); an fp32 problem is not its
own (None).
"""

from __future__ import annotations

from kerngen.agent.playbook.conv import build_s2d as s2d
from kerngen.agent.playbook.conv.build_wgmma import CONV16_IDEAS, CONV16_SPEC_NAME, VARIANT, conv16_wgmma
from kerngen.agent.playbook.conv.epi import CONV_EPI, read_conv_epi
from kerngen.agent.playbook.family import Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph

__all__ = ["CONV16", "DTYPES"]

DTYPES = ("bfloat16", "float16")
NAME = "conv16"


def _recognise(g: Graph) -> FamilyMatch | None:
    if len(g.dtypes) != 1 or next(iter(g.dtypes)) not in DTYPES:
        return None
    dtype = next(iter(g.dtypes))
    m = read_conv_epi(g, dtype, NAME)
    if m is None:
        return None
    m.facts = m.facts.model_copy(update={"dtype": dtype})
    m.message = f"{NAME} ({dtype}): {m.message}"
    return m


CONV16 = Family(name=NAME, leads=CONV_EPI.leads, recognise=_recognise,
                constraints=(*CONV_EPI.constraints, "every tensor bf16, or every one fp16"),
                variants={VARIANT: conv16_wgmma, s2d.VARIANT: s2d.conv16_s2d}, ideas=s2d.CONV16_S2D_IDEAS + CONV16_IDEAS,
                spec_names={VARIANT: CONV16_SPEC_NAME, s2d.VARIANT: s2d.S2D_SPEC_NAMES["conv16"]})
