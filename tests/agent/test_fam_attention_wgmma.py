"""The Hopper variant of the ``attention`` family (CPU tier, issue #17): ``wgmma`` (FlashAttention-3 style: TMA
copies by a producer warpgroup, wgmma products by 1-3 consumer warpgroups, setmaxnreg) is offered for bf16/fp16
at head dims 64 and 128 beside fa2, its plan passes q, k and v as TMA descriptors of the right boxes, its
constraints keep shared memory and the consumers' registers in bounds, and NVRTC compiles it for sm_90a (the
spec asks for the arch-specific target) at every sampled configuration without spills and without ptxas
serializing the wgmma (C7512). The emulator runs no wgmma/TMA: the GPU tier (test_gpu_fam_attention.py) runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook import explain, family_of
from kerngen.agent.playbook.attention.build import (MAX_SMEM_SM90, WGMMA_BLOCK_NS, WGMMA_DEFAULTS,
                                                   WGMMA_TUNABLES)
from kerngen.agent.playbook.coverage import offer
from kerngen.errors import CompileError, SpecError
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem

PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal={causal})


def get_inputs():
    return [torch.randn({q}, dtype=torch.{dt}), torch.randn({k}, dtype=torch.{dt}), torch.randn({k}, dtype=torch.{dt})]


def get_init_inputs():
    return []
'''


def _problem(tmp_path: Path, q, k=None, dtype="bfloat16", causal=True):
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.py"
    path.write_text(PROBLEM.format(q=q, k=k or q, dt=dtype, causal=causal))
    return load_problem(str(path))


def _resolve(spec, m, cfg=None):
    return plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)


def _admits(spec, m, cfg) -> bool:
    try:
        _resolve(spec, m, cfg)
    except SpecError:
        return False
    return True


def test_the_suite_problem_offers_it_with_tma_descriptors_of_the_tiles():
    m = explain(load_problem("attention"))  # causal bf16 (8, 16, 4096, 128)
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    spec = o.get("wgmma").spec
    assert spec.name == "playbook-attention-wgmma" and spec.arch_specific
    assert spec.default_config() == WGMMA_DEFAULTS[128]
    (launch,) = _resolve(spec, m).launches
    assert launch.grid == (4096 // 128, 8 * 16, 1) and launch.block == (3 * 128, 1, 1)
    assert launch.shared_mem == 2 * 128 * (128 + 2 * 3 * 128) + 1024 + 8 * (1 + 4 * 3)
    maps = launch.args[:3]
    assert [(a.kind, a.name, a.box, a.swizzle) for a in maps] == [
        ("tensormap", "q", (128, 64), 128), ("tensormap", "k", (128, 64), 128), ("tensormap", "v", (128, 64), 128)]
    assert [a.kind for a in launch.args[3:]] == ["tensor", "int32", "int32", "float32"]
    for instr in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "cp.async.bulk.tensor.4d",
                  "setmaxnreg.inc.sync.aligned", "mbarrier.try_wait.parity"):
        assert instr in spec.source
    # the box follows the tunables: one consumer warpgroup is 64 query rows, the key tile BLOCK_N rows
    (launch,) = _resolve(spec, m, {"CWG": 1, "BLOCK_N": 176, "STAGES": 2, "PINGPONG": 0}).launches
    assert [a.box for a in launch.args[:3]] == [(64, 64), (176, 64), (176, 64)] and launch.block == (256, 1, 1)


def test_constraints_keep_shared_memory_and_registers_in_bounds():
    m = explain(load_problem("attention"))
    spec = family_of(m).build(m, "wgmma")
    two = {"STAGES": 2}
    assert _admits(spec, m, {"BLOCK_N": 176, **two})  # FlashAttention-3's non-causal tile: O 64 + S 88 + P 44
    assert _admits(spec, m, {"BLOCK_N": 192, "PINGPONG": 0, **two})  # 64 + 96 + 48 + 32 = 240: no spills
    assert not _admits(spec, m, {"BLOCK_N": 192, **two})  # + 8 for the turns: ptxas spills 8 bytes
    assert _admits(spec, m, {"CWG": 3, "BLOCK_N": 64, "PINGPONG": 0})  # 160 registers a consumer: 64 + 32 + 16 + 32
    assert not _admits(spec, m, {"CWG": 3, "BLOCK_N": 96, "PINGPONG": 0})  # 168 > 160 (ptxas spills 48 bytes)
    assert _admits(spec, m, {"STAGES": 3})  # 32 KB of Q + 3 x 64 KB of K/V = 224 KB + 1 KB
    assert not _admits(spec, m, {"STAGES": 3, "BLOCK_N": 144})  # past 227 KB
    assert not _admits(spec, m, {"PINGPONG": 1, "CWG": 1})  # turns need two consumers
    for cfg in ({"BLOCK_N": 128, "STAGES": 4}, {"CWG": 3, "BLOCK_N": 112}):
        r = _resolve(spec, m, cfg) if _admits(spec, m, cfg) else None
        assert r is None or r.launches[0].shared_mem <= MAX_SMEM_SM90


def test_head_dim_64_takes_three_consumers_and_fp32_is_refused(tmp_path):
    m = explain(_problem(tmp_path, (2, 4, 1000, 64), dtype="float16", causal=False))
    spec = family_of(m).build(m, "wgmma")
    assert spec.default_config() == WGMMA_DEFAULTS[64] == {"CWG": 3, "BLOCK_N": 128, "STAGES": 3, "PINGPONG": 0}
    assert _admits(spec, m, {})  # FlashAttention-3's 192 x 128 tile at head dim 64: O 32 + S 64 + P 32 + 32 = 160
    assert _admits(spec, m, {"CWG": 2, "BLOCK_N": 192}) and not _admits(spec, m, {"BLOCK_N": 144})
    m32 = explain(_problem(tmp_path, (2, 4, 100, 64), dtype="float32"))
    o = offer(m32, sizes={}, tensors=m32.tensor_facts())
    assert "wgmma" not in [v.variant for v in o.offered] and "bf16 or fp16" in o.why_not("wgmma")


SAMPLES = {  # per head dim: the default, then each tunable moved, the register-tightest tiles included
    128: [{}, {"BLOCK_N": 176, "STAGES": 2}, {"PINGPONG": 0}, {"CWG": 1, "PINGPONG": 0},
          {"CWG": 1, "BLOCK_N": 192, "STAGES": 2, "PINGPONG": 0}, {"STAGES": 2}, {"BLOCK_N": 192, "STAGES": 2, "PINGPONG": 0},
          {"CWG": 3, "BLOCK_N": 64, "PINGPONG": 0}, {"BLOCK_N": 64, "STAGES": 4}, {"BLOCK_N": 112, "PINGPONG": 0}],
    64: [{}, {"CWG": 2, "PINGPONG": 1}, {"CWG": 2, "BLOCK_N": 192}, {"CWG": 1, "BLOCK_N": 64},
         {"CWG": 3, "BLOCK_N": 96, "STAGES": 2}],
}


@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("dtype, causal", [("bfloat16", True), ("float16", False)])
def test_it_compiles_for_sm90a_without_spills_or_serialized_wgmma(tmp_path, d, dtype, causal):
    m = explain(_problem(tmp_path, (2, 4, 1000, d), dtype=dtype, causal=causal))
    spec = family_of(m).build(m, "wgmma")
    for cfg in SAMPLES[d] if dtype == "bfloat16" else SAMPLES[d][:2]:
        job = job_for(spec, _resolve(spec, m, cfg), "sm_90")
        assert job.arch == "sm_90a"
        got = compile_job(job, cache=None)
        info = got.info.worst()
        assert info.spill_stores == 0 and info.spill_loads == 0 and info.stack_bytes == 0, (cfg, info)
        assert "C7512" not in got.info.log and "serialized" not in got.info.log, (cfg, got.info.log[-500:])


def test_it_does_not_compile_for_a_gpu_without_wgmma(tmp_path):
    m = explain(_problem(tmp_path, (2, 4, 256, 128)))
    spec = family_of(m).build(m, "wgmma")
    with pytest.raises(CompileError):
        compile_job(job_for(spec, _resolve(spec, m), "sm_80"), cache=None)


def test_every_block_n_it_offers_has_its_wgmma_shape():
    assert WGMMA_TUNABLES["BLOCK_N"] == WGMMA_BLOCK_NS and all(n % 16 == 0 and n <= 256 for n in WGMMA_BLOCK_NS)
    m = explain(load_problem("attention"))
    src = family_of(m).build(m, "wgmma").source
    assert all(f"#if BLOCK_N == {n}\n" in src and f".m64n{n}k16." in src for n in WGMMA_BLOCK_NS)
