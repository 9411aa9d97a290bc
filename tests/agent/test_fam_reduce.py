"""The reduce family (CPU tier): recognition of the KernelBench reductions and of written-out forms
(dims read from the meta model, keepdim, p, F.normalize), refusals with their reason, None for other
families' problems, the variants offered at each shape, rendering, plan resolution, NVRTC compilation
(sm_90, no GPU) of default and sampled configurations, the proposer's rounds, and, where the CPU
emulator of tests/emu is ready, the kernels' outputs against PyTorch at small shapes."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import explain, by_name, family_of
from kerngen.agent.playbook.reduce import family as fam_reduce
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import PlaybookProposer, seed_specs, variant_of_spec
from kerngen.agent.proposer import NodeSummary, SearchContext
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import EvalResult, GpuFacts, Verdict
from kerngen.harness.spec import plan
from tests.agent.spec_samples import sampled_plans
from kerngen.problems.load import load_problem
from tests.resources import kernelbench

from tests.emu.runner import emulate

ROOT = Path(__file__).resolve().parents[2]
KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench
needs_emulator = pytest.mark.needs_cxx

FILE = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return {forward}


def get_inputs():
    return [{make}]


def get_init_inputs():
    return [{dim}]
"""

# KernelBench level 1 at its own sizes: the formula read, the variants offered (sm_90 limits)
KB_LEVEL1 = {
    "37_FrobeniusNorm_.py": ("x / sqrt(sum(x^2, dims 0..3))", ["split"]),
    "38_L1Norm_.py": ("x / mean(|x|, dim 1)", ["rows", "split"]),
    "39_L2Norm_.py": ("x / sqrt(sum(x^2, dim 1))", ["rows", "split"]),
    "47_Sum_reduction_over_a_dimension.py": ("sum(x, dim 1)", ["cols"]),
    "48_Mean_reduction_over_a_dimension.py": ("mean(x, dim 1)", ["cols"]),
    "49_Max_reduction_over_a_dimension.py": ("max(x, dim 1)", ["cols"]),
    "51_Argmax_over_a_dimension.py": ("argmax(x, dim 1)", ["cols"]),
    "52_Argmin_over_a_dimension.py": ("argmin(x, dim 1)", ["cols"]),
    "53_Min_reduction_over_a_dimension.py": ("min(x, dim 1)", ["cols"]),
    # rmsnorm over dim 1 of (112, 64, 512, 512): not the last dim, so not the rmsnorm family's
    "36_RMSNorm_.py": ("x / sqrt((mean(x^2, dim 1) + 1e-05))", ["cols"]),
}
# other families' problems (reductions inside losses, scans, norms with eps, fused level-2 chains)
NOT_MINE = ["level1/23_Softmax.py", "level1/89_cumsum.py", "level1/93_masked_cumsum.py",
            "level1/94_MSELoss.py", "level1/100_HingeLoss.py", "level1/41_Max_Pooling_1D.py",
            "level2/14_Gemm_Divide_Sum_Scaling.py", "level2/56_Matmul_Sigmoid_Sum.py",
            "level2/78_ConvTranspose3d_Max_Max_Sum.py", "level2/23_Conv3d_GroupNorm_Mean.py"]

