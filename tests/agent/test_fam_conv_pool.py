"""conv_relu_maxpool's tensor-core variants (issue 34), CPU tier: ``wgmma_pool`` (sm_90a) and ``tf32x3_pool`` run
conv_epi's wgmma / 3xTF32 convolution with the ReLU fused into a scratch buffer, then the pool family's window kernel.
Offered after ``fused`` for the suite problem, its KernelBench-format copy and the VGG-style model's regions; their
joined plans, the scratch limit, NVRTC for sm_90a / sm_80, the round-0 ideas, and the 3xTF32 one on the CPU emulator
against PyTorch (a wrong intermediate fails). The GPU tier: test_gpu_fam_conv_pool.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain, family_of
from kerngen.agent.playbook.conv.build_conv_pool import MAX_CONV_SCRATCH
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec import plan
from kerngen.harness.tune.admissible import limits_for
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.test_fam_conv_tf32 import _emulated as emulated
from tests.agent.test_gemm_wgmma import A100, H100, _ctx
from tests.emu.runner import EmuError

ROOT = Path(__file__).parents[2]
VGG = ROOT / "problems" / "models" / "vgg_stack.py"
KB_COPY = Path(__file__).parents[1] / "data" / "playbook" / "suite_conv_relu_maxpool.py"
NEW = ("wgmma_pool", "tf32x3_pool")
SMALL = (2, 3, 12, 10)  # the suite's conv (64 channels, k3 p1) on a small input: partial tiles everywhere


def _resolve(spec, m, cfg=None):
    return plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)


# ----- who gets them ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["conv_relu_maxpool", str(KB_COPY)])
def test_offered_after_fused_for_the_suite_problem_and_its_kernelbench_copy(source):
    prop = PlaybookProposer(load_problem(source))
    assert prop.match.family == "conv_relu_maxpool"
    assert [v.variant for v in prop.offer.offered] == ["fused", *NEW]  # fused stays the default
    for vo in prop.offer.offered[1:]:
        spec = vo.spec
        assert spec.name == f"playbook-conv-relu-maxpool-{vo.variant.replace('_', '-')}"
        assert variant_of_spec(spec) == vo.variant and spec.origin.family == "conv_relu_maxpool"
        assert spec.arch_specific == (vo.variant == "wgmma_pool")


def test_the_vgg_models_pool_regions_offer_them():
    mp = plan_model(load_problem(str(VGG)))
    crp = [r for r in mp.regions if r.family == "conv_relu_maxpool"]
    assert [r.region.index for r in crp] == [1, 3]
    for r in crp:
        assert r.offered == ("fused", *NEW) and r.variant == "fused"
    chosen = plan_model(load_problem(str(VGG)), variants={1: "wgmma_pool", 3: "tf32x3_pool"})
    steps = [s for s in chosen.plan.steps if getattr(s, "variant", "")]
    assert [s.variant for s in steps] == ["igemm", "wgmma_pool", "igemm", "tf32x3_pool"]


def test_wgmma_pool_is_hopper_only_and_tf32x3_pool_is_not():
    m = explain(load_problem("conv_relu_maxpool"))
    off = offer(m, sizes={}, tensors=m.tensor_facts(), gpu=limits_for("sm_80"))
    assert "a Hopper kernel (sm_90a: wgmma, TMA), not offered for sm_80" in off.why_not("wgmma_pool")
    assert [v.variant for v in off.offered] == ["fused", "tf32x3_pool"]


def test_a_conv_output_past_the_scratch_limit_is_refused_with_its_reason():
    m = explain(load_problem(ProblemRef(source="conv_relu_maxpool", shape=(1024, 3, 256, 256))))
    assert 1024 * 64 * 256 * 256 > MAX_CONV_SCRATCH
    off = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in off.offered] == ["fused"]
    for v in NEW:
        assert f"<= {MAX_CONV_SCRATCH}" in off.why_not(v), off.why_not(v)


def test_the_relu_pool_order_the_variants_take(tmp_path):
    # relu after the pool is the same function, but not the graph these variants cut: refused, with the reason
    src = KB_COPY.read_text().replace("self.pool(F.relu(self.conv(x)))", "F.relu(self.pool(self.conv(x)))")
    assert src != KB_COPY.read_text()
    path = tmp_path / "pool_then_relu.py"
    path.write_text(src)
    prop = PlaybookProposer(load_problem(str(path)))
    assert prop.match.family == "conv_relu_maxpool" and [v.variant for v in prop.offer.offered] == ["fused"]
    assert "max_pool2d(relu(conv2d(x))) in this order only" in prop.offer.why_not("tf32x3_pool")


# ----- plans ----------------------------------------------------------------------------------------------------
def test_the_joined_plans_run_the_conv_into_scratch_then_the_pool():
    m = explain(load_problem("conv_relu_maxpool"))  # x (128, 3, 32, 32) -> conv 64 -> (128, 64, 32, 32) -> pool 2
    fam = family_of(m)
    wg, tf = (fam.build(m, v) for v in NEW)
    r = _resolve(wg, m)
    assert [launch.kernel for launch in r.launches] == ["r0_conv_wgmma_xprep", "r0_conv_wgmma_wprep", "r0_conv_wgmma",
                                                        "r1_max_pool2d"]
    assert ("r0_out", 128 * 64 * 32 * 32) in [(s.name, s.size) for s in r.scratch]
    main, pool = r.launches[2], r.launches[3]
    assert "r0_out" in [a.name for a in main.args] and "out" not in [a.name for a in main.args]
    assert [a.name for a in pool.args] == ["r0_out", "out"]
    # fp32 accuracy kept: 3xTF32 with the per-k-tile flush, plain TF32 never offered for a true-fp32 problem
    assert wg.tunables["r0_TERMS"] == [3] and wg.tunables["r0_FLUSH"] == [1] and wg.arch_specific
    assert "relu" in wg.description and "max (NaN-propagating) pooling" in wg.description
    rt = _resolve(tf, m)
    assert rt.launches[-1].kernel == "r1_max_pool2d" and rt.launches[-1].args[0].name == "r0_out"
    assert tf.tunables["r0_TERMS"] == [3] and not tf.arch_specific


def test_tf32_precision_reaches_the_conv():
    p = load_problem("conv_relu_maxpool")
    m = explain(p)
    m.precision = "tf32"
    spec = family_of(m).build(m, "wgmma_pool")
    assert 1 in spec.tunables["r0_TERMS"]


@pytest.mark.parametrize("variant,arch", [("wgmma_pool", "sm_90"), ("tf32x3_pool", "sm_80")])
def test_defaults_compile_with_nvrtc(variant, arch):
    m = explain(load_problem("conv_relu_maxpool"))
    spec = family_of(m).build(m, variant)
    job = job_for(spec, _resolve(spec, m), arch)
    assert job.arch == ("sm_90a" if variant == "wgmma_pool" else "sm_80")
    got = compile_job(job, cache=None)
    assert set(got.info.kernels) >= {"r1_max_pool2d"}
    for name, res in got.info.kernels.items():
        assert res.spill_stores == 0 and res.spill_loads == 0, (name, res)


# ----- ideas ----------------------------------------------------------------------------------------------------
def test_round0_starts_with_wgmma_pool_on_hopper_and_leaves_it_out_elsewhere():
    prop = PlaybookProposer(load_problem("conv_relu_maxpool"))
    (first,) = prop.ideas(_ctx(prop.match, H100), None, 1)
    (branch, *_) = prop.implement(_ctx(prop.match, H100), None, first, 1)
    assert variant_of_spec(branch.spec) == "wgmma_pool"
    fresh = PlaybookProposer(load_problem("conv_relu_maxpool"))
    ideas = fresh.ideas(_ctx(fresh.match, A100), None, 20)
    variants = [fresh._by_text[i.text].variant for i in ideas]
    assert "wgmma_pool" not in variants and "tf32x3_pool" in variants and "fused" in variants


# ----- on the CPU emulator --------------------------------------------------------------------------------------
def _emulated(spec_of=lambda s: s):
    return emulated(load_problem(ProblemRef(source="conv_relu_maxpool", shape=SMALL)), {}, "tf32x3_pool", spec_of)


@pytest.mark.needs_cxx
def test_tf32x3_pool_matches_pytorch_on_the_emulator():
    out, ref = _emulated()
    assert ref.shape == (2, 64, 6, 5) and (ref > 0).any()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.needs_cxx
def test_a_wrong_intermediate_fails_on_the_emulator():
    def poisoned(spec):
        data = spec.model_dump()
        # the pool reads the conv's packed weights (another scratch buffer) instead of the conv's output
        for step in data["steps"]:
            if step.get("kernel", "").startswith("r1_"):
                step["args"] = [{"name": "r0_wt"} if a.get("name") == "r0_out" else a for a in step["args"]]
        wrong = type(spec).model_validate(data)
        assert wrong.steps != spec.steps
        return wrong

    try:
        out, ref = _emulated(poisoned)
    except EmuError:
        return  # reading past the wrong buffer's end is a failure too
    assert not torch.allclose(out, ref, atol=1e-4, rtol=1e-4)
