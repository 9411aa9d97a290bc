// emu_coop.h: the parts of <cooperative_groups.h> that kernels use, over the fiber scheduler.
#pragma once

namespace cooperative_groups {

struct thread_block {
  void sync() const { __syncthreads(); }
  unsigned thread_rank() const { return (unsigned)kg_emu::g_cur->lin; }
  unsigned size() const { return (unsigned)kg_emu::g_nthreads; }
  unsigned num_threads() const { return size(); }
  dim3 group_index() const { return blockIdx; }
  dim3 thread_index() const { return threadIdx; }
  dim3 group_dim() const { return blockDim; }
  dim3 dim_threads() const { return blockDim; }
};
inline thread_block this_thread_block() { return {}; }

// N consecutive lanes of a warp (N a power of two up to 32)
template <unsigned N> struct thread_block_tile {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "a tile has a power-of-two size up to 32");
  unsigned lane() const { return (unsigned)kg_emu::g_cur->lin % 32u; }
  unsigned mask() const { return N == 32 ? 0xffffffffu : ((1u << N) - 1u) << (lane() / N * N); }
  void sync() const { __syncwarp(mask()); }
  unsigned thread_rank() const { return lane() % N; }
  unsigned size() const { return N; }
  unsigned num_threads() const { return N; }
  unsigned meta_group_rank() const { return (unsigned)kg_emu::g_cur->lin / N; }
  unsigned meta_group_size() const { return ((unsigned)kg_emu::g_nthreads + N - 1) / N; }
  template <class T> T shfl(T v, int src) const { return __shfl_sync(mask(), v, src, N); }
  template <class T> T shfl_up(T v, unsigned d) const { return __shfl_up_sync(mask(), v, d, N); }
  template <class T> T shfl_down(T v, unsigned d) const { return __shfl_down_sync(mask(), v, d, N); }
  template <class T> T shfl_xor(T v, int m) const { return __shfl_xor_sync(mask(), v, m, N); }
  int any(int p) const { return __any_sync(mask(), p); }
  int all(int p) const { return __all_sync(mask(), p); }
  unsigned ballot(int p) const { return __ballot_sync(mask(), p) >> (lane() / N * N); }
};
template <unsigned N, class Parent> inline thread_block_tile<N> tiled_partition(const Parent &) { return {}; }

struct grid_group {
  void sync() const { kg_emu::grid_sync(); }
  bool is_valid() const { return true; }
  unsigned long long num_threads() const {
    return (unsigned long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
  }
  unsigned long long size() const { return num_threads(); }
  unsigned long long thread_rank() const {
    const unsigned long long b = blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    return b * kg_emu::g_nthreads + kg_emu::g_cur->lin;
  }
};
inline grid_group this_grid() { return {}; }

template <class T> struct plus { T operator()(T a, T b) const { return a + b; } };
template <class T> struct less { T operator()(T a, T b) const { return b < a ? b : a; } };
template <class T> struct greater { T operator()(T a, T b) const { return a < b ? b : a; } };
template <class T> struct bit_and { T operator()(T a, T b) const { return a & b; } };
template <class T> struct bit_or { T operator()(T a, T b) const { return a | b; } };
template <class T> struct bit_xor { T operator()(T a, T b) const { return a ^ b; } };
// cg::reduce over a tile: a butterfly, every lane gets the result
template <unsigned N, class T, class Op> inline T reduce(const thread_block_tile<N> &g, T v, Op op) {
  for (unsigned o = N / 2; o > 0; o /= 2) v = op(v, g.shfl_xor(v, (int)o));
  return v;
}

}  // namespace cooperative_groups
