"""The compile boundary (NVRTC -> cubin): CPU tier, no GPU needed."""

from __future__ import annotations

import pickle
import time

import pytest

from kerngen.harness.compile import compiler as C
from kerngen.harness.compile.compiler import (
    CompiledKernel,
    CompileJob,
    build_options,
    compile_job,
    compile_many,
    job_for,
)
from kerngen.harness.compile.nvrtc_info import arch_for_capability, default_arch, nvrtc_version
from kerngen.harness.compile.cache import CompileCache
from kerngen.harness.compile.cubin import ELF_MAGIC, check_cubin, library_exemption_ok, read_cubin
from kerngen.errors import CompileError
from kerngen.harness.spec.plan import ResolvedArg, ResolvedLaunch, ResolvedPlan
from kerngen.harness.compile.ptxas import parse_ptxas
from kerngen.harness.spec.spec import KernelSpec

ARCH = "sm_90"

GOOD = r"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""

SPILLY = r"""
extern "C" __global__ void local_array(const float* x, float* y, int j) {
    float buf[512];
    for (int i = 0; i < 512; ++i) buf[i] = x[i * 7 + threadIdx.x];
    y[threadIdx.x] = buf[j & 511] + buf[(j * 3) & 511];
}
"""


def job(source: str, kernels: list[str] | None = None, options: list[str] | None = None) -> CompileJob:
    opts = options if options is not None else [f"--gpu-architecture={ARCH}", *C.BASE_OPTIONS]
    return CompileJob(source=source, options=opts, arch=ARCH, kernels=kernels or [])


@pytest.fixture
def cache(tmp_path) -> CompileCache:
    return CompileCache(tmp_path / "cubin")


@pytest.fixture(autouse=True)
def _private_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "default-cache"))
    monkeypatch.delenv("KERNGEN_ARCH", raising=False)


# ----- facts ------------------------------------------------------------------------------------
def test_nvrtc_version_and_arch(monkeypatch):
    assert nvrtc_version() == "13.0"
    assert default_arch() == "sm_90"  # no GPU on the CPU tier
    monkeypatch.setenv("KERNGEN_ARCH", "sm_80")
    assert default_arch() == "sm_80"
    assert arch_for_capability(9, 0) == "sm_90"
    assert arch_for_capability(8, 6) == "sm_86"


# ----- good kernels, resources ------------------------------------------------------------------
def test_good_kernel_compiles_to_cubin_with_resources():
    out = compile_job(job(GOOD, ["scale"]), cache=None)
    assert isinstance(out, CompiledKernel)
    assert out.cubin[:4] == ELF_MAGIC
    info = out.info
    assert info.arch == ARCH and info.nvrtc_version == "13.0" and not info.cached and info.seconds > 0
    assert len(info.key) == 64
    assert "Compiling entry function 'scale'" in info.log
    assert set(info.kernels) == {"scale"}
    assert info.kernels["scale"].registers > 0
    assert info.kernels["scale"].spill_stores == 0
    assert "scale" in read_cubin(out.cubin).entries


def test_local_array_indexed_at_run_time_shows_stack():
    out = compile_job(job(SPILLY, ["local_array"]), cache=None)
    res = out.info.kernels["local_array"]
    assert res.stack_bytes >= 2048  # 512 floats live in local memory
    assert out.info.worst().stack_bytes == res.stack_bytes


def test_ptxas_parser_on_real_log_with_shared_memory():
    src = r"""
    extern "C" __global__ void a(float* x) { __shared__ float s[256]; s[threadIdx.x] = x[threadIdx.x];
        __syncthreads(); x[threadIdx.x] = s[255 - threadIdx.x]; }
    extern "C" __global__ void b(float* x) { x[0] = sinf(x[1]) + powf(x[2], x[3]); }
    """
    out = compile_job(job(src, ["a", "b"]), cache=None)
    parsed = parse_ptxas(out.info.log)
    assert set(parsed) == {"a", "b"}
    assert parsed["a"].shared_bytes == 1024 and parsed["a"].registers > 0
    assert parsed["b"].shared_bytes == 0 and parsed["b"].registers > 0


def test_ptxas_parser_older_format_with_cmem_and_spills():
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_80'\n"
        "ptxas info    : Function properties for _Z1kPf\n"
        "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 255 registers, 4096 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]\n"
        "ptxas info    : Function properties for __internal_helper\n"
        "    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    )
    r = parse_ptxas(log)["_Z1kPf"]
    assert (r.registers, r.stack_bytes, r.spill_stores, r.spill_loads) == (255, 16, 8, 12)
    assert (r.shared_bytes, r.const_bytes) == (4096, 376)
    assert list(parse_ptxas(log)) == ["_Z1kPf"]


