"""An exported op at every shape (CPU tier): the kernel runs in the CPU emulator (tests/emu) behind
the same admission, caching and fallback code as on a GPU. Which bucket serves a shape, when the
problem's own PyTorch forward runs instead (warned once, counted), strict mode, the fake
implementation's shapes, and torch.compile(fullgraph=True) through the op."""

from __future__ import annotations

import warnings

import pytest
import torch

from kerngen.harness.gpu.op_call import register_op
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.registry import builtin_names
from kerngen.problems.ref import ProblemRef
from kerngen.results.export import BucketSource, export_spec
from kerngen.results.exported_kernel import ExportedKernel, FallbackWarning, shape_bound_sizes
from kerngen.results.op_fallback import builtin_fallback
from tests.emu.runner import available, emulate
from tests.kernels.specs import CASES

pytestmark = pytest.mark.skipif(not available(), reason="no C++ compiler (g++) for the CPU emulator")

SCALE_FILE = '''
import torch
import torch.nn as nn

cols = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return x * self.w


def get_inputs():
    return [torch.randn(8, cols)]


def get_init_inputs():
    return []
'''

SCALE_SOURCE = r"""
extern "C" __global__ void scale(const float* x, const float* w, float* out, long long n, int cols) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * w[i % cols];
}
"""


def scale_spec(cols: object = "x.shape[1]") -> KernelSpec:
    return KernelSpec.model_validate({
        "name": "scale", "source": SCALE_SOURCE, "constraints": ["w.shape[0] == x.shape[1]"],
        "steps": [{"kernel": "scale", "grid": ["cdiv(x.numel, 128)"], "block": [128],
                   "args": [{"name": "x"}, {"name": "w"}, {"name": "out"}, {"kind": "int64", "value": "x.numel"},
                            {"kind": "int32", "value": cols}]}]})


class Emulated:
    """A binder that runs plans in the CPU emulator, counting binds and runs per shape."""

    def __init__(self) -> None:
        self.binds: list[tuple] = []
        self.runs: list[tuple] = []

    def __call__(self, variant):
        def bind(plan, device, slots):
            self.binds.append(tuple(plan.steps[0].grid))
            scratch = {s.name for s in plan.scratch}

            def run(tensors, stream):
                named = {n: t for n, t in zip(slots.names, tensors) if n not in scratch}
                self.runs.append(tuple(tensors[0].shape))
                emulate(variant.spec, named, config=plan.config, sizes=variant.sizes)
            return run
        return bind


@pytest.fixture(scope="module")
def softmax_export(tmp_path_factory):
    """softmax_ok checked at two shapes: one export, two buckets."""
    spec = CASES["softmax_ok"].spec
    more = load_problem(ProblemRef(source="softmax", shape=(64, 100))).info
    return export_spec(spec, {"BLOCK": 128}, ProblemRef(source="softmax", shape=(8, 100)),
                       tmp_path_factory.mktemp("sm"), name="sm_buckets_test",
                       more=[BucketSource(spec=spec, config={"BLOCK": 64}, info=more, origin="test bucket")])


@pytest.fixture(scope="module")
def scale_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "scale.py"
    path.write_text(SCALE_FILE)
    return path


def scale_export(tmp_path, scale_file, spec: KernelSpec, name: str):
    return export_spec(spec, {}, ProblemRef(source=str(scale_file)), tmp_path / name, name=name)


def test_each_bucket_serves_its_shape_and_the_nearest_admitting_one_others(softmax_export):
    emu = Emulated()
    op = ExportedKernel(softmax_export.manifest, binder=emu)
    assert len(op.variants) == 2 and softmax_export.buckets == 1
    for rows in (8, 64, 8, 32, 32):
        x = torch.randn(rows, 100)
        assert torch.allclose(op(x), torch.softmax(x, dim=1), atol=1e-6)
    d = op.stats.decisions
    assert d["float32[8, 100]"] == "kernel of bucket 0" and d["float32[64, 100]"] == "kernel of bucket 1"
    assert d["float32[32, 100]"] == "kernel of bucket 1 (an unchecked shape)"  # 3200 is nearer 6400 than 800
    assert op.stats.fallback_calls == 0 and op.runtime.entries == 3
    assert emu.binds == [(8, 1, 1), (64, 1, 1), (32, 1, 1)]  # bound once per shape, 5 calls
    assert emu.runs == [(8, 100), (64, 100), (8, 100), (32, 100), (32, 100)]
    assert op._kernels[1].plans.builds == 2  # bucket 1: its own plan (seeded) and the one at 32 rows


class Tampered(Emulated):
    """The emulator behind a launch path that changes the output after the kernel ran (``tamper(out)``)."""

    def __init__(self, tamper) -> None:
        super().__init__()
        self.tamper = tamper

    def __call__(self, variant):
        inner = super().__call__(variant)

        def bind(plan, device, slots):
            run = inner(plan, device, slots)

            def tampered(tensors, stream):
                run(tensors, stream)
                self.tamper(tensors[slots.names.index("out")])
            return tampered
        return bind


