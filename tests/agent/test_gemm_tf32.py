"""The gemm family's 3xTF32 variant (#19): the fused-epilogue GEMM on the tensor cores at fp32
accuracy. Offered where its tiles divide the shape and A is row-major (nn.Linear, batched and
transposed-B products of KernelBench), never for a triangle mask; its specs resolve against the
files' own sizes and compile with NVRTC for sm_90 and sm_80 without spills; so does its split-K plan
(SPLIT_K 2 and 4, on resized copies whose outputs have few tiles: the files' own sizes fill the GPU and
are refused it). The numbers are the emulator's (tests/agent/test_emu_tf32.py) and the GPU tier's
(tests/agent/test_gpu_gemm_tf32.py)."""

from __future__ import annotations


import pytest

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.gemm.build_tf32 import VARIANT
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.gemm.gemm import GEMM as FAMILY
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.agent.family_checks import resized_copy
from tests.resources import kernelbench

KB = kernelbench()
pytestmark = pytest.mark.needs_kernelbench

CASES = {  # file: (TRANS_B, launch args by name, batch)
    "level2/76_Gemm_Add_ReLU.py": (1, ["x", "gemm.weight", "bias", "out"], 1),  # x @ W^T, then + bias, relu
    "level2/12_Gemm_Multiply_LeakyReLU.py": (1, ["x", "gemm.weight", "gemm.bias", "out"], 1),
    "level1/3_Batched_matrix_multiplication.py": (0, ["A", "B", "out"], 128),
    "level1/17_Matmul_with_transposed_B.py": (1, ["A", "B", "out"], 1),
}


def _resolved(name: str, config: dict[str, int] | None = None):
    m = explain(load_problem(str(KB / name)))
    spec = family_of(m).build(m, VARIANT)
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


# split-K at sizes of few output tiles: (file, its resized sizes, launch args of the two kernels, batch)
SPLIT_CASES = {
    "level2/76_Gemm_Add_ReLU.py": (dict(batch_size=128, in_features=4096, out_features=256),
                                   ["x", "gemm.weight", "partials"], ["partials", "bias", "out"], 1),
    "level1/3_Batched_matrix_multiplication.py": (dict(batch_size=4, m=128, k=4096, n=128),
                                                  ["A", "B", "partials"], ["partials", "out"], 4),
}


@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_k_plan_and_compiles(tmp_path, name, split):
    sizes, main_args, sum_args, batch = SPLIT_CASES[name]
    m = explain(load_problem(str(resized_copy(KB / name, tmp_path, **sizes))))
    spec = family_of(m).build(m, VARIANT, {"SPLIT_K": split})
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    main, reduce = r.launches
    assert [a.name for a in main.args if a.name] == main_args and main.grid[2] == batch * split
    assert [a.name for a in reduce.args if a.name] == sum_args and reduce.args[-1].value == batch
    assert [(s.name, s.size) for s in r.scratch] == [("partials", split * batch * m.outputs[0].shape[-2]
                                                      * m.outputs[0].shape[-1])]
    for arch in ("sm_90", "sm_80"):
        res = compile_job(job_for(spec, r, arch), cache=None).info.worst()
        assert res.spill_stores == 0 and 0 < res.registers <= 255, (arch, res)


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_k_is_refused_at_the_files_own_size_and_absent_by_default(name):
    m, spec, r = _resolved(name)
    assert "SPLIT_K" not in spec.tunables and len(r.launches) == 1  # the single fused launch
    with pytest.raises(Exception, match="constraint"):
        plan.resolve(family_of(m).build(m, VARIANT, {"SPLIT_K": 2}), sizes={}, tensors=m.tensor_facts())
