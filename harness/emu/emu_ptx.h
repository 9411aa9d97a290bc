// emu_ptx.h: the inline PTX instructions the emulator runs. ptx_asm.py turns each asm statement of a
// closed set into a call of one routine here: outputs as Dst (where to write, how many bytes), inputs as
// their bits, immediates as literals, in the template's order (after the instruction's name and line).
// Also the shared window: __cvta_generic_to_shared gives 32-bit shared addresses that map back to the
// block's shared memory, bounds-checked. See README.md ("Inline PTX").
#pragma once

namespace kg_emu {

// ----- the shared window: the static __shared__ section at 0, the dynamic buffer after it ------------
constexpr size_t kDynWindowAlign = 128;  // where the dynamic part starts, as a GPU aligns it
inline size_t dyn_window_base() { return (g_static_smem_bytes + kDynWindowAlign - 1) / kDynWindowAlign * kDynWindowAlign; }

inline bool in_shared(const void *p) {  // one past the end counts (an end pointer may be converted)
  const unsigned char *c = (const unsigned char *)p;
  return (g_static_smem && c >= g_static_smem && c <= g_static_smem + g_static_smem_bytes) ||
         (g_dyn_smem && c >= g_dyn_smem && c <= g_dyn_smem + g_dyn_smem_bytes);
}
inline unsigned long long shared_window_of(const void *p, const char *what) {
  const unsigned char *c = (const unsigned char *)p;
  if (g_static_smem && c >= g_static_smem && c <= g_static_smem + g_static_smem_bytes) return c - g_static_smem;
  if (g_dyn_smem && c >= g_dyn_smem && c <= g_dyn_smem + g_dyn_smem_bytes) return dyn_window_base() + (c - g_dyn_smem);
  fail("%s of %p, which is not in the block's shared memory", what, p);
}
// The block's bytes at shared address `a` .. a + bytes, or an EmuError naming the instruction.
inline unsigned char *shared_at(unsigned long long a, size_t bytes, const char *what, int line) {
  if (a + bytes <= g_static_smem_bytes) return g_static_smem + a;
  const size_t d = dyn_window_base();
  if (a >= d && a + bytes <= d + g_dyn_smem_bytes) return g_dyn_smem + (a - d);
  char dyn[80] = "";
  if (g_dyn_smem_bytes) std::snprintf(dyn, sizeof dyn, " and 0x%zx-0x%zx (dynamic)", d, d + g_dyn_smem_bytes);
  fail("out-of-bounds shared-memory access by %s (kernel.cu line %d): address 0x%llx, %zu bytes; the block's shared "
       "memory is 0x0-0x%zx (static)%s", what, line, a, bytes, g_static_smem_bytes, dyn);
}

namespace ptx {

// ----- operands -------------------------------------------------------------------------------------
constexpr int reg_bytes(char c) { return c == 'h' ? 2 : (c == 'l' || c == 'd') ? 8 : 4; }
struct Dst {
  void *p;
  int bytes;
};
template <char C, class T> inline Dst out(T &x) {
  static_assert(C != 'n' && !std::is_const_v<T>, "an asm output must be a writable register operand");
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == reg_bytes(C), "an asm output whose type does not fit its constraint");
  return Dst{(void *)&x, (int)sizeof(T)};
}
// an input's bits, as the constraint's register holds them
template <char C, class T> inline unsigned long long in(const T &x) {
  if constexpr (std::is_pointer_v<T>) {
    return (unsigned long long)(uintptr_t)x;
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    if constexpr (C == 'f') return kg_bits<unsigned>((float)x);
    else if constexpr (C == 'd') return kg_bits<unsigned long long>((double)x);
    else if constexpr (std::is_floating_point_v<T>) {
      static_assert(sizeof(T) == reg_bytes(C), "an asm input whose type does not fit its constraint");
      return to_bits(x);
    } else if constexpr (C == 'h') return (unsigned short)x;
    else if constexpr (C == 'r') return (unsigned)x;
    else return (unsigned long long)x;  // l, n
  } else {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == reg_bytes(C), "an asm input whose type does not fit its constraint");
    return to_bits(x);
  }
}
inline void put(const char *name, int line, Dst d, unsigned long long bits, int bytes) {
  if (d.bytes != bytes) fail("%s (kernel.cu line %d): an output of %d bytes for a %d-byte register", name, line, d.bytes, bytes);
  std::memcpy(d.p, &bits, bytes);  // the low bytes (little-endian)
}
inline float f32(unsigned long long bits) { return kg_bits<float>((unsigned)bits); }

