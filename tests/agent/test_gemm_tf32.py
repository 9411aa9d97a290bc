"""The gemm family's 3xTF32 variant (#19): the fused-epilogue GEMM on the tensor cores at fp32
accuracy. Offered where its tiles divide the shape and A is row-major (nn.Linear, batched and
transposed-B products of KernelBench), never for a triangle mask; its specs resolve against the
files' own sizes and compile with NVRTC for sm_90 and sm_80 without spills. The numbers are the GPU
tier's (tests/agent/test_gpu_gemm_tf32.py): the mma.sync PTX has no CPU model here beyond
tests/agent/test_tf32.py's split arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import builders, explain
from kerngen.agent.playbook.build_gemm_tf32 import VARIANT
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.fam_gemm import FAMILY
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem

KB = Path("/work/shared/kernelbench")
pytestmark = pytest.mark.skipif(not (KB / "level1").is_dir(), reason="no KernelBench copy at /work/shared/kernelbench")

CASES = {  # file: (TRANS_B, launch args by name, batch)
    "level2/76_Gemm_Add_ReLU.py": (1, ["x", "gemm.weight", "bias", "out"], 1),  # x @ W^T, then + bias, relu
    "level2/12_Gemm_Multiply_LeakyReLU.py": (1, ["x", "gemm.weight", "gemm.bias", "out"], 1),
    "level1/3_Batched_matrix_multiplication.py": (0, ["A", "B", "out"], 128),
    "level1/17_Matmul_with_transposed_B.py": (1, ["A", "B", "out"], 1),
}


def _resolved(name: str, config: dict[str, int] | None = None):
    m = explain(load_problem(str(KB / name)))
    spec = builders.build(m, VARIANT)
    return m, spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=config)


@pytest.mark.parametrize("name", list(CASES))
def test_offered_and_resolved_at_the_files_own_size(name):
    trans_b, names, batch = CASES[name]
    m, spec, r = _resolved(name)
    assert m.family == "gemm" and VARIANT in [v.variant for v in offer(m, sizes={}, tensors=m.tensor_facts()).offered]
    assert spec.name == FAMILY.spec_name(VARIANT) == "playbook-gemm-tf32x3" and variant_of_spec(spec) == VARIANT
    (launch,) = r.launches
    assert [a.name for a in launch.args if a.name] == names and [a.kind for a in launch.args][-3:] == ["int32"] * 3
    assert r.defines["TRANS_B"] == trans_b and launch.grid[2] == batch
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in spec.source
    assert spec.tunables["TERMS"] == [3] or r.config["TERMS"] == 3  # never plain TF32 in this family


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("name", ["level2/76_Gemm_Add_ReLU.py", "level1/3_Batched_matrix_multiplication.py"])
def test_both_layouts_compile_without_spills(name, arch):
    for config in (None, {"BM": 64, "BN": 128, "WM": 32, "WN": 64, "STAGES": 4}):
        _, spec, r = _resolved(name, config)
        res = compile_job(job_for(spec, r, arch), cache=None).info.worst()
        assert res.registers <= 255 and (config is not None or res.spill_stores == 0), (config, res)


@pytest.mark.parametrize("name, why", [
    ("level1/14_Matmul_for_upper_triangular_matrices.py", "cannot be rendered"),  # a triangle mask
    ("level1/8_Matmul_with_irregular_shapes_.py", "admissible"),  # 8205 x 2949 x 5921: no tile divides it
])
def test_not_offered_where_it_cannot_serve_and_said_why(name, why):
    m = explain(load_problem(str(KB / name)))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    dropped = {v.variant: v.why for v in o.dropped}
    assert VARIANT not in [v.variant for v in o.offered] and why in dropped[VARIANT]
    assert o.offered  # an FFMA kernel still serves it
