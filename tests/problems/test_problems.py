"""The problems layer on the CPU: built-ins, overrides, KernelBench files, errors, seeds,
perturbation, degeneracy. Sizes are small (``--shape`` overrides) except where a test checks
that describing the full default size is fast (meta tensors)."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kerngen.errors import ProblemError
from kerngen.expr import TensorFacts
from kerngen.problems import registry
from kerngen.problems.degenerate import DegeneracyReport, check_seed_dependence
from kerngen.problems.info import ProblemInfo, default_tolerance
from kerngen.problems.load import load_problem
from kerngen.problems.problem import Problem
from kerngen.problems.ref import ProblemRef, canonical_dtype, parse_shape
from kerngen.problems.torch_modes import strict_fp32

DATA = Path(__file__).parents[1] / "data" / "kernelbench"

BUILTINS = ["softmax", "layernorm", "rmsnorm", "gelu", "conv2d", "conv2d_wide", "conv_relu_maxpool", "matmul", "matmul_wide",
            "attention", "linear_gelu"]

# small shapes for running the references on the CPU (attention stays bf16: CPU SDPA supports it)
SMALL = {
    "softmax": (32, 256),
    "layernorm": (2, 4, 8, 8),
    "rmsnorm": (32, 128),
    "gelu": (64, 128),
    "conv2d": (2, 3, 48, 48),
    "conv2d_wide": (2, 3, 48, 48),
    "conv_relu_maxpool": (2, 3, 16, 16),
    "matmul": (32, 48, 64),
    "matmul_wide": (32, 48, 64),
    "attention": (1, 2, 64, 32),
    "linear_gelu": (32, 48, 64),
}


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text.strip(), text
    return text


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# --------------------------------------------------------------------------------------------
# built-ins


def test_builtin_names_and_paths():
    assert registry.builtin_names() == BUILTINS
    for name in BUILTINS:
        assert registry.builtin_path(name).is_file()
    with pytest.raises(ProblemError, match="unknown built-in"):
        registry.builtin_path("nope")
    shapes = registry.describe_builtin_shapes()
    assert set(shapes) == set(BUILTINS)
    assert "4096x65536" in shapes["softmax"] and "float32" in shapes["softmax"]
    assert "bfloat16" in shapes["attention"] and "bfloat16" in shapes["rmsnorm"]


def test_builtins_describe_fast_at_full_default_size():
    start = time.perf_counter()
    infos = {name: load_problem(name).info for name in BUILTINS}
    elapsed = time.perf_counter() - start
    assert elapsed < 20, elapsed  # meta tensors: no multi-GB allocation

    sm = infos["softmax"]
    assert [(t.name, t.shape, t.dtype) for t in sm.inputs] == [("x", (4096, 65536), "float32")]
    assert sm.outputs[0].name == "out" and sm.outputs[0].shape == (4096, 65536)
    assert sm.min_bytes == 2 * 4096 * 65536 * 4
    assert sm.flops is None and (sm.atol, sm.rtol) == (1e-4, 1e-4)
    assert sm.sizes == {"rows": 4096, "cols": 65536}

    ln = infos["layernorm"]
    assert {t.name: t.shape for t in ln.params} == {"ln.weight": (64, 256, 256), "ln.bias": (64, 256, 256)}

    rms = infos["rmsnorm"]
    assert rms.dtype == "bfloat16" and (rms.atol, rms.rtol) == (1e-2, 1e-2)
    assert rms.params[0].name == "weight" and rms.params[0].dtype == "bfloat16"
    assert rms.sizes["eps"] == 1e-6 and rms.sizes["hidden"] == 8192

    assert infos["gelu"].inputs[0].shape == (16384, 4096)
    assert math.prod(infos["gelu"].inputs[0].shape) == 64 * 2**20

    cv = infos["conv2d"]
    assert cv.outputs[0].shape == (100, 96, 55, 55)
    assert cv.flops == pytest.approx(2 * 100 * 96 * 55 * 55 * 3 * 11 * 11)  # 21.1 GFLOP, counted
    assert cv.flops_source == "counted"
    assert {t.name for t in cv.params} == {"conv.weight", "conv.bias"}

    crm = infos["conv_relu_maxpool"]
    assert crm.outputs[0].shape == (128, 64, 16, 16)

    mm = infos["matmul"]
    assert mm.flops == 2 * 4096**3 and mm.sizes == {"M": 4096, "N": 4096, "K": 4096}
    assert [t.name for t in mm.inputs] == ["A", "B"]

    at = infos["attention"]
    assert [t.name for t in at.inputs] == ["q", "k", "v"] and at.dtype == "bfloat16"
    assert at.flops == 2 * 8 * 16 * 4096 * 4096 * 128 and at.flops_source == "meta"
    for info in infos.values():
        assert info.builtin and info.shape_doc and info.description


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_runs_on_cpu_at_small_shape(name):
    p = load_problem(ProblemRef(source=name, shape=SMALL[name]))
    model = p.build_model("cpu", seed=1)
    inputs = p.make_inputs("cpu", seed=1)
    outputs = p.run_reference(model, inputs)
    assert isinstance(outputs, list) and len(outputs) == len(p.info.outputs)
    for t, info in zip(outputs, p.info.outputs):
        assert tuple(t.shape) == info.shape and str(t.dtype) == f"torch.{info.dtype}"
        assert torch.isfinite(t.float()).all()
    for x, info in zip(inputs, p.info.inputs):
        assert tuple(x.shape) == info.shape and x.dtype == getattr(torch, info.dtype)
    binds = p.bindings(model, inputs, outputs)
    assert set(binds) == set(p.info.tensor_facts())
    for key, facts in p.info.tensor_facts().items():
        assert facts == TensorFacts(tuple(binds[key].shape))
    assert not check_seed_dependence(p).degenerate


def test_reference_values_are_the_named_ops():
    p = load_problem(ProblemRef(source="softmax", shape=(8, 32)))
    x = p.make_inputs("cpu", 0)
    (out,) = p.run_reference(p.build_model("cpu", 0), x)
    torch.testing.assert_close(out, torch.softmax(x[0], dim=1))

    p = load_problem(ProblemRef(source="gelu", shape=(1000,)))
    x = p.make_inputs("cpu", 0)
    (out,) = p.run_reference(p.build_model("cpu", 0), x)
    torch.testing.assert_close(out, 0.5 * x[0] * (1 + torch.erf(x[0] / math.sqrt(2))))

    p = load_problem(ProblemRef(source="rmsnorm", shape=(4, 64)))
    model = p.build_model("cpu", 0)
    (x,) = p.make_inputs("cpu", 0)
    (out,) = p.run_reference(model, [x])
    h = x.float()
    want = model.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, want)

    p = load_problem(ProblemRef(source="attention", shape=(1, 2, 16, 8), dtype="fp32"))
    q, k, v = p.make_inputs("cpu", 0)
    (out,) = p.run_reference(p.build_model("cpu", 0), [q, k, v])
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# shape and dtype overrides


def test_shape_and_dtype_overrides():
    p = load_problem(ProblemRef(source="softmax", shape=(8192, 1024), dtype="bf16"))
    assert p.ref == ProblemRef(source="softmax", shape=(8192, 1024), dtype="bfloat16")
    assert p.info.inputs[0].shape == (8192, 1024) and p.info.inputs[0].dtype == "bfloat16"
    assert (p.info.atol, p.info.rtol) == (1e-2, 1e-2) and p.info.sizes == {"rows": 8192, "cols": 1024}

    mm = load_problem(ProblemRef(source="matmul", shape=(512,)))
    assert mm.ref.shape == (512, 512, 512) and mm.info.flops == 2 * 512**3
    mm = load_problem(ProblemRef(source="matmul", shape=(64, 32, 16), dtype="float16"))
    assert [t.shape for t in mm.info.inputs] == [(64, 16), (16, 32)]
    assert mm.info.outputs[0].shape == (64, 32) and mm.info.dtype == "float16"

    ln = load_problem(ProblemRef(source="layernorm", shape=(2, 3, 4, 5), dtype="fp16"))
    model = ln.build_model("cpu", 0)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert ln.info.params[0].shape == (3, 4, 5)
    x = ln.make_inputs("cpu", 0)
    assert x[0].dtype == torch.float16

    g = load_problem(ProblemRef(source="gelu", shape=(7,)))
    assert g.info.sizes == {"d0": 7}
    at = load_problem(ProblemRef(source="attention", shape=(1, 2, 64, 32), dtype="float32"))
    assert at.info.flops == 2 * 1 * 2 * 64 * 64 * 32 and at.info.atol == 1e-4
    cv = load_problem(ProblemRef(source="conv2d", shape=(1, 5, 64, 64)))
    assert cv.info.params[0].shape == (96, 5, 11, 11) and cv.info.sizes["in_channels"] == 5


def test_override_errors_are_one_line():
    with pytest.raises(ProblemError, match="expected 2") as e:
        load_problem(ProblemRef(source="softmax", shape=(1, 2, 3)))
    one_line(e.value)
    with pytest.raises(ProblemError, match="expected 1 or 3"):
        load_problem(ProblemRef(source="matmul", shape=(4, 4)))
    with pytest.raises(ProblemError, match="unknown dtype") as e:
        load_problem(ProblemRef(source="softmax", dtype="fp8"))
    one_line(e.value)
    with pytest.raises(ProblemError, match="built-in problems only"):
        load_problem(ProblemRef(source=str(DATA / "19_ReLU.py"), shape=(4, 4)))
    with pytest.raises(ProblemError, match="built-in problems only"):
        load_problem(ProblemRef(source=str(DATA / "19_ReLU.py"), dtype="bf16"))
    with pytest.raises(ProblemError, match="conv2d") as e:  # input smaller than the kernel
        load_problem(ProblemRef(source="conv2d", shape=(1, 3, 4, 4)))
    one_line(e.value)


def test_parse_shape_and_dtype():
    assert parse_shape("8192x1024") == (8192, 1024)
    assert parse_shape("8,16, 4096,128") == (8, 16, 4096, 128)
    assert parse_shape("(4096, 4096)") == (4096, 4096)
    assert parse_shape("512") == (512,)
    for bad in ("", "x", "axb", "0x4", "-1x4", "4x2.5"):
        with pytest.raises(ProblemError):
            parse_shape(bad)
    for alias, name in [("bf16", "bfloat16"), ("FP16", "float16"), ("fp32", "float32"), ("torch.float32", "float32"),
                        ("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32")]:  # fmt: skip
        assert canonical_dtype(alias) == name
    with pytest.raises(ProblemError):
        canonical_dtype("int4")
    assert default_tolerance("float32") == (1e-4, 1e-4)
    assert default_tolerance("bfloat16") == default_tolerance("float16") == (1e-2, 1e-2)
    assert default_tolerance("float64") == (1e-7, 1e-7)


# --------------------------------------------------------------------------------------------
# KernelBench-format files


def test_kernelbench_samples_load_unchanged():
    mm = load_problem(str(DATA / "1_Square_matrix_multiplication_.py"))
    assert not mm.info.builtin and mm.info.name == "1_Square_matrix_multiplication_"
    assert [t.name for t in mm.info.inputs] == ["A", "B"] and mm.info.sizes == {"N": 64}
    assert mm.info.flops == 2 * 64**3 and mm.info.description.startswith("Square matrix product")

    relu = load_problem(str(DATA / "19_ReLU.py"))
    assert relu.info.sizes == {"batch_size": 16, "dim": 1024}
    assert relu.info.flops is None and relu.info.min_bytes == 2 * 16 * 1024 * 4

    conv = load_problem(str(DATA / "1_Conv2D_ReLU_BiasAdd.py"))
    assert [t.name for t in conv.info.params] == ["bias", "conv.weight", "conv.bias"]
    assert conv.info.outputs[0].shape == (8, 16, 30, 30)
    assert conv.info.sizes["height"] == conv.info.sizes["width"] == 32  # chained assignment
    assert "bias_shape" not in conv.info.sizes  # tuples are not sizes

    scal = load_problem(str(DATA / "5_Matrix_scalar_multiplication.py"))
    assert [t.name for t in scal.info.inputs] == ["A"] and scal.info.scalars == {"s": 3.14}
    assert scal.info.sizes["s"] == 3.14 and scal.info.args == ["A", "s"]
    inputs = scal.make_inputs("cpu", 0)
    assert inputs[1] == 3.14 and scal.scalar_values(inputs) == {"s": 3.14}
    (out,) = scal.run_reference(scal.build_model("cpu", 0), inputs)
    torch.testing.assert_close(out, inputs[0] * 3.14)
    assert set(scal.bindings(scal.build_model("cpu", 0), inputs, [out])) == {"A", "out"}


def test_kernelbench_cuda_calls_and_distributions_work_without_gpu():
    # get_inputs calls .cuda(), device="cuda" and a torch.distributions sampler (.item() inside,
    # which meta tensors cannot do): describe falls back to fake tensors, runs on the CPU
    p = load_problem(str(DATA / "100_HingeLoss_cuda.py"))
    assert [(t.name, t.shape) for t in p.info.inputs] == [("predictions", (128, 64)), ("targets", (128, 1))]
    assert p.info.outputs[0].shape == ()  # a scalar loss
    inputs = p.make_inputs("cpu", 5)
    assert all(x.device.type == "cpu" for x in inputs)
    (out,) = p.run_reference(p.build_model("cpu", 5), inputs)
    assert out.shape == () and torch.isfinite(out)


def test_kernelbench_meta_overrides():
    p = load_problem(str(DATA / "33_BatchNorm_meta.py"))
    assert (p.info.atol, p.info.rtol) == (1e-3, 2e-3)
    assert p.info.flops == 2 * 4 * 8 * 16 * 16 and p.info.flops_source == "meta"
    assert p.info.min_bytes == 12345
    assert p.info.description == "BatchNorm2d in eval mode (running stats are buffers)"
    names = [t.name for t in p.info.params]
    assert names == ["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert p.info.params[-1].dtype == "int64"


def test_huge_kernelbench_file_describes_fast(tmp_path):
    path = write(tmp_path, "big.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super(Model, self).__init__()
            def forward(self, x):
                return torch.relu(x)

        batch_size = 32768
        dim = 32768

        def get_inputs():
            return [torch.rand(batch_size, dim)]

        def get_init_inputs():
            return []
        """)  # fmt: skip
    start = time.perf_counter()
    p = load_problem(str(path))
    assert time.perf_counter() - start < 5
    assert p.info.min_bytes == 2 * 32768 * 32768 * 4