# NaN at flat positions 7, 2006, 4005: some rows (columns) hold one, the others none
NAN_INPUT = "torch.randn{shape}.masked_fill_((torch.arange({n}) % 1999 == 7).view{shape}, math.nan)"
# written-out forms at small shapes: forward, input, formula, variants offered
FORMS = {
    "sum_keep_mid": ("torch.sum(x, dim=self.dim, keepdim=True)", "torch.randn(4, 64, 33)", "sum(x, dim 1)", ["cols"]),
    "mean_last": ("x.mean(-1)", "torch.rand(8, 1000) + 1", "mean(x, dim 1)", ["rows"]),
    "max_values": ("torch.max(x, dim=-1).values", "torch.randn(9, 777)", "max(x, dim 1)", ["rows"]),
    "min_mid": ("torch.min(x, dim=self.dim)[0]", "torch.randn(3, 50, 20)", "min(x, dim 1)", ["cols"]),
    "argmax_ties": ("torch.argmax(x, dim=-1)", "torch.randint(0, 4, (6, 1500)).float()", "argmax(x, dim 1)",
                    ["rows"]),
    "argmin_mid_ties": ("torch.argmin(x, dim=self.dim)", "torch.randint(0, 3, (3, 200, 8)).float()",
                        "argmin(x, dim 1)", ["cols"]),
    "max_indices": ("torch.max(x, 1).indices", "torch.randn(5, 300, 4)", "argmax(x, dim 1)", ["cols"]),
    "argmax_flat": ("torch.argmax(x)", "torch.randint(0, 9, (7, 1300)).float()", "argmax(x, dims 0..1)",
                    ["rows", "split"]),
    "sum_all": ("x.sum()", "torch.randn(3, 5000)", "sum(x, dims 0..1)", ["rows", "split"]),
    "amax_dims": ("torch.amax(x, dim=(1, 2))", "torch.randn(6, 16, 40)", "max(x, dims 1..2)", ["rows"]),
    "prod_last": ("torch.prod(x, dim=-1)", "torch.rand(64, 24) + 0.5", "prod(x, dim 1)", ["rows"]),
    "inf_norm": ("torch.linalg.vector_norm(x, ord=math.inf, dim=-1)", "torch.randn(8, 500)", "max(|x|, dim 1)",
                 ["rows"]),
    "sqrt_sumsq": ("torch.sqrt(torch.sum(x * x, dim=(1, 2)))", "torch.randn(4, 8, 16)", "sqrt(sum(x^2, dims 1..2))",
                   ["rows"]),
    "l1_rows": ("x / torch.mean(torch.abs(x), dim=1, keepdim=True)", "torch.randn(16, 1001)",
                "x / mean(|x|, dim 1)", ["rows"]),
    "l2_cols": ("x / torch.norm(x, p=2, dim=1, keepdim=True)", "torch.randn(2, 16, 8, 9)",
                "x / sqrt(sum(x^2, dim 1))", ["cols"]),
    "rms_mid": ("x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", "torch.rand(3, 37, 9, 13)",
                "x / sqrt((mean(x^2, dim 1) + 1e-05))", ["cols"]),  # KernelBench 36 at an odd size
    "l2_eps": ("x / (torch.norm(x, dim=1, keepdim=True) + 1e-8)", "torch.randn(16, 300)",
               "x / (sqrt(sum(x^2, dim 1)) + 1e-08)", ["rows"]),
    "normalize_fn": ("F.normalize(x, p=2, dim=1)", "torch.randn(8, 500)", "x / max(sqrt(sum(x^2, dim 1)), 1e-12)",
                     ["rows"]),
    "fro": ("x / torch.norm(x, p='fro')", "torch.randn(4, 8, 33, 35)", "x / sqrt(sum(x^2, dims 0..3))",
            ["rows", "split"]),
    # NaN wins, as in PyTorch (max propagates it, argmax points at it); a few rows hold one
    "amax_nan": ("torch.amax(x, dim=-1)", NAN_INPUT.format(shape="(6, 700)", n=4200), "max(x, dim 1)", ["rows"]),
    "argmax_nan_cols": ("torch.argmax(x, dim=1)", NAN_INPUT.format(shape="(3, 300, 5)", n=4500), "argmax(x, dim 1)", ["cols"]),
    "fro_big": ("x / torch.norm(x, p='fro')", "torch.randn(3, 37, 1001)", "x / sqrt(sum(x^2, dims 0..2))", ["split"]),
}
REFUSED = {
    "non_adjacent": ("torch.amax(x, dim=(0, 2))", "non-adjacent dims (0, 2)"),
    "p3": ("torch.norm(x, p=3, dim=1)", "p=3"),
    "float64_sum": ("torch.sum(x, dim=1, dtype=torch.float64)", "fp32 only"),
    "no_keepdim": ("x / torch.sum(x, dim=1)", "keepdim", "torch.randn(16, 16)"),  # broadcasts along the last dim
    "argmax_of_abs_scaled": ("torch.argmax(x, dim=1) * 2", "argmax with other ops"),
    "cube": ("torch.sum(x ** 3, dim=1)", "reduction of pow(x, ...)"),
}