// ----- conversions ------------------------------------------------------------------------------------
inline bool is_nan32(unsigned u) { return (u & 0x7fffffffu) > 0x7f800000u; }
// tf32: nearest, ties away from zero, 10 explicit mantissa bits (the low 13 come back zero)
inline unsigned tf32_rna(unsigned u) { return is_nan32(u) ? 0x7fffffffu : (u + 0x1000u) & 0xffffe000u; }
// bf16 and f16: IEEE round to nearest even; NaN becomes the canonical 0x7fff
inline unsigned bf16_rn(unsigned u) { return is_nan32(u) ? 0x7fffu : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; }
inline unsigned f16_rn(unsigned u) {
  const unsigned sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
  if (a < 0x38800000u)  // below 2^-14: a subnormal half, in units of 2^-24 (the scaling is exact)
    return sign | (unsigned)std::nearbyint(kg_bits<float>(a) * 16777216.0f);
  const unsigned m = a - 0x38000000u;  // the exponent rebiased from 127 to 15
  return sign | ((m + 0xfffu + ((m >> 13) & 1u)) >> 13);
}
inline float bf16_to_f32(unsigned h) { return kg_bits<float>((h & 0xffffu) << 16); }
inline float f16_to_f32(unsigned h) {
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return kg_bits<float>(sign | kg_bits<unsigned>((float)m * 5.9604644775390625e-8f));  // m * 2^-24
  if (e == 31) return kg_bits<float>(sign | 0x7f800000u | (m << 13));
  return kg_bits<float>(sign | ((e + 112u) << 23) | (m << 13));
}

inline void cvt_rna_tf32_f32(const char *n, int line, Dst d, unsigned long long a) { put(n, line, d, tf32_rna((unsigned)a), 4); }
inline void cvt_rn_bf16_f32(const char *n, int line, Dst d, unsigned long long a) { put(n, line, d, bf16_rn((unsigned)a), 2); }
inline void cvt_rn_f16_f32(const char *n, int line, Dst d, unsigned long long a) { put(n, line, d, f16_rn((unsigned)a), 2); }
// .x2: a to the upper half, b to the lower
inline void cvt_rn_bf16x2_f32(const char *n, int line, Dst d, unsigned long long a, unsigned long long b) {
  put(n, line, d, bf16_rn((unsigned)a) << 16 | bf16_rn((unsigned)b), 4);
}
inline void cvt_rn_f16x2_f32(const char *n, int line, Dst d, unsigned long long a, unsigned long long b) {
  put(n, line, d, f16_rn((unsigned)a) << 16 | f16_rn((unsigned)b), 4);
}
inline void cvt_f32_bf16(const char *n, int line, Dst d, unsigned long long a) { put(n, line, d, kg_bits<unsigned>(bf16_to_f32((unsigned)a)), 4); }
inline void cvt_f32_f16(const char *n, int line, Dst d, unsigned long long a) { put(n, line, d, kg_bits<unsigned>(f16_to_f32((unsigned)a)), 4); }
// ex2.approx.ftz.f32: 2^x computed exactly here (the hardware's is within 2^-22 relative); .ftz flushes a
// subnormal input or result to a zero of the same sign
inline void ex2_approx_ftz_f32(const char *n, int line, Dst d, unsigned long long a) {
  float x = f32(a);
  if (std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.f, x);
  float r = std::exp2(x);
  if (std::fpclassify(r) == FP_SUBNORMAL) r = 0.f;
  put(n, line, d, kg_bits<unsigned>(r), 4);
}
// bar.sync / bar.arrive a{, b}: named barrier a of b threads (bar.sync without b: the whole block; emu_sched.h)
inline void bar_sync(const char *n, int line, unsigned long long id, unsigned long long count) {
  named_barrier((int)id, (int)count, true, n, line);
}
inline void bar_arrive(const char *n, int line, unsigned long long id, unsigned long long count) {
  named_barrier((int)id, (int)count, false, n, line);
}
inline void bar_sync(const char *n, int line, unsigned long long id) { bar_sync(n, line, id, g_nthreads); }
inline void cvta_to_shared(const char *n, int line, Dst d, unsigned long long a) {
  put(n, line, d, shared_window_of((const void *)(uintptr_t)a, n), d.bytes);
}