MALFORMED = {
    "syntax.py": ("class Model(nn.Module:\n    pass\n", "syntax error at line 1"),
    "no_model.py": ("import torch\ndef get_inputs():\n    return [torch.ones(2)]\n", "no `class Model"),
    "no_inputs.py": (
        "import torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n",
        "no `get_inputs()`",
    ),
    "raises.py": ("import torch\nraise RuntimeError('boom\\nsecond line')\n", "RuntimeError: boom second line"),
    "missing_import.py": ("import no_such_module_kerngen\n", "ModuleNotFoundError"),
    "not_module.py": ("class Model:\n    pass\ndef get_inputs():\n    return []\n", "subclass of torch.nn.Module"),
    "bad_forward.py": (
        "import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x @ x\n"
        "def get_inputs():\n    return [torch.ones(2, 3)]\ndef get_init_inputs():\n    return []\n",
        "forward failed",
    ),
    "returns_int.py": (
        "import torch, torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return 3\n"
        "def get_inputs():\n    return [torch.ones(2)]\n",
        "must return a tensor",
    ),
    "bad_meta.py": (
        "import torch, torch.nn as nn\nKERNGEN_META = {'atoll': 1}\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return x\ndef get_inputs():\n    return [torch.ones(2)]\n",
        "unknown KERNGEN_META key",
    ),
    "bad_init.py": (
        "import torch, torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
        "    def forward(self, x):\n        return x\ndef get_inputs():\n    return [torch.ones(2)]\n"
        "def get_init_inputs():\n    return []\n",
        "Model(*get_init_inputs()) failed",
    ),
    "exits.py": ("import sys\nsys.exit(3)\n", "SystemExit"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_give_one_line_problem_error(tmp_path, name):
    text, fragment = MALFORMED[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ProblemError) as e:
        load_problem(str(path))
    msg = one_line(e.value)
    assert str(path) in msg and fragment in msg, msg


def test_missing_path_and_folder():
    with pytest.raises(ProblemError, match="not found"):
        load_problem("/no/such/file.py")
    with pytest.raises(ProblemError, match="not found"):
        load_problem("softmaxx")
    with pytest.raises(ProblemError, match="folder"):
        load_problem(str(DATA))


def test_each_ref_gets_its_own_module():
    a = load_problem("softmax")
    b = load_problem(ProblemRef(source="softmax", shape=(4, 4)))
    assert a.module is not b.module and a.module.__name__ != b.module.__name__
    assert a.module.SHAPE == (4096, 65536) and b.module.SHAPE == (4, 4)
    assert "def get_inputs" in a.source()


COUNTED = """
    import torch
    import torch.nn as nn

    with open({log!r}, "a") as _log:  # one line per execution of this file
        _log.write("imported\\n")

    SCALE = {scale}

    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x) * SCALE

    def get_inputs():
        return [torch.randn(64, 128)]

    def get_init_inputs():
        return []
    """


def _counted(tmp_path: Path, scale: float = 2.0) -> tuple[Path, Path]:
    log = tmp_path / "imports.log"
    return write(tmp_path, "counted.py", COUNTED.format(log=str(log), scale=scale)), log


def _imports(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_problem_is_loaded_once_per_ref_and_content(tmp_path):
    from kerngen.problems.load import describe_problem

    path, log = _counted(tmp_path)
    a = load_problem(str(path))
    assert load_problem(str(path)) is a and load_problem(ProblemRef(source=str(path))) is a
    assert describe_problem(str(path)) is a.info
    assert _imports(log) == 1
    assert a.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and "SCALE = 2.0" in a.source()

    path.write_text(path.read_text().replace("SCALE = 2.0", "SCALE = 3.0"))  # an edited file loads again
    b = load_problem(str(path))
    assert b is not a and _imports(log) == 2 and b.info.sizes["SCALE"] == 3.0 and "SCALE = 3.0" in b.source()
    assert a.info.sizes["SCALE"] == 2.0 and "SCALE = 2.0" in a.source()  # the first stays what it ran
    assert load_problem(str(path)) is b and _imports(log) == 2


def test_a_failed_load_is_not_cached(tmp_path):
    path = tmp_path / "flaky.py"
    path.write_text("raise RuntimeError('not yet')\n")
    with pytest.raises(ProblemError, match="not yet"):
        load_problem(str(path))
    path.write_text(textwrap.dedent(COUNTED.format(log=str(tmp_path / "log"), scale=1.0)))
    assert load_problem(str(path)).info.outputs[0].shape == (64, 128)


def test_one_generate_runs_the_problem_file_once(tmp_path):
    """``kerngen generate FILE`` (scripted proposer and evaluator) loads, checks, records, seeds
    and describes FILE in several places: all of them share one import of it."""
    path, log = _counted(tmp_path)
    env = {**os.environ, "KERNGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "kerngen", "generate", str(path), "--evaluator", "scripted", "--proposer", "scripted",
         "--rounds", "1", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _imports(log) == 1


# --------------------------------------------------------------------------------------------
# inputs, seeds, perturbation


def test_inputs_are_seeded_and_leave_global_rng_alone():
    p = load_problem(ProblemRef(source="softmax", shape=(16, 64)))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a1 = p.make_inputs("cpu", 1)[0]
    a2 = p.make_inputs("cpu", 1)[0]
    b = p.make_inputs("cpu", 2)[0]
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a1, a2) and not torch.equal(a1, b)


def test_all_zero_input_is_an_error(tmp_path):
    path = write(tmp_path, "zeros.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return x + 1

        def get_inputs():
            return [torch.zeros(4, 4)]

        def get_init_inputs():
            return []
        """)  # fmt: skip
    p = load_problem(str(path))  # describing is fine (meta)
    with pytest.raises(ProblemError, match="all zeros") as e:
        p.make_inputs("cpu", 0)
    one_line(e.value)


def test_perturbation_moves_default_weights_deterministically():
    p = load_problem(ProblemRef(source="layernorm", shape=(2, 3, 4, 5)))
    m1 = p.build_model("cpu", seed=7)
    m1b = p.build_model("cpu", seed=7)
    m2 = p.build_model("cpu", seed=8)
    w, b = m1.ln.weight, m1.ln.bias
    assert not torch.allclose(w, torch.ones_like(w)) and not torch.allclose(b, torch.zeros_like(b))
    assert 0.01 < float((w - 1).std()) < 1.0  # ~0.1 * randn around the default 1
    assert torch.equal(w, m1b.ln.weight) and torch.equal(b, m1b.ln.bias)
    assert not torch.equal(w, m2.ln.weight)
    assert not m1.training
    assert not any(p_.requires_grad for p_ in m1.parameters())  # a reference, not a trainee


def test_perturbation_leaves_buffers_alone():
    p = load_problem(str(DATA / "33_BatchNorm_meta.py"))
    m = p.build_model("cpu", seed=3)
    assert torch.equal(m.bn.running_mean, torch.zeros(8)) and torch.equal(m.bn.running_var, torch.ones(8))
    assert not torch.allclose(m.bn.weight, torch.ones(8))


def test_perturbation_scales_with_parameter_std():
    p = load_problem(ProblemRef(source="conv2d", shape=(1, 3, 32, 32)))
    torch.manual_seed(0)
    ref = p._construct(torch.device("cpu"), 4)  # default init, unperturbed
    m = p.build_model("cpu", 4)
    delta = ((m.conv.weight - ref.conv.weight).std() / ref.conv.weight.std()).detach()
    assert 0.05 < float(delta) < 0.2


# --------------------------------------------------------------------------------------------
# degeneracy


def test_degenerate_problems_are_flagged():
    const = check_seed_dependence(load_problem(str(DATA / "degenerate_constant.py")))
    assert isinstance(const, DegeneracyReport) and const.degenerate and "constant" in const.reason
    mean = check_seed_dependence(load_problem(str(DATA / "degenerate_mean.py")))
    assert mean.degenerate and mean.rel_diff < 1e-3 and "barely depends" in mean.reason
    ok = check_seed_dependence(load_problem(str(DATA / "19_ReLU.py")))
    assert not ok.degenerate and ok.rel_diff > 0.1 and ok.output_std > 0.1 and ok.reason == ""


@pytest.mark.parametrize("name", ["degenerate_constant.py", "degenerate_mean.py", "19_ReLU.py"])
def test_the_degeneracy_check_reads_outputs_chunk_by_chunk_with_the_same_verdict(name, monkeypatch):
    """KernelBench's 8.6 GB outputs as whole fp64 copies ran the baseline out of memory: the check
    now sums chunk by chunk; chunks of 7 elements give the whole-tensor figures."""
    import kerngen.problems.degenerate as D

    problem = load_problem(str(DATA / name))
    whole = check_seed_dependence(problem)
    monkeypatch.setattr(D, "CHUNK", 7)
    chunked = check_seed_dependence(problem)
    assert (chunked.degenerate, chunked.reason[:20]) == (whole.degenerate, whole.reason[:20])
    assert chunked.rel_diff == pytest.approx(whole.rel_diff, rel=1e-9, abs=1e-15)
    assert chunked.output_std == pytest.approx(whole.output_std, rel=1e-6, abs=1e-12)


# --------------------------------------------------------------------------------------------
# info API


def test_info_tensor_facts_summary_and_json_roundtrip():
    p = load_problem(ProblemRef(source="conv_relu_maxpool", shape=(4, 3, 16, 16)))
    facts = p.info.tensor_facts()
    assert facts["x"] == TensorFacts((4, 3, 16, 16)) and facts["out"].numel == 4 * 64 * 8 * 8
    assert facts["conv.weight"].ndim == 4
    text = p.info.summary()
    for needle in ("conv_relu_maxpool", "x: float32[4, 3, 16, 16]", "out: float32[4, 64, 8, 8]",
                   "conv.weight", "FLOPs", "atol=0.0001", "batch=4"):  # fmt: skip
        assert needle in text, needle
    again = ProblemInfo.model_validate_json(p.info.model_dump_json())
    assert again == p.info and again.tensor_facts() == facts
    assert isinstance(p, Problem) and p.dtype == torch.float32


def test_strict_fp32_turns_tf32_off():
    torch.backends.cuda.matmul.allow_tf32 = True
    strict_fp32()
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"


# --------------------------------------------------------------------------------------------
# GPU tier (skips itself without a CUDA device)


@pytest.mark.gpu
def test_gpu_inputs_are_generated_on_the_device():
    p = load_problem("softmax")  # 1 GiB fp32 input at the default size
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    (x,) = p.make_inputs("cuda", 0)
    assert x.is_cuda and x.shape == (4096, 65536)
    assert torch.cuda.memory_allocated() - base == x.numel() * 4
    (y,) = p.make_inputs("cuda", 0)
    assert torch.equal(x, y)
    del x, y
    h = load_problem(str(DATA / "100_HingeLoss_cuda.py"))
    inputs = h.make_inputs("cuda", 1)
    assert all(t.is_cuda for t in inputs)
    assert h.run_reference(h.build_model("cuda", 1), inputs)[0].is_cuda


@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILTINS)
def test_gpu_builtins_at_default_size(name):
    p = load_problem(name)
    model = p.build_model("cuda", 0)
    assert all(t.is_cuda for t in model.parameters())
    outputs = p.run_reference(model, p.make_inputs("cuda", 0))
    assert [tuple(o.shape) for o in outputs] == [t.shape for t in p.info.outputs]
    assert all(bool(torch.isfinite(o.float()).all()) for o in outputs)
    report = check_seed_dependence(p, device="cuda")
    assert not report.degenerate, report
    del model, outputs
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_gpu_fp32_reference_is_true_fp32_and_tf32_fails_the_check():
    p = load_problem(ProblemRef(source="matmul", shape=(2048,)))
    A, B = p.make_inputs("cuda", 0)
    (ref,) = p.run_reference(p.build_model("cuda", 0), [A, B])  # strict_fp32() inside
    exact = (A.double() @ B.double()).float()
    torch.testing.assert_close(ref, exact, atol=p.info.atol, rtol=p.info.rtol)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        tf32 = A @ B
    finally:
        strict_fp32()
    assert not torch.allclose(tf32, exact, atol=p.info.atol, rtol=p.info.rtol)