def corrupted():
    """One element off: what a checked kernel would give through a defective op path (on 4x H200, 2026-11-28,
    regions specs' ops differed from their kernels)."""
    return Tampered(lambda out: out.view(-1)[:1].add_(1.0))


def test_a_checked_buckets_first_call_is_compared_and_a_wrong_launch_path_falls_back(softmax_export):
    """The first call at a bucket's own checked shape is compared with PyTorch too: an op whose launch path disagrees
    with the kernel the harness checked gives PyTorch's answer, warned, and never the wrong one; a right one runs."""
    op = ExportedKernel(softmax_export.manifest, binder=corrupted())
    x = torch.randn(8, 100)
    with pytest.warns(FallbackWarning, match="the kernel disagreed with the fallback"):
        first = op(x)
    assert torch.allclose(first, torch.softmax(x, dim=1), atol=1e-6)
    assert torch.allclose(op(x), torch.softmax(x, dim=1), atol=1e-6) and op.stats.fallback_calls == 2
    good = ExportedKernel(softmax_export.manifest, binder=Emulated())
    assert torch.allclose(good(x), torch.softmax(x, dim=1), atol=1e-6) and good.stats.fallback_calls == 0


def rounded():
    """Every output element off by 1e-7 of the output's largest: what another honest fp32 summation order gives (a
    4096-deep matmul of randn inputs differs from cuBLAS by ~1e-3 in absolute terms, H200 2026-11-28, and fell back
    to PyTorch at 2.3x its kernel's time)."""
    return Tampered(lambda out: out.add_(1e-7 * out.abs().max()
                                         * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))))


def test_rounding_at_the_callers_scale_is_not_a_disagreement_but_a_wrong_value_is(tmp_path, scale_file):
    """The first call's comparison moves with the caller's scale: outputs of 1e4 off by 1e-3 (past atol and, near
    zero, rtol) are rounding by ||out-ref||/||ref||, and the kernel runs; one element off by 1% of the largest
    falls back, at any scale."""
    res = scale_export(tmp_path, scale_file, scale_spec(), "scale_ok")
    x, w = 1e4 * torch.randn(8, 128), torch.randn(128)
    op = ExportedKernel(res.manifest, binder=rounded(), fallback=_model_of(res))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = op(x, w)
    assert not torch.allclose(y, x * w, atol=1e-4, rtol=1e-5) and op.stats.fallback_calls == 0
    assert "kernel" in op.stats.decisions["float32[8, 128], float32[128]"]

    off = Tampered(lambda out: out.view(-1)[3:4].add_(0.01 * out.abs().max()))  # one element, 1% of the largest
    bad = ExportedKernel(res.manifest, binder=off, fallback=_model_of(res))
    with pytest.warns(FallbackWarning, match=r"\|\|out-ref\|\|/\|\|ref\|\| .* > 1e-05"):
        assert torch.allclose(bad(x, w), x * w)


def test_a_nan_where_pytorch_has_none_falls_back_however_small_the_relative_error(tmp_path, scale_file):
    """The comparison is the harness's own (compare.py): one NaN among 1024 rounded values, which the norms over
    finite elements would not see, is a disagreement; NaN where PyTorch has NaN too is not."""
    res = scale_export(tmp_path, scale_file, scale_spec(), "scale_nan")
    x, w = 1e4 * torch.randn(8, 128), torch.randn(128)
    nan = Tampered(lambda out: out.view(-1)[5:6].fill_(float("nan")))
    bad = ExportedKernel(res.manifest, binder=nan, fallback=_model_of(res))
    with pytest.warns(FallbackWarning, match="NaN or inf where PyTorch has none"):
        assert torch.allclose(bad(x, w), x * w)
    x[0, 0] = float("nan")  # PyTorch's output has that NaN too: the kernel's is no disagreement
    op = ExportedKernel(res.manifest, binder=Emulated(), fallback=_model_of(res))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = op(x, w)
    assert torch.isnan(y[0, 0]) and op.stats.fallback_calls == 0


