"""``kerngen check``: static checks of a spec with real NVRTC, no GPU; and the argument-size check
(harness/spec/kparams.py) on the evaluation path (the pool and the tuner's compile probe)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.errors import CompileError
from kerngen.harness.spec.kparams import check_launch_args, kernel_params, plan_problems
from kerngen.harness.spec.plan import resolve
from kerngen.harness.spec.spec import KernelSpec
from tests.cli_output import stderr_of

runner = CliRunner()

GELU = "gelu"
GELU_SHAPE = "999x1001"
SOURCE = r"""
__device__ __forceinline__ float gelu_f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
extern "C" __global__ void gelu(const float* x, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = gelu_f(x[i]);
}
"""


def gelu_spec(args=None, kernel: str = "gelu", **extra) -> dict:
    args = args if args is not None else [{"name": "x"}, {"name": "out"}, {"kind": "int64", "value": "x.numel"}]
    return {
        "name": "gelu-test", "source": SOURCE, "tunables": {"BLOCK": [128, 256, 512, 1024]},
        "constraints": ["BLOCK <= 512"],
        "steps": [{"kernel": kernel, "grid": ["cdiv(x.numel, BLOCK)"], "block": ["BLOCK"], "args": args}], **extra,
    }


def write(tmp_path: Path, data: dict, name: str = "spec.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def check(*args: str):
    return runner.invoke(kerngen.cli.app.app, ["check", *args])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))


def test_playbook_spec_passes_with_registers_and_configurations(tmp_path):
    out = tmp_path / "softmax.json"
    res = runner.invoke(kerngen.cli.app.app, ["playbook", "softmax", "--shape", "256x1024", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = check(str(out), "softmax", "--shape", "256x1024", "--arch", "sm_90")
    assert res.exit_code == 0, res.output + stderr_of(res)
    text = res.output
    assert "registers" in text and "spills" in text and "static shared" in text
    assert "admissible" in text and "ok: spec, config, plan, compile" in text and "arguments" in text
    spec = KernelSpec.load(out)
    assert f"of {spec.space_size()}" in text


def test_good_spec_json_parses(tmp_path):
    spec = write(tmp_path, gelu_spec())
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--config", "BLOCK=256", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ok"] is True and data["stage"] is None and data["config"] == {"BLOCK": 256}
    assert data["kernels"]["gelu"]["registers"] > 0 and data["kernels"]["gelu"]["params"] == [8, 8, 8]
    assert data["configs"]["total"] == 4 and data["configs"]["admissible"] == 3
    assert data["configs"]["pruned"] == {"constraint": 1}
    assert [a["bytes"] for a in data["plan"]["steps"][0]["args"]] == [8, 8, 8]


def test_compile_all_checks_every_admissible_configuration(tmp_path):
    spec = write(tmp_path, gelu_spec())
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--compile-all", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["configs"]["compiled"] is True and data["configs"]["admissible"] == 3


@pytest.mark.parametrize(
    "args, want",
    [
        # a missing argument: n is never passed
        ([{"name": "x"}, {"name": "out"}],
         "step 0: kernel 'gelu' argument 2 is missing (0 bytes given): the kernel takes 3 parameters, "
         "parameter 2 has 8 bytes"),
        # an extra argument
        ([{"name": "x"}, {"name": "out"}, {"kind": "int64", "value": "x.numel"}, {"kind": "int32", "value": 7}],
         "step 0: kernel 'gelu' argument 3 is extra: int32 7 (4 bytes) given, but the kernel takes only 3 "
         "parameters"),
        # an int32 given to a long long parameter
        ([{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": "x.numel"}],
         "step 0: kernel 'gelu' argument 2 has the wrong size: int32 999999 (4 bytes) given for parameter 2 of "
         "8 bytes"),
        # a tensor (8-byte pointer) given to the long long is fine; a float32 to it is not
        ([{"name": "x"}, {"name": "out"}, {"kind": "float32", "value": "1.5"}],
         "argument 2 has the wrong size: float32 1.5 (4 bytes) given for parameter 2 of 8 bytes"),
    ],
    ids=["missing", "extra", "int32-to-long-long", "float32-to-long-long"],
)
def test_argument_count_and_size_mismatches_fail_precisely(tmp_path, args, want):
    spec = write(tmp_path, gelu_spec(args))
    res = check(str(spec), GELU, "--shape", GELU_SHAPE)
    err = stderr_of(res).strip()
    assert res.exit_code == 1, res.output + err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: arguments: launch arguments: ")
    assert want in err
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--json")
    assert res.exit_code == 1
    data = json.loads(res.output)
    assert data["ok"] is False and data["stage"] == "arguments" and want in data["error"]
    assert data["kernels"]["gelu"]["params"] == [8, 8, 8]  # what was compiled is still reported


def test_unknown_kernel_name_fails(tmp_path):
    spec = write(tmp_path, gelu_spec(kernel="gelu_fast"))
    res = check(str(spec), GELU, "--shape", GELU_SHAPE)
    err = stderr_of(res).strip()
    assert res.exit_code == 1 and len(err.splitlines()) == 1
    assert "kernel 'gelu_fast' not found in the module" in err and err.startswith("error: kernels: ")


@pytest.mark.parametrize(
    "config, stage, want",
    [
        ("BLOCK=300", "config", "BLOCK=300 is not among its values [128, 256, 512, 1024]"),
        ("WARPS=4", "config", "unknown tunables in config: ['WARPS']"),
        ("BLOCK", "config", "bad --config entry 'BLOCK': expected NAME=INTEGER"),
        ("BLOCK=1024", "plan", "constraint violated: BLOCK <= 512"),
    ],
)
def test_bad_config_fails(tmp_path, config, stage, want):
    spec = write(tmp_path, gelu_spec())
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--config", config)
    err = stderr_of(res).strip()
    if stage == "config":  # a --config the spec does not take: the command line's error (exit 2)
        assert res.exit_code == 2 and len(err.splitlines()) == 1 and want in err
        return
    assert res.exit_code == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {stage}: ") and want in err
    if stage == "plan":  # a config the constraints refuse: one that they admit is suggested
        assert "an admissible configuration: --config BLOCK=128" in res.output


def test_invalid_spec_compile_error_and_forbidden_state_fail(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"source": "x", "steps": []}')
    res = check(str(bad), GELU, "--shape", GELU_SHAPE)
    assert res.exit_code == 1 and stderr_of(res).startswith("error: spec: invalid kernel spec")
    spec = write(tmp_path, gelu_spec(source=SOURCE.replace("gelu_f(x[i])", "gelu_g(x[i])")), "typo.json")
    res = check(str(spec), GELU, "--shape", GELU_SHAPE)
    assert res.exit_code == 1 and 'identifier "gelu_g" is undefined' in stderr_of(res)
    assert stderr_of(res).startswith("error: compile: ")
    state = SOURCE.replace("extern", "__device__ int calls;\nextern")
    state = state.replace("if (i < n)", "if (i == 0) calls++;\n  if (i < n)")
    spec = write(tmp_path, gelu_spec(source=state), "state.json")
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--json")
    data = json.loads(res.output)
    assert res.exit_code == 1 and data["stage"] == "forbidden" and "device global variable 'calls'" in data["error"]


def test_resources_over_the_target_fail(tmp_path):
    src = SOURCE.replace("long long i =", "__shared__ float s[10000]; s[threadIdx.x] = 1.f; __syncthreads();\n"
                         "  if (s[threadIdx.x ^ 1] == 0.f) return;\n  long long i =")
    data = gelu_spec(source=src)
    data["steps"][0]["shared_mem"] = 80000
    spec = write(tmp_path, data)
    # 40 KB static + 80 KB dynamic shared memory: fits sm_90 (227 KB), not sm_86 (99 KB)
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--arch", "sm_90", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kernels"]["gelu"]["shared_bytes"] == 40000
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--arch", "sm_86", "--json")
    data = json.loads(res.output)
    assert res.exit_code == 1 and data["stage"] == "resources", data
    assert "40000 B static + 80000 B dynamic shared memory > 101376 B per block (sm_86)" in data["error"]


def test_setup_errors_are_one_line_exit_2(tmp_path):
    spec = write(tmp_path, gelu_spec())
    res = check(str(spec), "no_such_problem_xyz")
    assert res.exit_code == 2 and len(stderr_of(res).strip().splitlines()) == 1
    res = check(str(spec), GELU, "--arch", "ampere")
    assert res.exit_code == 2 and "bad --arch" in stderr_of(res)
    res = check(str(spec), "no_such_problem_xyz", "--json")
    assert res.exit_code == 2 and json.loads(res.output)["stage"] == "setup"


def test_hostile_spec_text_is_one_line_without_control_sequences(tmp_path):
    data = gelu_spec()
    data["name"] = "evil\x1b]52;c;ZWNobyBvd25lZA==\x07name\x1b[2J"
    spec = write(tmp_path, data)
    proc = subprocess.run([sys.executable, "-m", "kerngen", "check", str(spec), GELU, "--shape", GELU_SHAPE,
                           "--config", "BLOCK=1024"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


# ----- the same check on the evaluation path ------------------------------------------------
def _plan_and_cubin(data: dict):
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    spec = KernelSpec.model_validate(data)
    info = load_problem(ProblemRef(source=GELU, shape=(999, 1001))).info
    plan = resolve(spec, sizes=info.sizes, tensors=info.tensor_facts())
    return spec, plan, compile_job(job_for(spec, plan, "sm_90"), None)


def test_kernel_params_read_from_the_cubin():
    src = r"""
    struct S { int a; int b; float c; };
    extern "C" __global__ void k(const float* p, int a, long long b, float c, double d, char e, short f) {}
    extern "C" __global__ void s(S v, int n) {}
    extern "C" __global__ void none() {}
    """
    from kerngen.harness.compile.compiler import CompileJob, compile_job

    out = compile_job(CompileJob(source=src, options=["--gpu-architecture=sm_90"], arch="sm_90"), None)
    params = kernel_params(out.cubin)
    assert [p.size for p in params["k"]] == [8, 4, 8, 4, 8, 1, 2]
    assert [p.offset for p in params["k"]] == [0, 8, 16, 24, 32, 40, 42]
    assert [p.size for p in params["s"]] == [12, 4] and params["none"] == []


def test_check_launch_args_raises_a_compile_error():
    _, plan, compiled = _plan_and_cubin(gelu_spec([{"name": "x"}, {"name": "out"},
                                                   {"kind": "int32", "value": "x.numel"}]))
    with pytest.raises(CompileError) as info:
        check_launch_args(compiled.cubin, plan, "the ptxas log")
    assert str(info.value).startswith("launch arguments: step 0: kernel 'gelu' argument 2 has the wrong size")
    assert "the ptxas log" in info.value.log
    _, plan, compiled = _plan_and_cubin(gelu_spec())
    assert plan_problems(compiled.cubin, plan) == []


def test_tuner_compile_probe_reports_a_bad_launch_as_a_compile_error():
    from kerngen.harness.results import GpuFacts
    from kerngen.harness.tune.prune import compile_probe

    spec, plan, _ = _plan_and_cubin(gelu_spec([{"name": "x"}, {"name": "out"}]))
    good, gplan, _ = _plan_and_cubin(gelu_spec())
    (bad_out,) = compile_probe(spec, [(plan.config, plan)], GpuFacts(name="t"))
    assert isinstance(bad_out, CompileError) and "argument 2 is missing" in str(bad_out)
    (good_out,) = compile_probe(good, [(gplan.config, gplan)], GpuFacts(name="t"))
    assert not isinstance(good_out, BaseException) and good_out.kernels["gelu"].registers > 0


def test_pool_reports_a_bad_launch_before_the_gpu(tmp_path):
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.harness.results import Verdict
    from kerngen.problems.ref import ProblemRef

    bad = KernelSpec.model_validate(gelu_spec([{"name": "x"}, {"name": "out"}, {"kind": "int32", "value": 3}]))
    good = KernelSpec.model_validate(gelu_spec())
    with WorkerPool(devices=["0"], timeout_s=5.0, worker_module="tests.fakes.fake_worker") as pool:
        results = pool.evaluate(ProblemRef(source=GELU, shape=(999, 1001)),
                                [Candidate(spec=bad), Candidate(spec=good)], EvalOptions(timeout_s=5.0))
    assert results[0].verdict is Verdict.compile_error
    assert results[0].message.startswith("launch arguments: step 0: kernel 'gelu' argument 2 has the wrong size")
    assert results[1].verdict is Verdict.ok