def _problem(folder: Path, name: str, forward: str, make: str = "torch.randn(6, 16)", dim: int = 1):
    f = folder / f"{name}.py"
    f.write_text(textwrap.dedent(FILE).format(forward=forward, make=make, dim=dim))
    return load_problem(str(f))


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reduce_forms")
    return {name: _problem(folder, name, fwd, make) for name, (fwd, make, _, _) in FORMS.items()}



def _offered(p) -> list[str]:
    prop = PlaybookProposer(p)
    return [v.variant for v in prop.offer.offered] if prop.offer else []


# ----- recognition ---------------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("name", sorted(KB_LEVEL1))
def test_kernelbench_reductions_are_recognised_with_their_variants(name):
    formula, variants = KB_LEVEL1[name]
    p = load_problem(str(KB / "level1" / name))
    m = explain(p)
    assert m.family == "reduce" and m.facts.formula == formula
    assert _offered(p) == variants


@needs_kb
def test_kernelbench_facts():
    l1 = explain(load_problem(str(KB / "level1" / "38_L1Norm_.py"))).facts
    assert (l1.prologue, l1.combine, l1.epilogue, l1.normalize) == ("abs", "sum", (("div_len", 0.0),), True)
    fro = explain(load_problem(str(KB / "level1" / "37_FrobeniusNorm_.py"))).facts
    assert fro.dims == (0, 3) and fro.keepdim is False and fro.epilogue == (("sqrt", 0.0),)
    s = explain(load_problem(str(KB / "level1" / "47_Sum_reduction_over_a_dimension.py"))).facts
    assert s.dims == (1, 1) and s.keepdim is True  # dim=self.dim, a constant of the trace
    am = explain(load_problem(str(KB / "level1" / "52_Argmin_over_a_dimension.py")))
    assert am.facts.combine == "argmin" and am.outputs[0].dtype == "int64"


@needs_kb
@pytest.mark.parametrize("path", NOT_MINE)
def test_other_families_problems_are_not_claimed(path):
    assert fam_reduce.REDUCE.recognise(trace(load_problem(str(KB / path)))) is None


@pytest.mark.parametrize("name", sorted(FORMS))
def test_written_out_forms(forms, name):
    _, _, formula, variants = FORMS[name]
    m = explain(forms[name])
    assert m.family == "reduce" and m.facts.formula == formula
    assert _offered(forms[name]) == variants


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_with_the_reason(tmp_path, name):
    """The reduce family's own reason; the problem may still be served as regions (a map, then the reduction)."""
    forward, word, make = (*REFUSED[name], "torch.randn(6, 16, 8)")[:3]
    p = _problem(tmp_path, name, forward, make)
    with pytest.raises(NotCovered, match=re.escape(word)):
        fam_reduce.REDUCE.recognise(trace(p))
    if name in ("cube", "no_keepdim"):
        assert explain(p).family == "regions"


def test_a_variance_is_cut_into_regions(tmp_path):
    p = _problem(tmp_path, "variance", "torch.mean((x - x.mean(dim=1, keepdim=True)) ** 2, dim=1)", "torch.randn(6, 16, 8)")
    assert fam_reduce.REDUCE.recognise(trace(p)) is None  # more than one reduction: not the family's alone
    m = explain(p)
    assert [r.match.family for r in m.facts.partition.regions] == ["reduce", "elementwise", "reduce"]


def test_half_precision_input_is_refused(tmp_path):
    p = _problem(tmp_path, "bf16", "torch.sum(x, dim=1)", "torch.randn(6, 16, dtype=torch.bfloat16)")
    with pytest.raises(NotCovered, match="fp32 only"):
        explain(p)


@pytest.mark.parametrize("forward", [
    "x - x.mean(dim=1, keepdim=True)",  # centering: not a reduction's output
    "x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-5)",  # rmsnorm
    "torch.log(torch.sum(torch.exp(x), dim=1))",  # logsumexp
    "torch.max(x, x * 2)",  # two-tensor max: elementwise
])
def test_not_a_reduction_of_this_family(tmp_path, forward):
    p = _problem(tmp_path, "other", forward)
    assert fam_reduce.REDUCE.recognise(trace(p)) is None
    try:
        family = explain(p).family
    except NotCovered as exc:
        family = str(exc)
    assert family != "reduce"


