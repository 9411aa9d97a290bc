// emu_driver.cpp: main() of every emulation executable, compiled once and linked with each kernel
// (whose translation unit ends with the table kg_emu_kernels, see emu_abi.h). Reads a job (buffers,
// steps), places every buffer against PROT_NONE guard pages, runs the steps (blocks one at a time
// in a shuffled order, one fiber per thread: emu_sched.h), writes the buffers back.
#include "cuda_emu.h"
#include "emu_context.h"

#include <algorithm>
#include <csignal>
#include <cstdarg>
#include <fcntl.h>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

// the sanitizer's options built in: a jailed run cannot read its environment from /proc/self/environ
extern "C" const char *__ubsan_default_options() { return "abort_on_error=1:print_stacktrace=0:print_summary=0"; }

extern "C" unsigned char __start_kg_shared[] __attribute__((weak));  // the static __shared__ variables
extern "C" unsigned char __stop_kg_shared[] __attribute__((weak));

namespace kg_emu {

Block *g_blk = nullptr;
Fiber *g_cur = nullptr;
dim3 g_block_dim, g_grid_dim;
int g_nthreads = 0;
unsigned char *g_dyn_smem = nullptr;
unsigned char *g_static_smem = nullptr;
size_t g_static_smem_bytes = 0, g_dyn_smem_bytes = 0;
Context g_sched_ctx;
bool g_cooperative = false;
Block *g_blocks = nullptr;
int g_nblocks = 0, g_grid_arrived = 0, g_grid_alive = 0;

static const char *const kArgKindNames[] = {"a tensor", "an int32", "an int64", "a float32"};
// ----- guarded buffers ------------------------------------------------------------------------------
constexpr size_t kPage = 4096;
constexpr unsigned char kCanary = 0xA5;  // the accessible slack around a buffer: checked after each launch
struct Buffer {
  std::string name;
  size_t nbytes = 0, offset = 0;
  int fill = -1;  // -1: load from the data file; else every byte (scratch poison)
  unsigned char *map = nullptr, *data = nullptr;
  size_t map_len = 0, pages = 0;
};
static size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }
// [guard page][slack][data, ends on a 16-byte boundary][slack <16][guard page]: the data starts 16-byte aligned
static void place(Buffer &b) {
  const size_t data_len = round_up(b.nbytes ? b.nbytes : 1, 16);
  b.pages = round_up(data_len, kPage);
  b.map_len = b.pages + 2 * kPage;
  void *m = mmap(nullptr, b.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fail("cannot map %zu bytes for '%s'", b.map_len, b.name.c_str());
  b.map = (unsigned char *)m;
  mprotect(b.map, kPage, PROT_NONE);
  mprotect(b.map + kPage + b.pages, kPage, PROT_NONE);
  b.data = b.map + kPage + b.pages - data_len;
  std::memset(b.map + kPage, kCanary, b.pages);
}
static std::string canary_damage(const Buffer &b) {
  const unsigned char *lo = b.map + kPage, *hi = b.map + kPage + b.pages;
  for (const unsigned char *p = lo; p < b.data; ++p)
    if (*p != kCanary) return "wrote " + std::to_string(b.data - p) + " bytes before the start of '" + b.name + "'";
  for (const unsigned char *p = b.data + b.nbytes; p < hi; ++p)
    if (*p != kCanary)
      return "wrote byte " + std::to_string(p - b.data) + " of '" + b.name + "', which has " + std::to_string(b.nbytes) +
             " bytes";
  return "";
}

struct Step {
  bool memset = false;
  int buffer = 0, value = 0;  // memset: bytes [offset, offset + nbytes) of the buffer
  size_t offset = 0, nbytes = 0;
  std::string kernel;
  unsigned grid[3], block[3];
  long long shared_mem = 0;
  bool cooperative = false;
  std::vector<std::pair<ArgKind, std::string>> args;  // kind, "buffer:byte offset" or value
};

std::vector<Buffer> g_buffers;
static std::string g_kernel = "(none)";
static unsigned char *g_stacks = nullptr;  // g_stack_count stacks, each below a PROT_NONE page
static size_t g_stack_bytes = 128 * 1024, g_stack_count = 0;
static Buffer g_dyn_buffer;
static void (*g_call)(const Arg *) = nullptr;
static const Arg *g_call_args = nullptr;

static std::string where() {
  char s[200];
  int n = std::snprintf(s, sizeof s, "kernel %s", g_kernel.c_str());
  if (g_cur) {
    const uint3 b = g_cur->block->idx;
    std::snprintf(s + n, sizeof s - n, ", block (%u,%u,%u), thread (%u,%u,%u)", b.x, b.y, b.z, g_cur->tid.x,
                  g_cur->tid.y, g_cur->tid.z);
  }
  return s;
}

[[noreturn]] void fail(const char *fmt, ...) {
  char msg[1000];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::fflush(stdout);
  std::fprintf(stderr, "KG_EMU_ERROR: %s: %s\n", where().c_str(), msg);
  std::fflush(stderr);
  _exit(3);
}

// ----- faults: name the buffer whose guard page was touched ----------------------------------------
static void on_signal(int sig, siginfo_t *info, void *) {
  const unsigned char *a = (const unsigned char *)info->si_addr;
  std::string what;
  if (sig == SIGSEGV || sig == SIGBUS) {
    std::vector<Buffer *> all;
    for (Buffer &b : g_buffers) all.push_back(&b);
    all.push_back(&g_dyn_buffer);
    for (Buffer *b : all) {
      if (!b->map || a < b->map || a >= b->map + b->map_len) continue;
      const long long off = (long long)(a - b->data);
      what = "out-of-bounds access to '" + b->name + "': byte offset " + std::to_string(off) + " of a buffer of " +
             std::to_string(b->nbytes) + " bytes";
    }
    if (what.empty() && g_stacks && a >= g_stacks && a < g_stacks + g_stack_count * (g_stack_bytes + kPage))
      what = "a thread's stack overflowed (" + std::to_string(g_stack_bytes / 1024) + " KB per thread)";
    if (what.empty() && info->si_code == SI_KERNEL)  // a general-protection fault: no address
      what = "a misaligned vector access (float2/float4/int4 ... need their natural alignment, as on a GPU) or a "
             "non-canonical pointer";
    if (what.empty()) {
      char s[160];
      std::snprintf(s, sizeof s, "invalid memory access at address %p (a wild or misaligned pointer?)", (const void *)a);
      what = s;
    }
  } else if (sig == SIGFPE) {
    what = "arithmetic trap (an integer division by zero?)";
  } else if (sig == SIGABRT) {
    what = "the kernel aborted (a failed assert or __trap)";
  } else {
    what = "signal " + std::to_string(sig);
  }
  std::fprintf(stderr, "KG_EMU_ERROR: %s: %s\n", where().c_str(), what.c_str());
  _exit(4);
}

static void install_handlers() {
  static unsigned char alt[1 << 16];
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL}) sigaction(sig, &sa, nullptr);
}


