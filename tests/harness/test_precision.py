"""``--precision tf32`` without a GPU: the tolerance derived from how far PyTorch's TF32 result lies
from fp64 (with its margin of 4) admits a 1xTF32 kernel (the playbook's TF32 GEMM with TERMS 1,
its arithmetic modelled in numpy) and still refuses one off by more, while at the default (true
fp32) the same 1xTF32 kernel is rejected; the settings, the plumbing and the labels."""

from __future__ import annotations

import pytest
import torch

from kerngen.harness.gpu.compare import compare
from kerngen.harness.gpu.precision import (
    TF32_MARGIN, Tolerance, default_tolerance, measure_tf32, tf32_tolerance, tolerance_for,
)
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef, parse_precision, parse_problem_ref, parse_shapes
from kerngen.problems.torch_modes import (
    DEFAULTS_LABEL, Precision, precision_mode, pytorch_defaults, set_precision, strict_fp32,
)
from kerngen.agent.playbook.gemm.build_tf32 import TERMS_PLAIN, TERMS_SPLIT
from tests.agent.test_tf32 import mma_model, tf32

SHAPE = (64, 64, 512)  # M, N, K: K long enough for TF32's rounding to show


@pytest.fixture(scope="module")
def matmul():
    """The built-in matmul's inputs, the truth in fp64, "PyTorch at TF32" (inputs rounded to TF32,
    products summed in fp32, as cuBLAS's TF32 path does) and the true fp32 reference."""
    p = load_problem(ProblemRef(source="matmul", shape=SHAPE, precision="tf32"))
    a, b = p.make_inputs("cpu", 3)
    truth = a.double() @ b.double()
    pytorch_tf32 = torch.from_numpy(tf32(a.numpy())) @ torch.from_numpy(tf32(b.numpy()))
    return p, a.numpy(), b.numpy(), truth, pytorch_tf32, (a @ b)


def test_a_1xtf32_kernel_is_rejected_at_true_fp32_and_admitted_at_tf32(matmul):
    p, a, b, truth, pytorch_tf32, fp32_ref = matmul
    plain = torch.from_numpy(mma_model(a, b, TERMS_PLAIN, flush_bk=32))  # what TERMS 1 computes
    split3 = torch.from_numpy(mma_model(a, b, TERMS_SPLIT, flush_bk=32))
    default = default_tolerance(p.info)
    assert not compare(plain, fp32_ref, atol=default.atol, rtol=default.rtol).ok  # still rejected at the default
    assert compare(split3, fp32_ref, atol=default.atol, rtol=default.rtol).ok

    tol = tf32_tolerance(p.info, [pytorch_tf32], [truth], "fp64")
    assert tol.precision is Precision.tf32 and tol.measured_abs > 1e-4  # TF32 is off by more than fp32's atol
    assert tol.atol == pytest.approx(TF32_MARGIN * tol.measured_abs)
    assert tol.rel_limit("float32") == pytest.approx(TF32_MARGIN * tol.measured_rel)
    assert tol.rel_limit(torch.bfloat16) is None and tol.rtol == default.rtol
    c = compare(plain, pytorch_tf32, atol=tol.atol, rtol=tol.rtol, rel_limit=tol.rel_limit(torch.float32))
    assert c.ok, c.message  # 1xTF32 against PyTorch's TF32 reference: within the measured tolerance
    assert compare(split3, pytorch_tf32, atol=tol.atol, rtol=tol.rtol, rel_limit=tol.rel_limit(torch.float32)).ok
    # a kernel further off than PyTorch's own TF32 (products of bf16-rounded inputs) is still refused
    bf16 = (torch.from_numpy(a).bfloat16().float() @ torch.from_numpy(b).bfloat16().float())
    assert not compare(bf16, pytorch_tf32, atol=tol.atol, rtol=tol.rtol, rel_limit=tol.rel_limit(torch.float32)).ok
    assert "TF32: PyTorch's TF32 output is off by" in tol.note() and "4x that" in tol.note()


