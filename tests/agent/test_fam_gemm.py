"""The playbook's ``gemm`` family (CPU tier): recognition of nn.Linear + elementwise epilogues (KernelBench level 2)
and of the matmul variants the built-in ``matmul`` family refuses (level 1: bmm, n-D x matrix, einsum, transposed
operands, triu/tril, diag(A) @ B, matrix-vector), refusals with their reasons, the specs' plans and NVRTC
compilation, the proposer's rounds, and the kernels against PyTorch on the CPU emulator at small shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.epilogue import EpIndex
from kerngen.agent.playbook.gemm.gemm import GEMM as FAMILY
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.proposer import NodeSummary, SearchContext
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import EvalResult, GpuFacts, Verdict
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.agent.family_checks import forward_problem, resized_copy
from tests.resources import kernelbench

from tests.emu.runner import emulate

KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench
needs_emulator = pytest.mark.needs_cxx

def _problem(tmp_path: Path, forward: str, inputs: dict[str, tuple[int, ...]], init: str = "pass",
             dtype: str = "float32"):
    return forward_problem(tmp_path, forward, inputs, init=init, dtype=dtype)



# ----- recognition --------------------------------------------------------------------------------------
LINEAR_L2 = {  # file: (the epilogue's formula, the Linear's own bias, the extra tensors the epilogue reads)
    "9_Matmul_Subtract_Multiply_ReLU.py": ("relu(((x - 2) * 1.5))", True, ()),
    "12_Gemm_Multiply_LeakyReLU.py": ("leaky_relu((x * 2), 0.1)", True, ()),
    "29_Matmul_Mish_Mish.py": ("mish(mish(x))", True, ()),
    "40_Matmul_Scaling_ResidualAdd.py": ("(x * 0.5) + x", True, ()),
    "53_Gemm_Scaling_Hardtanh_GELU.py": ("gelu(clamp((x * 0.5), -2, 2))", True, ()),
    "59_Matmul_Swish_Scaling.py": ("(x * sigmoid(x)) * 2", True, ()),
    "63_Gemm_ReLU_Divide.py": ("relu(x) / 2", True, ()),
    "68_Matmul_Min_Subtract.py": ("minimum(x, constant) - constant", True, (("constant", EpIndex.scalar),)),
    "70_Gemm_Sigmoid_Scaling_ResidualAdd.py": ("(sigmoid(x) * 2) + x", True, ()),
    "76_Gemm_Add_ReLU.py": ("relu((x + bias))", False, (("bias", EpIndex.channel),)),
    "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py": ("clamp(tanh(clamp(((x * sigmoid(x)) / 2), -1, 1)), -1, 1)", True, ()),
    "86_Matmul_Divide_GELU.py": ("gelu((x / 10))", True, ()),
    "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py": ("clamp(gelu(tanh((sigmoid((x + add_value)) * (x + add_value)))), "
                                                  "-1, 1)", True, (("add_value", EpIndex.channel),)),
}


@needs_kb
@pytest.mark.parametrize("name", sorted(LINEAR_L2))
def test_level2_linear_with_an_elementwise_epilogue(name):
    formula, has_bias, params = LINEAR_L2[name]
    m = explain(load_problem(str(KB / "level2" / name)))
    f = m.facts
    assert m.family == "gemm" and f.kind == "gemm" and f.a == "x"
    assert f.b.endswith(".weight") and f.trans_b and not f.trans_a and f.mask == ""
    assert f.ep.formula == formula
    assert bool(f.bias) == has_bias
    assert tuple((p.name, p.index) for p in f.ep.params) == params


LEVEL1 = {  # file: facts the recogniser must read
    "3_Batched_matrix_multiplication.py": dict(trans_a=False, trans_b=False, BATCH="A.shape[0]", M="A.shape[1]"),
    "4_Matrix_vector_multiplication_.py": dict(trans_a=False, trans_b=False, N="B.shape[1]", BATCH="1"),
    "10_3D_tensor_matrix_multiplication.py": dict(M="A.shape[0] * A.shape[1]", BATCH="1", SA="0"),
    "11_4D_tensor_matrix_multiplication.py": dict(M="A.shape[0] * A.shape[1] * A.shape[2]", K="A.shape[3]",
                                                  N="B.shape[1]"),
    "14_Matmul_for_upper_triangular_matrices.py": dict(mask="upper", diag=0),
    "15_Matmul_for_lower_triangular_matrices.py": dict(mask="lower", diag=0),
    "16_Matmul_with_transposed_A.py": dict(trans_a=True, trans_b=False, M="A.shape[1]", K="A.shape[0]"),
    "17_Matmul_with_transposed_B.py": dict(trans_a=False, trans_b=True, N="B.shape[0]", LDB="B.shape[1]"),
    "18_Matmul_with_transposed_both.py": dict(trans_a=True, trans_b=True, LDA="A.shape[1]", LDB="B.shape[1]"),
    "12_Matmul_with_diagonal_matrices_.py": dict(kind="rowscale", d="A", m="B", R="B.shape[0]"),
}


@needs_kb
@pytest.mark.parametrize("name", sorted(LEVEL1))
def test_level1_matmul_variants(name):
    m = explain(load_problem(str(KB / "level1" / name)))
    assert m.family == "gemm"
    assert {k: getattr(m.facts, k) for k in LEVEL1[name]} == LEVEL1[name]


@needs_kb
@pytest.mark.parametrize("name", ["1_Square_matrix_multiplication_.py", "2_Standard_matrix_multiplication_.py",
                                  "8_Matmul_with_irregular_shapes_.py", "13_Matmul_for_symmetric_matrices.py"])
def test_plain_2d_matmul_stays_with_the_builtin_family(name):
    p = load_problem(str(KB / "level1" / name))
    assert FAMILY.recognise(trace(p)) is None
    assert explain(p).family == "matmul"


REFUSED_L2 = {
    "14_Gemm_Divide_Sum_Scaling.py": r"row reduction \(sum over dim 1\)",
    "18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp.py": r"row reduction \(sum over dim 1\)",
    "22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish.py": r"row reduction \(logsumexp over dim 1\)",
    "28_BMM_InstanceNorm_Sum_ResidualAdd_Multiply.py": "instance_norm",
    "30_Gemm_GroupNorm_Hardtanh.py": "group_norm",
    "45_Gemm_Sigmoid_LogSumExp.py": "2 nn.Linear calls",
    "55_Matmul_MaxPool_Sum_Scale.py": "max_pool1d over the columns",
    "66_Matmul_Dropout_Softmax.py": r"row reduction \(softmax over dim 1\)",
    "80_Gemm_Max_Subtract_GELU.py": r"row reduction \(max over dim 1\)",
    "98_Matmul_AvgPool_GELU_Scale_Max.py": "avg_pool1d",
}


@needs_kb
@pytest.mark.parametrize("name", ["33_Gemm_Scale_BatchNorm.py", "41_Gemm_BatchNorm_GELU_ReLU.py"])
def test_level2_gemm_with_an_eval_batch_norm_fuses_its_running_statistics(name):
    m = explain(load_problem(str(KB / "level2" / name)))
    assert m.family == "gemm"
    names = [p.name for p in m.facts.ep.params]
    lead = "bn" if name.startswith("33") else "batch_norm"
    assert [f"{lead}.running_mean", f"{lead}.running_var", f"{lead}.weight", f"{lead}.bias"] == names[-4:]
    assert "rsqrtf(" in " ".join(m.facts.ep.statements)


@needs_kb
@pytest.mark.parametrize("name", sorted(REFUSED_L2))
def test_level2_gemm_with_reductions_is_refused_with_the_reason(name):
    p = load_problem(str(KB / "level2" / name))
    with pytest.raises(NotCovered, match=REFUSED_L2[name]):  # the gemm family's own word (gemm_rows takes most)
        FAMILY.recognise(trace(p))


@pytest.mark.parametrize("inputs, forward, want", [
    ({"A": (3, 5, 7), "B": (3, 6, 7)}, "torch.bmm(A, B.mT)", dict(trans_b=True, BATCH="A.shape[0]", N="B.shape[1]")),
    ({"A": (5, 7), "B": (3, 7, 6)}, "torch.matmul(A, B)", dict(SA="0", BATCH="B.shape[0]", SB="(A.shape[1]) * "
                                                                                           "(B.shape[2])")),
    ({"A": (2, 7, 5), "B": (7, 6)}, "torch.matmul(A.transpose(1, 2), B)", dict(trans_a=True, SB="0", M="A.shape[2]")),
    ({"A": (2, 4, 7), "B": (2, 6, 7)}, "torch.einsum('bik,bjk->bij', A, B)", dict(trans_b=True, BATCH="A.shape[0]")),
    ({"A": (2, 7, 4), "B": (2, 7, 6)}, "torch.einsum('bki,bkj->bij', A, B)", dict(trans_a=True, K="A.shape[1]")),
    ({"A": (9, 7), "B": (7,)}, "A @ B", dict(N="1", LDB="1")),
    ({"A": (8, 7), "B": (7, 8)}, "torch.tril(A @ B, diagonal=-1)", dict(mask="lower", diag=-1)),
    ({"A": (8, 7), "B": (8, 7)}, "A.matmul(B.permute(1, 0))", dict(trans_b=True, trans_a=False)),
])
def test_written_contractions(tmp_path, inputs, forward, want):
    m = explain(_problem(tmp_path, forward, inputs))
    assert m.family == "gemm"
    assert {k: getattr(m.facts, k) for k in want} == want


@pytest.mark.parametrize("inputs, forward, why, regions", [
    ({"A": (3, 5, 7), "B": (1, 7, 6)}, "torch.matmul(A, B)", "broadcast batch dims", None),
    ({"A": (5, 7), "B": (7, 6)}, "torch.matmul(A, B) * 2.0", "fuses an elementwise epilogue after an nn.Linear",
     ["matmul", "elementwise"]),
    ({"A": (5, 7), "B": (7, 6)}, "torch.matmul(A * 2.0, B)", "computed in the forward", ["elementwise", "matmul"]),
    ({"A": (5, 7), "B": (7, 6)}, "torch.matmul(A, B).sum(dim=1)", r"row reduction \(sum over dim 1\)",
     ["matmul", "reduce"]),
    ({"A": (2, 4, 7), "B": (7, 2)}, "torch.einsum('bik,kb->bi', A, B)", "not one matrix product", None),
])
def test_written_contractions_refused(tmp_path, inputs, forward, why, regions):
    """The gemm family's own reason; what it refuses whole the partitioner may serve as regions."""
    p = _problem(tmp_path, forward, inputs)
    with pytest.raises(NotCovered, match=why):
        FAMILY.recognise(trace(p))
    if regions is None:
        with pytest.raises(NotCovered, match=why):
            explain(p)
    else:
        m = explain(p)
        assert m.family == "regions" and [r.match.family for r in m.facts.partition.regions] == regions