constexpr int kMaxCooperativeThreads = 1 << 16;
constexpr unsigned char kPoison = 0xCD;  // shared memory and scratch before use: 0xCDCDCDCD is -4.3e8 as a float
static std::vector<Step> g_steps;
static unsigned long long g_seed = 0;


// A fiber's life: the kernel, then it counts as arrived everywhere and hands the OS thread on
// (to the next ready fiber of its block, else to the scheduler). Never resumed.
static void fiber_entry() {
  g_call(g_call_args);
  fiber_finished(g_cur);
  Context dead;
  if (g_blk->q_size > 0) {
    Fiber *next = q_pop(g_blk);
    g_cur = next;
    context_switch(&dead, &next->ctx);
  }
  context_switch(&dead, &g_sched_ctx);
  std::abort();  // unreachable
}

// ----- blocks -----------------------------------------------------------------------------------------
// A launch's slots: one block at a time, or every block of a cooperative launch at once.
static std::vector<Block> g_slots;
static std::vector<Fiber> g_fibers;
static std::vector<int> g_orders;
static std::vector<Fiber *> g_queues;
static std::vector<unsigned char> g_saved_shared;  // cooperative: each block's shared memory, when not running
static size_t g_shared_bytes = 0;  // static __shared__ variables

static void ensure_stacks(size_t count) {
  if (count <= g_stack_count) return;
  const size_t per = g_stack_bytes + kPage;
  if (g_stacks) munmap(g_stacks, per * g_stack_count);
  void *m = mmap(nullptr, per * count, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) fail("cannot map %zu thread stacks", count);
  g_stacks = (unsigned char *)m;
  g_stack_count = count;
  for (size_t i = 0; i < count; ++i) mprotect(g_stacks + i * per, kPage, PROT_NONE);
}