def test_a_wider_limit_moves_the_gross_error_line_with_it():
    ref = torch.linspace(1, 2, 1000)
    out = ref * (1 + 3e-3)  # 0.3% off: within atol/rtol of 1e-2
    assert compare(out, ref, atol=1e-2, rtol=1e-2).failed.value == "precision_loss"  # fp32's 1e-5 limit
    assert compare(out, ref, atol=1e-2, rtol=1e-2, rel_limit=4e-3).ok
    assert compare(out, ref, atol=1e-2, rtol=1e-2, rel_limit=1e-3).failed.value == "precision_loss"


def test_measured_on_the_problem_itself(matmul):
    """On the CPU PyTorch has no TF32, so the measurement finds fp32's own rounding and the tolerance
    stays the problem's: the plumbing (inputs, fp64 copy of the model, settings) is what runs here."""
    p = matmul[0]
    tol = measure_tf32(p, p.build_model("cpu", 0), "cpu")
    assert tol.against == "fp64" and tol.measured_abs < 1e-4
    assert tol.atol == p.info.atol and tol.rel_limit("float32") == pytest.approx(1e-5)


class _State:
    def __init__(self, precision: str | None) -> None:
        self.problem = load_problem(ProblemRef(source="softmax", shape=(4, 8), precision=precision))
        self.info, self.model, self.device = self.problem.info, None, "cpu"


def test_tolerance_of_a_worker_state_is_measured_once_at_tf32_only():
    measured = []

    def measure(problem, model, device):
        measured.append(problem.ref.precision)
        return Tolerance(precision=Precision.tf32, atol=3e-3, rtol=1e-4, rel_limits={"float32": 2e-3})

    fp32 = _State(None)
    assert tolerance_for(fp32, measure) == default_tolerance(fp32.info) and measured == []
    tf = _State("tf32")
    assert tolerance_for(tf, measure).atol == 3e-3 and tolerance_for(tf, measure).atol == 3e-3
    assert measured == ["tf32"]


def test_precision_settings_and_their_restoring():
    strict_fp32()
    assert not torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    with pytorch_defaults() as label:
        assert label == DEFAULTS_LABEL and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"  # matmuls as a fresh process has them
    assert not torch.backends.cudnn.allow_tf32
    with pytorch_defaults("tf32") as label:
        assert "matmul" in label and torch.get_float32_matmul_precision() == "high"
    with precision_mode("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert not torch.backends.cuda.matmul.allow_tf32
    set_precision("tf32")
    assert torch.backends.cuda.matmul.allow_tf32
    set_precision(None)
    assert not torch.backends.cuda.matmul.allow_tf32


def test_precision_on_the_problem_ref():
    fp32 = ProblemRef(source="softmax")
    assert ProblemRef(source="softmax", precision="fp32") == fp32  # one spelling of the default
    assert "precision" not in fp32.model_dump_json()  # journals and keys as before the field
    tf = parse_problem_ref("softmax", precision="TF32")
    assert tf.precision == "tf32" and tf.label() == "softmax [tf32]" and tf.key() != fp32.key()
    assert ProblemRef.model_validate_json(tf.model_dump_json()) == tf
    assert parse_precision(None) is None and parse_precision("fp32") is None
    from kerngen.errors import ProblemError

    with pytest.raises(ProblemError, match="unknown precision 'fp16'"):
        parse_precision("fp16")
    with pytest.raises(ValueError):
        ProblemRef(source="softmax", precision="bf16x9")


def test_a_tf32_problem_runs_its_reference_at_tf32():
    p = load_problem(ProblemRef(source="softmax", shape=(4, 8), precision="tf32"))
    assert p.ref.precision == "tf32" and p.info.atol == 1e-4  # the problem's own; widened when measured


@pytest.mark.parametrize("text,shapes", [
    ("1x4096,8x4096,64x4096", [(1, 4096), (8, 4096), (64, 4096)]),
    ("8192x1024", [(8192, 1024)]),
    ("8192,1024", [(8192, 1024)]),  # a comma between plain numbers: one shape, as before
    ("(8192, 1024)", [(8192, 1024)]),
    ("1x4096;8x4096", [(1, 4096), (8, 4096)]),
])
def test_shape_lists(text, shapes):
    assert parse_shapes(text) == shapes


def test_bad_shape_lists():
    from kerngen.errors import ProblemError

    with pytest.raises(ProblemError, match="names a shape twice"):
        parse_shapes("8x8,8x8")
    with pytest.raises(ProblemError, match="cannot read shape"):
        parse_shapes("8x8,ax8")

