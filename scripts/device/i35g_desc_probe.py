"""Issue 35: does a wgmma shared-memory descriptor (128-byte swizzle, K-major tf32 A) work from a start row that is
no multiple of 8, and with which base-offset field? (PTX ISA "Matrix Descriptor Format": base offset = (start
address >> 7) & 7 when the start is not aligned to the 1024-byte pattern.) A tile of 128 rows x 32 fp32 is written
swizzled as TMA writes it (16-byte chunk j of row r at chunk j ^ (r & 7), from a 1024-byte aligned base); one
warpgroup multiplies rows r0 .. r0 + 63 by an 8 x 32 B with m64n8k8 over 4 k steps. Modes: 0 base offset 0, 1 base
offset (addr >> 7) & 7. Prints, per r0 and mode, the max error against the host product (exact small integers).
Developer probe: python3 scripts/device/i35g_desc_probe.py (needs cupy, an sm_90 GPU).
"""

import cupy as cp
import numpy as np

SRC = r"""
typedef unsigned long long u64;
__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u64 desc(unsigned addr, unsigned lbo, unsigned sbo, unsigned bo) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | ((u64)(bo & 7u) << 49)
         | (1ull << 62);
}
extern "C" __global__ void probe(const float *A, const float *B, float *D, int r0, int mode) {
  extern __shared__ __align__(1024) unsigned char sm[];
  const unsigned raw = sa(sm), base = (raw + 1023u) & ~1023u;
  unsigned char *p = sm + (base - raw);
  const int t = threadIdx.x;
  for (int i = t; i < 136 * 32; i += 128) {  // rows 0..127: A, 128..135: B (its own 1024-byte pattern)
    const int r = i / 32, k = i % 32, rr = r < 128 ? r : r - 128;
    const unsigned off = (r < 128 ? 0u : 16384u) + rr * 128u + ((unsigned)((k / 4) ^ (rr & 7)) * 16u) + (k % 4) * 4u;
    *(float *)(p + off) = r < 128 ? A[r * 32 + k] : B[rr * 32 + k];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int kk = 0; kk < 4; ++kk) {
    const unsigned a = base + (unsigned)r0 * 128u + kk * 32u;
    const u64 da = desc(a, 16u, 1024u, mode == 1 ? (a >> 7) & 7u : 0u);
    const u64 db = desc(base + 16384u + kk * 32u, 16u, 1024u, 0u);
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, %4, %5, q, 1, 1;\n}\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(da), "l"(db), "r"(kk));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  const int warp = t >> 5, lane = t & 31, g = lane >> 2, tq = lane & 3;
  const float v[4] = {d0, d1, d2, d3};
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e) D[(16 * warp + g + 8 * h) * 8 + 2 * tq + e] = v[2 * h + e];
}
"""


def main() -> None:
    mod = cp.RawModule(code=SRC, options=("--gpu-architecture=sm_90a", "-std=c++17"))
    fn = mod.get_function("probe")
    rng = np.random.default_rng(1)
    a = rng.integers(-3, 4, (128, 32)).astype(np.float32)
    b = rng.integers(-3, 4, (8, 32)).astype(np.float32)
    da, db = cp.asarray(a), cp.asarray(b)
    print("| r0 | mode 0 (base offset 0) max err | mode 1 (base offset (addr>>7)&7) max err |")
    for r0 in (0, 1, 2, 3, 5, 7, 8, 9, 57, 59, 64):
        errs = []
        for mode in (0, 1):
            d = cp.zeros((64, 8), cp.float32)
            fn((1,), (128,), (da, db, d, np.int32(r0), np.int32(mode)), shared_mem=20480 + 1024)
            cp.cuda.runtime.deviceSynchronize()
            ref = a[r0:r0 + 64] @ b.T
            errs.append(float(np.abs(cp.asnumpy(d) - ref).max()))
        print(f"| {r0} | {errs[0]:g} | {errs[1]:g} |")




# ----- the throughput: wgmma m64n96k8 tf32 from shared memory, A from an aligned or an unaligned start row ----------
def _speed_src() -> str:
    regs = ", ".join(f"%{i}" for i in range(48))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(48))
    return SRC.split('extern "C"')[0] + r"""
extern "C" __global__ void __launch_bounds__(256, 1) speed(float *sink, int r0, int iters) {
  extern __shared__ __align__(1024) unsigned char sm[];
  const unsigned raw = sa(sm), base = (raw + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < (256 * 128 + 96 * 128) / 4; i += 256) ((float *)(sm + (base - raw)))[i] = 0.f;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[48];
  for (int i = 0; i < 48; ++i) d[i] = 0.f;
  const int wg = threadIdx.x >> 7;
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned a = base + (unsigned)(r0 + 64 * wg) * 128u + kk * 32u;
      const u64 da = desc(a, 16u, 1024u, 0u), db = desc(base + 32768u + kk * 32u, 16u, 1024u, 0u);
#pragma unroll
      for (int t = 0; t < 3; ++t)
        asm volatile("{\n wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 {REGS}, %48, %49, 1, 1, 1;\n}\n"
                     : OUTS : "l"(da), "l"(db));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  float s = 0.f;
  for (int i = 0; i < 48; ++i) s += d[i];
  if (s != 0.f) sink[threadIdx.x] = s;
}
""".replace("{REGS}", "{" + regs + "}").replace("OUTS", outs)


def speed() -> None:
    fn = cp.RawModule(code=_speed_src(), options=("--gpu-architecture=sm_90a", "-std=c++17")).get_function("speed")
    smem = 256 * 128 + 96 * 128 + 1024 + 128 * 64
    fn.max_dynamic_shared_size_bytes = smem
    sink = cp.zeros(256, cp.float32)
    iters = 4000
    print("\n| A start row | ms (132 blocks x 2 warpgroups, %d x 12 wgmma m64n96k8 each) | TFLOP/s |" % iters)
    for r0 in (0, 1, 3, 8, 57, 0):
        fn((132,), (256,), (sink, np.int32(r0), np.int32(iters)), shared_mem=smem)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn((132,), (256,), (sink, np.int32(r0), np.int32(iters)), shared_mem=smem)
        stop.record()
        stop.synchronize()
        ms = cp.cuda.get_elapsed_time(start, stop)
        flop = 132 * 2 * iters * 12 * 64 * 96 * 8 * 2
        print(f"| {r0} | {ms:.3f} | {flop / ms / 1e9:.0f} |")


if __name__ == "__main__":
    main()
    speed()
