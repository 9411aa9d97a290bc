"""Playbook family ``matmul``: one plain 2-D ``A @ B`` of the two forward inputs (no transposes, batches or
epilogues), fp32: the register-blocked SGEMM, its bounds-checked fallback, and the 3xTF32 tensor-core GEMM
(padded for shapes it does not tile), and on Hopper the wgmma core (:mod:`.gemm.wgmma`). Builders: :mod:`.conv.build_conv2d`, :mod:`.gemm.build_matmul_tf32`."""

from __future__ import annotations

from kerngen.agent.playbook.gemm.build_matmul_tf32 import (PADDED_SPEC_NAME, PADDED_VARIANT, SPEC_NAME, TF32_IDEAS, sgemm_tf32x3,
                                               sgemm_tf32x3_padded)
from kerngen.agent.playbook.gemm.build_matmul import sgemm_simple, sgemm_tiled
from kerngen.agent.playbook.gemm.wgmma import MATMUL_IDEAS, VARIANT as WGMMA, matmul_wgmma
from kerngen.agent.playbook.entry import A, C, CF, Entry, M, PAR
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["MATMUL"]


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    n = live[-1] if len(live) == 1 else None
    if n is None or n.op not in ("matmul", "mm") or len(g.inputs) != 2 or any(len(t.shape) != 2 for t in g.inputs) or \
            [n.args.get("self"), n.args.get("other", n.args.get("mat2"))] != [t.name for t in g.inputs]:
        return None  # not a plain 2-D A @ B of the two inputs: the gemm family's, or nobody's
    a, b = g.inputs
    if a.shape[1] != b.shape[0] or g.out.shape != (a.shape[0], b.shape[1]):
        raise NotCovered("matmul operands do not match A (M, K) @ B (K, N)")
    if b.shape[1] == 1:
        return None  # a matrix-vector product: the gemm family's gemv
    if g.dtypes != {"float32"}:
        return None  # bf16 / fp16: the gemm16 family's; other dtypes: nobody's
    return FamilyMatch.of(g, Facts())


IDEAS = (
    Entry("mm-tiled", "Register-blocked SGEMM with true fp32 FFMA accumulation: a BM x BN tile per block, 8x8 "
          "outputs per thread split 4+4 for conflict-free float4 shared loads, A transposed in shared "
          "memory, double buffering with cp.async, grouped block order for L2 reuse.", C,
          "~90-97% of cuBLAS fp32", "tiled", ({}, {"BM": 128, "BN": 128}), round0=True),
    Entry("mm-simple", "Safe tiled GEMM with bounds checks for shapes the register-blocked kernel rejects.", CF,
          "correct for any shape; ~4x slower than the tiled kernel", "simple", ({},), round0=True),
    Entry("mm-pipeline", "Deeper K step (BK 16) and cp.async for B so that global loads of the next tile overlap "
          "the FFMAs of this one.", A, "5-30% over a register-prefetch double buffer",
          "tiled", ({"BK": 16, "CP_ASYNC": 1}, {"BK": 8, "CP_ASYNC": 1}), after=frozenset({"tiled"})),
    Entry("mm-l2", "Tune the grouped launch order (GROUP_M) so that the blocks in flight share A and B tiles "
          "in L2.", M, "0-5%", "tiled", ({"GROUP_M": 4}, {"GROUP_M": 16}), after=frozenset({"tiled"})),
    Entry("mm-tile-shape", "Change the block tile (64x128, 128x128): a larger tile reuses more, a smaller one "
          "gives more blocks per SM.", PAR, "0-10%", "tiled",
          ({"BM": 128, "BN": 128}, {"BM": 64, "BN": 64}), after=frozenset({"tiled"})),
) + TF32_IDEAS
IDEAS = MATMUL_IDEAS + IDEAS  # the Hopper core first in round 0

MATMUL = Family(name="matmul", leads=frozenset({Lead.contraction}), recognise=_recognise,
                constraints=("one matmul", "nothing else", "of the two forward inputs", "2-D", "no transposes"),
                variants={"tiled": sgemm_tiled, "simple": sgemm_simple, "tf32x3": sgemm_tf32x3,
                          PADDED_VARIANT: sgemm_tf32x3_padded, WGMMA: matmul_wgmma},  # wgmma: Hopper only
                ideas=IDEAS,
                spec_names={"tiled": "playbook-matmul-sgemm", "simple": "playbook-matmul-simple", "tf32x3": SPEC_NAME,
                            PADDED_VARIANT: PADDED_SPEC_NAME})