def test_a_residual_input_and_3d_rows(tmp_path):
    m = explain(_problem(tmp_path, "torch.relu(self.fc(x)) * y + y", {"x": (2, 5, 8), "y": (2, 5, 6)},
                         init="self.fc = nn.Linear(8, 6)"))
    f = m.facts
    assert (f.M, f.K, f.bias) == ("x.shape[0] * x.shape[1]", "x.shape[2]", "fc.bias")
    assert [(p.name, p.index) for p in f.ep.params] == [("y", EpIndex.full)]


def test_fp16_refused_column_scaling_left_alone_diag_recognised(tmp_path):
    half = explain(_problem(tmp_path, "A @ B.T", {"A": (4, 8), "B": (6, 8)}, dtype="float16"))
    assert half.family == "gemm16" and half.facts.dtype == "float16"  # the 16-bit family's (wgmma, issue 35)
    with pytest.raises(NotCovered, match="fp32 only"):  # a 16-bit row scaling: this family's, which is fp32 only
        explain(_problem(tmp_path, "torch.diag(d) @ M", {"d": (6,), "M": (6, 5)}, dtype="float16"))
    column_scale = _problem(tmp_path, "A * B.unsqueeze(0)", {"A": (4, 6), "B": (6,)})
    assert FAMILY.recognise(trace(column_scale)) is None
    rowscale = explain(_problem(tmp_path, "torch.diag(d) @ M", {"d": (6,), "M": (6, 5)}))
    assert rowscale.facts.model_dump(include={"kind", "d", "m", "R", "C"}) == dict(
        kind="rowscale", d="d", m="M", R="M.shape[0]", C="M.shape[1]")


