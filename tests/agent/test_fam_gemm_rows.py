"""The playbook's ``gemm_rows`` family (CPU tier): a GEMM followed by ops local to each row of its output (KernelBench
level 2's Gemm + Sum / LogSumExp / Softmax / GroupNorm / InstanceNorm / MaxPool / AvgPool files): the row programs
read from the forwards, refusals with their reasons, the GEMM's fused epilogue, the offered variants, their plans,
NVRTC compilation for sm_90, the proposer's rounds, and the kernels against PyTorch on the CPU emulator at small
and odd shapes (a kernel broken on purpose fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.gemm.build_rows import split_epilogue
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.gemm.gemm import GEMM
from kerngen.agent.playbook.gemm.rows import GEMM_ROWS as FAMILY
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

from tests.emu import cases
from tests.emu.runner import emulate


def _build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)

KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench
needs_emulator = pytest.mark.needs_cxx

def _problem(tmp_path: Path, forward: str, inputs: dict[str, tuple[int, ...]], init: str):
    return forward_problem(tmp_path, forward, inputs, init=init, make="randn")


def _kb(name: str) -> Path:
    return next((KB / "level2").glob(f"{name}_*.py"))


# ----- recognition --------------------------------------------------------------------------------------
LEVEL2 = {  # file number: (the row ops in order, the row program's formula over the GEMM's row x)
    "14": (("reduce:sum",), "mul(sum(div(x, 2)), 1.5)"),
    "18": (("reduce:sum",), "sum(x)"),  # max / mean / logsumexp of one value per row: the value itself
    "22": (("reduce:logsumexp",), None),
    "28": (("norm/1",), "mul(add(group_norm(x, 1, 0; groups=1), y), y)"),
    "30": (("norm/16",), "clamp(group_norm(x, group_norm.weight, group_norm.bias; groups=16), -2, 2)"),
    "37": (("norm/64",), None),
    "51": (("reduce:mean",), "add(gelu(mean(sub(x, subtract))), x)"),  # + original_x: the GEMM's input row
    "55": (("max_pool/2", "reduce:sum"), "mul(sum(max_pool(x, 2, 2)), 0.5)"),
    "56": (("reduce:sum",), "sum(sigmoid(x))"),
    "62": (("norm/512",), None),
    "64": (("reduce:logsumexp",), "gelu(gelu(leaky_relu(leaky_relu(logsumexp(x), 0.01), 0.01)))"),
    "66": (("softmax",), "softmax(x)"),  # dropout in eval mode: nothing
    "75": (("norm/512", "reduce:min"), None),
    "80": (("reduce:max",), "gelu(sub(max(x), max(x)))"),
    "84": (("softmax",), None),
    "88": (("norm/256",), None),
    "94": (("norm/256",), None),
    "98": (("avg_pool/16", "reduce:max"), "max(mul(gelu(avg_pool(x, 16, 16)), 2))"),
    "99": (("softmax",), "softmax(gelu(x))"),
}


@needs_kb
@pytest.mark.parametrize("name", sorted(LEVEL2, key=int))
def test_level2_gemm_with_row_ops(name):
    steps, formula = LEVEL2[name]
    m = explain(load_problem(str(_kb(name))))
    assert m.family == "gemm_rows"
    prog = m.facts.tail.program
    assert prog.steps() == steps
    if formula is not None:
        assert prog.formula() == formula


@needs_kb
def test_the_outputs_layouts_and_the_tensors_read():
    m75 = explain(load_problem(str(_kb("75"))))  # min over the row + bias (1, N, 1, 1): a (1, N, B, 1) output
    out = m75.facts.tail.program.out
    assert (out.row_stride, out.col_stride) == ("out.shape[3]", "out.shape[2] * out.shape[3]")
    m51 = explain(load_problem(str(_kb("51"))))
    tensors = {t.name: (t.row_stride, t.col_stride) for t in m51.facts.tail.program.tensors}
    assert tensors == {"subtract": (None, "1"), "x": ("x.shape[1]", "1")}
    lead = explain(load_problem(str(_kb("14")))).facts.tail.lead  # torch.matmul(x, self.weight.T)
    assert (lead.x, lead.weight, lead.trans_b, lead.bias) == ("x", "weight", True, None)


@needs_kb
@pytest.mark.parametrize("name, formula, steps", [
    ("94", "mish(clamp((x + bias), -1, 1))", ("norm/256",)),  # into the GEMM's store, then the norm
    ("37", "(sigmoid(x) * x) + bias", ("norm/64",)),
    ("84", None, ("softmax",)),  # eval batch norm and the scale
    ("30", "", ("norm/16",)),  # nothing before the norm
])
def test_the_elementwise_head_goes_into_the_gemms_epilogue(name, formula, steps):
    tail = explain(load_problem(str(_kb(name)))).facts.tail
    ep, rest = split_epilogue(tail)
    if formula == "":
        assert ep is None
    else:
        assert ep is not None and rest.source.var != tail.program.source.var
        assert formula is None or ep.formula == formula
    assert rest.steps() == steps


@needs_kb
@pytest.mark.parametrize("name", ["12_Gemm_Multiply_LeakyReLU.py", "33_Gemm_Scale_BatchNorm.py"])
def test_gemm_with_an_elementwise_epilogue_stays_with_the_gemm_family(name):
    p = load_problem(str(KB / "level2" / name))
    assert FAMILY.recognise(trace(p)) is None
    assert explain(p).family == "gemm"


@needs_kb
def test_two_gemms_are_two_regions():
    """Neither GEMM family takes two GEMMs whole; the partitioner gives each its own region."""
    p = load_problem(str(_kb("45")))
    assert FAMILY.recognise(trace(p)) is None
    with pytest.raises(NotCovered, match="2 nn.Linear calls"):
        GEMM.recognise(trace(p))
    m = explain(p)
    assert [r.match.family for r in m.facts.partition.regions] == ["gemm", "gemm_rows"]


@needs_kb
def test_the_gemm_family_still_says_why_when_asked_alone():
    with pytest.raises(NotCovered, match="group_norm"):
        GEMM.recognise(trace(load_problem(str(_kb("30")))))


WRITTEN = [  # (forward, inputs, init, the row ops)
    ("F.log_softmax(self.fc(x), dim=-1) * 2", {"x": (6, 16)}, "self.fc = nn.Linear(16, 12)", ("log_softmax",)),
    ("self.ln(torch.relu(self.fc(x))) + y", {"x": (6, 16), "y": (6, 12)},
     "self.fc = nn.Linear(16, 12); self.ln = nn.LayerNorm(12)", ("norm/1",)),
    ("torch.amax(self.fc(x), dim=1)", {"x": (6, 16)}, "self.fc = nn.Linear(16, 12)", ("reduce:max",)),
    ("self.fc(x).max(dim=-1).values - self.fc.bias[0]", {"x": (6, 16)}, "self.fc = nn.Linear(16, 12)", None),
    ("F.avg_pool1d(self.fc(x).unsqueeze(1), 3, 2, 1, count_include_pad=False).squeeze(1).sum(1, keepdim=True)",
     {"x": (6, 16)}, "self.fc = nn.Linear(16, 13)", ("avg_pool/3", "reduce:sum")),
    ("self.norm(F.linear(x, self.w, self.b).unsqueeze(1)).squeeze(1)", {"x": (6, 16)},
     "self.w = nn.Parameter(torch.randn(12, 16)); self.b = nn.Parameter(torch.randn(12)); "
     "self.norm = nn.InstanceNorm1d(1, affine=True)", ("norm/1",)),
    ("torch.logsumexp(x @ self.w, dim=1)", {"x": (6, 16)}, "self.w = nn.Parameter(torch.randn(16, 12))",
     ("reduce:logsumexp",)),
]


@pytest.mark.parametrize("forward, inputs, init, steps", WRITTEN, ids=[w[0][:40] for w in WRITTEN])
def test_written_row_programs(tmp_path, forward, inputs, init, steps):
    p = _problem(tmp_path, forward, inputs, init)
    if steps is None:  # a GEMM's bias read again outside the GEMM: its own parameter slice
        with pytest.raises(NotCovered, match="gemm followed by row ops"):
            explain(p)
        return
    m = explain(p)
    assert m.family == "gemm_rows" and m.facts.tail.program.steps() == steps


@pytest.mark.parametrize("forward, init, why", [
    ("torch.sum(self.fc(x), dim=0)", "self.fc = nn.Linear(16, 12)", "the GEMM's rows: not row-local"),
    ("torch.softmax(self.fc(x), dim=0)", "self.fc = nn.Linear(16, 12)", "not over the GEMM's columns"),
    ("self.fc(x).sum()", "self.fc = nn.Linear(16, 12)", "over all elements"),
    ("torch.var(self.fc(x), dim=1)", "self.fc = nn.Linear(16, 12)", "var after the GEMM is not covered"),
    ("self.fc(x).view(3, 24).sum(1)", "self.fc = nn.Linear(16, 12)", "mixes the rows and columns"),
    ("torch.argmax(self.fc(x), dim=1)", "self.fc = nn.Linear(16, 12)", "argmax after the GEMM is not covered"),
    ("self.fc(x).cumsum(1)", "self.fc = nn.Linear(16, 12)", "cumsum after the GEMM is not covered"),
    ("torch.softmax(self.fc(x) * x[:, :12], 1)", "self.fc = nn.Linear(16, 12)", "computed from inputs or parameters"),
])
def test_refused_with_the_reason(tmp_path, forward, init, why):
    """gemm_rows' own reason (the partitioner may still serve the problem as regions)."""
    p = _problem(tmp_path, forward, {"x": (6, 16)}, init)
    with pytest.raises(NotCovered, match=why):
        FAMILY.recognise(trace(p))