# ----- errors -----------------------------------------------------------------------------------
def test_syntax_error_carries_full_log():
    src = 'extern "C" __global__ void k(float* x) {\n    x[0] = 1.0f\n    x[1] = undefined_name;\n}\n'
    with pytest.raises(CompileError) as ei:
        compile_job(job(src, ["k"]), cache=None)
    err = ei.value
    assert "\n" not in str(err) and "error" in str(err)
    assert "kernel.cu(" in err.log and "error" in err.log
    assert "undefined_name" in err.log  # every error is in the log, not just the first
    assert "kernel.cu(3)" in err.log or "kernel.cu(2)" in err.log


def test_compile_error_pickles_with_log():
    err = pickle.loads(pickle.dumps(CompileError("kernel.cu(2): error: x", "the\nfull\nlog")))
    assert isinstance(err, CompileError) and str(err) == "kernel.cu(2): error: x" and err.log == "the\nfull\nlog"


# ----- options from a spec and plan -------------------------------------------------------------
SPEC_SOURCE = r"""
#if BLOCK != 128 && BLOCK != 256
#error BLOCK must be 128 or 256
#endif
extern "C" __global__ void fill(float* y, int n) {
    __shared__ float s[BLOCK];
    s[threadIdx.x] = EPS * (float)WIDTH;
    __syncthreads();
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = s[BLOCK - 1 - threadIdx.x];
}
"""


def _spec_and_plan(block: int, fast_math: bool = False) -> tuple[KernelSpec, ResolvedPlan]:
    spec = KernelSpec(
        source=SPEC_SOURCE,
        tunables={"BLOCK": [128, 256]},
        defines={"EPS": "1e-5", "WIDTH": "n"},
        fast_math=fast_math,
        steps=[{"kernel": "fill", "grid": ["n / BLOCK"], "block": ["BLOCK"], "args": [{"name": "out"}]}],
    )
    launch = ResolvedLaunch(
        kernel="fill", grid=(8, 1, 1), block=(block, 1, 1), shared_mem=0, args=[ResolvedArg(kind="tensor", name="out")]
    )
    plan = ResolvedPlan(config={"BLOCK": block}, defines={"EPS": 1e-5, "WIDTH": 4096}, scratch=[], steps=[launch, launch])
    return spec, plan


def test_build_options_and_tunables_change_the_code():
    spec, plan = _spec_and_plan(128)
    opts = build_options(spec, plan, ARCH)
    assert opts[:4] == [f"--gpu-architecture={ARCH}", "--std=c++17", "-lineinfo", "--ptxas-options=-v"]
    assert "-DBLOCK=128" in opts and "-DEPS=1e-05" in opts and "-DWIDTH=4096" in opts
    assert "-use_fast_math" not in opts
    assert "-use_fast_math" in build_options(_spec_and_plan(128, fast_math=True)[0], plan, ARCH)
    j128 = job_for(spec, plan, ARCH)
    assert j128.kernels == ["fill"] and j128.arch == ARCH and j128.source == SPEC_SOURCE
    spec256, plan256 = _spec_and_plan(256)
    a = compile_job(j128, cache=None)
    b = compile_job(job_for(spec256, plan256, ARCH), cache=None)
    assert a.info.kernels["fill"].shared_bytes == 128 * 4
    assert b.info.kernels["fill"].shared_bytes == 256 * 4
    assert a.cubin != b.cubin and a.info.key != b.info.key
    bad = j128.model_copy(update={"options": [o for o in j128.options if o != "-DBLOCK=128"] + ["-DBLOCK=64"]})
    with pytest.raises(CompileError, match="BLOCK must be 128 or 256"):
        compile_job(bad, cache=None)


def test_float_define_literals():
    assert C._literal(1e-5) == "1e-05" and C._literal(0.5) == "0.5" and C._literal(-2.0) == "(-2.0)"
    assert C._literal(float("inf")) == "(INFINITY)" and C._literal(7) == "7" and C._literal(True) == "1"


# ----- headers and prelude ----------------------------------------------------------------------
def test_bf16_fp16_headers_and_prelude_macros():
    src = r"""
    #include <cuda_bf16.h>
    #include <cuda_fp16.h>
    #include <cmath>
    #include <cstdint>
    #include <cfloat>
    extern "C" __global__ void mixed(const __nv_bfloat16* x, __half* y, float* z, int n) {
        int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= n) return;
        float v = __bfloat162float(x[i]);
        float m = fmaxf(-INFINITY, v) + (isnan(v) ? NAN : 0.0f);
        z[i] = m * (float)M_PI + FLT_EPSILON;
        y[i] = __hadd(__float2half(m), __float2half(1.0f));
    }
    """
    out = compile_job(job(src, ["mixed"]), cache=None)
    assert out.info.kernels["mixed"].registers > 0