# ----- specs: coverage, plans, NVRTC ---------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("level, name, offered", [
    ("level2", "12_Gemm_Multiply_LeakyReLU.py", ["tiled", "tf32x3", "wgmma"]),  # wgmma: sm_90 limits
    ("level1", "4_Matrix_vector_multiplication_.py", ["gemv"]),  # a tile would waste its N side
    ("level1", "12_Matmul_with_diagonal_matrices_.py", ["rowscale"]),
    ("level1", "14_Matmul_for_upper_triangular_matrices.py", ["tiled", "wgmma"]),
])
def test_variants_offered_at_the_problems_shape(level, name, offered):
    m = explain(load_problem(str(KB / level / name)))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in o.offered] == offered
    assert all(v.why for v in o.dropped)


@needs_kb
def test_linear_plan_at_kernelbench_size():
    m = explain(load_problem(str(KB / "level2" / "76_Gemm_Add_ReLU.py")))  # 1024 x 8192 @ (8192 x 8192)^T
    spec = family_of(m).build(m, "tiled")
    assert spec.name == FAMILY.spec_name("tiled") == "playbook-gemm-tiled"
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    (launch,) = r.launches
    assert [a.name for a in launch.args] == ["x", "gemm.weight", "bias", "out"]  # no Linear bias; ep0 = bias
    assert launch.grid == (8 * 64, 1, 1) and launch.block == (256, 1, 1)
    assert launch.shared_mem == 4 * 2 * (16 * 132 + 16 * 132)  # two stages of k-major 16 x (128 + 4) tiles
    assert (r.defines["EVEN"], r.defines["VEC_A"], r.defines["TRANS_B"], r.defines["K_"]) == (1, 1, 1, 8192)


