"""Playbook family ``gemm_rows``: a GEMM (``nn.Linear``, ``F.linear``, ``x @ W`` / ``x @ W.T`` of a forward input
and a parameter) whose output then goes through ops local to each of its rows: reductions over the columns
(sum, mean, max, min, logsumexp), softmax / log_softmax, GroupNorm / LayerNorm, an InstanceNorm of a row seen as
one channel, eval-mode BatchNorm1d, max / avg pool 1-D over the columns, elementwise ops before, between and
after them (per-column parameters, one-element parameters, forward inputs read by row: a residual). KernelBench
level 2's Gemm_*_Sum / _LogSumExp / _Softmax / _GroupNorm / _MaxPool files.

:mod:`.gemm.row_trace` reads the forward as the GEMM plus a :class:`~.row_program.RowProgram`; a GEMM followed by
elementwise ops only is the ``gemm`` family's (None here, as is anything that is not one GEMM of a forward
input). A row op the program does not cover raises :class:`NotCovered` saying which.
"""

from __future__ import annotations

from kerngen.agent.playbook.gemm.build_rows import (gemm_rows_staged, gemm_rows_streamed, gemm_rows_tf32x3_staged,
                                                   gemm_rows_tf32x3_streamed, gemm_rows_wgmma_staged,
                                                   gemm_rows_wgmma_streamed)
from kerngen.agent.playbook.entry import A, C, CF, M, P, PAR, Entry
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.gemm.row_trace import RowTail, trace_rows

__all__ = ["GEMM_ROWS", "GemmRowsFacts"]


class GemmRowsFacts(Facts):
    tail: RowTail
    steps: tuple[str, ...]
    formula: str


def _recognise(g: Graph) -> FamilyMatch | None:
    if not any(n.op in ("linear", "matmul", "mm") for n in g.live()):
        return None
    try:
        tail = trace_rows(g)
    except NotCovered as exc:
        raise NotCovered(f"gemm followed by row ops: {exc}") from None
    if tail is None:
        return None
    if g.dtypes != {"float32"}:
        raise NotCovered(f"the playbook's gemm_rows family is fp32 only; got {', '.join(sorted(g.dtypes))}")
    prog = tail.program
    facts = GemmRowsFacts(tail=tail, steps=prog.steps(), formula=prog.formula())
    return FamilyMatch.of(g, facts, f"gemm {tail.lead.what}, then per row: {prog.formula()}")


# Hopper only (coverage offers a *wgmma* variant on sm_90 alone): first in round 0 there
_WGMMA = (
    Entry("gemm-rows-wgmma", "The GEMM on Hopper's wgmma core at fp32 accuracy (3xTF32: a pre-pass splits x and the "
          "weight into big + small tf32 planes; a persistent grid, a producer warpgroup issuing TMA copies into a "
          "swizzled shared-memory ring, two consumer warpgroups on wgmma, FLUSH partial sums per k tile), its "
          "elementwise head fused into the store into the scratch rows; then the row kernel reads each row once "
          "more per pass (streamed).", P, "the GEMM as the gemm family's wgmma (target >= 1.6x cuBLAS fp32) "
          "instead of ~1.15x for mma.sync; measured on KernelBench level-2 99: 1.96x eager against mma.sync's 1.14x, "
          "one H200, 2026-11-28", "wgmma_streamed", ({}, {"GROUP_M": 16}),
          round0=True),
    Entry("gemm-rows-wgmma-staged", "The wgmma 3xTF32 GEMM, then the row kernel with every vector read more than "
          "once held in shared memory.", P, "as the streamed one, less L2 traffic in multi-pass row programs",
          "wgmma_staged", ({},), round0=True),
)


def _refinements_wgmma(variant: str) -> tuple[Entry, ...]:
    after, tag = frozenset({variant}), f" ({variant})"
    rows = [e for e in _refinements(variant) if e.id.endswith(("-block", "-kahan"))]
    return (
        Entry(f"gemm-rows-{variant}-tile", "Re-shape the wgmma GEMM's tile: 128 x 64 for problems of few tiles, "
              "two m64 blocks a consumer, or one consumer." + tag, PAR, "0-15% of the GEMM", variant,
              ({"BN": 64}, {"BN": 64, "WGM": 2, "STAGES": 2}, {"CWG": 1, "BN": 128}), after=after),
        Entry(f"gemm-rows-{variant}-splitk", "Split K across blocks where the GEMM's output has too few tiles to "
              "fill the SMs (fp32 partials added in slice order by a second kernel)." + tag, PAR,
              "up to SPLIT_K x on the GEMM where most SMs idle", variant, ({"SPLIT_K": 4}, {"SPLIT_K": 16}),
              after=after),
        *rows,
    )