// ----- mma.sync (warp-collective): fragments as in the PTX ISA, g = lane / 4, t = lane % 4 -------------
// tf32 m16n8k8: A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B b0 (t, g), b1 (t+4, g).
// bf16/f16 m16n8k16 (two per register, the lower column in the low half): A a0 (g, 2t..2t+1),
// a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (2t..2t+1, g), b1 (2t+8..2t+9, g).
// C and D (f32): c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
// D[m][n] = C[m][n], then for k = 0, 1, ... in order: D = fma(A[m][k], B[k][n], D) in fp32 (round to nearest;
// every product of two tf32/bf16/f16 values is exact in fp32). tf32 operands keep their top 19 bits only
// (the tensor core ignores the low 13), so an operand that skipped cvt.rna.tf32 is truncated, not exact.
enum class MmaType { TF32, BF16, F16 };
struct MmaLane {
  unsigned a[4], b[2];
  float c[4], d[4];
};
template <MmaType T> inline float mma_half(unsigned reg, int hi) {
  const unsigned h = (reg >> (16 * hi)) & 0xffffu;
  return T == MmaType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
inline float tf32_operand(unsigned u) { return kg_bits<float>(is_nan32(u) ? u : u & 0xffffe000u); }

template <MmaType T> void mma_run(void *const lanes[32]) {
  constexpr int K = T == MmaType::TF32 ? 8 : 16;
  float A[16][K], B[K][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const MmaLane &L = *(const MmaLane *)lanes[l];
    const int g = l >> 2, t = l & 3;
    if constexpr (T == MmaType::TF32) {
      A[g][t] = tf32_operand(L.a[0]);
      A[g + 8][t] = tf32_operand(L.a[1]);
      A[g][t + 4] = tf32_operand(L.a[2]);
      A[g + 8][t + 4] = tf32_operand(L.a[3]);
      B[t][g] = tf32_operand(L.b[0]);
      B[t + 4][g] = tf32_operand(L.b[1]);
    } else {
      for (int e = 0; e < 2; ++e) {
        A[g][2 * t + e] = mma_half<T>(L.a[0], e);
        A[g + 8][2 * t + e] = mma_half<T>(L.a[1], e);
        A[g][2 * t + 8 + e] = mma_half<T>(L.a[2], e);
        A[g + 8][2 * t + 8 + e] = mma_half<T>(L.a[3], e);
        B[2 * t + e][g] = mma_half<T>(L.b[0], e);
        B[2 * t + 8 + e][g] = mma_half<T>(L.b[1], e);
      }
    }
    C[g][2 * t] = L.c[0];
    C[g][2 * t + 1] = L.c[1];
    C[g + 8][2 * t] = L.c[2];
    C[g + 8][2 * t + 1] = L.c[3];
  }
  for (int l = 0; l < 32; ++l) {
    MmaLane &L = *(MmaLane *)lanes[l];
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int m = g + 8 * (i >> 1), n = 2 * t + (i & 1);
      float acc = C[m][n];
      for (int k = 0; k < K; ++k) acc = std::fma(A[m][k], B[k][n], acc);
      L.d[i] = acc;
    }
  }
}
template <MmaType T>
inline void mma(const char *n, int line, Dst d0, Dst d1, Dst d2, Dst d3, unsigned long long a0, unsigned long long a1,
                unsigned long long a2, unsigned long long a3, unsigned long long b0, unsigned long long b1,
                unsigned long long c0, unsigned long long c1, unsigned long long c2, unsigned long long c3) {
  MmaLane L{{(unsigned)a0, (unsigned)a1, (unsigned)a2, (unsigned)a3}, {(unsigned)b0, (unsigned)b1},
            {f32(c0), f32(c1), f32(c2), f32(c3)}, {}};
  warp_collective(&mma_run<T>, &L, n, line);
  const Dst d[4] = {d0, d1, d2, d3};
  for (int i = 0; i < 4; ++i) put(n, line, d[i], kg_bits<unsigned>(L.d[i]), 4);
}
#define KGEMU_MMA(name, type)                                                                                  \
  template <class... A> inline void name(const char *n, int line, A... args) { mma<MmaType::type>(n, line, args...); }
