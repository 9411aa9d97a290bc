"""The static checks a spec meets before any GPU time, on the search's path (the pool's compile
stage: resolve -> job_for -> compile_many -> launch arguments) and in ``kerngen check``: a launch
one argument short, an int32 given to a ``long long``, a tunable redefined in the source, a tensor
that does not exist, a kernel the source does not have. Real NVRTC, no GPU."""

from __future__ import annotations

import pytest

from kerngen.cli.check import run_check
from kerngen.errors import CompileError, SpecError
from kerngen.harness.compile import compiler as C
from kerngen.harness.compile import source_checks
from kerngen.harness.compile.cache import CompileCache
from kerngen.harness.compile.compiler import compile_job, compile_many, job_for
from kerngen.harness.compile.source_checks import global_functions, redefinitions
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.pool.local import WorkerPool
from kerngen.harness.results import Verdict
from kerngen.harness.spec.plan import resolve
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.cli.test_check_cli import GELU, GELU_SHAPE, SOURCE, gelu_spec, write

REF = ProblemRef(source=GELU, shape=(999, 1001))
REDEFINED = "#define BLOCK 256\n" + SOURCE
ONE_SHORT = [{"name": "x"}, {"name": "out"}]
INT32_FOR_LONG_LONG = [{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"}]
NO_SUCH_TENSOR = [{"name": "x"}, {"name": "y"}, {"kind": "int64", "value": "x.numel"}]

# (spec, the verdict of the search, kerngen check's stage, the message's start, then a part of it)
CASES = {
    "one-argument-short": (
        gelu_spec(ONE_SHORT), Verdict.compile_error, "arguments",
        "launch arguments: step 0: kernel 'gelu' argument 2 is missing (0 bytes given): the kernel takes 3 "
        "parameters, parameter 2 has 8 bytes, the launch passes 2 arguments", ""),
    "int32-for-long-long": (
        gelu_spec(INT32_FOR_LONG_LONG), Verdict.compile_error, "arguments",
        "launch arguments: step 0: kernel 'gelu' argument 2 has the wrong size: int32 999999 (4 bytes) given for "
        "parameter 2 of 8 bytes", 'kind "int64" for long long'),
    "tunable-redefined": (
        gelu_spec(source=REDEFINED), Verdict.compile_error, "compile",
        "tunable BLOCK is redefined in the source at line 1 (#define BLOCK 256): each configuration's "
        "-DBLOCK=value would be ignored; guard it with #ifndef BLOCK", ""),
    "unknown-tensor": (
        gelu_spec(NO_SUCH_TENSOR), Verdict.invalid_spec, "plan",
        "launch plan: step 0: kernel 'gelu' argument 1: unknown tensor 'y'", "the tensors a step can bind are the "
        "problem's: x, out; no scratch buffers"),
    "unknown-kernel": (
        gelu_spec(kernel="gelu_fast"), Verdict.compile_error, "kernels",
        "kernel 'gelu_fast' not found in the module: the source's __global__ functions are gelu "
        "(a typo in the launch plan?)", ""),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))


# ----- the search's path: WorkerPool._compile_all, before any worker sees the candidate ------------
def test_the_pool_catches_each_before_the_gpu(monkeypatch):
    sent: list[str] = []
    run_one = WorkerPool._run_one

    def spy(self, worker, problem, cand, plan, compiled, options):
        sent.append(cand.spec.name)
        return run_one(self, worker, problem, cand, plan, compiled, options)

    monkeypatch.setattr(WorkerPool, "_run_one", spy)
    specs = [KernelSpec.model_validate({**data, "name": case}) for case, (data, *_) in CASES.items()]
    specs.append(KernelSpec.model_validate({**gelu_spec(), "name": "good"}))
    with WorkerPool(devices=["0"], timeout_s=5.0, worker_module="tests.fakes.fake_worker") as pool:
        results = pool.evaluate(REF, [Candidate(spec=s) for s in specs], EvalOptions(timeout_s=5.0))
    assert sent == ["good"]  # nothing else reached a GPU worker
    for (case, (_, verdict, _, start, part)), r in zip(CASES.items(), results):
        assert r.verdict is verdict, (case, r.message)
        assert r.message.startswith(start), (case, r.message)
        assert part in r.message and "\n" not in r.message and r.config == {"BLOCK": 128}, case
    assert results[-1].verdict is Verdict.ok


# ----- kerngen check: the same checks, the same messages --------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_kerngen_check_catches_each_with_the_same_message(tmp_path, case):
    data, verdict, stage, start, part = CASES[case]
    report = run_check(str(write(tmp_path, data)), GELU, shape=GELU_SHAPE, arch="sm_90")
    assert report["ok"] is False and report["stage"] == stage, report
    message = start.removeprefix("launch plan: ") if verdict is Verdict.invalid_spec else start
    assert message in report["error"] and part in report["error"]


# ----- (c) a tunable redefined in the source ---------------------------------------------------------
def _compiled_ignoring_the_check(job, cache, monkeypatch):
    """What NVRTC alone does with the job: compiles it, only warning (and caches the success)."""
    with monkeypatch.context() as m:
        m.setattr(source_checks, "check_macros", lambda *a, **k: None)
        return compile_job(job, cache)


def test_nvrtc_alone_only_warns_and_the_value_is_ignored(tmp_path, monkeypatch):
    spec = KernelSpec.model_validate(gelu_spec(source=REDEFINED))
    info = load_problem(REF).info
    plans = [resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config={"BLOCK": b}) for b in (128, 256)]
    out = [_compiled_ignoring_the_check(job_for(spec, p, "sm_90"), None, monkeypatch) for p in plans]
    assert "incompatible redefinition of macro \"BLOCK\"" in out[0].info.log
    assert out[0].cubin == out[1].cubin  # every configuration is the same kernel