static void init_slots(int nslots) {
  const int lanes = (g_nthreads + 31) / 32 * 32;
  g_slots.assign(nslots, Block{});
  g_fibers.assign((size_t)nslots * lanes, Fiber{});
  g_orders.assign((size_t)nslots * g_nthreads, 0);
  g_queues.assign((size_t)nslots * g_nthreads, nullptr);
  ensure_stacks((size_t)nslots * g_nthreads);
  for (int k = 0; k < nslots; ++k) {
    g_slots[k].fib = &g_fibers[(size_t)k * lanes];
    g_slots[k].order = &g_orders[(size_t)k * g_nthreads];
    g_slots[k].queue = &g_queues[(size_t)k * g_nthreads];
  }
}

// Block `slot` starts as block `idx`: its fibers at the kernel's entry, queued with warps in a random order.
static void start_block(int slot, uint3 idx, std::mt19937_64 &rng) {
  Block &b = g_slots[slot];
  b.idx = idx;
  const int n = g_nthreads, nwarps = (n + 31) / 32;
  int warps[kWarps];
  std::iota(warps, warps + nwarps, 0);
  std::shuffle(warps, warps + nwarps, rng);  // no kernel may rely on an order of warps
  int k = 0;
  for (int w = 0; w < nwarps; ++w)
    for (int l = 0; l < 32 && warps[w] * 32 + l < n; ++l) b.order[k++] = warps[w] * 32 + l;
  const unsigned bx = g_block_dim.x, by = g_block_dim.y;
  for (int i = 0; i < nwarps * 32; ++i) {
    Fiber &f = b.fib[i];
    f.block = &b;
    f.lin = i;
    f.tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
    f.state = i < n ? F_READY : F_DONE;
    f.in = f.out = 0xCDCDCDCDCDCDCDCDull;
    f.mask = 0;
    f.copies.clear();
    f.groups_committed = 0;
    f.named_id = 0;
    if (i < n) context_init(&f.ctx, g_stacks + ((size_t)slot * n + i) * (g_stack_bytes + kPage) + kPage, g_stack_bytes,
                            fiber_entry);
  }
  for (int w = 0; w < nwarps; ++w) {
    const int live = n - w * 32 < 32 ? n - w * 32 : 32;
    b.warp_live[w] = live == 32 ? 0xffffffffu : (1u << live) - 1u;
    b.warp_arrived[w] = 0;
  }
  b.alive = n;
  b.bar_arrived = b.bar_count = 0;
  for (int i = 0; i < kNamedBarriers; ++i) b.named_arrived[i] = b.named_count[i] = 0;
  b.q_head = b.q_size = 0;
  for (int i = 0; i < n; ++i) q_push(&b.fib[b.order[i]]);
}

// Shared memory is one (static section + dynamic buffer): poisoned for each block; a cooperative
// launch keeps each block's copy and swaps it in when the scheduler moves to another block.
static void poison_shared() {
  if (g_shared_bytes) std::memset(__start_kg_shared, kPoison, g_shared_bytes);
  if (g_dyn_buffer.nbytes) std::memset(g_dyn_smem, kPoison, g_dyn_buffer.nbytes);
}
static void swap_shared(int from, int to) {
  const size_t per = g_shared_bytes + g_dyn_buffer.nbytes;
  if (per == 0) return;
  if (from >= 0) {
    unsigned char *save = &g_saved_shared[(size_t)from * per];
    std::memcpy(save, __start_kg_shared, g_shared_bytes);
    std::memcpy(save + g_shared_bytes, g_dyn_smem, g_dyn_buffer.nbytes);
  }
  const unsigned char *load = &g_saved_shared[(size_t)to * per];
  std::memcpy(__start_kg_shared, load, g_shared_bytes);
  std::memcpy(g_dyn_smem, load + g_shared_bytes, g_dyn_buffer.nbytes);
}

