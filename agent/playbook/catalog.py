"""The playbook's catalogue: per family, optimization ideas in natural language, each with its
category, expected effect, the template variant that implements it and the configurations
(branches) to render. ``round0`` ideas make the first kernel from nothing; the others apply to
a parent built from one of the variants in ``after``."""

from __future__ import annotations

from kerngen.agent.playbook.entry import A, C, CF, Entry, M, PAR
from kerngen.agent.playbook.build_conv_tf32 import CONV2D_IDEAS
from kerngen.agent.playbook.build_tf32 import TF32_IDEAS
from kerngen.agent.playbook.registry import REGISTRY
from kerngen.agent.playbook.wgmma_variants import MATMUL_IDEAS

__all__ = ["CATALOG", "Entry"]


CATALOG: dict[str, list[Entry]] = {
    "elementwise": [
        Entry("ew-vec", "One pass over the tensor with 16-byte vector loads and stores (float4, or 8 x 16-bit), "
              "several vectors per thread loaded before the first use, fp32 math in registers.", M,
              "reads and writes each byte once in wide coalesced transactions: ~90-97% of the copy bandwidth",
              "vec", ({}, {"UNROLL": 2, "BLOCK": 512}, {"UNROLL": 8}), round0=True),
        Entry("ew-ilp", "Raise the bytes in flight per thread: unroll to 8 independent 16-byte loads so that DRAM "
              "latency is covered with fewer resident warps.", A, "a few % when the parent is latency-bound",
              "vec", ({"UNROLL": 8, "BLOCK": 128}, {"UNROLL": 8, "BLOCK": 256}), after=frozenset({"vec"})),
        Entry("ew-persistent", "Grid-stride persistent loop over a grid of a few waves (GRID_CAP blocks) instead of "
              "one thread per vector group: fewer block launches and tail effects.", PAR,
              "0-5%: fewer blocks to schedule, steadier occupancy", "vec",
              ({"GRID_CAP": 1056}, {"GRID_CAP": 2112, "UNROLL": 2}), after=frozenset({"vec"})),
        Entry("ew-stream", "Streaming cache hints (ld.global.cs / st.global.cs, evict-first) so that the output "
              "does not displace useful lines in L2.", M, "0-5%, sometimes negative on H100/H200",
              "vec", ({"CACHE_HINT": 1}, {"CACHE_HINT": 1, "UNROLL": 2}), after=frozenset({"vec"})),
    ],
    "softmax": [
        Entry("sm-rows-reg", "Hold each row in registers: TPR threads per row (a warp for short rows, a block for "
              "long ones), 16-byte loads, max and sum by warp shuffles (+ shared memory across warps), "
              "one read and one write of the row.", M, "2 passes over DRAM (the floor): ~85-90% of bandwidth",
              "rows_reg", ({}, {"BLOCK": 256}), round0=True),
        Entry("sm-long-online", "Long rows: one block per row with an online softmax (running max and rescaled "
              "running sum) in a single DRAM pass; the second pass re-reads the row from L2 (the SMs' rows in "
              "flight fit in L2), or from shared memory for the part cached there; streaming stores.", M,
              "2 DRAM passes instead of 3: ~1.5x over a 3-pass softmax, ~85-90% of bandwidth",
              "long", ({}, {"UNROLL": 4}), round0=True),
        Entry("sm-long-smem", "Keep as much of the row as fits (up to ~200 KB) in shared memory during pass 1 so "
              "that pass 2 reads on-chip memory instead of L2.", M,
              "less L2 traffic; helps when the rows in flight overflow L2, can cost occupancy",
              "long", ({"CACHE_KB": 64}, {"CACHE_KB": 128}, {"CACHE_KB": 200}), after=frozenset({"long"})),
        Entry("sm-rows-pipelined", "Several rows per block in turn with the next row's loads issued before this "
              "row's reductions (software pipelining across rows).", A, "0-8%",
              "rows_reg", ({"RITER": 4}, {"RITER": 8}), after=frozenset({"rows_reg"})),
        Entry("sm-rows-pack", "Pack several rows per block (BLOCK/TPR rows) so that short rows keep enough warps "
              "per SM and each block does enough work.", PAR, "5-20% for short rows",
              "rows_reg", ({"BLOCK": 512}, {"BLOCK": 1024}), after=frozenset({"rows_reg"})),
        Entry("sm-more-inflight", "More independent 16-byte loads in flight per thread in pass 1 (UNROLL) and "
              "smaller blocks so that two blocks share an SM.", A, "a few %",
              "long", ({"UNROLL": 8, "BLOCK": 512}, {"UNROLL": 2, "BLOCK": 1024}), after=frozenset({"long"})),
    ],
    "layernorm": [
        Entry("ln-rows-reg", "Short rows: hold each row in registers (TPR threads per row), exact two-pass mean and "
              "variance from registers, one read and one write.", M, "the 2-pass DRAM floor",
              "rows_reg", ({},), round0=True),
        Entry("ln-split", "Few, very long rows: split every row over many blocks. Kernel 1 writes one (mean, M2) "
              "pair per chunk (Welford/Chan merges), kernel 2 merges a row's pairs and normalises its chunk. "
              "Grids are (rows, chunks) so one chunk of weight and bias serves all rows from L2, and kernel 2 "
              "walks the chunks backwards to reuse what kernel 1 left in L2.", PAR,
              "fills the GPU with 16 rows; 3 passes over x (read, read, write) ~80% of bandwidth",
              "split", ({}, {"ITEMS": 8}), round0=True),
        Entry("ln-coop", "Few, very long rows in two DRAM passes: one cooperative persistent grid (a block per SM) "
              "holds one row at a time in registers, each block a contiguous segment of it. The weight's segment "
              "and as much of the bias' as fits stay in shared memory for the whole launch, so a row's only L2 "
              "traffic is the row. Each block publishes its (n, mean, M2) and arrives on the row's counter; "
              "several warps then merge the blocks' triples at once, every thread normalises its registers; "
              "meanwhile the next row is bulk-prefetched into L2 so DRAM keeps reading through the barrier.", M,
              "2 passes over x instead of the split kernel's 3; measured on the suite (H200) at 0.21 ms against "
              "the split kernel's 0.23: the per-row barrier and the reduction still leave DRAM idle part of each row",
              "coop", ({}, {"BLOCK": 1024}), after=frozenset({"split"})),
        Entry("ln-coop-balance", "Re-balance the persistent grid: threads per block against values per thread, and "
              "the grid without the next-row prefetch or with the bias read from L2, to see what carries the "
              "gain.", A, "0-10%", "coop", ({"PF": 0}, {"BSL": 0}, {"BLOCK": 768}, {"PG": 2}),
              after=frozenset({"coop"})),
        Entry("ln-split-chunks", "Tune the chunk size: fewer, larger chunks (more vectors per thread, more bytes in "
              "flight) or more, smaller ones (more blocks, better balance).", A, "a few %",
              "split", ({"ITEMS": 2, "BLOCK": 512}, {"ITEMS": 16}, {"BLOCK": 512, "ITEMS": 8}), after=frozenset({"split"})),
        Entry("ln-rows-pack", "Several short rows per block for occupancy.", PAR, "5-20% for short rows",
              "rows_reg", ({"BLOCK": 512},), after=frozenset({"rows_reg"})),
    ],
    "rmsnorm": [
        Entry("rms-rows-reg", "Block per row with the row in registers: 16-byte loads (8 x bf16), sum of squares "
              "in fp32, one block reduction, rsqrt, scale by the weight, 16-byte stores.", M,
              "one read and one write: ~90% of bandwidth", "rows_reg", ({}, {"TPR": 256, "BLOCK": 256}), round0=True),
        Entry("rms-two-pass", "Block per row without holding the row: one loop streams it for the sum of squares "
              "(U 16-byte loads in flight a thread, evict-last in L2), a second loop re-reads it from L1/L2, scales "
              "and stores. Few registers a thread, so full occupancy and more rows in flight per SM.", M,
              "one DRAM read and one write like the register-held row, ~2-4% faster when that one is "
              "register-limited (H200, bf16 8192x8192: 0.0684 vs 0.0703 ms)",
              "two_pass", ({}, {"BLOCK": 512, "U": 2, "MIN_BLOCKS": 4}), round0=True),
        Entry("rms-two-pass-ilp", "Trade loads in flight against occupancy in the two-loop kernel: U 2-8 vectors a "
              "thread with MIN_BLOCKS sized so that the registers still fit (no spills).", A, "0-3%",
              "two_pass", ({"U": 4, "MIN_BLOCKS": 4}, {"U": 2, "MIN_BLOCKS": 8}, {"U": 8, "MIN_BLOCKS": 4}),
              after=frozenset({"two_pass"})),
        Entry("rms-rows-pack", "Smaller groups per row and several rows per block (TPR 128-256, BLOCK 256-512) for "
              "more independent rows in flight per SM.", PAR, "0-5%",
              "rows_reg", ({"TPR": 128, "BLOCK": 256}, {"TPR": 256, "BLOCK": 512}), after=frozenset({"rows_reg"})),
        Entry("rms-occupancy", "Cap registers with __launch_bounds__(BLOCK, MIN_BLOCKS) so that 2048 / BLOCK "
              "blocks stay resident (32 registers a thread): more warps in flight to cover DRAM latency.", PAR,
              "0-2%: ncu showed 75% theoretical occupancy (register-limited) against torch.compile's 100%",
              "rows_reg", ({"MIN_BLOCKS": 4, "TPR": 512, "BLOCK": 512}, {"MIN_BLOCKS": 8, "TPR": 256, "BLOCK": 256}),
              after=frozenset({"rows_reg"})),
        Entry("rms-stream", "Other load paths for the row: streaming hints on loads and stores (evict-first), or "
              "plain coherent loads instead of the read-only (texture) path.", M, "0-3%",
              "rows_reg", ({"CACHE_HINT": 1}, {"CACHE_HINT": 2}), after=frozenset({"rows_reg"})),
        Entry("rms-pipelined", "Walk RITER rows per block in turn and issue the next row's 16-byte loads before "
              "this row's reduction and stores: the DRAM stream never waits on a barrier, the weight stays in "
              "L1, and a grid of ~one wave leaves no tail.", A, "2-8% when blocks idle at the reduction",
              "rows_reg", ({"RITER": 4}, {"RITER": 8}, {"RITER": 8, "TPR": 128, "BLOCK": 256}),
              after=frozenset({"rows_reg"})),
        Entry("rms-bulk", "Bring each block's rows into shared memory with one bulk (TMA) copy per row group, "
              "double-buffered and tracked by mbarriers: the copy engine keeps ~32-64 KB per block in flight "
              "while the threads reduce the previous rows, with no per-thread load instructions.", A,
              "closer to the copy bandwidth when per-thread loads cannot keep enough bytes in flight",
              "rows_reg", ({"BULK": 1, "RITER": 4}, {"BULK": 1, "RITER": 8, "TPR": 512, "BLOCK": 512},
                           {"BULK": 1, "RITER": 2}), after=frozenset({"rows_reg"})),
    ],
    "conv2d": [
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
    ],
    "conv_relu_maxpool": [
        Entry("crp-fused", "Fuse conv + relu + max-pool: each thread keeps the PK x PK conv outputs under one "
              "pooled output for OCT channels in registers and writes max(relu) once; input rows reused across "
              "taps from registers; input patch and weights in shared memory.", M,
              "the conv output never reaches DRAM (4x fewer bytes written), one launch instead of three",
              "fused", ({}, {"OCB": 32, "OCT": 8}), round0=True),
        Entry("crp-shape", "Re-shape the block: fewer pooled positions and more channels per thread (or the "
              "reverse) to balance register reuse against the number of blocks.", PAR, "5-15%",
              "fused", ({"PTW": 16, "PTH": 4, "OCB": 64, "OCT": 8}, {"PTW": 8, "PTH": 8, "OCB": 32, "OCT": 8},
                        {"OCT": 4}), after=frozenset({"fused"})),
    ],
    "matmul": [
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
    ],
}

CATALOG["matmul"] += TF32_IDEAS  # fp32 on the tensor cores, split precision (build_tf32)
CATALOG["matmul"] = [*MATMUL_IDEAS, *CATALOG["matmul"]]  # hook (issue 35): the Hopper core first in round 0
CATALOG["conv2d"] += CONV2D_IDEAS  # the same for the convolution (build_conv_tf32)
CATALOG.update({f.name: list(f.ideas) for f in REGISTRY})