def _compile(spec, resolved):
    return compile_job(job_for(spec, resolved, "sm_90"), cache=None)


@needs_kb
@pytest.mark.parametrize("level, name", [
    ("level2", "12_Gemm_Multiply_LeakyReLU.py"), ("level2", "68_Matmul_Min_Subtract.py"),
    ("level2", "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py"), ("level1", "3_Batched_matrix_multiplication.py"),
    ("level1", "4_Matrix_vector_multiplication_.py"), ("level1", "11_4D_tensor_matrix_multiplication.py"),
    ("level1", "12_Matmul_with_diagonal_matrices_.py"), ("level1", "15_Matmul_for_lower_triangular_matrices.py"),
    ("level1", "16_Matmul_with_transposed_A.py"), ("level1", "18_Matmul_with_transposed_both.py"),
])
def test_offered_defaults_compile_without_spills(level, name):
    m = explain(load_problem(str(KB / level / name)))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert o.offered
    for v in o.offered:
        compiled = _compile(v.spec, plan.resolve(v.spec, sizes={}, tensors=m.tensor_facts()))
        for res in compiled.info.kernels.values():  # wgmma: the pre-pass and the GEMM
            assert res.spill_stores == 0 and res.registers <= 255, (v.variant, res)


@pytest.mark.parametrize("forward, inputs, config", [
    ("A @ B.T", {"A": (100, 64), "B": (96, 64)}, dict(CP_ASYNC=1, STAGES=3, SMEM_T=0)),
    ("A.T @ B", {"A": (64, 100), "B": (64, 96)}, dict(CP_ASYNC=1, STAGES=4, BK=32)),
    ("A.T @ B.T", {"A": (64, 100), "B": (96, 64)}, dict(SMEM_T=0, TM=4, BM=64, MIN_BLOCKS=2)),
    ("A @ B.T", {"A": (100, 63), "B": (97, 63)}, dict(BK=8, BM=64, BN=64, TN=4)),  # rows of 63 floats: element loads
    ("torch.triu(A @ B)", {"A": (72, 72), "B": (72, 72)}, dict(TRI_SKIP=1, CP_ASYNC=1, STAGES=3, SMEM_T=0)),
    ("torch.bmm(A, B)", {"A": (2, 64, 96), "B": (2, 96, 64)}, dict(CP_ASYNC=1)),  # A by registers, B by cp.async
])
def test_other_configurations_compile(tmp_path, forward, inputs, config):
    m = explain(_problem(tmp_path, forward, inputs))
    spec = family_of(m).build(m, "tiled")
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=config)
    (res,) = _compile(spec, r).info.kernels.values()
    assert res.spill_stores == 0