def test_a_redefinition_is_refused_even_where_the_cache_holds_a_success(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path / "cubin")
    spec = KernelSpec.model_validate(gelu_spec(source=REDEFINED))
    info = load_problem(REF).info
    job = job_for(spec, resolve(spec, sizes=info.sizes, tensors=info.tensor_facts()), "sm_90")
    assert job.tunables == ["BLOCK"]
    _compiled_ignoring_the_check(job, cache, monkeypatch)  # a success cached before the check existed
    assert cache.get(CompileCache.key_for(job)).ok
    with pytest.raises(CompileError, match=r"^tunable BLOCK is redefined in the source at line 1"):
        compile_job(job, cache)
    (out,) = compile_many([job], cache=cache)
    assert isinstance(out, CompileError) and "guard it with #ifndef BLOCK" in str(out)


def test_a_guarded_default_compiles_and_each_value_counts(monkeypatch):
    guarded = "#ifndef BLOCK\n#define BLOCK 256\n#endif\n" + SOURCE.replace("blockDim.x", "BLOCK")
    spec = KernelSpec.model_validate(gelu_spec(source=guarded))
    info = load_problem(REF).info
    plans = [resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config={"BLOCK": b}) for b in (128, 256)]
    a, b = (compile_job(job_for(spec, p, "sm_90"), None) for p in plans)
    assert a.cubin != b.cubin


def test_a_define_of_the_spec_redefined_and_an_undef_are_refused():
    job = C.CompileJob(source="#undef VEC\n#define SCALE 2.0f\n" + SOURCE, arch="sm_90", tunables=["VEC"],
                       options=["--gpu-architecture=sm_90", "-DSCALE=1.5", "-DVEC=4"], kernels=["gelu"])
    with pytest.raises(CompileError) as info:
        compile_job(job, None)
    assert str(info.value) == ("tunable VEC is undefined in the source at line 1 (#undef VEC): each configuration's "
                               "-DVEC=value would be lost; remove the #undef and name a local macro otherwise "
                               "(+1 more)")
    assert ("define SCALE is redefined in the source at line 2 (#define SCALE 2.0f): the spec's define "
            "-DSCALE=value would be ignored; guard it with #ifndef SCALE") in info.value.log


@pytest.mark.parametrize(
    "source",
    [
        "#ifndef BLOCK\n#define BLOCK 256\n#endif\n",
        "#if !defined(BLOCK)\n#define BLOCK 256\n#endif\n",
        "#if !defined BLOCK && VEC > 1\n#define BLOCK 256\n#endif\n",
        "#if (!defined(BLOCK)) && (!defined(VEC))\n#define BLOCK 256\n#define VEC 4\n#endif\n",
        "#ifdef BLOCK\n#else\n#define BLOCK 256\n#endif\n",
        "#if defined(BLOCK)\n#elif 1\n#define BLOCK 256\n#endif\n",
        "#ifndef BLOCK\n#if VEC > 2\n#define BLOCK 128\n#else\n#define BLOCK 256\n#endif\n#endif\n",
        "// #define BLOCK 1\n/* #define BLOCK 2\n#undef BLOCK */\n#define BLOCKS (BLOCK * 2)\n",
        '#define MSG "#define BLOCK 3"\n',
    ],
    ids=["ifndef", "if-not-defined", "and-chain", "parenthesised", "else-of-ifdef", "elif-after-defined", "nested",
         "comments-and-longer-name", "in-a-string"],
)
def test_guarded_defaults_are_not_redefinitions(source):
    assert redefinitions(source, frozenset({"BLOCK", "VEC"})) == ()