# ----- cache ------------------------------------------------------------------------------------
def test_cache_hit_and_misses(cache):
    j = job(SPILLY, ["local_array"])
    t0 = time.perf_counter()
    first = compile_job(j, cache)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    second = compile_job(j, cache)
    warm = time.perf_counter() - t0
    assert not first.info.cached and second.info.cached and second.info.seconds == 0
    assert second.cubin == first.cubin and second.info.kernels == first.info.kernels
    assert warm < cold / 3
    assert CompileCache.key_for(j) == first.info.key
    other_opts = j.model_copy(update={"options": [*j.options, "-DUNUSED=1"]})
    assert not compile_job(other_opts, cache).info.cached
    other_src = j.model_copy(update={"source": SPILLY + "\n// changed\n"})
    assert not compile_job(other_src, cache).info.cached
    other_arch = j.model_copy(update={"arch": "sm_80"})
    assert CompileCache.key_for(other_arch) != CompileCache.key_for(j)


def test_default_cache_from_env(tmp_path):
    j = job(GOOD, ["scale"])
    assert not compile_job(j).info.cached
    assert compile_job(j).info.cached
    assert list((tmp_path / "default-cache" / "cubin").glob("*/*.cubin"))  # $KERNGEN_CACHE_DIR/cubin


@pytest.mark.parametrize("damage", ["truncate_json", "garbage_json", "flip_cubin", "drop_cubin"])
def test_corrupt_entry_is_a_miss(cache, damage):
    j = job(GOOD, ["scale"])
    key = compile_job(j, cache).info.key
    meta, blob = cache._paths(key)
    if damage == "truncate_json":
        meta.write_text(meta.read_text()[:40])
    elif damage == "garbage_json":
        meta.write_bytes(b"\xff\x00 not json")
    elif damage == "flip_cubin":
        data = bytearray(blob.read_bytes())
        data[100] ^= 0xFF
        blob.write_bytes(bytes(data))
    else:
        blob.unlink()
    assert cache.get(key) is None
    again = compile_job(j, cache)
    assert not again.info.cached and again.cubin[:4] == ELF_MAGIC
    assert compile_job(j, cache).info.cached  # repaired


def test_cached_failure_reraises_with_log(cache, monkeypatch):
    j = job('extern "C" __global__ void k(float* x) { x[0] = nope; }', ["k"])
    with pytest.raises(CompileError) as first:
        compile_job(j, cache)

    def no_nvrtc(_job):
        raise AssertionError("NVRTC must not run for a cached failure")

    monkeypatch.setattr(C, "_run_nvrtc", no_nvrtc)
    with pytest.raises(CompileError) as second:
        compile_job(j, cache)
    assert str(second.value) == str(first.value)
    assert second.value.log == first.value.log and '"nope" is undefined' in second.value.log


def test_no_torn_files_left(cache):
    compile_job(job(GOOD, ["scale"]), cache)
    names = [p.name for p in cache.root.rglob("*") if p.is_file()]
    assert len(names) == 2 and not [n for n in names if n.endswith(".tmp")]


# ----- cheat defense in the cubin -------------------------------------------------------------
@pytest.mark.parametrize(
    "decl",
    [
        "__device__ int counter;",
        "static __device__ float cache[1024];",
        "__device__ int seen = 5;",
        "const __device__ float table[4] = {1, 2, 3, 4};",
    ],
)
def test_writable_device_globals_rejected(decl, cache):
    name = decl.split("[")[0].split("=")[0].split()[-1].rstrip(";")
    src = decl + '\nextern "C" __global__ void k(float* x) { x[threadIdx.x] += (float)' + name + (
        "[threadIdx.x & 3]" if "[" in decl else ""
    ) + ";" + (f" {name}++;" if decl.startswith("__device__ int counter") else "") + " }\n"
    with pytest.raises(CompileError) as ei:
        compile_job(job(src, ["k"]), cache)
    assert str(ei.value).startswith("forbidden:") and name in str(ei.value)
    with pytest.raises(CompileError, match="^forbidden:"):  # and cached as a failure
        compile_job(job(src, ["k"]), cache)


def test_constant_memory_math_tables_and_printf_accepted():
    src = r"""
    __constant__ float coeffs[16];
    extern "C" __global__ void k(float* x, double* y) {
        x[threadIdx.x] = sinf(x[threadIdx.x]) * coeffs[threadIdx.x & 15];
        y[threadIdx.x] = cos(y[threadIdx.x]);
        if (threadIdx.x == 9999) printf("never %d\n", (int)threadIdx.x);
    }
    """
    out = compile_job(job(src, ["k"]), cache=None)
    names = {s.name for s in read_cubin(out.cubin).symbols}
    assert "coeffs" in names and "__cudart_i2opi_f" in names  # the library table really is there