def test_constraints_refuse_cp_async_on_unaligned_rows(tmp_path):
    m = explain(_problem(tmp_path, "A @ B.T", {"A": (100, 63), "B": (97, 63)}))
    spec = family_of(m).build(m, "tiled")
    with pytest.raises(Exception, match=r"CP_ASYNC == 0 or .*% 4 == 0"):
        plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=dict(CP_ASYNC=1, STAGES=3, SMEM_T=0))


# ----- proposer --------------------------------------------------------------------------------------------
@needs_kb
def test_proposer_rounds():
    prop = PlaybookProposer(load_problem(str(KB / "level2" / "86_Matmul_Divide_GELU.py")))
    assert prop.match is not None and prop.match.family == "gemm"
    # an A100: no wgmma variant (on an H100 it comes first: tests/agent/test_gemm_wgmma.py)
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in prop.match.tensors().items()}, gpu=GpuFacts(name="A100", arch="sm_80"))
    first = prop.ideas(ctx, None, 3)
    # the FFMA tile and the 3xTF32 one; gemv and rowscale are not offered here
    assert [i.text for i in first] == [e.text for e in FAMILY.ideas if e.id in ("gemm-tiled", "gemm-tf32x3")]
    (branch, *_) = prop.implement(ctx, None, first[0], 2)
    assert branch.spec is not None and variant_of_spec(branch.spec) == "tiled"
    parent = NodeSummary(node_id=1, idea=first[0], spec=branch.spec, result=EvalResult(verdict=Verdict.ok))
    later = prop.ideas(ctx, parent, 20)
    assert {i.text for i in later} >= {e.text for e in FAMILY.ideas if e.id in ("gemm-cp-async", "gemm-k-step")}
    not_here = {e.text for e in FAMILY.ideas if e.variant in ("gemv", "rowscale") or e.id == "gemm-tri-skip"}
    assert not {i.text for i in later} & not_here  # other variants' ideas, and k-range skipping without a triangle
    configs = {tuple(sorted(b.spec.default_config().items())) for i in later
               for b in prop.implement(ctx, parent, i, 3) if b.spec is not None}
    assert len(configs) >= 8


@needs_kb
def test_triangular_problems_get_the_k_range_skipping_idea():
    prop = PlaybookProposer(load_problem(str(KB / "level1" / "15_Matmul_for_lower_triangular_matrices.py")))
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in prop.match.tensors().items()}, gpu=GpuFacts(name="A100", arch="sm_80"))
    (first,) = prop.ideas(ctx, None, 1)
    (branch, *_) = prop.implement(ctx, None, first, 1)
    assert branch.spec.default_config()["TRI_SKIP"] == 0  # off unless proposed: it assumes triangular inputs
    parent = NodeSummary(node_id=1, idea=first, spec=branch.spec, result=EvalResult(verdict=Verdict.ok))
    skip = next(i for i in prop.ideas(ctx, parent, 20) if i.text == next(e.text for e in FAMILY.ideas
                                                                            if e.id == "gemm-tri-skip"))
    assert all(b.spec.default_config()["TRI_SKIP"] == 1 for b in prop.implement(ctx, parent, skip, 2))


# ----- the kernels on the CPU emulator against PyTorch ------------------------------------------------------
def _emulated(path: Path, variant: str, config: dict | None = None) -> None:
    p = load_problem(str(path))
    m = explain(p)
    model, inputs = p.build_model("cpu", 0), p.make_inputs("cpu", 0)
    (want,) = p.run_reference(model, inputs)
    out = torch.full_like(want, float("nan"))  # every element must be written
    emulate(family_of(m).build(m, variant), p.bindings(model, inputs, [out]), config=config)
    assert torch.allclose(out, want, atol=1e-4, rtol=1e-4), (out - want).abs().nan_to_num(1e9).max()