@pytest.mark.parametrize(
    "source, line, text",
    [
        ("#define BLOCK 256\n", 1, "#define BLOCK 256"),
        ("int a;\n\n#define BLOCK /* the block */ 256 // threads\n", 3, "#define BLOCK 256"),
        ("#ifndef VEC\n#define BLOCK 256\n#endif\n", 2, "#define BLOCK 256"),
        ("#if !defined(BLOCK) || VEC\n#define BLOCK 256\n#endif\n", 2, "#define BLOCK 256"),
        ("#ifndef BLOCK\n#else\n#define BLOCK 256\n#endif\n", 3, "#define BLOCK 256"),
        ("#ifndef BLOCK\n#endif\n#define BLOCK 256\n", 3, "#define BLOCK 256"),
        ("#define BL\\\nOCK 256\n", 1, "#define BLOCK 256"),
        ("  #  define BLOCK(x) ((x) * 2)\n", 1, "# define BLOCK(x) ((x) * 2)"),
        ("#undef BLOCK\n", 1, "#undef BLOCK"),
        ("%:define BLOCK 256\n", 1, "#define BLOCK 256"),
    ],
    ids=["plain", "comments", "other-guard", "or-chain", "else-of-ifndef", "after-the-guard", "continued-name",
         "function-like", "undef", "digraph"],
)
def test_unguarded_redefinitions_are_found_with_their_line(source, line, text):
    (found,) = redefinitions(source, frozenset({"BLOCK"}))
    assert (found.line, found.name, found.text) == (line, "BLOCK", text)


def test_only_names_passed_with_minus_d_are_checked():
    assert redefinitions("#define TM 8\n#define BLOCK 1\n", frozenset({"TM2"})) == ()
    assert redefinitions("#define BLOCK 1\n", frozenset()) == ()


# ----- (d) a tensor that does not exist; (e) a kernel that is not in the source --------------------
def test_unknown_tensor_lists_every_bindable_name_and_the_closest():
    info = load_problem(REF).info
    data = gelu_spec([{"name": "x"}, {"name": "outt"}, {"kind": "int64", "value": 1}])
    data["scratch"] = [{"name": "partial", "dtype": "float32", "size": 8}]
    data["steps"].insert(0, {"op": "memset", "tensor": "partial", "value": 0})
    with pytest.raises(SpecError) as err:
        resolve(KernelSpec.model_validate(data), sizes=info.sizes, tensors=info.tensor_facts())
    assert str(err.value) == ("step 1: kernel 'gelu' argument 1: unknown tensor 'outt' (did you mean 'out'?); the "
                              "tensors a step can bind are the problem's: x, out; scratch: partial")
    data["steps"][0]["tensor"] = "partials"
    with pytest.raises(SpecError, match=r"^step 0: memset: unknown tensor 'partials' \(did you mean 'partial'\?\)"):
        resolve(KernelSpec.model_validate(data), sizes=info.sizes, tensors=info.tensor_facts())


def test_global_function_names_are_read_from_the_source():
    src = r"""
    #define KERNEL(n) extern "C" __global__ void n(float* x)
    extern "C" __global__ void __launch_bounds__(256, 2)
      first(const float* __restrict__ x) {}
    template <int N> __global__ void second(int* y) {}
    static __global__ __attribute__((noinline)) void third() {}
    __device__ void helper(float* p) {}
    // __global__ void commented(float* x) {}
    """
    assert global_functions(src) == ("first", "second", "third")


def test_a_kernel_missing_from_the_source_is_named_with_what_is_there(tmp_path):
    src = 'extern "C" __global__ void gelu_a(float* x) {}\nextern "C" __global__ void gelu_b(float* x) {}\n'
    job = C.CompileJob(source=src, options=["--gpu-architecture=sm_90"], arch="sm_90", kernels=["gelu_a", "gelu"])
    with pytest.raises(CompileError) as err:
        compile_job(job, None)
    assert str(err.value) == ("kernel 'gelu' not found in the module: the source's __global__ functions are gelu_a, "
                              "gelu_b (a typo in the launch plan?)")
    assert "entry functions found: " in err.value.log and "gelu_b" in err.value.log
