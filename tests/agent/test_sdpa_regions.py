"""The attention family's fp32 candidates of three regions (agent/playbook/attention/regions.py): SDPA decomposed by
the partitioner into S = (q @ k^T) * scale (a batched gemm, the scale in its epilogue), P = softmax(S), O = P @ v,
joined into one spec with S and P in scratch. Offered for fp32 (KernelBench level 1's 97, a small problem) beside
``simt``, never for bf16 or a causal mask; NVRTC compiles it at 97's size for sm_90; the harness's memory plan takes
its scratch; the CPU emulator runs it against F.scaled_dot_product_attention, and a wrong intermediate fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kerngen.agent.playbook import PlaybookProposer, by_name, explain, family_of, partition, trace
from kerngen.agent.playbook.leads import Lead
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.memory_plan import plan_memory
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from tests.emu.runner import EmuError, emulate
from tests.resources import kernelbench

KB97 = kernelbench("level1", "97_ScaledDotProductAttention.py")
needs_kb = pytest.mark.needs_kernelbench
needs_emulator = pytest.mark.needs_cxx
NEW = ("regions", "regions_wgmma")

PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v{opts})


def get_inputs():
    return [torch.randn({qs}, dtype=torch.{dt}), torch.randn({ks}, dtype=torch.{dt}),
            torch.randn({ks}, dtype=torch.{dt})]


def get_init_inputs():
    return []
'''


def _problem(tmp_path: Path, q: tuple[int, ...], k: tuple[int, ...] | None = None, dtype: str = "float32",
             opts: str = ""):
    path = tmp_path / f"sdpa{len(list(tmp_path.iterdir()))}.py"
    path.write_text(PROBLEM.format(qs=q, ks=k or q, dt=dtype, opts=opts))
    return load_problem(str(path))


def _offered(problem) -> dict[str, object]:
    return {v.variant: v.spec for v in PlaybookProposer(problem).offer.offered}


# ----- what is offered --------------------------------------------------------------------------------------
@needs_kb
def test_kernelbench_97_offers_the_three_region_specs_beside_simt():
    p = load_problem(str(KB97))
    specs = _offered(p)
    assert list(specs) == ["simt", *NEW]
    assert specs["simt"].name == "playbook-attention-simt" and not specs["simt"].scratch
    tf32 = specs["regions"]
    assert tf32.origin.family == "attention" and tf32.origin.variant == "regions"
    kernels = [s.kernel for s in tf32.steps]
    assert kernels == ["r0_sgemm_tf32x3", "r1_softmax_rows", "r2_sgemm_tf32x3"]
    args = [[a.name for a in s.args if hasattr(a, "name")] for s in tf32.steps]
    assert args == [["Q", "K", "r0_out"], ["r0_out", "r1_out"], ["r1_out", "V", "out"]]
    assert "0.03125f" in tf32.source  # 1/sqrt(1024), in the first GEMM's epilogue
    wg = [s.kernel for s in specs["regions_wgmma"].steps]
    assert "r0_gemm_wgmma" in wg and "r2_gemm_wgmma" in wg and "r1_softmax_rows" in wg
    for spec in specs.values():  # every scratch buffer resolves; S and P are 32*32*512*512 floats (1 GiB) each
        r = plan.resolve(spec, sizes=dict(p.info.sizes), tensors=p.info.tensor_facts(), config=spec.default_config())
        sizes = {s.name: s.size for s in r.scratch}
        if spec is not specs["simt"]:
            assert sizes["r0_out"] == sizes["r1_out"] == 32 * 32 * 512 * 512
        scratch = sum(4 * n for n in sizes.values())
        # the harness's memory plan checks it on an 80 GB GPU (H100) and an H200: inputs 3 x 2 GiB, output 2 GiB
        for free in (80e9, 140e9):
            mp = plan_memory(free_bytes=int(free), input_bytes=3 * 2**31, output_bytes=2**31, scratch_bytes=scratch)
            assert mp.scratch_bytes == scratch and mp.timed_sets >= 1


def test_the_family_declares_them_and_the_regions_layer_builds_them(tmp_path):
    """The attention family (below the registry) declares the candidates as data; :func:`family_of` (above it,
    beside the partition) gives its record with them built, offered after the family's own."""
    bare = by_name("attention")
    assert list(bare.variants) == ["fa2", "wgmma", "simt"] and list(bare.partitioned) == list(NEW)
    assert bare.partitioned["regions"].leads == (Lead.contraction, Lead.softmax, Lead.contraction)
    m = explain(_problem(tmp_path, (1, 2, 64, 48)))
    built = family_of(m)
    assert list(built.variants) == ["fa2", "wgmma", "simt", *NEW] and built.ideas == bare.ideas
    spec = built.build(m, "regions")
    assert (spec.origin.family, spec.origin.variant) == ("attention", "regions")
    assert built.build(m, "regions") == spec  # the joined match is made once per graph


def test_the_partition_without_the_attention_family_is_two_gemms_around_a_softmax(tmp_path):
    g = trace(_problem(tmp_path, (1, 2, 37, 24), (1, 2, 40, 24)))
    assert [n.op for n in g.live()] == ["scaled_dot_product_attention"]
    assert len(partition(g).regions) == 1  # the problem itself: one attention region, as before
    part = partition(g, frozenset({"attention"}))
    assert part.covered, part.why
    assert [(r.lead, r.match.family) for r in part.regions] == [
        (Lead.contraction, "gemm"), (Lead.softmax, "softmax"), (Lead.contraction, "gemm")]
    s = part.regions[0].match.facts
    assert (s.a, s.b, s.trans_b, s.BATCH) == ("q", "k", True, "q.shape[0] * q.shape[1]")
    assert s.ep is not None and s.ep.formula.startswith("x * 0.2041")
    assert [part.storage[str(r.graph.output)] for r in part.regions] == ["r0_out", "r1_out", "out"]