# ----- specs ----------------------------------------------------------------------------------
# every combine, a prologue and an epilogue of each kind, the three variants, normalize in each
SPEC_FORMS = ("sum_keep_mid", "argmax_ties", "argmax_flat", "l2_cols", "normalize_fn", "fro", "prod_last",
              "max_indices", "argmin_mid_ties", "inf_norm", "l1_rows")
N_SPECS = sum(len(FORMS[name][3]) for name in SPEC_FORMS)


def _specs(forms):
    for name in SPEC_FORMS:
        m = explain(forms[name])
        for var in FORMS[name][3]:
            yield name, var, m, family_of(m).build(m, var)


def test_specs_are_pure_cuda_named_by_variant_and_resolve(forms):
    seen = 0
    for name, var, m, spec in _specs(forms):
        assert spec.name.startswith(f"playbook-reduce-{var}-") and variant_of_spec(spec) == var
        assert all(v == sorted(v) for v in spec.tunables.values())
        assert 'extern "C" __global__' in spec.source and "{{" not in spec.source and "{%" not in spec.source
        assert "asm" not in spec.source  # the emulator runs no inline PTX
        resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
        kinds = {a.name for launch in resolved.launches for a in launch.args if a.kind == "tensor"}
        assert kinds <= set(m.tensors()) | {s.name for s in resolved.scratch}
        seen += 1
    assert seen == N_SPECS


def test_constraints_keep_each_variant_to_its_shapes(forms):
    cols_form = explain(forms["sum_keep_mid"])  # inner 33: no rows, no split, no 16-byte loads
    facts = cols_form.tensor_facts()
    for var in ("rows", "split"):
        with pytest.raises(Exception, match="constraint violated"):
            plan.resolve(family_of(cols_form).build(cols_form, var), sizes={}, tensors=facts)
    with pytest.raises(Exception, match="VEC"):
        plan.resolve(family_of(cols_form).build(cols_form, "cols", {"VEC": 1}), sizes={}, tensors=facts)
    rows_form = explain(forms["mean_last"])  # 1000 a row: too short to split, no cache without a second pass
    with pytest.raises(Exception, match="4096"):
        plan.resolve(family_of(rows_form).build(rows_form, "split"), sizes={}, tensors=rows_form.tensor_facts())
    with pytest.raises(Exception, match="CACHE_KB == 0"):
        plan.resolve(family_of(rows_form).build(rows_form, "rows", {"CACHE_KB": 64, "TPR": 256, "BLOCK": 256}), sizes={},
                     tensors=rows_form.tensor_facts())


@needs_kb
def test_split_grid_and_scratch_at_the_frobenius_size():
    m = explain(load_problem(str(KB / "level1" / "37_FrobeniusNorm_.py")))
    r = plan.resolve(family_of(m).build(m, "split"), sizes={}, tensors=m.tensor_facts())
    part, scale = r.launches
    assert part.grid[0] == scale.grid[0] == r.defines["NCHR"] == 1024  # one row, a few waves of chunks
    assert r.scratch[0].size == 1024 and r.defines["SPAN"] * 1024 >= 112 * 64 * 512 * 512
    assert "part_i" not in {s.name for s in r.scratch}  # only arg reductions carry indices


def _compile(spec, resolved) -> None:
    compile_job(job_for(spec, resolved, "sm_90"), cache=None)



def test_default_and_sampled_configs_compile(forms):
    compiled = 0
    for name, var, m, spec in _specs(forms):
        facts = m.tensor_facts()
        for r in [plan.resolve(spec, sizes={}, tensors=facts)] + sampled_plans(spec, facts, 1):
            _compile(spec, r)
            compiled += 1
    assert compiled == 2 * N_SPECS


@needs_kb
@pytest.mark.parametrize("name", ["37_FrobeniusNorm_.py", "39_L2Norm_.py", "48_Mean_reduction_over_a_dimension.py",
                                  "51_Argmax_over_a_dimension.py"])
def test_kernelbench_seeds_compile(name):
    p = load_problem(str(KB / "level1" / name))
    specs = seed_specs(p)
    assert [variant_of_spec(s) for s in specs] == KB_LEVEL1[name][1]
    m = explain(p)
    for spec in specs:
        _compile(spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts()))