SMALL_TILE = dict(BM=32, BN=32, TM=4, TN=4, BK=8)
EMULATED = [  # (level, file, small sizes, variant, configs: None is the default)
    ("level2", "12_Gemm_Multiply_LeakyReLU.py", dict(batch_size=37, in_features=72, out_features=45), "tiled",
     [None, dict(SMALL_TILE, SMEM_T=0)]),
    ("level2", "12_Gemm_Multiply_LeakyReLU.py", dict(batch_size=64, in_features=64, out_features=64), "tiled",
     [dict(SMALL_TILE, BK=16), dict(BM=64, BN=32, TM=8, TN=4, BK=32)]),  # EVEN: no predication
    ("level2", "68_Matmul_Min_Subtract.py", dict(batch_size=20, in_features=36, out_features=28), "tiled", [None]),
    ("level2", "70_Gemm_Sigmoid_Scaling_ResidualAdd.py", dict(batch_size=20, input_size=36, hidden_size=28),
     "tiled", [None]),
    ("level2", "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py", dict(batch_size=20, in_features=36, out_features=28),
     "tiled", [None]),
    ("level1", "3_Batched_matrix_multiplication.py", dict(batch_size=3, m=33, k=20, n=27), "tiled",
     [None, SMALL_TILE]),
    ("level1", "4_Matrix_vector_multiplication_.py", dict(M=45, K=1000), "gemv",
     [None, dict(TPR=32, BLOCK=128, UNROLL=2), dict(TPR=64, BLOCK=128, UNROLL=1, CACHE_HINT=1)]),
    ("level1", "4_Matrix_vector_multiplication_.py", dict(M=45, K=1001), "gemv", [None]),  # element loads
    ("level1", "10_3D_tensor_matrix_multiplication.py", dict(N=3, M=11, K=24, L=36), "tiled", [None]),
    ("level1", "11_4D_tensor_matrix_multiplication.py", dict(b=2, i=3, j=5, l=12, k=20), "tiled", [None]),
    ("level1", "12_Matmul_with_diagonal_matrices_.py", dict(M=203, N=7), "rowscale",
     [None, dict(BLOCK=128, UNROLL=1, CACHE_HINT=1)]),
    ("level1", "12_Matmul_with_diagonal_matrices_.py", dict(M=204, N=7), "rowscale", [None]),
    ("level1", "14_Matmul_for_upper_triangular_matrices.py", dict(N=70), "tiled",
     [SMALL_TILE, dict(SMALL_TILE, TRI_SKIP=1)]),
    ("level1", "15_Matmul_for_lower_triangular_matrices.py", dict(M=70), "tiled",
     [SMALL_TILE, dict(SMALL_TILE, TRI_SKIP=1)]),
    ("level1", "16_Matmul_with_transposed_A.py", dict(M=33, K=21, N=40), "tiled", [None, SMALL_TILE]),
    ("level1", "17_Matmul_with_transposed_B.py", dict(M=33, K=21, N=40), "tiled", [None, dict(SMALL_TILE, SMEM_T=0)]),
    ("level1", "18_Matmul_with_transposed_both.py", dict(M=33, K=24, N=40), "tiled",
     [None, dict(SMALL_TILE, SMEM_T=0)]),
]


@needs_emulator
@needs_kb
@pytest.mark.parametrize("level, name, sizes, variant, configs", EMULATED,
                         ids=[f"{c[1].split('_')[0]}-{c[3]}-{'x'.join(map(str, c[2].values()))}" for c in EMULATED])
def test_kernelbench_kernels_match_pytorch_on_the_emulator(tmp_path, level, name, sizes, variant, configs):
    path = resized_copy(KB / level / name, tmp_path, **sizes)
    for config in configs:
        _emulated(path, variant, config)


@needs_emulator
@pytest.mark.parametrize("forward, inputs, init, config", [
    ("torch.relu(self.fc(x)) * y + y", {"x": (2, 5, 24), "y": (2, 5, 20)}, "self.fc = nn.Linear(24, 20)", None),
    ("torch.matmul(A, B)", {"A": (9, 12), "B": (3, 12, 10)}, "pass", SMALL_TILE),
    ("torch.einsum('bki,bkj->bij', A, B)", {"A": (2, 13, 9), "B": (2, 13, 11)}, "pass", None),
    ("torch.tril(A @ B, diagonal=-1)", {"A": (20, 12), "B": (12, 20)}, "pass", SMALL_TILE),
    ("d[:, None] * M", {"d": (9,), "M": (9, 13)}, "pass", None),
    ("A.T @ v", {"A": (37, 21), "v": (37,)}, "pass", SMALL_TILE),  # one column of a transposed A: the tiled kernel
])
def test_written_problems_match_pytorch_on_the_emulator(tmp_path, forward, inputs, init, config):
    p = _problem(tmp_path, forward, inputs, init=init)
    _emulated(Path(p.path), "rowscale" if "None" in forward else "tiled", config)
