"""Every kernel the GPU tier evaluates: correct ones (positive controls) and the cheats of the
brief's list ("Known ways generated kernels cheat a harness", numbered as there).

A :class:`Case` is a KernelSpec plus the problem it is bound to and what the compile stage must
make of it. ``tests/harness/test_kernel_sources_compile.py`` compiles all of them on the CPU (NVRTC), so a
typo here fails CI before any GPU time is spent; the GPU tests assert the harness's verdicts.

Problems are the built-ins at small shapes (the whole GPU tier runs in a few minutes):
softmax ``x`` (rows, cols) over dim 1; gelu ``x`` (any shape, elementwise, inputs ~ 3*randn);
matmul ``A`` (M, K) @ ``B`` (K, N); layernorm ``x`` over the last 3 dims with ``ln.weight`` and
``ln.bias``; rmsnorm ``x`` bf16 with a bf16 ``weight``, eps 1e-6. The output is ``out``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef

SOFTMAX = ProblemRef(source="softmax", shape=(256, 1000))
SOFTMAX_WIDE = ProblemRef(source="softmax", shape=(256, 4096))
GELU = ProblemRef(source="gelu", shape=(999, 1001))  # 999999 elements: not a multiple of 4
MATMUL = ProblemRef(source="matmul", shape=(512, 512, 512))
LAYERNORM = ProblemRef(source="layernorm", shape=(8, 4, 32, 32))
RMSNORM = ProblemRef(source="rmsnorm", shape=(256, 1024))

CHEAT_PROBLEMS = Path(__file__).resolve().parent.parent / "data" / "cheat_problems"
DEGENERATE = ProblemRef(source=str(CHEAT_PROBLEMS / "degenerate.py"))


@dataclass(frozen=True)
class Case:
    name: str
    problem: ProblemRef
    spec: KernelSpec
    nvrtc_ok: bool = True  # False: NVRTC itself must refuse the source
    forbidden: bool = False  # NVRTC compiles it; the harness's module check must refuse it


CASES: dict[str, Case] = {}


def case(name: str) -> Case:
    return CASES[name]


def _add(name: str, problem: ProblemRef, source: str, steps: list, *, nvrtc_ok: bool = True,
         forbidden: bool = False, **spec: object) -> None:
    assert name not in CASES, name
    model = KernelSpec.model_validate({"name": name, "source": source.strip() + "\n", "steps": steps, **spec})
    CASES[name] = Case(name, problem, model, nvrtc_ok=nvrtc_ok, forbidden=forbidden)


def launch(kernel: str, grid: list, block: list, *args: object, shared_mem: object = 0) -> dict:
    """A launch step; a str argument binds a tensor by name, a dict is a scalar (see I32...)."""
    bound = [{"name": a} if isinstance(a, str) else a for a in args]
    return {"op": "launch", "kernel": kernel, "grid": grid, "block": block, "shared_mem": shared_mem, "args": bound}


def memset(tensor: str, value: int = 0) -> dict:
    return {"op": "memset", "tensor": tensor, "value": value}


def I32(value: object) -> dict:
    return {"kind": "int32", "value": value}


def I64(value: object) -> dict:
    return {"kind": "int64", "value": value}


def F32(value: object) -> dict:
    return {"kind": "float32", "value": value}


# =============================================================================================
# GELU (elementwise): most cheats are a few lines around this kernel
# =============================================================================================
GELU_F = r"""
// exact GELU, as torch.nn.functional.gelu(x) (approximate="none")
__device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
"""


def _gelu_source(comment: str, body: str, params: str = "const float* x, float* out, long long n") -> str:
    return f"""{GELU_F}
