"""Playbook family ``matmul``: one plain 2-D ``A @ B`` of the two forward inputs (no transposes, batches or
epilogues), fp32: the register-blocked FFMA GEMM (predicated edges only where the shape needs them), the 3xTF32
tensor-core GEMM (padded for shapes it does not tile), and on Hopper the wgmma core. Its kernels are the gemm
family's (a plain A @ B is a GEMM of its layout: :func:`.gemm.build.as_gemm`; :mod:`.gemm.build`,
:mod:`.gemm.build_tf32`, :mod:`.gemm.wgmma`) under its own names, defaults, ideas and variant order."""

from __future__ import annotations

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.gemm.build import as_gemm, gemm_tiled
from kerngen.agent.playbook.gemm.build_tf32 import (PADDED_SPEC_NAME, PADDED_VARIANT, SPEC_NAME, TF32_IDEAS, sgemm_tf32x3,
                                                    sgemm_tf32x3_padded)
from kerngen.agent.playbook.gemm.wgmma import MATMUL_IDEAS, VARIANT as WGMMA, gemm_wgmma
from kerngen.agent.playbook.entry import A, C, Entry, M, PAR
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
          "memory, double buffering with cp.async, grouped block order for L2 reuse; bounds checks only where "
          "the tiles do not divide the shape.", C,
          "~90-97% of cuBLAS fp32", "tiled", ({}, {"BM": 128, "BN": 128}), round0=True),
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

def _tiled(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """The gemm family's FFMA GEMM with the defaults of the former sgemm.cu.j2's measured kernel: 64 x 128 tiles, A
    transposed into shared memory through registers, B by cp.async (where its 16-byte copies find aligned rows)."""
    g = as_gemm(m)
    _, _, n, k = g.facts.shape
    return gemm_tiled(g, {"BM": 64, "CP_ASYNC": int(n % 4 == 0 and k % 4 == 0), **defaults}, "playbook-matmul-sgemm")


def _wgmma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return gemm_wgmma(as_gemm(m), defaults, f"playbook-matmul-{WGMMA}")


MATMUL = Family(name="matmul", leads=frozenset({Lead.contraction}), recognise=_recognise,
                constraints=("one matmul", "nothing else", "of the two forward inputs", "2-D", "no transposes"),
                variants={"tiled": _tiled, "tf32x3": sgemm_tf32x3, PADDED_VARIANT: sgemm_tf32x3_padded,
                          WGMMA: _wgmma},  # wgmma: Hopper only
                ideas=IDEAS,
                spec_names={"tiled": "playbook-matmul-sgemm", "tf32x3": SPEC_NAME, PADDED_VARIANT: PADDED_SPEC_NAME})
