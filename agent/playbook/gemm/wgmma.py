"""The Hopper GEMM core (:mod:`.gemm.build_wgmma`) offered by the families: each hook here only turns a family's
match facts into a :class:`GemmProblem`; the catalogue entries say what the variant does. Every variant is named
``wgmma`` (spec names ``playbook-<family>-wgmma``), is ``arch_specific`` (sm_90a), and is offered only on Hopper
(:mod:`.coverage` drops arch-specific variants elsewhere), its ideas first in round 0; the mma.sync and FFMA
variants stay as they were, for other GPUs and as the fallback.

- :func:`gemm_wgmma`: the ``gemm`` family (fp32 nn.Linear + epilogue, batched / transposed contractions, triu /
  tril) and the built-in ``matmul`` family (a plain 2-D fp32 A @ B, as a gemm match): 3xTF32;
- :func:`gemm16_wgmma`: the ``gemm16`` family (:mod:`.gemm.gemm16`: the same problems in bf16 or fp16): bf16 / f16
  wgmma with fp32 accumulation.
"""

from __future__ import annotations

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.entry import A, C, M, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.gemm.build import GemmFacts, gemm_facts
from kerngen.agent.playbook.gemm.build_wgmma import VARIANT, GemmProblem, Operand, gemm_wgmma_spec

__all__ = ["GEMM16_IDEAS", "GEMM_IDEAS", "MATMUL_IDEAS", "VARIANT", "gemm16_wgmma", "gemm_problem", "gemm_wgmma"]


def gemm_problem(f: GemmFacts, dtype: str, tf32: bool = False) -> GemmProblem:
    """The GEMM of the gemm family's facts (:mod:`.gemm.build`'s layout expressions) in ``dtype`` (``tf32``: checked
    at --precision tf32)."""
    a = Operand(f.a, mn_major=f.trans_a, batched=f.SA != "0")  # A^T is stored [K][M]
    b = Operand(f.b, mn_major=not f.trans_b, batched=f.SB != "0")  # B is stored [K][N] unless transposed
    checks = ((f"({f.N}) > 1",) if not f.trans_a and not f.mask else ()) + f.checks  # N == 1: the gemv kernel's
    return GemmProblem(a=a, b=b, M=f.M, N=f.N, K=f.K, batch=f.BATCH, dtype=dtype, shape=f.shape, bias=f.bias,
                       ep=f.ep, mask=f.mask, diag=f.diag, what=f.what, checks=checks, tf32=tf32)


def gemm_wgmma(m: FamilyMatch, defaults: dict[str, int], name: str = f"playbook-gemm-{VARIANT}") -> KernelSpec:
    return gemm_wgmma_spec(gemm_problem(gemm_facts(m), "float32", m.tf32), defaults, name)


def gemm16_wgmma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = gemm_facts(m)
    return gemm_wgmma_spec(gemm_problem(f, f.dtype), defaults, f"playbook-gemm16-{VARIANT}")


_AFTER = frozenset({VARIANT})
_CORE = ("on Hopper's wgmma: a persistent grid of one block per SM walks the output tiles in grouped order; a "
         "producer warpgroup issues TMA copies of the k tiles of A and B into a 3-4 deep ring of 128-byte-swizzled "
         "shared memory (mbarriers), two consumer warpgroups (registers moved to them with setmaxnreg) multiply "
         "straight from shared memory with wgmma (one commit group per k tile, the slot freed when its group is "
         "done), and the epilogue runs on the fp32 accumulators before paired stores")
_TF32 = (" fp32 stays fp32-accurate: a pre-pass splits A and B into big + small tf32 planes (K-major), and every k8 "
         "step multiplies small*big, big*small, then big*big; each k tile's products land in fresh registers that "
         "are added into the fp32 sum (FLUSH), so the tensor core's accumulation rounding stays local.")


_PINGPONG = ("Run the GEMM core with ping-pong consumers (PINGPONG 1): each of the two consumer warpgroups owns a whole "
             "(64 * WGM) x BN tile and they take the persistent schedule's tiles in turns, named barriers ordering "
             "their main loops, so one's epilogue (bias, activation, the stores) runs while the other's wgmma keep "
             "the tensor cores busy; the producer feeds both in tile order.")
_CLUSTER = ("Run the GEMM core in thread-block clusters of 2 (CLUSTER 2, along M): the two blocks of a cluster take "
            "vertically adjacent tiles of one column and share B's k tiles, each loading half of B's TMA boxes and "
            "multicasting them into both blocks' rings (a slot is freed once the consumers of both blocks released "
            "it), which halves B's L2 traffic.")
_STAGED = ("Stage the epilogue's outputs through shared memory (EPI_SMEM 1): each consumer warp computes the epilogue "
           "of its 16 rows 64 columns at a time with no branch per value (the bias read once per column pair), "
           "writes the pairs into its own padded staging tile, and stores whole 16-byte row pieces, so a warp writes "
           "full 128-byte lines instead of 16 bytes into each of 8 rows.")
_CLUSTER_EFFECT = ("1.5-2.1x slower on every case measured (H200, 2026-11-28: a slot is freed only when both blocks' "
                   "consumers have, so the pair runs in lockstep)")
_PINGPONG_EFFECT = ("0-8%: the bf16 Linear + bias + GELU 0.6069 -> 0.5562 ms; large plain GEMMs 11% slower (64-row "
                    "tiles read more per FLOP; H200, 2026-11-28)")
_STAGED_EFFECT = ("bf16 8192 x 8192 x 2048 on an H200 (2026-11-29): the GEMM alone 0.4311 -> 0.3627 ms, Linear + bias "
                  "+ GELU 0.6037 -> 0.4373 ms (1.10-1.17x torch.compile at full clocks, 1.03-1.05x at the power cap)")