static void report_deadlock() {
  int count[F_DONE + 1] = {0};
  Fiber *first = nullptr;
  for (Block &b : g_slots)
    for (int i = 0; i < g_nthreads; ++i) {
      ++count[b.fib[i].state];
      if (!first && b.fib[i].state != F_DONE && b.fib[i].state != F_GRID) first = &b.fib[i];
    }
  g_cur = first;
  fail("deadlock: of %d threads, %d wait at __syncthreads, %d at warp-level operations (%s with mask 0x%08x waits "
       "for lanes that never arrive), %d at the grid barrier, %d at named barriers (bar.sync), %d have exited",
       (int)g_slots.size() * g_nthreads, count[F_BARRIER], count[F_WARP],
       first && first->state == F_WARP ? warp_op_name(*first) : "none", first ? first->mask : 0u, count[F_GRID],
       count[F_NAMED], count[F_DONE]);
}

// Run the slots' fibers until none is ready, staying with one block while it has ready fibers.
static void run_slots() {
  const int nslots = (int)g_slots.size();
  int k = 0, resident = -1;
  for (;;) {
    int pick = -1;
    for (int j = 0; j < nslots && pick < 0; ++j)
      if (g_slots[(k + j) % nslots].q_size > 0) pick = (k + j) % nslots;
    if (pick < 0) break;
    if (nslots > 1 && pick != resident) swap_shared(resident, pick);
    k = resident = pick;
    g_blk = &g_slots[k];
    g_cur = q_pop(g_blk);
    context_switch(&g_sched_ctx, &g_cur->ctx);
  }
  for (const Block &b : g_slots)
    if (b.alive > 0) report_deadlock();
  g_cur = nullptr;
}

static void launch(const Step &s, int index) {
  g_kernel = s.kernel;
  const KernelEntry *entry = nullptr;
  for (int i = 0; i < kg_emu_kernel_count; ++i)
    if (s.kernel == kg_emu_kernels[i].name) entry = &kg_emu_kernels[i];
  if (!entry) fail("the kernel is not in the emulation's table");
  std::vector<Arg> args;
  for (const auto &[kind, text] : s.args) {
    Arg a{kind, nullptr, 0, 0.f};
    if (kind == A_TENSOR) {  // a view: its buffer (the whole storage around it) and where it starts in it
      const size_t colon = text.find(':');
      Buffer &b = g_buffers.at(std::stoul(text.substr(0, colon)));
      const size_t off = colon == std::string::npos ? 0 : std::stoull(text.substr(colon + 1));
      if (off > b.nbytes) fail("a tensor argument at byte %zu of a buffer of %zu bytes", off, b.nbytes);
      a.ptr = b.data + off;
    }
    else if (kind == A_F32) a.f = kg_bits<float>((unsigned)std::stoul(text, nullptr, 16));
    else a.i = std::stoll(text);
    args.push_back(a);
  }
  const Mismatch m = entry->check(args.data(), (int)args.size());
  if (m.index == -1) fail("the kernel takes %d parameters, the plan passes %zu arguments", m.expected, args.size());
  if (m.index >= 0)
    fail("parameter %d is %s, the plan passes %s", m.index, m.what, kArgKindNames[args[m.index].kind]);
  g_call = entry->call;
  g_call_args = args.data();
  g_block_dim = dim3(s.block[0], s.block[1], s.block[2]);
  g_grid_dim = dim3(s.grid[0], s.grid[1], s.grid[2]);
  g_nthreads = (int)(s.block[0] * s.block[1] * s.block[2]);
  if (g_nthreads > kMaxThreads) fail("%d threads per block; at most %d", g_nthreads, kMaxThreads);
  g_dyn_buffer = Buffer{};
  g_dyn_buffer.name = "dynamic shared memory";
  g_dyn_buffer.nbytes = (size_t)s.shared_mem;
  place(g_dyn_buffer);
  g_dyn_smem = g_dyn_buffer.data;
  g_shared_bytes = __start_kg_shared ? (size_t)(__stop_kg_shared - __start_kg_shared) : 0;
  g_static_smem = __start_kg_shared;  // the shared window (emu_ptx.h): the static section, then the dynamic buffer
  g_static_smem_bytes = g_shared_bytes;
  g_dyn_smem_bytes = g_dyn_buffer.nbytes;
  const unsigned long long nblocks = (unsigned long long)s.grid[0] * s.grid[1] * s.grid[2];
  if (nblocks > (1ull << 26)) fail("a grid of %llu blocks is too large to emulate", nblocks);
  std::vector<unsigned> order(nblocks);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(g_seed * 1000003ull + (unsigned long long)index);
  std::shuffle(order.begin(), order.end(), rng);  // no kernel may rely on an order of blocks
  auto block_index = [&](unsigned b) { return uint3{b % s.grid[0], (b / s.grid[0]) % s.grid[1], b / (s.grid[0] * s.grid[1])}; };
  g_cooperative = s.cooperative;
  if (g_cooperative) {  // every block at once: a grid barrier needs them all
    if (nblocks * g_nthreads > kMaxCooperativeThreads)
      fail("a cooperative grid of %llu threads is too large to emulate (at most %d)", nblocks * g_nthreads,
           kMaxCooperativeThreads);
    init_slots((int)nblocks);
    g_saved_shared.assign(nblocks * (g_shared_bytes + g_dyn_buffer.nbytes), kPoison);
    for (unsigned k = 0; k < nblocks; ++k) start_block((int)k, block_index(order[k]), rng);
    g_blocks = g_slots.data();
    g_nblocks = (int)nblocks;
    g_grid_alive = (int)(nblocks * g_nthreads);
    g_grid_arrived = 0;
    run_slots();
  } else {
    init_slots(1);
    for (unsigned b : order) {
      start_block(0, block_index(b), rng);
      poison_shared();
      run_slots();
    }
  }
  const std::string smem_damage = canary_damage(g_dyn_buffer);
  if (!smem_damage.empty()) fail("%s (an out-of-bounds write within the 16-byte padding)", smem_damage.c_str());
  munmap(g_dyn_buffer.map, g_dyn_buffer.map_len);
  g_dyn_buffer = Buffer{};
  g_dyn_smem = nullptr;
  g_dyn_smem_bytes = 0;
  for (const Buffer &b : g_buffers) {
    const std::string damage = canary_damage(b);
    if (!damage.empty()) fail("%s (an out-of-bounds write within the 16-byte padding)", damage.c_str());
  }
}