# ----- specs: coverage, plans, NVRTC ---------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("name, offered", [  # sm_90's limits: the wgmma variants too
    ("30", ["staged", "streamed", "tf32x3_staged", "tf32x3_streamed", "wgmma_staged", "wgmma_streamed"]),
    ("99", ["staged", "streamed", "tf32x3_staged", "tf32x3_streamed", "wgmma_staged", "wgmma_streamed"]),
    # a 32768 x 32768 fp32 weight: its 3xTF32 planes (8 GiB) are past the wgmma pre-pass's scratch limit
    ("56", ["streamed", "tf32x3_streamed"]),
    ("55", ["streamed", "tf32x3_streamed"])])
def test_variants_offered_at_the_files_shape(name, offered):
    m = explain(load_problem(str(_kb(name))))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in o.offered] == offered
    for v in o.dropped:  # staged holds nothing where every value is read once
        assert "read once" in v.why or (v.variant == "wgmma_streamed" and v.why.startswith("0 of")), v.why


@needs_kb
def test_plan_at_kernelbench_size():
    m = explain(load_problem(str(_kb("30"))))  # 1024 x 8192 @ (8192 x 8192)^T, GroupNorm(16), hardtanh
    spec = family_of(m).build(m, "staged")
    assert spec.name == FAMILY.spec_name("staged") == "playbook-gemm-rows-staged"
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    gemm, rows = r.launches
    assert [a.name for a in gemm.args] == ["x", "gemm.weight", "gemm.bias", "gemm_out"]
    assert [a.name for a in rows.args] == ["gemm_out", "group_norm.weight", "group_norm.bias", "out"]
    assert rows.grid == (1024, 1, 1) and rows.block == (512, 1, 1)
    assert rows.shared_mem == 4 * (8192 + 16 + 16)  # the GEMM's row and each group's mean and 1/std
    assert r.defines["RT_L0"] == 8192 and r.defines["RT_ORS"] == 8192


