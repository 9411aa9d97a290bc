"""The playbook's ``attention`` family (CPU tier, issue #17): recognition of F.scaled_dot_product_attention and
of the explicit softmax(q k^T * scale [+ causal mask]) v chain (the suite's problem, KernelBench 97), refusals
with their reasons, the specs' plans at the files' own sizes, NVRTC compilation for sm_80 and sm_90 without
spills, and both kernels against PyTorch on the CPU emulator (tests/emu runs cp.async, ldmatrix and mma.sync
by the PTX ISA's fragment layouts) at small and odd shapes, through the harness's own comparison."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import family_of, PlaybookProposer, explain, seed_specs
from kerngen.agent.playbook.attention.build import FA2_DEFAULTS, MAX_SMEM_SM80, fa2_smem_bytes
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.attention.family import ATTENTION as FAMILY
from kerngen.agent.playbook.graph import trace
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.errors import SpecError
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.compare import compare
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.agent.family_checks import resized_copy
from tests.resources import kernelbench

from tests.emu.runner import EmuError, emulate


def _build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)

DATA = Path(__file__).parents[1] / "data" / "playbook"
KB97 = kernelbench("level1", "97_ScaledDotProductAttention.py")
needs_kb = pytest.mark.needs_kernelbench
needs_emulator = pytest.mark.needs_cxx
LOG2E = math.log2(math.e)

PROBLEM = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, q, k, v):
        {body}


def get_inputs():
    return [torch.randn({qs}, dtype=torch.{dt}), torch.randn({ks}, dtype=torch.{dt}),
            torch.randn({vs}, dtype=torch.{dt})]


def get_init_inputs():
    return []
'''


def _problem(tmp_path: Path, body: str, q: tuple[int, ...], k: tuple[int, ...] | None = None,
             v: tuple[int, ...] | None = None, dtype: str = "bfloat16", init: str = "pass"):
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.py"
    k = k or q
    path.write_text(PROBLEM.format(init=init, body=body, qs=q, ks=k, vs=v or k, dt=dtype))
    return load_problem(str(path))


SDPA = "return F.scaled_dot_product_attention(q, k, v{})"
CHAIN_CAUSAL = ("n = q.size(-2)\n        mask = torch.ones(n, n, device=q.device).tril() == 0\n        "
                "s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])\n        "
                "return torch.softmax(s.masked_fill(mask, float('-inf')), dim=-1) @ v")
CHAIN_BMM = "return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.1, dim=-1), v)"


# ----- recognition --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, causal, dtype, d", [
    ("suite_attention", True, "bfloat16", 128), ("kb_attention", True, "bfloat16", 64),
    ("explicit_attention", True, "bfloat16", 64)])
def test_recognises_the_data_files(name, causal, dtype, d):
    m = explain(load_problem(str(DATA / f"{name}.py")))
    f = m.facts
    assert m.family == "attention" and (f.causal, f.dtype, f.head_dim, f.scale) == (causal, dtype, d, None)
    assert (f.q, f.k, f.v, f.nd) == ("q", "k", "v", 4) and m.message.startswith("attention: softmax(")


def test_recognises_the_builtin_suite_problem():
    m = explain(load_problem("attention"))
    assert m.family == "attention" and m.facts.causal and m.facts.head_dim == 128


@needs_kb
def test_recognises_kernelbench_97_as_fp32_attention():
    m = explain(load_problem(str(KB97)))
    f = m.facts
    assert m.family == "attention" and (f.q, f.k, f.v) == ("Q", "K", "V")
    assert (f.causal, f.dtype, f.head_dim, f.scale) == (False, "float32", 1024, None)


@pytest.mark.parametrize("body, q, k, dtype, causal, scale", [
    (SDPA.format(", is_causal=True"), (2, 4, 64, 128), None, "float16", True, None),
    (SDPA.format(", scale=0.2"), (1, 2, 16, 64), (1, 2, 24, 64), "bfloat16", False, 0.2),
    (SDPA.format(", None, 0.0, True"), (1, 2, 16, 64), None, "bfloat16", True, None),  # positional options
    (CHAIN_CAUSAL, (1, 3, 40, 64), None, "float16", True, None),
    (CHAIN_BMM, (6, 40, 128), (6, 50, 128), "bfloat16", False, 0.1),  # 3-D, Sq != Sk, a literal scale
])
def test_recognises_sdpa_calls_and_explicit_chains(tmp_path, body, q, k, dtype, causal, scale):
    m = explain(_problem(tmp_path, body, q, k, dtype=dtype))
    f = m.facts
    assert m.family == "attention" and f.causal == causal and f.nd == len(q)
    assert (f.scale is None) if scale is None else math.isclose(f.scale, scale, rel_tol=1e-9)


@pytest.mark.parametrize("body, q, k, v, dtype, init, why", [
    (SDPA.format(", attn_mask=torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()"), (1, 2, 16, 64), None,
     None, "bfloat16", "pass", "attn_mask"),
    (SDPA.format(", dropout_p=0.1"), (1, 2, 16, 64), None, None, "bfloat16", "pass", "dropout"),
    (SDPA.format(", enable_gqa=True"), (1, 4, 16, 64), (1, 2, 16, 64), None, "bfloat16", "pass", "grouped-query"),
    (SDPA.format(""), (1, 2, 16, 96), None, None, "bfloat16", "pass", "head dim 96"),
    (SDPA.format(""), (1, 2, 16, 64), None, (1, 2, 16, 128), "bfloat16", "pass", "value head dim 128"),
    (SDPA.format(", is_causal=True"), (1, 2, 16, 64), (1, 2, 24, 64), None, "bfloat16", "pass", "top-left"),
    (SDPA.format("").replace("(q, k, v", "(q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1)")
     + ".transpose(-2, -1)", (1, 2, 64, 64), None, None, "bfloat16", "pass", "computes none"),  # (.., dim, seq)
    (SDPA.format(""), (1, 2, 16, 64), None, None, "float64", "pass", "float64"),
    (SDPA.format(", scale=-0.125"), (1, 2, 16, 64), None, None, "bfloat16", "pass", "not positive"),
])
def test_refuses_what_it_does_not_cover_with_the_reason(tmp_path, body, q, k, v, dtype, init, why):
    p = _problem(tmp_path, body, q, k, v, dtype=dtype, init=init)
    with pytest.raises(NotCovered, match=why):
        explain(p)


def test_projections_are_their_own_regions(tmp_path):
    """The attention family refuses the projection; the partitioner serves it as a GEMM region before the core."""
    p = _problem(tmp_path, "return F.scaled_dot_product_attention(self.proj(q), k, v)", (1, 2, 16, 64),
                 dtype="float32", init="self.proj = nn.Linear(64, 64)")
    with pytest.raises(NotCovered, match="projections"):
        FAMILY.recognise(trace(p))
    m = explain(p)
    assert [r.match.family for r in m.facts.partition.regions] == ["gemm", "attention"]


def test_a_softmax_between_products_that_is_no_attention_is_left_to_the_other_families(tmp_path):
    p = _problem(tmp_path, "return torch.softmax(q @ k, dim=-1) @ v", (1, 2, 64, 64), dtype="float32")
    assert FAMILY.recognise(trace(p)) is None


# ----- specs and plans ------------------------------------------------------------------------------------
def test_suite_problem_offers_the_tensor_core_kernel_at_its_own_size():
    p = load_problem("attention")
    m = explain(p)
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in o.offered] == ["fa2", "wgmma"] and "fp32" in o.why_not("simt")
    spec = o.get("fa2").spec
    assert spec.name == FAMILY.spec_name("fa2") == "playbook-attention-fa2" and variant_of_spec(spec) == "fa2"
    assert spec.default_config() == FA2_DEFAULTS[128]
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    (launch,) = r.launches
    assert launch.grid == (4096 // 128, 8 * 16, 1) and launch.block == (128, 1, 1)
    assert launch.shared_mem == fa2_smem_bytes(spec.default_config(), 128) == 2 * 128 * (128 + 2 * 2 * 64)
    assert [a.name for a in launch.args[:4]] == ["q", "k", "v", "out"]
    assert [(a.kind, a.value) for a in launch.args[4:6]] == [("int32", 4096), ("int32", 4096)]
    assert launch.args[6].kind == "float32" and math.isclose(launch.args[6].value, LOG2E / math.sqrt(128))
    assert r.defines["HEAD_DIM"] == 128
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in spec.source and "ldmatrix" in spec.source


def _admits(spec, m, cfg: dict[str, int]) -> bool:
    try:
        plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)
    except SpecError:
        return False
    return True


def test_every_offered_configuration_fits_sm80_shared_memory():
    m = explain(load_problem("attention"))
    spec = family_of(m).build(m, "fa2")
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
    assert r.launches[0].shared_mem <= MAX_SMEM_SM80
    for cfg in ({"BLOCK_N": 128, "STAGES": 3}, {"SWIZZLE": 0, "BLOCK_N": 128, "STAGES": 2, "BLOCK_M": 128}):
        fits = fa2_smem_bytes({**spec.default_config(), **cfg}, 128) <= MAX_SMEM_SM80
        assert fits == _admits(spec, m, cfg)


@needs_kb
def test_q_from_shared_memory_only_with_two_row_tiles_a_warp_and_q_in_registers_only_where_it_fits():
    m = explain(load_problem("attention"))  # D = 128
    spec = family_of(m).build(m, "fa2")
    assert _admits(spec, m, {"BLOCK_M": 128, "WARPS": 4, "QSMEM": 1})  # FlashAttention-2's tile
    assert not _admits(spec, m, {"BLOCK_M": 128, "WARPS": 4, "QSMEM": 0})  # O, S and Q: ~300 registers
    assert not _admits(spec, m, {"BLOCK_M": 128, "WARPS": 8, "QSMEM": 1})  # one m16 tile a warp: no gain
    assert _admits(spec, m, {"BLOCK_M": 256, "WARPS": 8, "BLOCK_N": 32, "QSMEM": 1})
    assert not _admits(spec, m, {"BLOCK_M": 256, "WARPS": 8, "BLOCK_N": 128, "QSMEM": 1})
    # ping-pong: two groups of 4 warps and a ring of exactly 3 slots
    assert _admits(spec, m, {"WARPS": 8, "QSMEM": 0, "STAGES": 3, "PINGPONG": 1})
    assert not _admits(spec, m, {"WARPS": 4, "STAGES": 3, "PINGPONG": 1})
    assert not _admits(spec, m, {"WARPS": 8, "QSMEM": 0, "STAGES": 2, "PINGPONG": 1})


@needs_kb
def test_kernelbench_97_offers_the_fp32_kernel_at_its_own_size():
    m = explain(load_problem(str(KB97)))
    o = offer(m, sizes={}, tensors=m.tensor_facts(), family=family_of(m))
    # simt, then the two-GEMM candidates of three regions, built above the registry (tests/agent/test_sdpa_regions.py)
    assert [v.variant for v in o.offered] == ["simt", "regions", "regions_wgmma"] and "bf16 or fp16" in o.why_not("fa2")
    assert "bf16 or fp16" in o.why_not("wgmma")
    r = plan.resolve(o.get("simt").spec, sizes={}, tensors=m.tensor_facts())
    (launch,) = r.launches
    assert launch.grid == (512 // 16, 32 * 32, 1) and launch.block == (256, 1, 1)
    assert [a.name for a in launch.args[:4]] == ["Q", "K", "V", "out"] and launch.args[6].kind == "float32"


def test_an_explicit_scale_is_the_kernels_argument(tmp_path):
    m = explain(_problem(tmp_path, CHAIN_BMM, (6, 40, 128), (6, 50, 128)))
    r = plan.resolve(family_of(m).build(m, "fa2"), sizes={}, tensors=m.tensor_facts())
    (launch,) = r.launches
    assert launch.grid == (1, 6, 1) and [a.value for a in launch.args[4:6]] == [40, 50]
    assert math.isclose(launch.args[6].value, 0.1 * LOG2E, rel_tol=1e-6)


def test_round0_and_refinement_ideas_render():
    prop = PlaybookProposer(load_problem("attention"))
    specs = seed_specs(load_problem("attention"))
    assert {s.name for s in specs} == {"playbook-attention-fa2", "playbook-attention-wgmma"}
    after = [e for e in prop._entries() if not e.round0 and e.after & {"fa2", "wgmma"}]
    rendered = [b for e in after for b in prop._render(e, None, 3)]
    assert len(rendered) >= len(after) and all(b.spec is not None for b in rendered)


# ----- NVRTC --------------------------------------------------------------------------------------------
FA2_SAMPLES = {  # per head dim: the default, then the configurations nearest the register limit
    128: [{}, {"WARPS": 8, "QSMEM": 0, "BLOCK_N": 128}, {"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 128, "QSMEM": 0},
          {"SWIZZLE": 0, "STAGES": 3}, {"WARPS": 8, "QSMEM": 0},
          {"BLOCK_M": 256, "WARPS": 8, "BLOCK_N": 32, "QSMEM": 1, "STAGES": 3},
          {"WARPS": 8, "QSMEM": 0, "STAGES": 3, "PINGPONG": 1},
          {"BLOCK_M": 256, "WARPS": 8, "BLOCK_N": 32, "QSMEM": 1, "STAGES": 3, "PINGPONG": 1}],
    64: [{}, {"SWIZZLE": 0, "STAGES": 4}, {"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 128}, {"WARPS": 8, "BLOCK_N": 128},
         {"QSMEM": 1}, {"BLOCK_M": 256, "WARPS": 8, "BLOCK_N": 64, "QSMEM": 1}],
}


def _compiled(spec, m, cfg, arch):
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)
    return compile_job(job_for(spec, r, arch), cache=None).info.worst()


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("dtype, causal", [("bfloat16", True), ("float16", False)])
def test_the_tensor_core_kernel_compiles_without_spills(tmp_path, arch, d, dtype, causal):
    m = explain(_problem(tmp_path, SDPA.format(f", is_causal={causal}"), (2, 4, 1000, d), dtype=dtype))
    spec = family_of(m).build(m, "fa2")
    for cfg in FA2_SAMPLES[d] if (dtype, arch) == ("bfloat16", "sm_90") else FA2_SAMPLES[d][:1]:
        res = _compiled(spec, m, cfg, arch)
        assert res.registers <= 255 and res.spill_stores == 0 and res.spill_loads == 0, (cfg, res)


@needs_kb
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_the_fp32_kernel_compiles_without_spills(arch):
    m = explain(load_problem(str(KB97)))
    spec = family_of(m).build(m, "simt")
    for cfg in ({}, {"WARPS": 4, "BLOCK_N": 32}):
        res = _compiled(spec, m, cfg, arch)
        assert res.registers <= 255 and res.spill_stores == 0, (cfg, res)


# ----- the CPU emulator -----------------------------------------------------------------------------------
def _emulated(problem, variant: str, config: dict[str, int] | None = None, source: str | None = None):
    """The kernel's output and PyTorch's, on the problem's own (small) inputs."""
    m = explain(problem)
    spec = family_of(m).build(m, variant)
    if source is not None:
        spec = spec.model_copy(update={"source": source})
    model = problem.build_model("cpu", 0)
    inputs = problem.make_inputs("cpu", 1)
    (ref,) = problem.run_reference(model, inputs)
    out = torch.full_like(ref, float("nan"))
    tensors = {t.name: x.contiguous() for t, x in zip(m.inputs, inputs)} | {"out": out}
    try:
        emulate(spec, tensors, config=config, timeout_s=600)
    except EmuError as exc:
        if "is not emulated" in str(exc):
            pytest.skip(f"this emulator runs no inline PTX: {exc}")
        raise
    return out, ref