static void read_job(const char *path) {
  std::ifstream in(path);
  std::string word;
  while (in >> word) {
    if (word == "seed") {
      in >> g_seed;
    } else if (word == "stack_kb") {
      in >> g_stack_bytes;
      g_stack_bytes = round_up(g_stack_bytes * 1024, kPage);
    } else if (word == "buffer") {
      Buffer b;
      in >> b.name >> b.nbytes >> b.offset >> b.fill;
      g_buffers.push_back(b);
    } else if (word == "memset") {
      Step s;
      s.memset = true;
      in >> s.buffer >> s.value >> s.offset >> s.nbytes;
      g_steps.push_back(s);
    } else if (word == "launch") {
      Step s;
      int nargs = 0;
      in >> s.kernel >> s.grid[0] >> s.grid[1] >> s.grid[2] >> s.block[0] >> s.block[1] >> s.block[2] >> s.shared_mem >>
          s.cooperative >> nargs;
      for (int i = 0; i < nargs; ++i) {
        std::string kind, value;
        in >> kind >> value;
        const ArgKind k = kind == "t" ? A_TENSOR : kind == "i32" ? A_I32 : kind == "i64" ? A_I64 : A_F32;
        s.args.emplace_back(k, value);
      }
      g_steps.push_back(s);
    } else {
      fail("unreadable job file (at '%s')", word.c_str());
    }
  }
}

}  // namespace kg_emu

int main(int argc, char **argv) {
  using namespace kg_emu;
  if (argc != 3) return 2;
  install_handlers();
  read_job(argv[1]);
  const int fd = open(argv[2], O_RDWR);
  struct stat st{};
  if (fd < 0 || fstat(fd, &st) != 0) fail("cannot open the data file %s", argv[2]);
  unsigned char *file = st.st_size ? (unsigned char *)mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                   : nullptr;
  for (Buffer &b : g_buffers) {
    place(b);
    if (b.fill < 0) std::memcpy(b.data, file + b.offset, b.nbytes);
    else std::memset(b.data, b.fill, b.nbytes);
  }
  for (size_t i = 0; i < g_steps.size(); ++i) {
    const Step &s = g_steps[i];
    if (s.memset) {
      Buffer &b = g_buffers.at(s.buffer);
      if (s.offset + s.nbytes > b.nbytes) fail("a memset past the end of '%s'", b.name.c_str());
      std::memset(b.data + s.offset, s.value, s.nbytes);
    }
    else launch(s, (int)i);
  }
  for (const Buffer &b : g_buffers)
    if (b.fill < 0) std::memcpy(file + b.offset, b.data, b.nbytes);
  std::fflush(stdout);
  return 0;
}
