"""The GPU's mma.sync m16n8k16 bf16 throughput ceiling, beside cuBLAS's bf16 GEMM (wgmma on Hopper) and
SDPA's causal attention at the suite's shape (8, 16, 4096, 128): what the attention family's mma.sync
target asks of the tensor cores (docs/playbook.md, "The mma.sync ceiling"). Needs a CUDA GPU, torch and
cupy; run from the repository root: ``python scripts/mma_sync_ceiling.py``. Independent accumulator
chains (2-8 a warp) in 4-16 warps a block, 1-2 blocks an SM; timed as the harness times kernels."""
import cupy as cp
import torch
import torch.nn.functional as F

from kerngen.harness.gpu.timing import L2Flusher, bench

SRC = r'''
extern "C" __global__ void mma_peak(float *out, int iters) {
  unsigned a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3f803f80u, a2 = a0 + 7u, a3 = a1 + 3u, b0 = a0 ^ 0x11u, b1 = a1 ^ 0x5u;
  float c[NCH][4];
#pragma unroll
  for (int j = 0; j < NCH; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < NCH; ++j)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NCH; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 1234.5f) out[threadIdx.x] = s;
}
'''

def time_ms(fn, flusher: L2Flusher) -> float:
    """The median of the harness's own timing (``kerngen.harness.gpu.timing.bench``: warm-up and repeats
    from a budget, L2 flushed before each, CUDA events) on the current stream."""
    stream = torch.cuda.current_stream()
    return bench(fn, stream=stream, flusher=flusher, budget_ms=300.0).median_ms


def mma_sync_peak(flusher: L2Flusher, iters: int = 4096) -> float:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = cp.zeros(1024, dtype=cp.float32)
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    best = 0.0
    for nch in (2, 4, 8):
        kernel = cp.RawKernel(SRC.replace("NCH", str(nch)), "mma_peak", options=("-arch=sm_90",))
        for warps in (4, 8, 16):
            for blocks_per_sm in (1, 2):
                grid = sms * blocks_per_sm

                def run() -> None:
                    with stream:
                        kernel((grid,), (32 * warps,), (out, cp.int32(iters)))
                tflops = grid * warps * iters * nch * 4096 / time_ms(run, flusher) / 1e9  # 2*16*8*16 flops an mma
                best = max(best, tflops)
                print(f"mma.sync m16n8k16 bf16: {nch} chains, {warps} warps x {blocks_per_sm} blocks/SM: "
                      f"{tflops:.0f} TFLOP/s")
    return best


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("mma_sync_ceiling: needs a CUDA GPU (torch sees none)")
    flusher = L2Flusher("cuda")
    best = mma_sync_peak(flusher)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    print(f"cuBLAS bf16 8192^3: {2 * 8192 ** 3 / time_ms(lambda: a @ b, flusher) / 1e9:.0f} TFLOP/s")
    q, k, v = (torch.randn(8, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), flusher)
    flops = 4 * 8 * 16 * 4096 * 4096 * 128 / 2
    print(f"SDPA causal 8x16x4096x128: {ms:.4f} ms, {flops / ms / 1e9:.0f} TFLOP/s (causal half of 4*B*H*S^2*D)")
    need = 0.8 * flops / ms / 1e9
    print(f"mma.sync best {best:.0f} TFLOP/s; 0.8x SDPA needs {need:.0f} TFLOP/s = {100 * need / best:.0f}% of it")


if __name__ == "__main__":
    main()