// {comment}
extern "C" __global__ void gelu({params}) {{
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
{body}
}}"""


def _gelu_steps(*extra: object) -> list:
    return [launch("gelu", ["cdiv(x.numel, 256)"], [256], "x", "out", I64("x.numel"), *extra)]


def _gelu(name: str, comment: str, body: str, *extra: object, params: str | None = None, prelude: str = "",
          **kw: object) -> None:
    src = _gelu_source(comment, body, params) if params else _gelu_source(comment, body)
    _add(name, GELU, prelude + src, _gelu_steps(*extra), **kw)


_gelu("gelu_ok", "Correct: one element per thread.", "  if (i < n) out[i] = gelu_f(x[i]);")

# --- cheat 1 / 11: the output must be written, and it must be checked ------------------------
_gelu("gelu_writes_nothing", "Cheat 1: writes nothing, hoping the output buffer still holds the reference's result.",
      "  (void)i; (void)x; (void)out; (void)n;")
_gelu("gelu_constant", "Cheat 11: writes a constant that matches nothing (proves the output is compared).",
      "  if (i < n) out[i] = 0.5f;")
_gelu("gelu_zeros", "Cheat 11: writes gelu(0) = 0 everywhere: passes only if the inputs were zeros.",
      "  if (i < n) out[i] = 0.0f;")

# --- cheat 2: inputs must stay unchanged ----------------------------------------------------
_gelu("gelu_zeroes_input", "Cheat 2: correct output, then zeroes the input (a later reference would agree with 0).",
      "  if (i < n) { out[i] = gelu_f(x[i]); x[i] = 0.0f; }", params="float* x, float* out, long long n")

# --- cheat 3 / 4 / 8: state that survives across calls is forbidden -------------------------
_gelu("gelu_cache_by_pointer", "Cheat 4: caches results in __device__ memory keyed by the input pointer.",
      """  if (i >= n) return;
  if (i < 4096 && cached_x == x) { out[i] = cache[i]; return; }
  float v = gelu_f(x[i]);
  out[i] = v;
  if (i < 4096) cache[i] = v;
  if (i == 0) cached_x = x;""", prelude="__device__ const float* cached_x;\n__device__ float cache[4096];\n", forbidden=True)


def _stateful(name: str, comment: str, decl: str, counter: str) -> None:
    """A call counter in persistent device memory: do the work on every other call only
    (cheat 8: behave differently when checked; cheat 3: deferred work needs the same state)."""
    body = f"""  unsigned int calls = atomicAdd({counter}, i == 0 ? 1u : 0u);  // every thread reads it; thread 0 counts
  if (i < n) out[i] = (calls % 2 == 0) ? gelu_f(x[i]) : out[i];"""
    _add(name, GELU, decl.strip() + "\n" + _gelu_source(comment, body), _gelu_steps(), forbidden=True)


_stateful("gelu_call_counter", "Cheat 8: counts calls in a __device__ global (works only every other call).",
          "__device__ unsigned int n_calls;", "&n_calls")
_stateful("gelu_static_counter", "Cheat 8: the counter as a static __device__ variable.",
          "static __device__ unsigned int n_calls;", "&n_calls")
_stateful("gelu_macro_counter", "Cheat 8: __device__ hidden behind a macro (defeats a text scan).",
          "#define PERSISTENT __device__\nPERSISTENT unsigned int n_calls;", "&n_calls")
_stateful("gelu_managed_counter", "Cheat 8: the counter in __managed__ memory.",
          "__managed__ unsigned int n_calls;", "&n_calls")
_stateful("gelu_const_cast_counter", "Cheat 8: a 'const' __device__ table written through a cast.",
          "__device__ const unsigned int n_calls[1] = {0u};", "(unsigned int*)n_calls")
_stateful("gelu_disguised_counter", "Cheat 8: the counter named like the CUDA math library's own table.",
          "__device__ unsigned int __cudart_i2opi_f[6] = {2u, 4u, 6u, 8u, 10u, 12u};", "&__cudart_i2opi_f[0]")
_stateful("gelu_string_literal_counter", "Cheat 8: a string literal cast to writable memory as the counter.",
          '#define N_CALLS ((unsigned int*)(void*)"\\x02\\x04\\x06\\x08\\x0a\\x0c\\x0e\\x10")', "N_CALLS")
_stateful("gelu_inline_ptx_counter", "Cheat 8: a .global variable declared in inline PTX (no __device__ anywhere).",
          """__device__ __forceinline__ unsigned int* ptx_counter() {
  unsigned long long p;
  asm volatile("{\\n\\t.global .align 4 .u32 hidden_calls;\\n\\tmov.u64 %0, hidden_calls;\\n\\t}" : "=l"(p));
  return (unsigned int*)p;
}""", "ptx_counter()")

_gelu("gelu_deferred", "Cheat 3: writes the previous call's result (work deferred to the next call) from __device__ memory.",
      """  if (i >= n) return;
  out[i] = i < 4096 ? pending[i] : gelu_f(x[i]);
  if (i < 4096) pending[i] = gelu_f(x[i]);""", prelude="__device__ float pending[4096];\n", forbidden=True)

_gelu("gelu_device_malloc_cache", "Cheat 4: the device heap survives across launches: a cache with no __device__ variable.",
      """  if (i >= n) return;
  float* heap = (float*)malloc(16);  // the same address call after call, holding what the last call left
  if (heap != nullptr) { heap[0] = gelu_f(x[i]); out[i] = heap[0]; free(heap); } else { out[i] = gelu_f(x[i]); }""",
      forbidden=True)

_add("gelu_dynamic_parallelism", GELU, GELU_F + r"""
// Cheat 3: work escaping the timed region: a device-side launch of a child grid.
extern "C" __global__ void gelu_child(const float* x, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = gelu_f(x[i]);
}
extern "C" __global__ void gelu(const float* x, float* out, long long n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) gelu_child<<<(unsigned)((n + 255) / 256), 256>>>(x, out, n);
}""", _gelu_steps(), nvrtc_ok=False)

# --- cheat 5: precision ---------------------------------------------------------------------
_add("gelu_tanh_approx", GELU, r"""
// Cheat 5: the tanh approximation of GELU (max error ~5e-4): must fail an fp32 check at 1e-4.
extern "C" __global__ void gelu(const float* x, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float v = x[i]; out[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))); }
}""", _gelu_steps())

# --- cheat 6: partial writes ----------------------------------------------------------------
_gelu("gelu_first_half", "Cheat 6: writes only the first half of the output.", "  if (i < n / 2) out[i] = gelu_f(x[i]);")
_gelu("gelu_only_sampled", "Cheat 6: real values only where a sampling check might look (every 64th); the input elsewhere.",
      "  if (i < n) out[i] = (i % 64 == 0) ? gelu_f(x[i]) : x[i];")

# --- cheat 7: out-of-bounds writes and reads ------------------------------------------------
_OOB_WRITE = "  if (i < n) out[i] = gelu_f(x[i]);\n  if (i == 0) out[offset] = 0.0f;"
_OOB_PARAMS = "const float* x, float* out, long long n, long long offset"
_gelu("gelu_write_past_end", "Cheat 7: correct, plus one write just past the end of the output (offset = n).",
      _OOB_WRITE, I64("x.numel"), params=_OOB_PARAMS)
_gelu("gelu_write_before_start", "Cheat 7: correct, plus one write just before the output (offset = -1).",
      _OOB_WRITE, I64(-1), params=_OOB_PARAMS)
_gelu("gelu_read_past_end", "Cheat 7: the last element reads x[n], one past the end of the input (an off-by-one).",
      "  if (i < n) out[i] = gelu_f(x[i == n - 1 ? n : i]);")

# --- cheat 8: behave differently when checked than when timed -------------------------------
_gelu("gelu_skip_unless_nan", "Cheat 8: works only where the output still holds NaN poison, trusting stale results elsewhere.",
      "  if (i < n && out[i] != out[i]) out[i] = gelu_f(x[i]);")
_gelu("gelu_skip_on_fill_patterns", "Cheat 8: skips the work when the output holds a byte-fill pattern (0xFF.. or 0x7F..).",
      """  if (i >= n) return;
  unsigned int bits = __float_as_uint(out[i]);
  if (bits == 0xFFFFFFFFu || bits == 0x7F7F7F7Fu) return;
  out[i] = gelu_f(x[i]);""")

# The timed loop poisons scratch with one byte (0xFF.. or 0x7F..), the check with random bits: a
# kernel can tell them apart. It is correct while checked and wrong while timed: only the
# verification of the timed outputs sees it (timed_output_mismatch).
_gelu("gelu_wrong_when_timed", "Cheat 8: correct unless its scratch word holds a byte-fill pattern (the timed loop's).",
      """  if (i >= n) return;
  unsigned int p = probe[0];
  out[i] = (p == 0xFFFFFFFFu || p == 0x7F7F7F7Fu) ? 0.0f : gelu_f(x[i]);""",
      "probe", params="const float* x, float* out, long long n, const unsigned int* probe",
      scratch=[{"name": "probe", "dtype": "int32", "size": 1}])
# Correct only while every run starts from fresh scratch: a second launch leaves a mark there, and a run that finds
# the mark doubles its output. The check poisons scratch before every run (and the timed loop before every call),
# so the mark is never seen and the kernel is ok; a harness that let scratch carry over would call it a mismatch.
_add("gelu_marks_scratch", GELU, GELU_F + """
// Correct while its scratch is fresh on every run: leave_mark writes a word that gelu doubles its output on.
extern "C" __global__ void gelu(const float* x, float* out, long long n, const unsigned int* mark) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = mark[0] == 0x5EED5EEDu ? 2.0f * gelu_f(x[i]) : gelu_f(x[i]);
}
extern "C" __global__ void leave_mark(unsigned int* mark) { mark[0] = 0x5EED5EEDu; }""",
     [*_gelu_steps("mark"), launch("leave_mark", [1], [1], "mark")], scratch=[{"name": "mark", "dtype": "int32", "size": 1}])
# Reads its own output before writing it (uninitialized memory): what the poison left there moves
# element 0 by 0.9 of the tolerance, up or down. Each run alone matches the reference; the two
# runs of one input set disagree by 1.8 tolerances (nondeterministic).
_gelu("gelu_uninit_read", "Cheat 7: element 0 depends on what the output held before the run (within tolerance).",
      """  if (i >= n) return;
  float v = gelu_f(x[i]);
  if (i == 0) {
    float tol = 1e-4f + 1e-4f * fabsf(v);
    v += (out[0] != out[0]) ? 0.9f * tol : -0.9f * tol;
  }
  out[i] = v;""")
# A far write: zeroes its input AND the harness's pristine copy of it (at byte distance ``delta``
# from the input, which a GPU test learns from the allocator and passes in), and writes gelu(0) = 0:
# a reference run on the zeroed copy would agree. Only the seal on the pristine copy sees it.
_gelu("gelu_far_write_pristine", "Cheat 2 by a far write: zeroes the input and the harness's pristine copy of it.",
      """  if (i >= n) return;
  out[i] = 0.0f;
  x[i] = 0.0f;
  *(float*)((char*)(x + i) + delta) = 0.0f;""", I64(0), params="float* x, float* out, long long n, long long delta")

# --- cheat 12: hangs and crashes ------------------------------------------------------------
_gelu("gelu_hang", "Bug 12: one thread never finishes; everything else is correct.",
      "  if (i == 0) for (;;) __nanosleep(1000);\n  if (i < n) out[i] = gelu_f(x[i]);")
_gelu("gelu_trap", "Bug 12: a device-side trap.", "  if (i == 0) __trap();\n  if (i < n) out[i] = gelu_f(x[i]);")
_BAD_STORE = """  if (i == 0) {
    char* base = absolute ? (char*)0 : (char*)out;
    *(volatile float*)(base + offset) = 1.0f;
  }
  if (i < n) out[i] = gelu_f(x[i]);"""
_BAD_STORE_PARAMS = "const float* x, float* out, long long n, long long offset, int absolute"
_BAD_STORE_COMMENT = "Bug 12: thread 0 stores to base + offset (base: out, or address 0 when absolute != 0)."
for _name, _offset, _absolute in (
    ("gelu_null_store", 0, 1),  # a write to address 0
    ("gelu_far_store", "1 << 42", 0),  # 4 TiB past the output: unmapped
    ("gelu_misaligned_store", 1, 0),  # a 4-byte store to an odd address
):
    _gelu(_name, _BAD_STORE_COMMENT, _BAD_STORE, I64(_offset), I32(_absolute), params=_BAD_STORE_PARAMS)

# --- positive controls ----------------------------------------------------------------------
# A grid-wide barrier: phase 1 writes x reversed into scratch, phase 2 reads it back reversed, so
# every block reads what other blocks wrote. Correct only if the barrier holds, which needs every
# block resident at once: the launch is cooperative. The counter lives in scratch (poisoned before
# each call), so a memset step zeroes it first.
_GRID_BARRIER = GELU_F + r"""
// {comment}
__device__ __forceinline__ void grid_barrier(unsigned int *count) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1u);
    unsigned int seen;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory"); } while (seen < gridDim.x);
  }
  __syncthreads();
}
extern "C" __global__ void gelu_grid(const float* x, float* out, float* tmp, unsigned int* count, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) tmp[n - 1 - i] = x[i];
  grid_barrier(count);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = gelu_f(tmp[n - 1 - i]);
}"""
_GRID_SCRATCH = [{"name": "tmp", "dtype": "float32", "size": "x.numel"}, {"name": "count", "dtype": "int32", "size": 1}]


def _coop(kernel: str, grid: list, block: list, *args: object) -> dict:
    return {**launch(kernel, grid, block, *args), "cooperative": True}


_add("gelu_grid_barrier", GELU, _GRID_BARRIER.replace("{comment}", "Correct: a grid-wide barrier under a cooperative launch."),
     [memset("count"), _coop("gelu_grid", [132], [256], "x", "out", "tmp", "count", I64("x.numel"))],
     scratch=_GRID_SCRATCH)
# The same kernel on a grid that can never be resident at once: the harness refuses the launch
# (cupy would shrink the grid, and the grid-stride loops would still pass on the smaller one).
_add("gelu_grid_too_large", GELU, _GRID_BARRIER.replace("{comment}", "Bug: a cooperative grid that cannot be resident."),
     [memset("count"), _coop("gelu_grid", [1 << 20], [1024], "x", "out", "tmp", "count", I64("x.numel"))],
     scratch=_GRID_SCRATCH)

_add("gelu_vec4", GELU, GELU_F + r"""
// Correct: float4 loads and stores (the harness must keep buffers 16-byte aligned), a scalar tail.
extern "C" __global__ void gelu_vec4(const float* x, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long n4 = n / 4;
  if (i < n4) {
    float4 v = reinterpret_cast<const float4*>(x)[i];
    v.x = gelu_f(v.x); v.y = gelu_f(v.y); v.z = gelu_f(v.z); v.w = gelu_f(v.w);
    reinterpret_cast<float4*>(out)[i] = v;
  }
  if (i < n - n4 * 4) out[n4 * 4 + i] = gelu_f(x[n4 * 4 + i]);  // the tail: at most 3 elements
}""", [launch("gelu_vec4", ["cdiv(cdiv(x.numel, 4), BLOCK)"], ["BLOCK"], "x", "out", I64("x.numel"))],
     tunables={"BLOCK": [128, 256, 512]}, defaults={"BLOCK": 256})

_add("gelu_constant_table", GELU, r"""
// Correct: coefficients in __constant__ memory (read-only: must NOT be rejected as a global).
__constant__ float kCoef[2] = {0.5f, 0.70710678118654752f};
extern "C" __global__ void gelu(const float* x, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float v = x[i]; out[i] = kCoef[0] * v * (1.0f + erff(v * kCoef[1])); }
}""", _gelu_steps())

# =============================================================================================
# Softmax over dim 1: a naive 3-pass kernel, one block of BLOCK threads per row
# =============================================================================================
REDUCE = r"""
#ifndef BLOCK
#error "BLOCK comes from the tunables (-DBLOCK=...)"
#endif
#define NEG_INF __int_as_float(0xff800000)
// block-wide max or sum through shared memory (BLOCK is a power of two)
__device__ float block_reduce(float v, float* s, bool take_max) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int k = BLOCK / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] = take_max ? fmaxf(s[threadIdx.x], s[threadIdx.x + k]) : s[threadIdx.x] + s[threadIdx.x + k];
    __syncthreads();
  }
  float r = s[0];
  __syncthreads();
  return r;
}
"""

REDUCE_RACY = r"""
#define NEG_INF __int_as_float(0xff800000)
// Cheat 7 (race): the same tree reduction WITHOUT __syncthreads: warp 0 reads slots the other
// warps have not written yet (stale shared memory). The sleep only makes the bad order certain.
__device__ float block_reduce(float v, float* s, bool take_max) {
  if (threadIdx.x >= 32) __nanosleep(4000);
  s[threadIdx.x] = v;
  for (int k = BLOCK / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] = take_max ? fmaxf(s[threadIdx.x], s[threadIdx.x + k]) : s[threadIdx.x] + s[threadIdx.x + k];
  }
  return s[0];
}
"""


def _softmax_source(comment: str, *, store: str = "yr[c] = expf(xr[c] - m) / sum;", head: str = "",
                    x_type: str = "const float*", reduce: str = REDUCE, prefix: str = "") -> str:
    return f"""{prefix}{reduce}