def test_device_malloc_rejected():
    src = 'extern "C" __global__ void k(float* x) { float* p = (float*)malloc(64); p[0] = x[0]; x[1] = p[0]; free(p); }'
    with pytest.raises(CompileError, match="^forbidden: device-side heap allocation"):
        compile_job(job(src, ["k"]), cache=None)


def test_missing_kernel_detected(cache):
    src = '__global__ void mangled(float* x) { x[0] = 1; }\nextern "C" __global__ void other(float* x) { x[0] = 2; }\n'
    with pytest.raises(CompileError) as ei:
        compile_job(job(src, ["mangled"]), cache)
    assert str(ei.value) == ("kernel 'mangled' not found in the module: the source declares __global__ mangled "
                             "without extern \"C\", so the module has it as _Z7mangledPf; declare it extern \"C\"")
    assert "other" in ei.value.log and "_Z7mangledPf" in ei.value.log
    assert compile_job(job(src, ["other"]), cache).info.cached  # the module itself was fine


def test_library_exemption_rules():
    assert library_exemption_ok("#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n")
    assert library_exemption_ok("namespace mine { struct S { int a; }; }\n// namespace cuda {\n")
    assert not library_exemption_ok("namespace cuda { __device__ int c; }")
    assert not library_exemption_ok("#define NS cuda\nnamespace NS { }")
    assert not library_exemption_ok("#define CAT(a, b) a##b\n")
    assert not library_exemption_ok('__device__ int v asm("_ZN4cuda1vE");')


def test_cooperative_groups_accepted_but_cuda_namespace_cheat_rejected():
    body = r"""
    #include <cooperative_groups.h>
    #include <cooperative_groups/reduce.h>
    namespace cg = cooperative_groups;
    CHEAT
    extern "C" __global__ void k(float* x) {
        auto tile = cg::tiled_partition<32>(cg::this_thread_block());
        x[0] = cg::reduce(tile, x[threadIdx.x], cg::plus<float>());
    }
    """
    compile_job(job(body.replace("CHEAT", ""), ["k"]), cache=None)
    with pytest.raises(CompileError, match="^forbidden:"):
        compile_job(job(body.replace("CHEAT", "namespace cuda { __device__ float stash[64]; }"), ["k"]), cache=None)


def test_check_cubin_rejects_non_elf():
    with pytest.raises(CompileError, match="unreadable cubin"):
        check_cubin(b"not an elf at all" * 10, [])


# ----- many at once ---------------------------------------------------------------------------
def test_compile_many_mixed_in_parallel(cache):
    jobs = [
        job(GOOD, ["scale"]),
        job("extern \"C\" __global__ void k(float* x) { x[0] = ; }", ["k"]),
        job(SPILLY, ["local_array"]),
        job("__device__ int counter;\nextern \"C\" __global__ void k(int* x) { x[0] = counter++; }", ["k"]),
        job(GOOD, ["missing"]),
        job(GOOD, ["scale"]),  # a duplicate: compiled once
    ]
    out = compile_many(jobs, workers=2, cache=cache)
    assert [type(r).__name__ for r in out] == [
        "CompiledKernel", "CompileError", "CompiledKernel", "CompileError", "CompileError", "CompiledKernel"
    ]
    assert "error" in out[1].log and "kernel.cu(1)" in out[1].log
    assert str(out[3]).startswith("forbidden:")
    assert "not found in the module" in str(out[4])
    assert out[0].info.kernels["scale"].registers > 0 and out[0].cubin == out[5].cubin
    again = compile_many(jobs[:3], workers=2, cache=cache)  # all served from the cache
    assert again[0].info.cached and again[2].info.cached and isinstance(again[1], CompileError)
    assert again[1].log == out[1].log


def test_compile_workers_are_kept_across_calls_and_replaced_after_a_kill():
    """Worker start-up costs several compiles: sandboxed workers outlive compile_many, and a
    killed one is replaced by a fresh one on the next call."""
    from kerngen.harness.compile import sandbox

    jobs = [job(GOOD.replace("scale", f"scale{i}"), [f"scale{i}"]) for i in range(3)]
    first = compile_many(jobs[:2], workers=1, cache=None)
    box = sandbox.sandbox()
    pids = {w.proc.pid for w in list(box._idle.queue)}
    assert pids and all(not isinstance(r, CompileError) for r in first)
    second = compile_many(jobs[1:], workers=1, cache=None)
    assert {w.proc.pid for w in list(box._idle.queue)} & pids and all(not isinstance(r, CompileError) for r in second)
    for w in list(box._idle.queue):
        w.kill()
    third = compile_many(jobs[:2], workers=1, cache=None)
    assert not ({w.proc.pid for w in list(box._idle.queue) if w.alive()} & pids)
    assert [r.cubin for r in third] == [r.cubin for r in first]
