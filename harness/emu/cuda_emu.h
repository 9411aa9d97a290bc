// cuda_emu.h: a CUDA-C shim for g++ (force-included before kerngen's prelude and the kernel).
// Qualifiers become host C++, the built-in variables read the running fiber, and the warp- and
// block-level intrinsics go to the fiber scheduler (emu_sched.h). See README.md.
#pragma once
#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <type_traits>

// ----- qualifiers ----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
// no __noinline__ macro: libstdc++'s own __attribute__((__noinline__)) would break under it (source_rewrite.py
// turns a kernel's __noinline__ into the attribute)
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// Blocks run one at a time, so static storage serves as the block's shared memory; the section
// lets the driver poison it before every block (-fno-weak keeps inline functions' statics in it).
#define __shared__ static __attribute__((section("kg_shared")))
#define CUDART_INF_F __int_as_float(0x7f800000)
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_PI_F 3.141592654f
#define __CUDACC__ 1
#define __CUDA_ARCH__ 900
#define __CUDACC_RTC__ 1  // the harness compiles with NVRTC
#define KERNGEN_EMU 1

// ----- vector types ----------------------------------------------------------------------------
#define KGEMU_VEC2(N, T, A) struct alignas(A) N { T x, y; }; \
  inline N make_##N(T x, T y) { N v; v.x = x; v.y = y; return v; }
#define KGEMU_VEC3(N, T) struct N { T x, y, z; }; \
  inline N make_##N(T x, T y, T z) { N v; v.x = x; v.y = y; v.z = z; return v; }
#define KGEMU_VEC4(N, T, A) struct alignas(A) N { T x, y, z, w; }; \
  inline N make_##N(T x, T y, T z, T w) { N v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
#define KGEMU_VEC1(N, T) struct N { T x; }; inline N make_##N(T x) { N v; v.x = x; return v; }
#define KGEMU_VECS(P, T, S) KGEMU_VEC1(P##1, T) KGEMU_VEC2(P##2, T, 2 * S) KGEMU_VEC3(P##3, T) KGEMU_VEC4(P##4, T, 4 * S)
KGEMU_VECS(char, signed char, 1)
KGEMU_VECS(uchar, unsigned char, 1)
KGEMU_VECS(short, short, 2)
KGEMU_VECS(ushort, unsigned short, 2)
KGEMU_VECS(int, int, 4)
KGEMU_VECS(uint, unsigned int, 4)
KGEMU_VECS(float, float, 4)
KGEMU_VEC1(long1, long) KGEMU_VEC2(long2, long, 16) KGEMU_VEC3(long3, long) KGEMU_VEC4(long4, long, 16)
KGEMU_VEC1(ulong1, unsigned long) KGEMU_VEC2(ulong2, unsigned long, 16) KGEMU_VEC3(ulong3, unsigned long)
KGEMU_VEC4(ulong4, unsigned long, 16)
KGEMU_VEC1(longlong1, long long) KGEMU_VEC2(longlong2, long long, 16) KGEMU_VEC3(longlong3, long long)
KGEMU_VEC4(longlong4, long long, 16)
KGEMU_VEC1(ulonglong1, unsigned long long) KGEMU_VEC2(ulonglong2, unsigned long long, 16)
KGEMU_VEC3(ulonglong3, unsigned long long) KGEMU_VEC4(ulonglong4, unsigned long long, 16)
KGEMU_VEC1(double1, double) KGEMU_VEC2(double2, double, 16) KGEMU_VEC3(double3, double) KGEMU_VEC4(double4, double, 16)
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
#undef KGEMU_VEC1
#undef KGEMU_VEC2
#undef KGEMU_VEC3
#undef KGEMU_VEC4
#undef KGEMU_VECS
constexpr int warpSize = 32;