# ----- the proposer ---------------------------------------------------------------------------
def test_every_idea_names_a_variant_and_round0_covers_each():
    ideas = list(by_name("reduce").ideas)
    assert {e.variant for e in ideas if e.round0} == {"rows", "cols", "split"}
    assert len({e.id for e in ideas}) == len(ideas)
    assert all(e.variant in by_name("reduce").variants for e in ideas)


@pytest.mark.parametrize("name", ["l1_rows", "argmin_mid_ties", "fro"])
def test_proposer_rounds(forms, name):
    prop = PlaybookProposer(forms[name])
    m = prop.match
    ctx = SearchContext(problem_name=name, problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in m.tensors().items()}, gpu=GpuFacts(name="H100"))
    first = prop.ideas(ctx, None, 3)
    assert first and all(prop._by_text[i.text].variant in FORMS[name][3] for i in first)
    branches = prop.implement(ctx, None, first[0], 2)
    assert branches and all(b.spec is not None for b in branches)
    parent = NodeSummary(node_id=1, idea=first[0], spec=branches[0].spec, result=EvalResult(verdict=Verdict.ok))
    more = prop.ideas(ctx, parent, 4)
    pvar = variant_of_spec(branches[0].spec)
    for idea in more:
        entry = prop._by_text[idea.text]
        assert not entry.round0 and entry.variant == pvar
        got = prop.implement(ctx, parent, idea, 3)
        assert got and all(b.spec is not None for b in got)
        # a refinement changes something (one branch may land on the parent's own configuration)
        assert any(b.spec.content_hash() != branches[0].spec.content_hash() for b in got), entry.id


# ----- outputs on the CPU emulator --------------------------------------------------------------
def _emulated_matches(p, spec, config=None, seed=0) -> None:
    inputs = p.make_inputs("cpu", seed)
    ref = p.run_reference(p.build_model("cpu", 0), inputs)[0]
    out = torch.full_like(ref, -7) if ref.dtype == torch.int64 else torch.full_like(ref, float("nan"))
    emulate(spec, {"x": inputs[0].contiguous(), "out": out}, config=config, seed=seed)  # seed: block/warp order
    if ref.dtype == torch.int64:
        assert torch.equal(out, ref), (out[out != ref][:8], ref[out != ref][:8])
    else:  # the harness's fp32 check: elementwise closeness (NaN where PyTorch has NaN), the relative error
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4, equal_nan=True)
        ok = ~ref.isnan()
        assert float((out[ok].double() - ref[ok].double()).norm() / ref[ok].double().norm()) <= 1e-5


# other configurations: two warps a row and two rows a block (no cache), a sub-warp group with 8 loads in
# flight; narrow and tall blocks, fewer threads than 16-byte columns; few long chunks, many short ones
OTHER = {"rows": [{"TPR": 64, "BLOCK": 128, "UNROLL": 2, "CACHE_KB": 0}, {"TPR": 8, "BLOCK": 128, "UNROLL": 8,
                                                                          "CACHE_KB": 0, "HINT": 1}],
         "cols": [{"TX": 8, "TY": 4, "UNROLL": 1}, {"TX": 16, "TY": 2, "UNROLL": 2, "HINT": 1}],
         "split": [{"NCH": 8, "BLOCK": 128, "UNROLL": 1}, {"NCH": 64, "BLOCK": 512, "UNROLL": 8, "HINT": 1}]}


@needs_emulator
@pytest.mark.parametrize("name", sorted(FORMS))
def test_default_kernels_match_pytorch_on_the_emulator(forms, name):
    p = forms[name]
    m = explain(p)
    for var in FORMS[name][3]:
        _emulated_matches(p, family_of(m).build(m, var))


@needs_emulator
@pytest.mark.parametrize("name", ["argmax_ties", "argmin_mid_ties", "l1_rows", "fro", "l2_cols", "sum_all"])
def test_other_configs_match_pytorch_on_the_emulator(forms, name):
    p = forms[name]
    m = explain(p)
    for var in FORMS[name][3]:
        spec = family_of(m).build(m, var)
        for cfg in OTHER[var]:
            plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)  # admissible at this shape
            _emulated_matches(p, spec, config=cfg, seed=1)