def test_a_small_fp32_problem_offers_them_and_bf16_or_causal_does_not(tmp_path):
    specs = _offered(_problem(tmp_path, (1, 2, 64, 48)))
    assert set(NEW) <= set(specs)
    assert [s.kernel for s in specs["regions"].steps] == ["r0_sgemm_tf32x3", "r1_softmax_rows", "r2_gemm_tiled"]
    bf16 = PlaybookProposer(_problem(tmp_path, (1, 2, 64, 64), dtype="bfloat16")).offer
    assert [v.variant for v in bf16.offered] == ["fa2", "wgmma"]
    assert "fp32's" in bf16.why_not("regions") and "fp32's" in bf16.why_not("regions_wgmma")
    causal = PlaybookProposer(_problem(tmp_path, (1, 2, 64, 48), opts=", is_causal=True")).offer
    assert not causal.get("regions") and "causal" in causal.why_not("regions")
    assert [v.variant for v in PlaybookProposer(load_problem("attention")).offer.offered] == ["fa2", "wgmma"]


# ----- NVRTC at KernelBench 97's size -----------------------------------------------------------------------
@needs_kb
@pytest.mark.parametrize("variant", NEW)
def test_the_joined_spec_compiles_for_sm_90_at_kernelbench_97(variant):
    p = load_problem(str(KB97))
    m = explain(p)
    spec = _offered(p)[variant]
    r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=spec.default_config())
    worst = compile_job(job_for(spec, r, "sm_90"), cache=None).info.worst()
    assert 0 < worst.registers <= 255 and worst.spill_stores == 0, worst


# ----- the CPU emulator ---------------------------------------------------------------------------------------
def _run(problem, spec, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    m = explain(problem)
    q, k, v = (torch.randn(t.shape, generator=gen) for t in m.inputs)
    want = F.scaled_dot_product_attention(q, k, v)
    out = torch.full_like(want, float("nan"))
    emulate(spec, {m.inputs[0].name: q, m.inputs[1].name: k, m.inputs[2].name: v, "out": out}, timeout_s=600)
    return out, want


@needs_emulator
@pytest.mark.parametrize("q, k, kernels", [
    ((1, 2, 37, 24), (1, 2, 40, 24), ["r0_gemm_tiled", "r1_softmax_rows", "r2_gemm_tiled"]),  # odd query length
    ((1, 2, 64, 48), None, ["r0_sgemm_tf32x3", "r1_softmax_rows", "r2_gemm_tiled"]),
    ((2, 1, 64, 64), None, ["r0_sgemm_tf32x3", "r1_softmax_rows", "r2_sgemm_tf32x3"]),
], ids=["37x40x24", "64x48", "64x64"])
def test_the_joined_spec_matches_pytorch_on_the_emulator(tmp_path, q, k, kernels):
    p = _problem(tmp_path, q, k)
    spec = _offered(p)["regions"]
    assert [s.kernel for s in spec.steps] == kernels
    out, want = _run(p, spec)
    assert torch.allclose(out, want, atol=1e-4, rtol=1e-4), float((out - want).abs().nan_to_num(1e9).max())


def _broken(spec, how: str):
    data = spec.model_dump()
    if how == "softmax reads its own output":  # the softmax region reads P's buffer instead of S
        step = next(s for s in data["steps"] if s.get("kernel") == "r1_softmax_rows")
        for arg in step["args"]:
            if arg.get("name") == "r0_out":
                arg["name"] = "r1_out"
    else:  # the scale in the first GEMM's epilogue corrupted
        region0 = data["source"].split("// ---- region 1")[0]
        scale = re.search(r"0\.1767[0-9]*f", region0).group(0)  # 1/sqrt(32)
        data["source"] = data["source"].replace(scale, "0.25f", 1)
    return type(spec).model_validate(data)


@needs_emulator
@pytest.mark.parametrize("how", ["softmax reads its own output", "a corrupted scale"])
def test_a_wrong_intermediate_fails(tmp_path, how):
    p = _problem(tmp_path, (1, 2, 64, 32))  # S and P no larger than q, k, v and out: offered (the bound below)
    spec = _offered(p)["regions"]
    out, want = _run(p, spec)
    assert torch.allclose(out, want, atol=1e-4, rtol=1e-4)  # the spec itself is right at this shape
    wrong = _broken(spec, how)
    assert wrong != spec
    try:
        out, want = _run(p, wrong)
    except EmuError:
        return  # a buffer read before it is written is a failure too
    assert not torch.allclose(out, want, atol=1e-4, rtol=1e-4)


def test_they_are_not_offered_where_s_and_p_outweigh_the_problem(tmp_path):
    """S and P grow with the lengths squared: at head dim 64 and length 512 they are 4x q, k, v and out together
    (the flash-style kernel's case, and scratch that can outgrow the GPU), so only simt is offered; at KernelBench
    97's head dim 1,024 they are a quarter (above)."""
    off = PlaybookProposer(_problem(tmp_path, (1, 2, 512, 64))).offer
    assert [v.variant for v in off.offered] == ["simt"]
    for v in NEW:
        why = off.why_not(v)
        assert "S and P (4.00 MiB) would be larger than q, k, v and out together (1.00 MiB)" in why, why
    # the bound itself: S + P = 2 x 2 x 256 x 256 floats against (4 x 2 x 256 x 128): equal, so offered
    assert set(NEW) <= {v.variant for v in PlaybookProposer(_problem(tmp_path, (1, 2, 256, 128))).offer.offered}