// ----- bit casts and integer intrinsics ----------------------------------------------------------
template <class To, class From> inline To kg_bits(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
inline float __int_as_float(int v) { return kg_bits<float>(v); }
inline float __uint_as_float(unsigned int v) { return kg_bits<float>(v); }
inline int __float_as_int(float v) { return kg_bits<int>(v); }
inline unsigned int __float_as_uint(float v) { return kg_bits<unsigned int>(v); }
inline double __longlong_as_double(long long v) { return kg_bits<double>(v); }
inline long long __double_as_longlong(double v) { return kg_bits<long long>(v); }
inline int __double2hiint(double v) { return (int)(kg_bits<unsigned long long>(v) >> 32); }
inline int __double2loint(double v) { return (int)kg_bits<unsigned long long>(v); }
inline double __hiloint2double(int hi, int lo) {
  return kg_bits<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}
inline int __popc(unsigned int v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll((unsigned long long)v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline unsigned int __brev(unsigned int v) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned long long __brevll(unsigned long long v) {
  return ((unsigned long long)__brev((unsigned)v) << 32) | __brev((unsigned)(v >> 32));
}
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const unsigned long long bytes = ((unsigned long long)y << 32) | x;
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int s) {
  return (unsigned)(((((unsigned long long)hi << 32) | lo) << (s & 31)) >> 32);
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int s) {
  return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s & 31));
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xffffff) * (b & 0xffffff); }
inline unsigned int __sad(int a, int b, unsigned int c) { return (unsigned)(a > b ? a - b : b - a) + c; }
inline unsigned int __usad(unsigned a, unsigned b, unsigned c) { return (a > b ? a - b : b - a) + c; }

// ----- min / max (CUDA has them for every arithmetic type, mixed ones by the usual conversions) ----
#define KGEMU_MINMAX(T) inline T min(T a, T b) { return b < a ? b : a; } inline T max(T a, T b) { return a < b ? b : a; }
KGEMU_MINMAX(int) KGEMU_MINMAX(unsigned int) KGEMU_MINMAX(long) KGEMU_MINMAX(unsigned long) KGEMU_MINMAX(long long)
KGEMU_MINMAX(unsigned long long) KGEMU_MINMAX(double)
#undef KGEMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B> &&
                                                     !std::is_same_v<A, B>>>
inline std::common_type_t<A, B> min(A a, B b) { return min((std::common_type_t<A, B>)a, (std::common_type_t<A, B>)b); }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B> &&
                                                     !std::is_same_v<A, B>>>
inline std::common_type_t<A, B> max(A a, B b) { return max((std::common_type_t<A, B>)a, (std::common_type_t<A, B>)b); }
inline int umin(int a, int b) { return min(a, b); }