def _compile(spec, resolved):
    return compile_job(job_for(spec, resolved, "sm_90"), cache=None)


@needs_kb
# one file per kind of row program (instance norm + residuals, group norm, mean/logsumexp + residual, a pool,
# softmax); each compiles every offered variant, the 3xTF32 leads included: NVRTC time bounds the list
@pytest.mark.parametrize("name", ["28", "30", "51", "55", "99"])
def test_offered_defaults_compile_without_spills(name):
    m = explain(load_problem(str(_kb(name))))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert o.offered
    for v in o.offered:
        compiled = _compile(v.spec, plan.resolve(v.spec, sizes={}, tensors=m.tensor_facts()))
        gemm = {"tf32x3": {"sgemm_tf32x3"}, "wgmma": {"gemm_wgmma_prep", "gemm_wgmma"}}.get(  # 3xTF32, Hopper's, FFMA
            v.variant.split("_")[0], {"gemm_tiled"})
        assert set(compiled.info.kernels) == {*gemm, "gemm_rows_tail"}
        for res in compiled.info.kernels.values():
            assert res.spill_stores == 0 and res.registers <= 255, (v.variant, res)


@needs_kb
@pytest.mark.parametrize("config", [dict(BLOCK=32, RPB=4, KAHAN=1), dict(BLOCK=1024, CP_ASYNC=1, STAGES=3, SMEM_T=0)])
def test_other_configurations_compile(config):
    m = explain(load_problem(str(_kb("62"))))  # 512 groups of 16 columns
    for variant in ("staged", "streamed"):
        spec = family_of(m).build(m, variant)
        resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=config)
        assert all(res.spill_stores == 0 for res in _compile(spec, resolved).info.kernels.values())


