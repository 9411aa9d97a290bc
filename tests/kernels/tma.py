"""A TMA kernel for the ``tensormap`` launch argument: the CPU tier compiles it (sm_90a) and checks
its arguments against the compiled parameters, the GPU tier runs it (tests/harness/test_gpu_tensormap.py).

``tma_rows`` loads, per block, one box of BOX_ROWS rows of the full width of a bf16 tensor viewed
as [outer, rows, COLS] (block x: the row tile, block y: the outer index) with one
``cp.async.bulk.tensor.4d`` at {0, row0, 0, outer}, waits on an mbarrier for its bytes, then
un-swizzles shared memory into ``out`` viewed as [outer, out_rows, COLS]: rows of the tile below
``out_rows`` are written (their bits XOR 0x8000 per element, a negation, when ``negate``)."""

from __future__ import annotations

from typing import Any

from kerngen.harness.spec.spec import KernelSpec

TMA_SOURCE = r"""
#include <stdint.h>

// -D BOX_ROWS, BOX_COLS (elements of one slab row), COLS (= x.shape[3]), SWIZZLE (bytes: 0, 32, 64, 128)
#define ESIZE 2
#define SLAB_ROW_BYTES (BOX_COLS * ESIZE)
#define SLAB_BYTES (BOX_ROWS * SLAB_ROW_BYTES)
#define BOX_BYTES (BOX_ROWS * COLS * ESIZE)
#define ROW_CHUNKS (COLS * ESIZE / 16)
#define SLAB_CHUNKS (SLAB_ROW_BYTES / 16)
#define SWIZZLE_MASK (SWIZZLE ? SWIZZLE / 16 - 1 : 0)

// The TMA's swizzle of a byte offset from a 1024-byte aligned base: the 16-byte chunk (bits 4..6)
// XOR bits 7..9 (128B: 3 bits, 64B: 2, 32B: 1). For 128-byte slab rows: chunk c of row r at
// r*128 + ((c ^ (r % 8)) * 16).
__device__ __forceinline__ uint32_t swizzled(uint32_t offset) {
    return offset ^ (((offset >> 7) & SWIZZLE_MASK) << 4);
}

extern "C" __global__ void __launch_bounds__(128) tma_rows(const void* map, uint4* out, int out_rows, int negate) {
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long full_barrier;
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled boxes need 1024-byte alignment
    const unsigned char* box = smem_raw + (base - raw);
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&full_barrier);
    const int row0 = blockIdx.x * BOX_ROWS;
    const int outer = blockIdx.y;
    if (threadIdx.x == 0) {
        const uint64_t map_addr = reinterpret_cast<uint64_t>(map);
        // the map was written by a copy (generic proxy): acquire it for the tensormap proxy
        asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(map_addr) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(BOX_BYTES) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3, %4, %5}], [%6];"
            :: "r"(base), "l"(map_addr), "r"(0), "r"(row0), "r"(0), "r"(outer), "r"(bar)
            : "memory");
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done) : "r"(bar), "r"(0) : "memory");
    }
    const unsigned int flip = negate ? 0x80008000u : 0u;
    for (int i = threadIdx.x; i < BOX_ROWS * ROW_CHUNKS; i += blockDim.x) {
        const int r = i / ROW_CHUNKS, chunk = i % ROW_CHUNKS;
        const int row = row0 + r;
        if (row >= out_rows) continue;
        const uint32_t logical = (uint32_t)((chunk / SLAB_CHUNKS) * SLAB_BYTES + r * SLAB_ROW_BYTES
                                            + (chunk % SLAB_CHUNKS) * 16);
        uint4 v = *reinterpret_cast<const uint4*>(box + swizzled(logical));
        v.x ^= flip; v.y ^= flip; v.z ^= flip; v.w ^= flip;
        out[((size_t)outer * out_rows + row) * ROW_CHUNKS + chunk] = v;
    }
}
"""

# (box_rows, box_cols, swizzle): every swizzle; a tile of 48 rows ends past the 100 rows too
CASES = [(64, 64, 128), (48, 64, 128), (64, 32, 64), (64, 16, 32), (32, 64, 0)]


def tma_spec(box_rows: int, box_cols: int, swizzle: int, *, out_rows: str, negate: int, out: str = "out",
             arch_specific: bool = True) -> KernelSpec:
    """``tma_rows`` over the 4-D bf16 tensor ``x``: grid (row tiles, outer), 128 threads."""
    arg: dict[str, Any] = {"kind": "tensormap", "name": "x", "box_rows": "BOX_ROWS", "box_cols": "BOX_COLS",
                           "swizzle": swizzle}
    return KernelSpec.model_validate({
        "name": f"tma_rows_{box_rows}x{box_cols}_sw{swizzle}",
        "source": TMA_SOURCE,
        "arch_specific": arch_specific,
        "defines": {"BOX_ROWS": box_rows, "BOX_COLS": box_cols, "COLS": "x.shape[3]", "SWIZZLE": swizzle},
        "steps": [{"kernel": "tma_rows", "grid": ["cdiv(x.shape[2], BOX_ROWS)", "x.shape[0] * x.shape[1]"],
                   "block": [128], "shared_mem": "BOX_ROWS * COLS * 2 + 1024",
                   "args": [arg, {"name": out}, {"kind": "int32", "value": out_rows},
                            {"kind": "int32", "value": negate}]}],
    })


def tile_spec(box_rows: int, box_cols: int, swizzle: int) -> KernelSpec:
    """Every row of every tile to ``out`` of shape [outer, tiles * box_rows, COLS] (zeros past x's rows)."""
    return tma_spec(box_rows, box_cols, swizzle, out_rows="cdiv(x.shape[2], BOX_ROWS) * BOX_ROWS", negate=0)


def negate_spec(box_rows: int = 64, box_cols: int = 64, swizzle: int = 128) -> KernelSpec:
    """``out = -x`` (x and out of one shape): the rows of x only, sign bits flipped."""
    return tma_spec(box_rows, box_cols, swizzle, out_rows="x.shape[2]", negate=1)