_ROUND0 = (
    Entry("gemm-rows-staged", "Two launches: the register-tiled fp32 GEMM (FFMA, no TF32) with the elementwise ops "
          "right after it fused into its store writes the M x N product once; then one block per row runs the rest "
          "as straight-line code: reductions by warp shuffles and one shared-memory exchange in fp32, logsumexp and "
          "softmax as one online (max, sum of exp) pass, group statistics by a team of warps per group, every "
          "vector the row program reads more than once computed once into shared memory.", C,
          "the GEMM dominates (~85-95% of cuBLAS fp32); the row pass reads the product once from L2/DRAM instead of "
          "one eager kernel per op", "staged", ({},), round0=True),
    Entry("gemm-rows-streamed", "The same two launches with no shared-memory staging in the row kernel: every pass "
          "over a row (a norm's two statistics passes, softmax's max/sum and output) re-reads the GEMM's row, which "
          "stays in L1/L2 between passes; fits any row length and keeps occupancy high.", M,
          "equal to the staged kernel where rows are read once; any N (no shared-memory limit)", "streamed", ({},),
          round0=True),
    Entry("gemm-rows-tf32x3", "The same two launches with the GEMM on the tensor cores at fp32 accuracy (3xTF32: "
          "each operand split into tf32 hi + lo, lo*hi + hi*lo + hi*hi per k8 step with mma.sync, per-k-tile fp32 "
          "partial sums), its fused epilogue before the store into the scratch rows; then the row kernel, staged "
          "or streamed.", P, "the GEMM at ~1.15-1.2x cuBLAS fp32 (measured in the gemm family on an H100) instead "
          "of ~0.65x for the FFMA tile", "tf32x3_streamed", ({},), round0=True),
    Entry("gemm-rows-tf32x3-staged", "3xTF32 GEMM, then the row kernel with every vector read more than once "
          "held in shared memory.", P, "as the streamed one, less L2 traffic in multi-pass row programs",
          "tf32x3_staged", ({},), round0=True),
)


def _refinements(variant: str) -> tuple[Entry, ...]:
    after, tag = frozenset({variant}), f" ({variant} row kernel)"
    return (
        Entry(f"gemm-rows-{variant}-cp-async", "Feed the GEMM from a STAGES-deep cp.async ring (16-byte copies "
              "straight into shared memory, zero-filled at the edges) so more of the next tiles' loads are in "
              "flight; the GEMM is most of the time." + tag, A, "5-20% of the GEMM when it waits on loads", variant,
              ({"CP_ASYNC": 1, "STAGES": 3, "SMEM_T": 0}, {"CP_ASYNC": 1, "STAGES": 4, "SMEM_T": 0}), after=after),
        Entry(f"gemm-rows-{variant}-tile", "Re-shape the GEMM's block tile: 64 x 64 for more blocks when M or N is "
              "small, 128 x 256 for more reuse, 2 blocks per SM to hide barriers." + tag, PAR, "0-15%", variant,
              ({"BM": 64, "BN": 64}, {"BM": 128, "BN": 256}, {"MIN_BLOCKS": 2}), after=after),
        Entry(f"gemm-rows-{variant}-block", "Re-balance threads per row in the row kernel: fewer threads for short "
              "rows (less idle lanes in the block reductions), more for long rows (more loads in flight)." + tag, PAR,
              "0-10% of the row pass", variant, ({"BLOCK": 128}, {"BLOCK": 256}, {"BLOCK": 1024}), after=after),
        Entry(f"gemm-rows-{variant}-rows", "Walk several rows per block in turn (RPB 2-4): fewer, longer-lived "
              "blocks, the block's setup and tail amortised over rows." + tag, CF, "0-5% of the row pass",
              variant, ({"RPB": 2}, {"RPB": 4}), after=after),
        Entry(f"gemm-rows-{variant}-kahan", "Compensated (Kahan) fp32 sums in the row kernel's reductions and group "
              "statistics: the rounding error of a long row's sum no longer grows with N." + tag, P,
              "accuracy at ~0% cost (the row pass is memory-bound)", variant, ({"KAHAN": 1},), after=after),
        Entry(f"gemm-rows-{variant}-l2", "Group the GEMM's block order (GROUP_M) so that blocks in flight share "
              "the weight's tiles in L2." + tag, M, "0-5%", variant, ({"GROUP_M": 4}, {"GROUP_M": 16}), after=after),
    )


def _refinements_tf32(variant: str) -> tuple[Entry, ...]:
    after, tag = frozenset({variant}), f" ({variant})"
    rows = [e for e in _refinements(variant) if e.id.endswith(("-block", "-rows", "-kahan"))]
    return (
        Entry(f"gemm-rows-{variant}-tile", "Re-shape the 3xTF32 GEMM's block tile: 64 x 128 with 32 x 64 warp "
              "tiles for fewer rows, or a 4-deep cp.async ring." + tag, PAR, "0-15% of the GEMM", variant,
              ({"BM": 64, "BN": 128, "WM": 32, "WN": 64, "STAGES": 4}, {"STAGES": 4}), after=after),
        Entry(f"gemm-rows-{variant}-l2", "Change the 3xTF32 GEMM's grouped block order (GROUP_M) for L2 reuse of "
              "the weight." + tag, M, "0-5%", variant, ({"GROUP_M": 1},), after=after),
        *rows,
    )


IDEAS = (_WGMMA + _ROUND0 + _refinements_wgmma("wgmma_streamed") + _refinements_wgmma("wgmma_staged")
         + _refinements("staged") + _refinements("streamed") + _refinements_tf32("tf32x3_staged")
         + _refinements_tf32("tf32x3_streamed"))

GEMM_ROWS = Family(name="gemm_rows", leads=frozenset({Lead.contraction}), recognise=_recognise,
                   constraints=("one GEMM of a forward input and a weight", "a row op after it",
                                "row-local ops only", "elementwise between them"),
                   variants={"staged": gemm_rows_staged, "streamed": gemm_rows_streamed,
                          "tf32x3_staged": gemm_rows_tf32x3_staged, "tf32x3_streamed": gemm_rows_tf32x3_streamed,
                          "wgmma_staged": gemm_rows_wgmma_staged, "wgmma_streamed": gemm_rows_wgmma_streamed},
                ideas=IDEAS)