# ----- proposer --------------------------------------------------------------------------------------------
@needs_kb
def test_proposer_rounds():
    prop = PlaybookProposer(load_problem(str(_kb("99"))))
    assert prop.match is not None and prop.match.family == "gemm_rows"
    ctx = SearchContext(problem_name="p", problem_source="", problem_summary="",
                        tensors={k: list(v) for k, v in prop.match.tensors().items()},
                        gpu=GpuFacts(name="A100", arch="sm_80"))  # off Hopper: no wgmma idea
    first = prop.ideas(ctx, None, 3)
    round0 = [e.text for e in FAMILY.ideas if e.round0 and "wgmma" not in e.variant]
    assert [i.text for i in first] == round0[:3]  # FFMA staged, streamed, 3xTF32
    (branch, *_) = prop.implement(ctx, None, first[1], 2)
    assert variant_of_spec(branch.spec) == "streamed"
    parent = NodeSummary(node_id=1, idea=first[1], spec=branch.spec, result=EvalResult(verdict=Verdict.ok))
    later = prop.ideas(ctx, parent, 20)
    assert later and all("(streamed row kernel)" in i.text for i in later)
    assert {i.category for i in later} == {e.category for e in FAMILY.ideas if not e.round0}
    configs = {tuple(sorted(b.spec.default_config().items())) for i in later
               for b in prop.implement(ctx, parent, i, 3) if b.spec is not None}
    assert len(configs) >= 8


