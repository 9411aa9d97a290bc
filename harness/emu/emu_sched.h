// emu_sched.h: one fiber per CUDA thread, all on one OS thread; one block at a time (a cooperative
// launch: all blocks of the grid, switched when the running block has no ready fiber).
// A fiber runs until it must wait (a block barrier, a warp-level operation, a grid barrier) or ends;
// the last arriver at a barrier releases the others (queued, in the block's order) and runs on, so a
// waiting fiber is never resumed before its barrier is released. Exited threads count as arrived.
#pragma once
#include <ucontext.h>
#include <vector>

namespace kg_emu {

// A fiber's saved context. On x86-64 only a stack pointer: kg_emu_switch (emu_driver.cpp) pushes the
// callee-saved registers and the FP control words and swaps stacks, without the system call that
// swapcontext makes (a block of 1024 threads switches often). Elsewhere a ucontext.
#if defined(__x86_64__) && !defined(KG_EMU_UCONTEXT)
struct Context { void *sp; };
extern "C" void kg_emu_switch(void **save_sp, void *to_sp);
inline void context_switch(Context *from, const Context *to) { kg_emu_switch(&from->sp, to->sp); }
#else
struct Context { ucontext_t uc; };
inline void context_switch(Context *from, const Context *to) { swapcontext(&from->uc, &to->uc); }
#endif

enum WarpOp {
  W_SYNC, W_BALLOT, W_ALL, W_MATCH_ANY, W_MATCH_ALL, W_IDX, W_UP, W_DOWN, W_XOR,
  W_RED_ADD, W_RED_MIN, W_RED_MAX, W_RED_AND, W_RED_OR, W_RED_XOR,
  W_COLLECTIVE  // a warp-collective PTX instruction (mma.sync, ldmatrix: emu_ptx.h), all 32 lanes
};
inline const char *const kWarpOpNames[] = {
  "__syncwarp", "__ballot_sync", "__all_sync", "__match_any_sync", "__match_all_sync", "__shfl_sync",
  "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__reduce_add_sync", "__reduce_min_sync",
  "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync", "a warp-collective PTX instruction"};
enum FiberState { F_READY, F_BARRIER, F_WARP, F_GRID, F_NAMED, F_DONE };
constexpr int kNamedBarriers = 16;  // bar.sync / bar.arrive ids 0-15 (0 is __syncthreads's)
constexpr int kMaxThreads = 1024;
constexpr int kWarps = kMaxThreads / 32;

// A warp-collective instruction's work, run by the last lane to arrive on every lane's data (lanes[l]).
using CollectiveRun = void (*)(void *const lanes[32]);
// One cp.async copy of a thread, performed when a cp.async.wait covers its group (emu_ptx.h).
struct AsyncCopy {
  unsigned char *dst;
  const unsigned char *src;
  int bytes, src_bytes;  // src_bytes < bytes: the rest is zero-filled
  long long group;  // -1: not committed yet
};

struct Block;
struct Fiber {
  Context ctx;
  Block *block;
  uint3 tid;
  int lin;  // threadIdx linearised (x fastest): lane = lin % 32, warp = lin / 32
  FiberState state;
  // the warp-level operation this fiber waits in, and its result
  int op, b, width;
  unsigned mask;
  unsigned long long in, out;
  // the warp-collective instruction this fiber waits in (op W_COLLECTIVE): its work, its data, where
  CollectiveRun coll_run;
  void *coll_data;
  const char *coll_name;
  int coll_line;
  // cp.async: this thread's copies not performed yet, and the groups it committed so far
  std::vector<AsyncCopy> copies;
  long long groups_committed;
  int named_id;  // the named barrier this fiber waits at (state F_NAMED)
};
struct BarrierResult { int count, arrived; };
struct Block {
  uint3 idx;
  Fiber *fib;  // its threads (whole warps), fib[lin]
  int *order;  // its fibers in scheduling order (warps shuffled)
  Fiber **queue;  // ready fibers, each at most once: a ring of g_nthreads
  int q_head, q_size;
  int alive;
  int bar_arrived, bar_count, bar_line;
  const void *bar_site;
  BarrierResult bar_result;
  unsigned warp_live[kWarps], warp_arrived[kWarps];
  int named_arrived[kNamedBarriers], named_count[kNamedBarriers];  // bar.sync / bar.arrive, ids 1-15
  unsigned char *saved_shared;  // cooperative launches: its shared memory while another block runs
};

// defined in emu_driver.cpp (compiled once, linked with every kernel)
extern Block *g_blk;  // the running block
extern Fiber *g_cur;  // the running fiber (null between blocks)
extern dim3 g_block_dim, g_grid_dim;
extern int g_nthreads;  // per block
extern unsigned char *g_dyn_smem;  // this launch's dynamic shared memory
extern unsigned char *g_static_smem;  // the static __shared__ variables (their linker section)
extern size_t g_static_smem_bytes, g_dyn_smem_bytes;
extern Context g_sched_ctx;
extern bool g_cooperative;
extern Block *g_blocks;  // a cooperative launch's blocks (else just the running one)
extern int g_nblocks, g_grid_arrived, g_grid_alive;

[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

inline void q_push(Fiber *f) {
  Block *b = f->block;
  b->queue[(b->q_head + b->q_size++) % g_nthreads] = f;
}
inline Fiber *q_pop(Block *b) {
  Fiber *f = b->queue[b->q_head];
  b->q_head = (b->q_head + 1) % g_nthreads;
  --b->q_size;
  return f;
}

template <class T> inline unsigned long long to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp operations take values of at most 8 bytes");
  unsigned long long r = 0;
  std::memcpy(&r, &v, sizeof(T));
  return r;
}
template <class T> inline T from_bits(unsigned long long bits) {
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

// The running fiber waits: hand the OS thread to the next ready fiber of its block, or to the
// scheduler (which runs another block, or reports a deadlock when fibers remain and none is ready).
inline void switch_away() {
  Fiber *me = g_cur;
  if (g_blk->q_size == 0) {
    context_switch(&me->ctx, &g_sched_ctx);
  } else {
    Fiber *next = q_pop(g_blk);
    g_cur = next;
    context_switch(&me->ctx, &next->ctx);
  }
  g_cur = me;
}

inline bool barrier_try_release(Fiber *self) {
  Block *b = g_blk;
  if (b->bar_arrived == 0 || b->bar_arrived < b->alive) return false;
  b->bar_result = BarrierResult{b->bar_count, b->bar_arrived};
  b->bar_arrived = b->bar_count = 0;
  for (int i = 0; i < g_nthreads; ++i) {
    Fiber *f = &b->fib[b->order[i]];
    if (f->state != F_BARRIER) continue;
    f->state = F_READY;
    if (f != self) q_push(f);
  }
  return true;
}

inline BarrierResult block_barrier(int pred, int line, const void *site) {
  Fiber *f = g_cur;
  Block *b = g_blk;
  if (b->bar_arrived == 0) {
    b->bar_line = line;
    b->bar_site = site;
  } else if (line != b->bar_line || site != b->bar_site) {
    fail("threads of the block wait at different __syncthreads calls (%s %d and %d): a barrier in divergent code",
         line == b->bar_line ? "two on line" : "lines", b->bar_line, line);
  }
  f->state = F_BARRIER;
  ++b->bar_arrived;
  b->bar_count += pred;
  if (!barrier_try_release(f)) switch_away();
  return b->bar_result;
}

// A named barrier (PTX bar.sync / bar.arrive a, b): barrier `id` completes when `count` threads (whole
// warps) have arrived, by either instruction, wherever in the code; bar.sync waits for it, bar.arrive does
// not. The thread that completes it releases the waiters and runs on. Exited threads do not count.
inline void named_barrier(int id, int count, bool wait, const char *name, int line) {
  Fiber *f = g_cur;
  Block *b = g_blk;
  if (id < 1 || id >= kNamedBarriers)
    fail("%s (kernel.cu line %d) with barrier %d: ids 1-%d (0 is __syncthreads's, not emulated here)", name, line, id,
         kNamedBarriers - 1);
  if (count < 32 || count % 32 != 0 || count > g_nthreads)
    fail("%s (kernel.cu line %d) with a count of %d threads: a multiple of 32 up to the block's %d", name, line, count,
         g_nthreads);
  if (b->named_arrived[id] == 0) {
    b->named_count[id] = count;
  } else if (b->named_count[id] != count) {
    fail("%s (kernel.cu line %d): barrier %d is waited for by %d threads here and by %d elsewhere", name, line, id,
         count, b->named_count[id]);
  }
  if (++b->named_arrived[id] == count) {
    b->named_arrived[id] = 0;
    for (int i = 0; i < g_nthreads; ++i) {
      Fiber *o = &b->fib[b->order[i]];
      if (o->state != F_NAMED || o->named_id != id) continue;
      o->state = F_READY;
      q_push(o);
    }
    return;
  }
  if (!wait) return;
  f->state = F_NAMED;
  f->named_id = id;
  switch_away();
}

// A cooperative launch's grid-wide barrier (cooperative_groups::this_grid().sync()).
inline bool grid_try_release(Fiber *self) {
  if (g_grid_arrived == 0 || g_grid_arrived < g_grid_alive) return false;
  g_grid_arrived = 0;
  for (int k = 0; k < g_nblocks; ++k) {
    Block *b = &g_blocks[k];
    for (int i = 0; i < g_nthreads; ++i) {
      Fiber *f = &b->fib[b->order[i]];
      if (f->state != F_GRID) continue;
      f->state = F_READY;
      if (f != self) q_push(f);
    }
  }
  return true;
}
inline void grid_sync() {
  if (!g_cooperative) fail("this_grid().sync() in a launch that is not cooperative (\"cooperative\": true)");
  g_cur->state = F_GRID;
  ++g_grid_arrived;
  if (!grid_try_release(g_cur)) switch_away();
}

// One lane's result of a released warp-level operation (PTX shfl.sync lane rules: segments of
// `width` lanes; a source outside the segment gives the lane its own value).
inline unsigned long long warp_result(const Fiber *base, int lane, unsigned group) {
  const Fiber &f = base[lane];
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l)
    if ((group >> l & 1) && base[l].in) ballot |= 1u << l;
  const unsigned seg = (unsigned)(32 - f.width), b = (unsigned)f.b & 31u;
  const unsigned lo = (unsigned)lane & seg, hi = lo | (31u & ~seg);
  unsigned long long acc = 0;
  int j = lane;
  switch (f.op) {
    case W_SYNC: return 0;
    case W_BALLOT: return ballot;
    case W_ALL: return ballot == group;
    case W_MATCH_ANY:
    case W_MATCH_ALL: {
      unsigned same = 0;
      for (int l = 0; l < 32; ++l)
        if ((group >> l & 1) && base[l].in == f.in) same |= 1u << l;
      return f.op == W_MATCH_ANY ? same : (same == group ? group : 0);
    }
    case W_IDX: j = (int)(lo | (b & ~seg)); break;
    case W_UP: j = lane - (int)b; if (j < (int)lo) j = lane; break;
    case W_DOWN: j = lane + (int)b; if (j > (int)hi) j = lane; break;
    case W_XOR: j = lane ^ (int)b; if (j > (int)hi) j = lane; break;
    default: {  // __reduce_*_sync over 32-bit values (f.b: signed)
      bool first = true;
      for (int l = 0; l < 32; ++l) {
        if (!(group >> l & 1)) continue;
        const unsigned u = (unsigned)base[l].in, a = (unsigned)acc;
        const bool below = f.b ? (int)u < (int)a : u < a, above = f.b ? (int)u > (int)a : u > a;
        if (first) acc = u;
        else if (f.op == W_RED_ADD) acc = (unsigned)(a + u);
        else if (f.op == W_RED_MIN) acc = below ? u : a;
        else if (f.op == W_RED_MAX) acc = above ? u : a;
        else if (f.op == W_RED_AND) acc = a & u;
        else if (f.op == W_RED_OR) acc = a | u;
        else acc = a ^ u;
        first = false;
      }
      return acc;
    }
  }
  return base[j].in;  // a source lane outside the group gives what it last held (undefined on a GPU)
}

inline const char *warp_op_name(const Fiber &f) { return f.op == W_COLLECTIVE ? f.coll_name : kWarpOpNames[f.op]; }

inline bool collective_in(const Fiber *base, unsigned group) {
  for (int l = 0; l < 32; ++l)
    if ((group >> l & 1) && base[l].op == W_COLLECTIVE) return true;
  return false;
}
// A warp-collective instruction (.sync.aligned): every lane of the warp at the same one, none exited.
inline void run_collective(int w, const Fiber *base, unsigned group) {
  int first = 0;
  while (!(group >> first & 1) || base[first].op != W_COLLECTIVE) ++first;
  const Fiber &f = base[first];
  if (group != 0xffffffffu)
    fail("%s (kernel.cu line %d) needs all 32 lanes of warp %d, but lanes 0x%08x have exited", f.coll_name,
         f.coll_line, w, ~group);
  void *lanes[32];
  for (int l = 0; l < 32; ++l) {
    const Fiber &o = base[l];
    if (o.op != W_COLLECTIVE || o.coll_run != f.coll_run || o.coll_line != f.coll_line)
      fail("lanes of warp %d meet at different warp-level operations: lane %d at %s (kernel.cu line %d), lane %d at "
           "%s (line %d; 0: not inline PTX): a warp-collective instruction in divergent code", w, first, f.coll_name,
           f.coll_line, l, warp_op_name(o), o.op == W_COLLECTIVE ? o.coll_line : 0);
    lanes[l] = o.coll_data;
  }
  f.coll_run(lanes);
}

// Release the lanes of warp `w` that wait with `mask` once every live lane of `mask` has arrived.
inline bool warp_try_release(int w, unsigned mask, Fiber *self) {
  Block *blk = g_blk;
  const unsigned group = mask & blk->warp_live[w];
  if (group == 0 || (blk->warp_arrived[w] & group) != group) return false;
  Fiber *base = &blk->fib[w * 32];
  for (int l = 0; l < 32; ++l)
    if ((group >> l & 1) && base[l].mask != mask)
      fail("warp-level operations with different masks meet in warp %d: lane %d passed 0x%08x, lane %d 0x%08x "
           "(%s)", w, l, base[l].mask, self ? self->lin % 32 : -1, mask, warp_op_name(base[l]));
  unsigned long long out[32] = {};
  if (collective_in(base, group)) run_collective(w, base, group);
  else
    for (int l = 0; l < 32; ++l)
      if (group >> l & 1) out[l] = warp_result(base, l, group);
  blk->warp_arrived[w] &= ~group;
  for (int l = 0; l < 32; ++l) {
    if (!(group >> l & 1)) continue;
    base[l].out = out[l];
    base[l].state = F_READY;
    if (&base[l] != self) q_push(&base[l]);
  }
  return true;
}

inline unsigned long long warp_op(int op, unsigned mask, unsigned long long value, int b, int width) {
  Fiber *f = g_cur;
  const int w = f->lin / 32, lane = f->lin % 32;
  if (!(mask >> lane & 1))
    fail("%s with mask 0x%08x, which does not name the calling lane %d", kWarpOpNames[op], mask, lane);
  if (width < 1 || width > 32 || (width & (width - 1)))
    fail("%s with width %d (a power of two up to 32 is needed)", kWarpOpNames[op], width);
  f->op = op;
  f->mask = mask;
  f->in = value;
  f->b = b;
  f->width = width;
  f->state = F_WARP;
  g_blk->warp_arrived[w] |= 1u << lane;
  if (!warp_try_release(w, mask, f)) switch_away();
  return f->out;
}

// A warp-collective instruction (no mask: the whole warp): `run` runs once every lane has arrived.
inline void warp_collective(CollectiveRun run, void *data, const char *name, int line) {
  Fiber *f = g_cur;
  const int w = f->lin / 32;
  f->op = W_COLLECTIVE;
  f->mask = 0xffffffffu;
  f->coll_run = run;
  f->coll_data = data;
  f->coll_name = name;
  f->coll_line = line;
  f->state = F_WARP;
  g_blk->warp_arrived[w] |= 1u << (f->lin % 32);
  if (!warp_try_release(w, 0xffffffffu, f)) switch_away();
}

inline unsigned active_mask() { return g_blk->warp_live[g_cur->lin / 32]; }

// A thread returned from the kernel: it counts as arrived at every barrier from now on.
inline void fiber_finished(Fiber *f) {
  Block *b = f->block;
  f->state = F_DONE;
  f->copies.clear();  // copies no wait covered never land (a missing wait shows as stale shared memory)
  --b->alive;
  const int w = f->lin / 32;
  b->warp_live[w] &= ~(1u << (f->lin % 32));
  barrier_try_release(nullptr);
  for (int l = 0; l < 32; ++l) {
    const Fiber &waiter = b->fib[w * 32 + l];
    if ((b->warp_arrived[w] >> l & 1) && waiter.state == F_WARP) warp_try_release(w, waiter.mask, nullptr);
  }
  if (g_cooperative) {
    --g_grid_alive;
    grid_try_release(nullptr);
  }
}

}  // namespace kg_emu