KGEMU_MMA(mma_m16n8k8_tf32, TF32)
KGEMU_MMA(mma_m16n8k16_bf16, BF16)
KGEMU_MMA(mma_m16n8k16_f16, F16)
#undef KGEMU_MMA

// ----- ldmatrix (warp-collective): lane 8j + r gives the address of row r of matrix j (16 bytes, 16-byte
// aligned); lane l receives, of each matrix j, the b16 pair of row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1
// (.trans: of the transposed matrix), the lower column in the low half ---------------------------------
struct LdmLane {
  unsigned long long addr;
  unsigned d[4];
  const char *name;
  int line;
};
template <int N, bool TRANS> void ldmatrix_run(void *const lanes[32]) {
  unsigned short m[N][8][8];
  for (int j = 0; j < N; ++j)
    for (int r = 0; r < 8; ++r) {
      const LdmLane &L = *(const LdmLane *)lanes[8 * j + r];
      if (L.addr % 16)
        fail("%s (kernel.cu line %d): lane %d's row address 0x%llx is not 16-byte aligned", L.name, L.line, 8 * j + r,
             L.addr);
      std::memcpy(m[j][r], shared_at(L.addr, 16, L.name, L.line), 16);
    }
  for (int l = 0; l < 32; ++l) {
    LdmLane &L = *(LdmLane *)lanes[l];
    const int row = l / 4, col = 2 * (l % 4);
    for (int j = 0; j < N; ++j) {
      const unsigned lo = TRANS ? m[j][col][row] : m[j][row][col], hi = TRANS ? m[j][col + 1][row] : m[j][row][col + 1];
      L.d[j] = lo | hi << 16;
    }
  }
}
template <int N, bool TRANS> inline void ldmatrix_do(const char *n, int line, const Dst *d, unsigned long long addr) {
  LdmLane L{addr, {}, n, line};
  asm volatile("" ::: "memory");  // earlier stores to shared memory are made before it is read
  warp_collective(&ldmatrix_run<N, TRANS>, &L, n, line);
  for (int j = 0; j < N; ++j) put(n, line, d[j], L.d[j], 4);
}
template <int N, bool TRANS> inline void ldmatrix(const char *n, int line, Dst d0, unsigned long long a) {
  static_assert(N == 1, "ldmatrix .x1 has one destination");
  ldmatrix_do<1, TRANS>(n, line, &d0, a);
}
template <int N, bool TRANS> inline void ldmatrix(const char *n, int line, Dst d0, Dst d1, unsigned long long a) {
  static_assert(N == 2, "ldmatrix .x2 has two destinations");
  const Dst d[2] = {d0, d1};
  ldmatrix_do<2, TRANS>(n, line, d, a);
}
template <int N, bool TRANS>
inline void ldmatrix(const char *n, int line, Dst d0, Dst d1, Dst d2, Dst d3, unsigned long long a) {
  static_assert(N == 4, "ldmatrix .x4 has four destinations");
  const Dst d[4] = {d0, d1, d2, d3};
  ldmatrix_do<4, TRANS>(n, line, d, a);
}