// ----- float intrinsics (fp32 in IEEE arithmetic; the *_rz/_ru/_rd rounding modes round to nearest) --
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.f, x); }
inline float exp10f(float x) { return powf(10.f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
inline float sinpif(float x) { return sinf((float)M_PI * x); }
inline float cospif(float x) { return cosf((float)M_PI * x); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.f / cbrtf(x); }
inline float __frsqrt_rn(float x) { return 1.f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.f / x; }
inline double __drcp_rn(double x) { return 1.0 / x; }
inline float __saturatef(float x) { return x >= 1.f ? 1.f : (x > 0.f ? x : 0.f); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * (float)M_SQRT1_2); }
inline double normcdf(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }
inline float erfinvf(float y) {  // Newton on erf from a rough start: enough for fp32 checks
  if (y <= -1.f) return y == -1.f ? -INFINITY : NAN;
  if (y >= 1.f) return y == 1.f ? INFINITY : NAN;
  double x = 0, w = -std::log((1.0 - y) * (1.0 + y));
  x = w < 5 ? y * (0.886 + 0.2 * w) : (y > 0 ? 1 : -1) * std::sqrt(w - std::log(w));
  for (int i = 0; i < 60; ++i) x -= (std::erf(x) - y) / (1.1283791670955126 * std::exp(-x * x));
  return (float)x;
}
#define KGEMU_ROUNDED(name, op) \
  inline float __f##name##_rn(float a, float b) { return a op b; } \
  inline float __f##name##_rz(float a, float b) { return a op b; } \
  inline float __f##name##_ru(float a, float b) { return a op b; } \
  inline float __f##name##_rd(float a, float b) { return a op b; } \
  inline double __d##name##_rn(double a, double b) { return a op b; }
KGEMU_ROUNDED(add, +) KGEMU_ROUNDED(sub, -) KGEMU_ROUNDED(mul, *)
#undef KGEMU_ROUNDED
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmaf_rz(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmaf_ru(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmaf_rd(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned int __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline unsigned int __float2uint_rz(float x) { return (unsigned)x; }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline long long __float2ll_rz(float x) { return (long long)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline int __double2int_rn(double x) { return (int)nearbyint(x); }
inline int __double2int_rz(double x) { return (int)x; }

// ----- loads and stores with cache hints (plain memory here) ---------------------------------------
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
template <class T> inline T __ldca(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
template <class T> inline T __ldlu(const T *p) { return *p; }
template <class T> inline T __ldcv(const T *p) { return *p; }
template <class T> struct kgemu_same { using type = T; };  // a parameter that is not deduced (converts)
template <class T> inline void __stwb(T *p, typename kgemu_same<T>::type v) { *p = v; }
template <class T> inline void __stcg(T *p, typename kgemu_same<T>::type v) { *p = v; }
template <class T> inline void __stcs(T *p, typename kgemu_same<T>::type v) { *p = v; }
template <class T> inline void __stwt(T *p, typename kgemu_same<T>::type v) { *p = v; }
template <class T> inline void __stcv(T *p, typename kgemu_same<T>::type v) { *p = v; }
template <class T> inline void __prefetch_global_l1(const T *) {}
template <class T> inline void __prefetch_global_l2(const T *) {}

// ----- fences: one OS thread, so every write is visible at once -------------------------------------
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline void __nanosleep(unsigned) {}
inline void __trap() { std::fprintf(stderr, "kernel called __trap()\n"); std::abort(); }
inline void __brkpt() { __trap(); }
inline long long clock64() { static long long t = 0; return t += 1000; }
template <class T> inline T __builtin_assume_aligned_emu(T p) { return p; }
inline void __builtin_assume_emu(bool) {}

// ----- atomics: plain read-modify-writes (no fiber switches inside one) ----------------------------
#define KGEMU_ATOMIC_RMW(name, expr)                                                                   \
  template <class T, class U> inline T name(T *p, U v) { T old = *p; *p = (T)(expr); return old; } \
  template <class T, class U> inline T name##_block(T *p, U v) { return name(p, v); }             \
  template <class T, class U> inline T name##_system(T *p, U v) { return name(p, v); }
KGEMU_ATOMIC_RMW(atomicAdd, old + (T)v)
KGEMU_ATOMIC_RMW(atomicSub, old - (T)v)
KGEMU_ATOMIC_RMW(atomicExch, (T)v)
KGEMU_ATOMIC_RMW(atomicMax, (T)v > old ? (T)v : old)
KGEMU_ATOMIC_RMW(atomicMin, (T)v < old ? (T)v : old)
KGEMU_ATOMIC_RMW(atomicAnd, old & (T)v)
KGEMU_ATOMIC_RMW(atomicOr, old | (T)v)
KGEMU_ATOMIC_RMW(atomicXor, old ^ (T)v)
KGEMU_ATOMIC_RMW(atomicInc, old >= (T)v ? (T)0 : (T)(old + 1))
KGEMU_ATOMIC_RMW(atomicDec, (old == 0 || old > (T)v) ? (T)v : (T)(old - 1))
#undef KGEMU_ATOMIC_RMW
template <class T, class U, class V> inline T atomicCAS(T *p, U cmp, V val) {
  T old = *p;
  if (old == (T)cmp) *p = (T)val;
  return old;
}
template <class T, class U, class V> inline T atomicCAS_block(T *p, U c, V v) { return atomicCAS(p, c, v); }
template <class T, class U, class V> inline T atomicCAS_system(T *p, U c, V v) { return atomicCAS(p, c, v); }

#include "emu_sched.h"

// ----- built-in variables: the running fiber's thread index, the block's index ----------------------
#define threadIdx (kg_emu::g_cur->tid)
#define blockIdx (kg_emu::g_blk->idx)
#define blockDim (kg_emu::g_block_dim)
#define gridDim (kg_emu::g_grid_dim)

// ----- block and warp synchronisation ----------------------------------------------------------
// Each __syncthreads call knows its site (source line, and its return address: two calls on one
// line differ) so that threads meeting at different calls are caught. Not inlined, for the address.
#define KGEMU_SITE __attribute__((noinline))
KGEMU_SITE inline void __syncthreads(int line = __builtin_LINE()) {
  kg_emu::block_barrier(0, line, __builtin_return_address(0));
}
KGEMU_SITE inline int __syncthreads_count(int p, int line = __builtin_LINE()) {
  return kg_emu::block_barrier(p != 0, line, __builtin_return_address(0)).count;
}
KGEMU_SITE inline int __syncthreads_or(int p, int line = __builtin_LINE()) {
  return kg_emu::block_barrier(p != 0, line, __builtin_return_address(0)).count > 0;
}
KGEMU_SITE inline int __syncthreads_and(int p, int line = __builtin_LINE()) {
  const kg_emu::BarrierResult r = kg_emu::block_barrier(p != 0, line, __builtin_return_address(0));
  return r.count == r.arrived;
}
#undef KGEMU_SITE
inline void __syncwarp(unsigned mask = 0xffffffffu) { kg_emu::warp_op(kg_emu::W_SYNC, mask, 0, 0, 32); }
inline unsigned __activemask() { return kg_emu::active_mask(); }
inline unsigned __ballot_sync(unsigned m, int p) { return (unsigned)kg_emu::warp_op(kg_emu::W_BALLOT, m, p != 0, 0, 32); }
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline int __all_sync(unsigned m, int p) { return (unsigned)kg_emu::warp_op(kg_emu::W_ALL, m, p != 0, 0, 32) != 0; }
inline unsigned __ballot(int p) { return __ballot_sync(0xffffffffu, p); }
template <class T> inline unsigned __match_any_sync(unsigned m, T v) {
  return (unsigned)kg_emu::warp_op(kg_emu::W_MATCH_ANY, m, kg_emu::to_bits(v), 0, 32);
}
template <class T> inline unsigned __match_all_sync(unsigned m, T v, int *pred) {
  const unsigned r = (unsigned)kg_emu::warp_op(kg_emu::W_MATCH_ALL, m, kg_emu::to_bits(v), 0, 32);
  *pred = r != 0;
  return r;
}
template <class T> inline T __shfl_sync(unsigned m, T v, int src, int width = 32) {
  return kg_emu::from_bits<T>(kg_emu::warp_op(kg_emu::W_IDX, m, kg_emu::to_bits(v), src, width));
}
template <class T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int width = 32) {
  return kg_emu::from_bits<T>(kg_emu::warp_op(kg_emu::W_UP, m, kg_emu::to_bits(v), (int)d, width));
}
template <class T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int width = 32) {
  return kg_emu::from_bits<T>(kg_emu::warp_op(kg_emu::W_DOWN, m, kg_emu::to_bits(v), (int)d, width));
}
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int lane_mask, int width = 32) {
  return kg_emu::from_bits<T>(kg_emu::warp_op(kg_emu::W_XOR, m, kg_emu::to_bits(v), lane_mask, width));
}
#define KGEMU_WARP_REDUCE(name, op, T)                                                               \
  inline T name(unsigned m, T v) {                                                                \
    return (T)kg_emu::warp_op(op, m, (unsigned long long)(unsigned)v, std::is_signed_v<T>, 32); \
  }
KGEMU_WARP_REDUCE(__reduce_add_sync, kg_emu::W_RED_ADD, unsigned)
KGEMU_WARP_REDUCE(__reduce_add_sync, kg_emu::W_RED_ADD, int)
KGEMU_WARP_REDUCE(__reduce_min_sync, kg_emu::W_RED_MIN, unsigned)
KGEMU_WARP_REDUCE(__reduce_min_sync, kg_emu::W_RED_MIN, int)
KGEMU_WARP_REDUCE(__reduce_max_sync, kg_emu::W_RED_MAX, unsigned)
KGEMU_WARP_REDUCE(__reduce_max_sync, kg_emu::W_RED_MAX, int)
KGEMU_WARP_REDUCE(__reduce_and_sync, kg_emu::W_RED_AND, unsigned)
KGEMU_WARP_REDUCE(__reduce_or_sync, kg_emu::W_RED_OR, unsigned)
KGEMU_WARP_REDUCE(__reduce_xor_sync, kg_emu::W_RED_XOR, unsigned)
#undef KGEMU_WARP_REDUCE

// ----- inline PTX (the runner rewrites each asm statement into a call of a routine here) and the shared
// window (__cvta_generic_to_shared) ----
#include "emu_ptx.h"

#include "emu_coop.h"
#include "emu_abi.h"