// {comment}
extern "C" __global__ void softmax({x_type} x, float* out, int cols) {{
  __shared__ float s[BLOCK];
  if (blockDim.x != BLOCK) __trap();  // the plan's block and the -D value must agree
{head}  {x_type} xr = x + (size_t)blockIdx.x * cols;
  float* yr = out + (size_t)blockIdx.x * cols;
  float m = NEG_INF;
  for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, xr[c]);
  m = block_reduce(m, s, true);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK) sum += expf(xr[c] - m);
  sum = block_reduce(sum, s, false);
  for (int c = threadIdx.x; c < cols; c += BLOCK) {store}
}}"""


SOFTMAX_STEPS = [launch("softmax", ["x.shape[0]"], ["BLOCK"], "x", "out", I32("x.shape[1]"))]
FIXED_BLOCK = {"tunables": {"BLOCK": [256]}}

_add("softmax_ok", SOFTMAX, _softmax_source("Correct: naive 3-pass softmax (max, sum, write)."), SOFTMAX_STEPS,
     tunables={"BLOCK": [32, 64, 128, 256, 512, 1024]}, defaults={"BLOCK": 256})
_add("softmax_in_place", SOFTMAX, _softmax_source(
    "Cheat 2: computes in place in the input, then copies to the output.",
    store="{ xr[c] = expf(xr[c] - m) / sum; yr[c] = xr[c]; }", x_type="float*"), SOFTMAX_STEPS, **FIXED_BLOCK)
_add("softmax_even_rows", SOFTMAX, _softmax_source(
    "Cheat 6: only every other row is computed.", head="  if (blockIdx.x % 2) return;\n"), SOFTMAX_STEPS, **FIXED_BLOCK)
_add("softmax_race", SOFTMAX, _softmax_source(
    "Cheat 7: a reduction with a race (see block_reduce).", reduce=REDUCE_RACY.replace("#define NEG_INF", "#ifndef BLOCK\n#error BLOCK\n#endif\n#define NEG_INF")),
     SOFTMAX_STEPS, **FIXED_BLOCK)
_add("softmax_bf16_output", SOFTMAX_WIDE, _softmax_source(
    "Cheat 5: results rounded through bf16 (rel. error ~2e-3): output values ~1e-4 hide inside atol=1e-4.",
    store="yr[c] = __bfloat162float(__float2bfloat16(expf(xr[c] - m) / sum));", prefix="#include <cuda_bf16.h>\n"),
     [launch("softmax", ["x.shape[0]"], ["BLOCK"], "x", "out", I32("x.shape[1]"))], **FIXED_BLOCK)

# the same downgrade spelled with bit operations (no bf16 header: the CPU emulator runs it too)
_BF16_BITS = "#define BF16(v) __uint_as_float((__float_as_uint(v) + 0x8000u) & 0xFFFF0000u)\n"
_add("softmax_bf16_bits", SOFTMAX_WIDE, _softmax_source(
    "Cheat 5: results rounded to bf16 by bit operations: within atol=1e-4, past the relative-error limit.",
    store="yr[c] = BF16(expf(xr[c] - m) / sum);", prefix=_BF16_BITS), SOFTMAX_STEPS, **FIXED_BLOCK)

# --- a plan of several launches, scratch buffers, a memset, atomics ---------------------------
SOFTMAX_MULTI = REDUCE + r"""
// Correct: softmax in three launches through scratch buffers: the row max; exp-sums of CHUNKS
// column chunks added atomically into rsum (zeroed by a memset step of the plan); normalisation.
extern "C" __global__ void row_max(const float* x, float* rmax, int cols) {
  __shared__ float s[BLOCK];
  const float* xr = x + (size_t)blockIdx.x * cols;
  float m = NEG_INF;
  for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, xr[c]);
  m = block_reduce(m, s, true);
  if (threadIdx.x == 0) rmax[blockIdx.x] = m;
}
extern "C" __global__ void row_expsum(const float* x, const float* rmax, float* rsum, int cols) {
  __shared__ float s[BLOCK];
  int row = blockIdx.y, chunk = (cols + gridDim.x - 1) / gridDim.x;
  int c0 = blockIdx.x * chunk, c1 = min(cols, c0 + chunk);
  const float* xr = x + (size_t)row * cols;
  float sum = 0.0f;
  for (int c = c0 + threadIdx.x; c < c1; c += BLOCK) sum += expf(xr[c] - rmax[row]);
  sum = block_reduce(sum, s, false);
  if (threadIdx.x == 0) atomicAdd(&rsum[row], sum);
}
extern "C" __global__ void normalize(const float* x, const float* rmax, const float* rsum, float* out, int cols) {
  int row = blockIdx.y, c = blockIdx.x * BLOCK + threadIdx.x;
  if (c < cols) out[(size_t)row * cols + c] = expf(x[(size_t)row * cols + c] - rmax[row]) / rsum[row];
}
"""
_MULTI_SCRATCH = [{"name": "rmax", "size": "x.shape[0]"}, {"name": "rsum", "size": "x.shape[0]"}]
_MULTI_STEPS = [
    launch("row_max", ["x.shape[0]"], ["BLOCK"], "x", "rmax", I32("x.shape[1]")),
    memset("rsum", 0),
    launch("row_expsum", ["CHUNKS", "x.shape[0]"], ["BLOCK"], "x", "rmax", "rsum", I32("x.shape[1]")),
    launch("normalize", ["cdiv(x.shape[1], BLOCK)", "x.shape[0]"], ["BLOCK"], "x", "rmax", "rsum", "out", I32("x.shape[1]")),
]
_add("softmax_multi_launch", SOFTMAX, SOFTMAX_MULTI, _MULTI_STEPS, scratch=_MULTI_SCRATCH,
     tunables={"BLOCK": [128, 256], "CHUNKS": [1, 4]}, defaults={"BLOCK": 256, "CHUNKS": 4})
_add("softmax_multi_no_memset", SOFTMAX, SOFTMAX_MULTI.replace("// Correct:", "// Cheat 7: the memset step is gone: relies on scratch being zero. Otherwise:"),
     [s for s in _MULTI_STEPS if s["op"] != "memset"], scratch=_MULTI_SCRATCH,
     tunables={"BLOCK": [256], "CHUNKS": [4]})

# =============================================================================================
# Matmul fp32: a tiled FFMA kernel and split-K with atomics
# =============================================================================================
MATMUL_SRC = r"""
#ifndef TILE
#define TILE 16
#endif
#ifndef ROUND
#define ROUND(v) (v)  // the honest kernel keeps fp32 operands
#endif
// Correct: tiled fp32 matmul (FFMA), C[M,N] = A[M,K] @ B[K,N], TILE x TILE threads per block;
// blockIdx.z sums the K slice [z*chunk, (z+1)*chunk) and, with several slices, adds atomically.
__device__ float tile_product(const float* A, const float* B, int M, int N, int K, int kbeg, int kend) {
  __shared__ float As[TILE][TILE], Bs[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int k0 = kbeg; k0 < kend; k0 += TILE) {
    As[ty][tx] = (row < M && k0 + tx < kend) ? ROUND(A[(size_t)row * K + k0 + tx]) : 0.0f;
    Bs[ty][tx] = (k0 + ty < kend && col < N) ? ROUND(B[(size_t)(k0 + ty) * N + col]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  return acc;
}
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
  float acc = tile_product(A, B, M, N, K, 0, K);
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
extern "C" __global__ void matmul_splitk(const float* A, const float* B, float* C, int M, int N, int K) {
  int chunk = (K + gridDim.z - 1) / gridDim.z, kbeg = blockIdx.z * chunk;
  float acc = tile_product(A, B, M, N, K, kbeg, min(K, kbeg + chunk));
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  if (row < M && col < N) atomicAdd(&C[(size_t)row * N + col], acc);
}
"""
_MM_ARGS = ("A", "B", "out", I32("A.shape[0]"), I32("B.shape[1]"), I32("A.shape[1]"))
MATMUL_STEPS = [launch("matmul", ["cdiv(B.shape[1], TILE)", "cdiv(A.shape[0], TILE)"], ["TILE", "TILE"], *_MM_ARGS)]
SPLITK_STEPS = [memset("out", 0),
                launch("matmul_splitk", ["cdiv(B.shape[1], TILE)", "cdiv(A.shape[0], TILE)", "SPLITK"], ["TILE", "TILE"], *_MM_ARGS)]

_add("matmul_tiled", MATMUL, MATMUL_SRC, MATMUL_STEPS, tunables={"TILE": [8, 16, 32]}, defaults={"TILE": 16})
_add("matmul_splitk_atomic", MATMUL, MATMUL_SRC, SPLITK_STEPS, tunables={"TILE": [16], "SPLITK": [4]})
_add("matmul_splitk_no_memset", MATMUL, "// Cheat 7: atomics into an output never zeroed (no memset step).\n" + MATMUL_SRC,
     SPLITK_STEPS[1:], tunables={"TILE": [16], "SPLITK": [4]})
_add("matmul_bf16_operands", MATMUL, """// Cheat 5: operands rounded through bf16 before the fp32 FFMA (a tensor-core-style downgrade).
#include <cuda_bf16.h>
#define ROUND(v) __bfloat162float(__float2bfloat16(v))
""" + MATMUL_SRC, MATMUL_STEPS, tunables={"TILE": [16]})
_add("matmul_bf16_bits", MATMUL, "// Cheat 5: operands rounded to bf16 by bit operations before the fp32 FFMA.\n"
     + _BF16_BITS + "#define ROUND(v) BF16(v)\n" + MATMUL_SRC, MATMUL_STEPS, tunables={"TILE": [16]})
_add("matmul_fp16_operands", MATMUL, """// Cheat 5: operands rounded through fp16 before the fp32 FFMA.
#include <cuda_fp16.h>
#define ROUND(v) __half2float(__float2half(v))
""" + MATMUL_SRC, MATMUL_STEPS, tunables={"TILE": [16]})

# =============================================================================================
# LayerNorm over the last 3 dims (weight/bias ln.weight, ln.bias), RMSNorm bf16
# =============================================================================================
LAYERNORM_SRC = REDUCE + r"""
// Correct: one block per sample; two passes (mean, then variance), eps 1e-5, affine.
extern "C" __global__ void layernorm(const float* x, WEIGHT_T* w, WEIGHT_T* b, float* out, long long d, float eps) {
  __shared__ float s[BLOCK];
  const float* xr = x + (size_t)blockIdx.x * d;
  float* yr = out + (size_t)blockIdx.x * d;
  float sum = 0.0f;
  for (long long c = threadIdx.x; c < d; c += BLOCK) sum += xr[c];
  float mean = block_reduce(sum, s, false) / d;
  float sq = 0.0f;
  for (long long c = threadIdx.x; c < d; c += BLOCK) { float t = xr[c] - mean; sq += t * t; }
  float rstd = rsqrtf(block_reduce(sq, s, false) / d + eps);
  for (long long c = threadIdx.x; c < d; c += BLOCK) yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
  MUTATE
}
"""
LAYERNORM_STEPS = [launch("layernorm", ["x.numel // ln.weight.numel"], ["BLOCK"], "x", "ln.weight", "ln.bias", "out",
                          I64("ln.weight.numel"), F32("1e-5"))]
_add("layernorm_ok", LAYERNORM, "#define WEIGHT_T const float\n#define MUTATE\n" + LAYERNORM_SRC, LAYERNORM_STEPS,
     tunables={"BLOCK": [256, 512]})
_add("layernorm_resets_params", LAYERNORM, """// Cheat 2: correct output, then sets the parameters to weight 1, bias 0
// (a reference run afterwards would then agree with a kernel that ignores them).
#define WEIGHT_T float
#define MUTATE if (blockIdx.x == gridDim.x - 1) for (long long c = threadIdx.x; c < d; c += BLOCK) { w[c] = 1.0f; b[c] = 0.0f; }
""" + LAYERNORM_SRC, LAYERNORM_STEPS, tunables={"BLOCK": [256]})

RMSNORM_SRC = REDUCE + r"""
#include <cuda_bf16.h>
// Correct: RMSNorm of bf16 rows, as the reference: h = x * rsqrt(mean(x^2) + eps) in fp32,
// rounded to bf16, then times the bf16 weight (rounded to bf16 again).
extern "C" __global__ void rmsnorm(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* out, int cols, float eps) {
  __shared__ float s[BLOCK];
  const __nv_bfloat16* xr = x + (size_t)blockIdx.x * cols;
  __nv_bfloat16* yr = out + (size_t)blockIdx.x * cols;
  float sq = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK) { float v = __bfloat162float(xr[c]); sq += v * v; }
  float r = rsqrtf(block_reduce(sq, s, false) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += BLOCK) {
    float h = __bfloat162float(__float2bfloat16(__bfloat162float(xr[c]) * r));
    yr[c] = __float2bfloat16(__bfloat162float(w[c]) * h);
  }
}
"""
_add("rmsnorm_bf16", RMSNORM, RMSNORM_SRC,
     [launch("rmsnorm", ["x.shape[0]"], ["BLOCK"], "x", "weight", "out", I32("x.shape[1]"), F32("eps"))],
     tunables={"BLOCK": [128, 256]})