// ----- cp.async: a copy is queued at issue and performed (the source read, the destination written, the
// rest zero-filled) by the cp.async.wait that covers its group: shared memory read before the wait is stale ---
inline void cp_async(const char *n, int line, bool cg, unsigned long long dst, unsigned long long src,
                     unsigned long long size, unsigned long long src_size) {
  if (size != 4 && size != 8 && size != 16) fail("%s (kernel.cu line %d): cp-size %llu (4, 8 or 16)", n, line, size);
  if (cg && size != 16) fail("%s (kernel.cu line %d): .cg copies 16 bytes, not %llu", n, line, size);
  if (src_size > size) fail("%s (kernel.cu line %d): src-size %llu exceeds cp-size %llu", n, line, src_size, size);
  if (dst % size || src % size)
    fail("%s (kernel.cu line %d): misaligned %s address 0x%llx for a %llu-byte copy", n, line,
         dst % size ? "shared" : "global", dst % size ? dst : src, size);
  unsigned char *to = shared_at(dst, size, n, line);
  g_cur->copies.push_back(AsyncCopy{to, (const unsigned char *)(uintptr_t)src, (int)size, (int)src_size, -1});
}
inline void cp_async_ca(const char *n, int line, unsigned long long dst, unsigned long long src, unsigned long long size,
                        unsigned long long src_size) {
  cp_async(n, line, false, dst, src, size, src_size);
}
inline void cp_async_ca(const char *n, int line, unsigned long long dst, unsigned long long src, unsigned long long size) {
  cp_async(n, line, false, dst, src, size, size);
}
inline void cp_async_cg(const char *n, int line, unsigned long long dst, unsigned long long src, unsigned long long size,
                        unsigned long long src_size) {
  cp_async(n, line, true, dst, src, size, src_size);
}
inline void cp_async_cg(const char *n, int line, unsigned long long dst, unsigned long long src, unsigned long long size) {
  cp_async(n, line, true, dst, src, size, size);
}
inline void cp_async_commit_group(const char *, int) {
  Fiber *f = g_cur;
  ++f->groups_committed;  // an empty group counts too
  for (AsyncCopy &c : f->copies)
    if (c.group < 0) c.group = f->groups_committed;
}
// every copy of a committed group but the `pending` most recent ones lands, in issue order
inline void cp_async_wait_group(const char *, int, unsigned long long pending) {
  Fiber *f = g_cur;
  const long long upto = f->groups_committed - (long long)pending;
  asm volatile("" ::: "memory");
  size_t kept = 0;
  for (const AsyncCopy &c : f->copies) {
    if (c.group < 0 || c.group > upto) {
      f->copies[kept++] = c;
      continue;
    }
    if (c.src_bytes) std::memcpy(c.dst, c.src, (size_t)c.src_bytes);
    std::memset(c.dst + c.src_bytes, 0, (size_t)(c.bytes - c.src_bytes));
  }
  f->copies.resize(kept);
  asm volatile("" ::: "memory");  // the kernel's next reads of shared memory see the copies
}
inline void cp_async_wait_all(const char *n, int line) {
  cp_async_commit_group(n, line);
  cp_async_wait_group(n, line, 0);
}

}  // namespace ptx
}  // namespace kg_emu

// the address-space conversions of the CUDA runtime, over the shared window
inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)kg_emu::shared_window_of(p, "__cvta_generic_to_shared"); }
inline void *__cvta_shared_to_generic(size_t a) { return kg_emu::shared_at(a, 0, "__cvta_shared_to_generic", 0); }
inline size_t __cvta_generic_to_global(const void *p) { return (size_t)(uintptr_t)p; }
template <class T> inline bool __isShared(const T *p) { return kg_emu::in_shared(p); }
template <class T> inline bool __isGlobal(const T *p) { return !kg_emu::in_shared(p); }