def _check(out, ref, problem) -> None:
    c = compare(out, ref, atol=problem.info.atol, rtol=problem.info.rtol)
    assert c.ok, c.message


FA2_CASES = [  # (q shape, k shape, dtype, causal, config): odd lengths, every tunable moved once
    ((1, 2, 100, 64), None, "bfloat16", True, {}),
    ((1, 1, 130, 128), None, "bfloat16", True, {}),
    ((1, 1, 77, 128), (1, 1, 45, 128), "float16", False, {}),
    ((1, 1, 200, 64), None, "bfloat16", True, {"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 32, "STAGES": 3, "SWIZZLE": 0}),
    ((1, 1, 150, 128), None, "float16", True, {"BLOCK_M": 64, "WARPS": 4, "BLOCK_N": 128, "QSMEM": 0}),
    ((2, 1, 129, 64), None, "bfloat16", False, {"WARPS": 4, "SWIZZLE": 0, "STAGES": 4}),
    ((1, 1, 300, 64), None, "bfloat16", True, {"WARPS": 8, "BLOCK_N": 128, "STAGES": 3}),
    ((3, 1, 5, 128), (3, 1, 17, 128), "bfloat16", False, {}),
    # Q re-read from shared memory with 32 rows a warp (D = 128's default: cases {} above), and at D = 64
    ((1, 1, 150, 128), None, "bfloat16", True, {"WARPS": 8, "QSMEM": 0}),  # the 8-warp tile of 16 rows
    ((1, 2, 90, 64), (1, 2, 33, 64), "float16", False, {"QSMEM": 1, "BLOCK_N": 32, "STAGES": 3}),
    # ping-pong: two groups of 4 warps taking turns on the tensor cores, a 3-slot ring under named barriers
    ((1, 1, 300, 128), None, "bfloat16", True, {"WARPS": 8, "QSMEM": 0, "STAGES": 3, "PINGPONG": 1}),
    ((1, 2, 70, 128), (1, 2, 200, 128), "float16", False,
     {"WARPS": 8, "QSMEM": 0, "STAGES": 3, "PINGPONG": 1, "BLOCK_N": 32}),
    ((1, 1, 333, 64), None, "bfloat16", True,
     {"BLOCK_M": 256, "WARPS": 8, "QSMEM": 1, "STAGES": 3, "PINGPONG": 1, "BLOCK_N": 32}),
    ((2, 1, 3, 64), (2, 1, 5, 64), "bfloat16", False, {"WARPS": 8, "STAGES": 3, "PINGPONG": 1}),  # 1 key tile
]


@needs_emulator
@pytest.mark.parametrize("q, k, dtype, causal, config", FA2_CASES,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else None)
def test_the_tensor_core_kernel_matches_pytorch_on_the_emulator(tmp_path, q, k, dtype, causal, config):
    p = _problem(tmp_path, SDPA.format(f", is_causal={causal}"), q, k, dtype=dtype)
    out, ref = _emulated(p, "fa2", config)
    _check(out, ref, p)


@needs_emulator
def test_the_explicit_chain_runs_the_same_kernel(tmp_path):
    p = _problem(tmp_path, CHAIN_CAUSAL, (1, 2, 70, 64), dtype="float16")
    out, ref = _emulated(p, "fa2")
    _check(out, ref, p)


GROWING_KEYS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F



class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v{causal})


def get_inputs():
    # key j scaled by 10 ** (2 j / S): scores grow along the keys by far more than the kernel's rescale slack
    # (2^8), row by row differently (a row whose q points away from the keys sees its max fall), up to
    # exp2 arguments of several hundred: a kernel that never moved its reference max would overflow
    s = {s}
    ramp = torch.logspace(0, 2, s).view(1, 1, s, 1)
    return [torch.randn(1, 2, s, {d}, dtype=torch.{dt}), (torch.randn(1, 2, s, {d}) * ramp).to(torch.{dt}),
            torch.randn(1, 2, s, {d}, dtype=torch.{dt})]


def get_init_inputs():
    return []
'''


def _growing(tmp_path: Path, s: int, d: int, dtype: str, causal: bool):
    path = tmp_path / f"grow{len(list(tmp_path.iterdir()))}.py"
    path.write_text(GROWING_KEYS.format(s=s, d=d, dt=dtype, causal=", is_causal=True" if causal else ""))
    return load_problem(str(path))


@needs_emulator
@pytest.mark.parametrize("s, d, dtype, causal, config", [
    (200, 64, "bfloat16", True, {"BLOCK_N": 32}),
    (150, 128, "float16", False, {"WARPS": 4, "QSMEM": 1, "BLOCK_N": 32}),
])
def test_row_maxima_that_keep_growing_are_rescaled(tmp_path, s, d, dtype, causal, config):
    p = _growing(tmp_path, s, d, dtype, causal)
    out, ref = _emulated(p, "fa2", config)
    _check(out, ref, p)


@needs_emulator
@pytest.mark.parametrize("broken", [
    ("#define FA_SLACK 8.f", "#define FA_SLACK 1e30f"),  # the reference max never moves: exp2 overflows
    ("            o[i][jd][2 * h] *= alpha;\n", ""),  # O's even columns not rescaled with l
])
def test_a_kernel_that_does_not_rescale_fails(tmp_path, broken):
    p = _growing(tmp_path, 150, 64, "bfloat16", False)
    good = _build(explain(p), "fa2").source
    bad = good.replace(*broken)
    assert bad != good
    out, ref = _emulated(p, "fa2", {"BLOCK_N": 32}, source=bad)
    assert not compare(out, ref, atol=p.info.atol, rtol=p.info.rtol).ok


@needs_emulator
def test_a_wrong_fragment_layout_fails_the_check(tmp_path):
    """K's chunk for ldmatrix lanes 8-15 and 16-23 swapped: the emulator's mma sees the wrong k half."""
    p = _problem(tmp_path, SDPA.format(""), (1, 1, 64, 64))
    good = _build(explain(p), "fa2").source
    bad = good.replace("fa_k_chunk(int lane) { return (lane >> 3) & 1; }", "fa_k_chunk(int lane) { return lane >> 4; }")
    assert bad != good
    out, ref = _emulated(p, "fa2", source=bad)
    assert not compare(out, ref, atol=p.info.atol, rtol=p.info.rtol).ok


@needs_kb
@needs_emulator
@pytest.mark.parametrize("sizes, config", [
    (dict(batch_size=1, num_heads=2, sequence_length=37, embedding_dimension=1024), {}),
    (dict(batch_size=1, num_heads=1, sequence_length=70, embedding_dimension=64), {"WARPS": 4, "BLOCK_N": 32}),
])
def test_the_fp32_kernel_matches_pytorch_on_the_emulator(tmp_path, sizes, config):
    p = load_problem(str(resized_copy(KB97, tmp_path, **sizes)))
    out, ref = _emulated(p, "simt", config)
    _check(out, ref, p)


@needs_emulator
@pytest.mark.parametrize("body, q, k", [(SDPA.format(", is_causal=True"), (1, 2, 33, 128), None),
                                        (SDPA.format(", scale=0.3"), (2, 1, 20, 64), (2, 1, 50, 64))])
def test_the_fp32_kernel_masks_and_scales(tmp_path, body, q, k):
    p = _problem(tmp_path, body, q, k, dtype="float32")
    out, ref = _emulated(p, "simt")
    _check(out, ref, p)