# ----- the kernels on the CPU emulator against PyTorch ------------------------------------------------------
ALT = dict(BLOCK=64, RPB=2, KAHAN=1)
# every file at its default; the other configurations on one file per kind of row program (CI time)
ALT_FILES = ("28", "30", "51", "55", "66", "98", "99")
SMALL_TILE = dict(BLOCK=256, BM=32, BN=32, TM=4, TN=4, BK=8)  # more GEMM blocks than threads per row
EMULATED = [  # (file, small sizes: rows 13, odd column counts where the ops allow)
    ("14", dict(batch_size=13, input_size=40, hidden_size=71)),  # sum
    ("18", dict(batch_size=13, in_features=40, out_features=71)),
    ("22", dict(batch_size=13, input_size=40, hidden_size=71)),  # logsumexp
    ("28", dict(batch_size=13, in_features=40, out_features=71)),  # instance norm, residual inputs
    ("30", dict(batch_size=13, in_features=40, out_features=90, num_groups=6)),  # group norm
    ("37", dict(batch_size=13, in_features=40, out_features=96, num_groups=4)),
    ("51", dict(batch_size=13, in_features=40, out_features=72)),  # the residual: + original_x
    ("55", dict(batch_size=13, in_features=40, out_features=73)),  # max pool 2 (odd: the last column dropped)
    ("56", dict(batch_size=13, input_size=40, hidden_size=71)),
    ("62", dict(batch_size=13, input_size=40, hidden_size=96, num_groups=24)),
    ("64", dict(batch_size=13, in_features=40, out_features=71)),
    ("66", dict(batch_size=13, in_features=40, out_features=71)),  # softmax
    ("75", dict(batch_size=13, in_features=40, out_features=96, num_groups=12)),
    ("80", dict(batch_size=13, in_features=40, out_features=71)),
    ("84", dict(batch_size=13, in_features=40, out_features=71)),
    ("88", dict(batch_size=13, in_features=40, out_features=96, num_groups=8)),
    ("94", dict(batch_size=13, in_features=40, out_features=96, num_groups=8)),
    ("98", dict(batch_size=13, in_features=40, out_features=101, pool_kernel_size=4)),  # avg pool
    ("99", dict(batch_size=13, in_features=40, out_features=71)),
]


def _offered(path: Path) -> list[str]:
    """The offered variants the emulator runs (not the wgmma ones: TMA, mbarriers and wgmma are not emulated)."""
    m = explain(load_problem(str(path)))
    return [v.variant for v in offer(m, sizes={}, tensors=m.tensor_facts()).offered if "wgmma" not in v.variant]


@needs_emulator
@needs_kb
@pytest.mark.parametrize("name, sizes", EMULATED, ids=[f"{c[0]}-{'x'.join(map(str, c[1].values()))}" for c in EMULATED])
def test_kernelbench_kernels_match_pytorch_on_the_emulator(tmp_path, name, sizes):
    path = resized_copy(_kb(name), tmp_path, **sizes)
    for variant in _offered(path):
        extra = ([ALT] if name in ALT_FILES else []) + ([SMALL_TILE] if name in ("30", "55", "99") else [])
        for config in [None, *extra]:
            assert cases.run_variant(path, variant, config) == {}, (variant, config)


WRITTEN_EMULATED = [w for w in WRITTEN if w[3] is not None] + [
    ("torch.softmax(self.fc(x), dim=1) * self.s + y", {"x": (9, 20), "y": (9, 30)},
     "self.fc = nn.Linear(20, 30); self.s = nn.Parameter(torch.randn(30))", ("softmax",)),
    ("F.max_pool1d(self.fc(x).unsqueeze(1), 4, 3, 2).squeeze(1) * 2", {"x": (9, 20)}, "self.fc = nn.Linear(20, 31)",
     ("max_pool/4",)),
]


@needs_emulator
@pytest.mark.parametrize("forward, inputs, init, steps", WRITTEN_EMULATED, ids=[w[0][:40] for w in WRITTEN_EMULATED])
def test_written_problems_match_pytorch_on_the_emulator(tmp_path, forward, inputs, init, steps):
    path = Path(_problem(tmp_path, forward, inputs, init).path)
    for variant in _offered(path):
        for config in (None, ALT):
            assert cases.run_variant(path, variant, config) == {}, (variant, config)


@needs_emulator
@needs_kb
def test_a_broken_kernel_fails_the_check(tmp_path):
    path = resized_copy(_kb("30"), tmp_path, batch_size=5, in_features=24, out_features=36, num_groups=4)
    p = load_problem(str(path))
    spec = _build(explain(p), "staged")
    broken = spec.model_copy(update={"source": spec.source.replace("rsqrtf(var + ", "rsqrtf(0.9f * var + ")})
    assert broken.source != spec.source
    case = cases.make_case(p)
    emulate(broken, case.tensors, config=broken.default_config(), sizes=case.sizes)
    assert cases.mismatches(case)
