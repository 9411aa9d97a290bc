"""The playbook's inline-PTX kernels on the CPU emulator (tests/emu, which runs mma.sync, cp.async and the
tf32 cvt: tests/emu/README.md "Inline PTX") against PyTorch at the harness's fp32 tolerances, on small
KernelBench copies: the gemm and conv_epi families' 3xTF32 variants, the built-in conv2d's, and the conv_epi
implicit GEMM through its cp.async path (ASYNC 1, its offered default); and the 3xTF32 GEMM's split-K plan
(SPLIT_K 2 and 4: partial tiles, then the ordered sum with the epilogue) on a matmul whose k tiles do not
divide evenly among the slices, an nn.Linear with bias and epilogue, and a batched product."""

from __future__ import annotations


import pytest

from kerngen.agent.playbook import explain, family_of
from tests.agent.family_checks import resized_copy
from tests.emu import cases
from tests.emu.runner import emulate
from tests.resources import kernelbench


def _build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)


KB = kernelbench()
pytestmark = [pytest.mark.needs_cxx,
              pytest.mark.needs_kernelbench]

# the smallest 3xTF32 tiles: 4 warps of 32 x 32, two k8 steps per tile
TF32_GEMM = {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "STAGES": 3}
TF32_CONV = {"BM": 64, "BK": 16, "WM": 32, "WN": 16, "STAGES": 2}  # BN: the channel tile the builder picks


def test_gemm_tf32x3_with_its_epilogue(tmp_path):
    path = resized_copy(KB / "level2" / "12_Gemm_Multiply_LeakyReLU.py", tmp_path, batch_size=128, in_features=48,
                        out_features=64)
    assert cases.run_variant(path, "tf32x3", TF32_GEMM) == {}


@pytest.mark.parametrize("variant, config", [("igemm", None), ("tf32x3", TF32_CONV)])
def test_conv_epi_inline_ptx_variants(tmp_path, variant, config):
    path = resized_copy(KB / "level2" / "1_Conv2D_ReLU_BiasAdd.py", tmp_path, batch_size=2, in_channels=3,
                        out_channels=16, height="width = 9")
    assert cases.run_variant(path, variant, config) == {}


def test_conv2d_tf32x3():
    assert cases.run_variant("conv2d", "tf32x3", TF32_CONV, shape=(2, 3, 12, 10)) == {}


# split-K: 7 k tiles of 16 (K = 112): slices of 4 + 3 (SPLIT_K 2) and 2 + 2 + 2 + 1 (SPLIT_K 4)
SPLIT_K_INNER = 112


def _split_k_mismatches(source, split: int, shape=None) -> dict[str, str]:
    """Emulate the 3xTF32 GEMM built with ``SPLIT_K`` = ``split`` (its two-launch plan) on seeded inputs."""
    problem = cases.load(source, shape)
    spec = _build(explain(problem), "tf32x3", {**TF32_GEMM, "SPLIT_K": split})
    assert [s.kernel for s in spec.steps] == ["sgemm_tf32x3", "sgemm_tf32x3_sum"]
    case = cases.make_case(problem)
    emulate(spec, case.tensors, sizes=case.sizes)
    return cases.mismatches(case)


@pytest.mark.parametrize("split", [2, 4])
def test_split_k_matmul_with_uneven_slices(split):
    assert _split_k_mismatches("matmul", split, shape=(64, 128, SPLIT_K_INNER)) == {}


@pytest.mark.parametrize("split", [2, 4])
def test_split_k_linear_with_bias_and_epilogue(tmp_path, split):
    path = resized_copy(KB / "level2" / "12_Gemm_Multiply_LeakyReLU.py", tmp_path, batch_size=64,
                        in_features=SPLIT_K_INNER, out_features=128)
    assert _split_k_mismatches(path, split) == {}


@pytest.mark.parametrize("split", [2, 4])
def test_split_k_batched_matmul(tmp_path, split):
    path = resized_copy(KB / "level1" / "3_Batched_matrix_multiplication.py", tmp_path, batch_size=3, m=64,
                        k=SPLIT_K_INNER, n=64)
    assert _split_k_mismatches(path, split) == {}


# the padded variant (KernelBench 8: 8205 x 2949 x 5921, no tile divides it): A and B zero-padded to
# whole tiles, the aligned kernel, the leading block copied out; odd M, K and N, and a K under one tile
@pytest.mark.parametrize("shape", [(70, 37, 45), (3, 5, 2)])
def test_padded_matmul_where_no_tile_divides(shape):
    problem = cases.load("matmul", shape)
    spec = _build(explain(problem), "tf32x3_padded", TF32_GEMM)
    assert [s.kernel for s in spec.steps] == ["sgemm_tf32x3_pad"] * 2 + ["sgemm_tf32x3", "sgemm_tf32x3_pad"]
    case = cases.make_case(problem)
    emulate(spec, case.tensors, sizes=case.sizes)
    assert cases.mismatches(case) == {}