def _ideas(prefix: str, first: str, effect: str, tf32: bool) -> tuple[Entry, ...]:
    """The round-0 entry and the refinements of the wgmma variant of one family."""
    tile_branches: tuple[dict, ...] = (({"BN": 256, "FLUSH": 0, "STAGES": 2}, {"WGM": 2, "FLUSH": 0, "STAGES": 2},
                                        {"BN": 64, "WGM": 2})
                                       if tf32 else ({"BN": 128, "WGM": 2}, {"BN": 128}, {"CWG": 1, "BN": 128, "WGM": 2}))
    stage_branches: tuple[dict, ...] = (({"STAGES": 4, "BN": 64}, {"BK": 64, "STAGES": 2, "BN": 64})
                                        if tf32 else ({"STAGES": 3}, {"STAGES": 5, "BN": 192}, {"BK": 128, "STAGES": 2}))
    out = [
        Entry(f"{prefix}-wgmma", first + _CORE + "." + (_TF32 if tf32 else ""), C, effect, VARIANT,
              ({}, {"SPLIT_K": 8}, {"GROUP_M": 16}), round0=True),
        Entry(f"{prefix}-wgmma-tile", "Re-shape the wgmma tile: 128 x 256 or 256 x 128 (more reuse of each loaded "
              "byte, fewer L2 reads per FLOP), or a smaller one for problems with too few tiles to fill the SMs.",
              PAR, "0-20%", VARIANT, tile_branches, after=_AFTER),
        Entry(f"{prefix}-wgmma-pipeline", "Retune the TMA ring: more stages (more k tiles in flight to hide L2/DRAM "
              "latency) or a deeper k tile (fewer barrier round trips per FLOP).", A, "0-10%", VARIANT,
              stage_branches, after=_AFTER),
        Entry(f"{prefix}-wgmma-order", "Tune the persistent tile order: the group height (GROUP_M) that keeps the "
              "tiles in flight sharing A's rows and B's columns in L2, and the grid (114 for an H100 PCIe's SMs).",
              PAR, "0-5%", VARIANT, ({"GROUP_M": 4}, {"GROUP_M": 1}, {"CTAS": 114}), after=_AFTER),
        Entry(f"{prefix}-wgmma-splitk", "Split K across blocks where the output has too few tiles to fill the GPU: "
              "SPLIT_K k slices per tile write fp32 partial tiles that a second kernel adds in slice order (the same "
              "sum every run) before the epilogue.", PAR, "up to SPLIT_K x where most SMs would idle", VARIANT,
              ({"SPLIT_K": 4}, {"SPLIT_K": 16}), after=_AFTER),
    ]
    # 16-bit: the staged stores in round 0, its measured best first. Not for 3xTF32: its default ring leaves no room
    # for the staging tiles, and at 2 stages the fp32 matmul 4096^3 took 1.4296 ms against the default's 1.1831 (H200,
    # 2026-11-29; 1.4349 at 2 stages without them). Clusters only as a refinement: they lost wherever measured.
    if not tf32:
        out.append(Entry(f"{prefix}-wgmma-staged", _STAGED, M, _STAGED_EFFECT, VARIANT,
                         ({"EPI_SMEM": 1, "GROUP_M": 16}, {"EPI_SMEM": 1}, {"EPI_SMEM": 1, "PINGPONG": 1, "GROUP_M": 16}),
                         round0=True))
    out.append(Entry(f"{prefix}-wgmma-pingpong", _PINGPONG, C, _PINGPONG_EFFECT, VARIANT,
                     ({"PINGPONG": 1}, {"PINGPONG": 1, "WGM": 2, "BN": 128}, {"PINGPONG": 1, "STAGES": 5}),
                     round0=not tf32, after=frozenset() if not tf32 else _AFTER))
    out.append(Entry(f"{prefix}-wgmma-cluster", _CLUSTER, M, _CLUSTER_EFFECT, VARIANT,
                     ({"CLUSTER": 2}, {"CLUSTER": 2, "PINGPONG": 1}, {"CLUSTER": 2, "GROUP_M": 16}), after=_AFTER))
    if tf32:
        out.append(Entry(f"{prefix}-wgmma-accumulate", "Accumulate the 3xTF32 products straight in the wgmma "
                         "accumulator (no per-k-tile partial sums): half the registers, so 128 x 256 tiles, and no "
                         "wait per k tile; kept only if the fp32 check still passes (the tensor core's "
                         "accumulation rounding decides).", P, "10-30%, or rejected by the check", VARIANT,
                         ({"FLUSH": 0}, {"FLUSH": 0, "BN": 256, "STAGES": 2}), after=_AFTER))
    return tuple(out)


MATMUL_IDEAS = _ideas("mm", "Run the fp32 GEMM at fp32 accuracy (3xTF32) ",
                      "target >= 1.6x cuBLAS fp32 at 4096^3 on an H100 (the mma.sync 3xTF32 kernel: 1.15x); not yet "
                      "measured on a GPU", tf32=True)
GEMM_IDEAS = _ideas("gemm", "Run the GEMM with its fused epilogue at fp32 accuracy (3xTF32) ",
                    "as the matmul's (target >= 1.6x cuBLAS fp32); the epilogue costs no extra pass", tf32=True)
GEMM16_IDEAS = _ideas("gemm16", "Run the bf16/fp16 GEMM with its fused epilogue (fp32 accumulation, one rounding "
                      "at the store) ", "target >= 0.9x cuBLAS at 4096^3 and 8192^3 and >= 1.1x torch.compile for "
                      "Linear + bias + GELU on an H100; not yet measured on a GPU", tf32=False)