def test_a_dtype_no_kernel_has_falls_back_once_warned_and_counted(softmax_export):
    op = ExportedKernel(softmax_export.manifest, binder=Emulated())
    x = torch.randn(8, 100, dtype=torch.float64)
    with pytest.warns(FallbackWarning, match=r"float64\[8, 100\]: no kernel for these dtypes"):
        y = op(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per signature
        y2 = op(x)
    assert y.dtype == torch.float64 and torch.equal(y, y2) and torch.allclose(y, torch.softmax(x, dim=1))
    assert op.stats.fallback_calls == 2
    op.configure(strict=True)
    with pytest.raises(ValueError, match=r"no kernel for float64\[8, 100\].*\(strict mode\)"):
        op(x)
    with pytest.raises(ValueError, match="strict mode"):
        op.fake(torch.empty(8, 100, dtype=torch.float64, device="meta"))


def test_fake_gives_each_path_its_shapes(softmax_export):
    op = ExportedKernel(softmax_export.manifest, binder=Emulated())
    assert op.fake(torch.empty(64, 100, device="meta")).shape == (64, 100)  # a bucket: from the manifest
    assert op.fake(torch.empty(5, 7, device="meta")).shape == (5, 7)  # from the built-in problem on meta tensors
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        y = op.fake(mode.from_tensor(torch.empty(3, 100, dtype=torch.float16)))
        assert y.shape == (3, 100) and y.dtype == torch.float16


def test_a_kernel_that_disagrees_at_a_new_shape_is_dropped_there(tmp_path, scale_file):
    # cols hard-coded: right at the checked shape only
    res = scale_export(tmp_path, scale_file, scale_spec(64), "scale_fixed")
    op = ExportedKernel(res.manifest, binder=Emulated(), fallback=_model_of(res))
    x, w = torch.randn(8, 128), torch.randn(128)
    with pytest.warns(FallbackWarning, match="the kernel disagreed with the fallback"):
        y = op(x, w)
    assert torch.allclose(y, x * w) and "fallback" in op.stats.decisions["float32[8, 128], float32[128]"]
    assert torch.allclose(op(x, w), x * w) and op.stats.fallback_calls == 2  # the first call's, then this one


def load_module_model(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("scale_problem_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Model()


def test_a_problem_with_parameters_needs_its_model_for_new_shapes(tmp_path, scale_file):
    res = scale_export(tmp_path, scale_file, scale_spec(), "scale_ok")
    emu = Emulated()
    op = ExportedKernel(res.manifest, binder=emu)  # a file problem: no fallback of its own
    assert op.fallback is None
    x, w = torch.randn(8, 64), torch.randn(64)
    assert torch.allclose(op(x, w), x * w)  # the checked shape needs nothing more
    with pytest.raises(ValueError, match=r"no kernel for float32\[16, 32\], float32\[32\]: .*fallback=model"):
        op(torch.randn(16, 32), torch.randn(32))
    op.configure(fallback=_model_of(res))
    x2, w2 = torch.randn(16, 32), torch.randn(32)
    assert torch.allclose(op(x2, w2), x2 * w2)  # the op's own w, not the model's
    assert op.stats.decisions["float32[16, 32], float32[32]"] == "kernel of bucket 0 (an unchecked shape)"
    assert op.stats.fallback_calls == 0 and emu.runs[-1] == (16, 32)
    with pytest.raises(ValueError, match="no parameter or buffer 'w'"):
        op.configure(fallback=torch.nn.Linear(2, 2))


def _model_of(res):
    """The problem's Model, built from the file the export was made from (the user's own copy)."""
    from kerngen.results.manifest import read_manifest

    return load_module_model(read_manifest(res.manifest).problem.source)


def test_a_plan_that_reads_a_size_following_the_shapes_serves_its_own_shape_only(tmp_path, scale_file):
    res = scale_export(tmp_path, scale_file, scale_spec("cols"), "scale_sized")
    op = ExportedKernel(res.manifest, binder=Emulated(), fallback=_model_of(res))
    assert shape_bound_sizes(op.variants[0]) == ["cols"]
    x, w = torch.randn(8, 64), torch.randn(64)
    assert torch.allclose(op(x, w), x * w) and op.stats.decisions["float32[8, 64], float32[64]"] == "kernel of bucket 0"
    with pytest.warns(FallbackWarning, match="reads the size cols that follow the shapes"):
        assert torch.allclose(op(torch.ones(4, 64), w), w.expand(4, 64))


def test_torch_compile_fullgraph_traces_through_the_op(softmax_export):
    emu = Emulated()
    kernel = ExportedKernel(softmax_export.manifest, binder=emu)
    op = register_op("kerngen_test::sm_compiled", kernel.manifest.schema(), lambda *a: kernel(*a),
                     lambda *a: kernel.fake(*a))

    def model(x):
        return op(x * 2.0) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # a graph break would raise
    x = torch.randn(8, 100)
    assert torch.allclose(compiled(x), torch.softmax(x * 2.0, dim=1) + 1.0, atol=1e-6)
    assert emu.runs == [(8, 100)]


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtins_fallback_builds_at_its_own_shapes(name):
    # the first call of an export is compared with its built-in problem at the call's shapes, so the built-in must be
    # buildable from its arguments' shapes: linear_gelu's SHAPE (M, N, K) is no input's shape, and its first call
    # failed in the GPU host's run of kerngen.load (2026-11-29) until its shape_of_inputs read N from the weight
    info = load_problem(ProblemRef(source=name)).info
    fb = builtin_fallback(name, None, info.inputs, info.params, list(info.args), info.scalars)
    shapes = tuple((tuple(t.shape), getattr(torch, t.dtype)) for t in [*info.inputs, *info.params])
    assert fb.output_shapes(shapes, None) == [(tuple(o.shape), getattr(torch, o.dtype)) for o in info.outputs]
