"""The 3xTF32 convolution (``tf32x3`` of the conv2d and conv_epi families, #19), CPU tier: the
conv2d_wide problem has teeth (plain TF32 and a two-term split fail it, three terms pass, kernels
that only work on N(0, 1) data fail it, fp32 stays well inside it), the template's gather and store
index algebra checked in Python, the specs (offered with three terms only, every admissible
configuration within the device's limits), NVRTC compiles for sm_90/sm_80, and the kernels' results
on the CPU emulator at small odd shapes against PyTorch.

The numerical models are emulations of the kernel's arithmetic (tests/agent/test_tf32.py's split:
tf32 products exact in float64, one rounding to fp32 per k8 step, a fresh accumulator per k tile)."""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import pytest
import torch

from kerngen.agent.playbook import family_of, PlaybookProposer, explain
from kerngen.agent.playbook.conv.build_tf32 import (CONV2D_IDEAS, CONV2D_SPEC_NAME, CONV_EPI_IDEAS, DEFAULTS, VARIANT,
                                                    smem_bytes)
from kerngen.agent.playbook.gemm.build_tf32 import TERMS_PLAIN, TERMS_SPLIT
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.conv.epi import CONV_EPI
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.playbook.render import MAX_SMEM, render
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.compare import compare
from kerngen.harness.spec import plan
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from kerngen.problems.registry import is_builtin
from tests.agent.family_checks import CONV_PROBLEM, problem_files
from tests.agent.spec_samples import sampled_plans
from tests.agent.test_tf32 import _fp16_split_product, _row_fixed_point_product, split
from tests.resources import kernelbench
from tests.emu.runner import emulate


def _build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)


KB = kernelbench()
needs_kb = pytest.mark.needs_kernelbench
SMALL = (2, 3, 48, 48)  # conv2d's geometry (k11 s4 p2, 96 channels) on a small input: M = 242, K = 363
FP32_REL_LIMIT = 1e-5  # the harness's ||out - ref|| / ||ref|| limit for fp32 outputs

# conv_epi problems (family_checks.CONV_PROBLEM, no init lines): conv constructor, forward args, body, inputs
CASES = {
    "conv2d_bias_relu": ("nn.Conv2d(3, 8, 3)", "x", "        return torch.relu(self.conv(x)) * 2.0",
                         "torch.rand(2, 3, 9, 11)"),
    "conv2d_odd": ("nn.Conv2d(7, 13, 3, stride=2, padding=1)", "x", "        return self.conv(x) - 0.5",
                   "torch.rand(2, 7, 37, 41)"),
    "conv2d_grouped_dilated_residual": ("nn.Conv2d(8, 16, (3, 5), stride=(2, 1), padding=(2, 3), dilation=(2, 1), "
                                        "groups=2)", "x, y", "        return torch.sigmoid(self.conv(x)) * y",
                                        "torch.rand(2, 8, 11, 13), torch.rand(2, 16, 6, 15)"),
    "conv1d_strided": ("nn.Conv1d(6, 20, 5, stride=3, padding=2, bias=False)", "x",
                       "        return torch.tanh(self.conv(x))", "torch.rand(3, 6, 50)"),
}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    return problem_files(tmp_path_factory.mktemp("conv_tf32"), CONV_PROBLEM, CASES, ("ctor", "args", "body", "inputs"),
                         init="")


def _suite(name: str = "conv2d", shape=None):
    p = load_problem(ProblemRef(source=name, shape=shape))
    return p, explain(p)


def _resolved(m, defaults=None, config=None):
    spec = family_of(m).build(m, VARIANT, dict(defaults or {}))
    return spec, plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=config)


# ----- conv2d_wide: the proof of teeth ----------------------------------------------------------
def _gemm_view(name: str, seed: int, shape: tuple[int, ...] = SMALL):
    """The problem's conv as the kernel's GEMM: A (M, K) im2col rows, B (K, OC), the bias, the reference."""
    p = load_problem(ProblemRef(source=name, shape=shape))
    model = p.build_model("cpu", seed)
    (x,) = p.make_inputs("cpu", seed)
    (ref,) = p.run_reference(model, [x])
    conv = model.conv
    cols = torch.nn.functional.unfold(x, conv.kernel_size, padding=conv.padding, stride=conv.stride)  # (N, K, L)
    n, k, l = cols.shape
    a = cols.transpose(1, 2).reshape(n * l, k).numpy()
    b = conv.weight.reshape(conv.weight.shape[0], k).T.numpy()
    return p, a, b, conv.bias.numpy(), ref


def _as_output(c: np.ndarray, bias: np.ndarray, ref: torch.Tensor) -> torch.Tensor:
    n, oc = ref.shape[:2]
    out = torch.from_numpy((c + bias[None, :]).astype(np.float32)).reshape(n, -1, oc).permute(0, 2, 1)
    return out.reshape(ref.shape)


def _split_model(a: np.ndarray, b: np.ndarray, terms: int, bk: int = 32) -> np.ndarray:
    """The kernel's arithmetic: K zero-padded to the k tile, per k8 step the terms' tf32 products
    (3: lo*hi, hi*lo, hi*hi; 2: hi*lo, hi*hi; 1: hi*hi) added to the accumulator with one rounding
    to fp32, a fresh accumulator per k tile added to the fp32 sum (FLUSH 1)."""
    kp = -(-a.shape[1] // bk) * bk
    a = np.pad(a, ((0, 0), (0, kp - a.shape[1])))
    b = np.pad(b, ((0, kp - b.shape[0]), (0, 0)))
    (ah, al), (bh, bl) = split(a), split(b)
    pairs = {3: [(al, bh), (ah, bl), (ah, bh)], 2: [(ah, bl), (ah, bh)], 1: [(ah, bh)]}[terms]
    total = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for t0 in range(0, kp, bk):
        acc = np.zeros_like(total)
        for k0 in range(t0, t0 + bk, 8):
            step = sum(x[:, k0:k0 + 8].astype(np.float64) @ y[k0:k0 + 8].astype(np.float64) for x, y in pairs)
            acc = (acc.astype(np.float64) + step).astype(np.float32)
        total = total + acc
    return total


def _check(p, out: torch.Tensor, ref: torch.Tensor):
    return compare(out, ref, atol=p.info.atol, rtol=p.info.rtol)


def test_conv2d_wide_is_a_builtin_the_conv2d_family_takes():
    assert is_builtin("conv2d_wide")
    p, m = _suite("conv2d_wide", SMALL)
    assert "dynamic range" in p.info.description and (p.info.atol, p.info.rtol) == (1e-4, 1e-4)
    assert m.family == "conv2d" and m.facts.weight == "conv.weight" and m.facts.bias == "conv.bias"
    assert VARIANT in [v.variant for v in offer(m, sizes={}, tensors=m.tensor_facts()).offered]
    model = p.build_model("cpu", 0)
    (x,) = p.make_inputs("cpu", 0)
    spread = x.abs().amax(dim=(0, 2, 3))  # the channels' scales: 10**-3, 1, 10**3
    assert float(spread[2] / spread[0]) > 1e5
    w = model.conv.weight.abs().amax(dim=(0, 2, 3))
    assert float(w[0] / w[2]) > 1e5  # cancelled in the weights (a buffer: the harness's noise leaves it)


@pytest.mark.parametrize("seed", [0, 1])
def test_plain_and_two_term_tf32_fail_conv2d_wide_and_3xtf32_passes(seed):
    p, a, b, bias, ref = _gemm_view("conv2d_wide", seed)
    for terms in (1, 2):
        bad = _check(p, _as_output(_split_model(a, b, terms), bias, ref), ref)
        assert not bad.ok and bad.rel_err > 10 * FP32_REL_LIMIT, (terms, bad.message)
    good = _check(p, _as_output(_split_model(a, b, TERMS_SPLIT), bias, ref), ref)
    assert good.ok and good.rel_err < FP32_REL_LIMIT / 10, good.message


@pytest.mark.parametrize("kernel", [_fp16_split_product, _row_fixed_point_product], ids=["fp16-split", "row-scale"])
def test_conv2d_wide_catches_kernels_that_pass_on_normal_data(kernel):
    p, a, b, bias, ref = _gemm_view("conv2d", 0)
    assert _check(p, _as_output(kernel(a, b), bias, ref), ref).ok
    p, a, b, bias, ref = _gemm_view("conv2d_wide", 0)
    assert not _check(p, _as_output(kernel(a, b), bias, ref), ref).ok


def test_correct_fp32_stays_well_inside_the_conv2d_wide_check():
    # a serial fp32 chain (every product and add rounded) against PyTorch's conv: far from the limit
    p, a, b, bias, ref = _gemm_view("conv2d_wide", 2, (8, *SMALL[1:]))  # 8 samples: some scaled near 1
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc += np.outer(a[:, k], b[k])
    out, r = _as_output(acc, bias, ref).double(), ref.double()
    assert float(((out - r).abs() / (p.info.atol + p.info.rtol * r.abs())).max()) < 0.1  # measured: ~0.01
    assert float(r.abs().max()) > 1.0  # the largest outputs are checked relatively, not by atol


# ----- the template's index algebra, mirrored -----------------------------------------------------
@pytest.mark.parametrize("bm,nt,bk", [(128, 192, 32), (64, 128, 16), (128, 256, 32), (256, 384, 16), (64, 64, 32)])
def test_the_gather_copies_every_element_once_and_conflict_free(bm, nt, bk):
    lda = bk + 8
    seen = []
    for tid in range(nt):  # load_tile: column kc = tid & 7 of every k8 group, rows tid >> 3 + i * nt / 8
        kc = tid & 7
        for r in range(tid >> 3, bm, nt // 8):
            seen += [(r, j * 8 + kc) for j in range(bk // 8)]
    assert sorted(seen) == [(r, k) for r in range(bm) for k in range(bk)]
    for warp in range(nt // 32):  # one copy instruction of a warp: 32 destinations in 32 banks
        for i, j in itertools.product(range(bm * 8 // nt), range(bk // 8)):
            words = [((tid >> 3) + i * (nt // 8)) * lda + j * 8 + (tid & 7) for tid in range(warp * 32, warp * 32 + 32)]
            assert sorted(w % 32 for w in words) == list(range(32))


@pytest.mark.parametrize("wm,wn", [(64, 32), (32, 48), (16, 96), (32, 16)])
def test_the_stores_write_each_output_of_the_block_once_from_its_fragment(wm, wn):
    bm, bn = 2 * wm, 2 * wn
    rng = np.random.default_rng(wm + wn)
    c = rng.standard_normal((bm, bn))  # the block's GEMM result
    out = np.full((bm, bn), np.nan)
    for warp in range((bm // wm) * (bn // wn)):
        warp_m, warp_n = warp // (bn // wn), warp % (bn // wn)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            r0, c0 = warp_m * wm + g, warp_n * wn + 2 * t
            for i, h, j, e in itertools.product(range(wm // 16), range(2), range(wn // 8), range(2)):
                row, col = i * 16 + h * 8, j * 8 + e  # PTX: c[2h + e] of tile (i, j) is (g + 8h, 2t + e)
                assert np.isnan(out[r0 + row, c0 + col])
                out[r0 + row, c0 + col] = c[warp_m * wm + i * 16 + g + 8 * h, warp_n * wn + j * 8 + 2 * t + e]
    assert np.array_equal(out, c)


def test_the_conv_runs_the_gemm_loop():
    loop = render("_tf32x3_mma.cuh.j2")  # nothing at the top level: the macros are imported
    assert "mma.sync" not in loop
    m = _suite()[1]
    conv = family_of(m).build(m, VARIANT).source
    gemm = _build(_matmul_match(), "tf32x3").source
    core = gemm[gemm.index("#pragma unroll\n  for (int s = 0; s < STAGES - 1; ++s)"):gemm.index("tf_wait<0>();")]
    assert len(core) > 2000 and core in conv and "#define TRANS_B 1" in conv


def _matmul_match():
    return explain(load_problem(ProblemRef(source="matmul", shape=(256, 256, 256))))


# ----- the specs ---------------------------------------------------------------------------------
def test_offered_for_the_suite_with_three_terms_and_plain_tf32_only_when_asked():
    p, m = _suite()
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in o.offered] == ["direct", "igemm", VARIANT, "wgmma", "wgmma_s2d"]  # sm_90: Hopper's too
    spec, r = _resolved(m)
    assert spec.name == CONV2D_SPEC_NAME and variant_of_spec(spec) == VARIANT
    assert spec.tunables["TERMS"] == [TERMS_SPLIT] and all(v == sorted(v) for v in spec.tunables.values())
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in spec.source and "cvt.rna.tf32.f32" in spec.source
    pack, main = r.launches
    assert r.config == dict(DEFAULTS, BM=128, BN=96, WM=64, WN=32)
    assert (r.defines["K_"], r.defines["KP"], r.defines["OCGP"]) == (363, 384, 96)
    assert main.grid == (-(-100 * 55 * 55 // 128), 1, 1) and main.block == (192, 1, 1)
    assert main.shared_mem == smem_bytes(r.config)
    assert [a.name for a in pack.args] == ["conv.weight", "wt", "ktab"]
    assert [a.name for a in main.args] == ["x", "wt", "ktab", "conv.bias", "out"]
    plain = family_of(m).build(m, VARIANT, {"TERMS": TERMS_PLAIN})
    assert plain.tunables["TERMS"] == [TERMS_PLAIN, TERMS_SPLIT] and plain.defaults["TERMS"] == TERMS_PLAIN
    with pytest.raises(Exception, match="constraint"):
        _resolved(m, {"TERMS": 2})


def test_every_admissible_config_fits_the_device():
    _, m = _suite()
    spec, _ = _resolved(m)
    names = list(spec.tunables)
    admitted = 0
    for combo in itertools.product(*(spec.tunables[n] for n in names)):
        cfg = dict(zip(names, combo))
        try:
            r = plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)
        except Exception:
            continue
        admitted += 1
        main = r.launches[1]
        assert main.shared_mem == smem_bytes(cfg) <= MAX_SMEM and main.block[0] % 32 == 0 and main.block[0] <= 1024
        assert 4 * (cfg["WM"] // 16) * (cfg["WN"] // 8) * (1 + cfg["FLUSH"]) <= 128
    assert admitted > 100


@pytest.mark.parametrize("name", sorted(CASES))
def test_offered_for_conv_epi_problems(problems, name):
    m = explain(problems[name])
    assert m.family == "conv_epi"
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert VARIANT in [v.variant for v in o.offered]
    spec, r = _resolved(m, o.get(VARIANT).defaults)
    assert spec.name == CONV_EPI.spec_name(VARIANT) and variant_of_spec(spec) == VARIANT
    assert r.launches[1].grid[2] == m.facts.G


@needs_kb
def test_not_offered_for_depthwise():
    m = explain(load_problem(str(KB / "level1/82_conv_depthwise_2D_square_input_square_kernel.py")))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert [v.variant for v in o.offered] == ["depthwise"] and "shape[1] >= 2" in o.why_not(VARIANT)


@needs_kb
@pytest.mark.parametrize("name, family", [("level1/50_conv_standard_2D__square_input__square_kernel.py", "conv2d"),
                                          ("level1/87_conv_pointwise_2D.py", "conv2d"),
                                          ("level2/54_Conv2d_Multiply_LeakyReLU_GELU.py", "conv_epi"),
                                          ("level1/67_conv_standard_1D.py", "conv_epi")])
def test_offered_at_the_kernelbench_files_own_size(name, family):
    m = explain(load_problem(str(KB / name)))
    o = offer(m, sizes={}, tensors=m.tensor_facts())
    assert m.family == family and VARIANT in [v.variant for v in o.offered]
    plan.resolve(o.get(VARIANT).spec, sizes={}, tensors=m.tensor_facts())


def test_ideas_never_ask_for_plain_tf32_and_start_the_search():
    for ideas, fam in ((CONV2D_IDEAS, "conv2d"), (CONV_EPI_IDEAS, "conv_epi")):
        assert [e.round0 for e in ideas].count(True) == 1 and ideas[0].round0
        assert all(e.variant == VARIANT and all("TERMS" not in b for b in e.branches) for e in ideas)
        assert all(e.after == frozenset({VARIANT}) for e in ideas[1:]), fam
    prop = PlaybookProposer(load_problem("conv2d"))
    assert "conv-tf32x3" in {e.id for e in prop._entries() if e.round0}


# ----- NVRTC --------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_defaults_compile_without_spills(problems, arch):
    for m in (_suite()[1], explain(problems["conv2d_grouped_dilated_residual"])):
        for defaults in ({}, {"TERMS": TERMS_PLAIN}):
            spec, r = _resolved(m, defaults)
            res = compile_job(job_for(spec, r, arch), cache=None).info.worst()
            assert res.spill_stores == 0 and res.spill_loads == 0 and 0 < res.registers <= 255, (defaults, res)


def test_sampled_configs_and_idea_branches_compile():
    _, m = _suite()
    spec, _ = _resolved(m)
    resolved = sampled_plans(spec, m.tensor_facts(), 3)
    assert len(resolved) == 3
    for r in resolved:
        assert compile_job(job_for(spec, r, "sm_90"), cache=None).info.worst().registers > 0
    seen = set()
    for e in CONV2D_IDEAS:
        for branch in e.branches:
            try:
                spec, r = _resolved(m, branch)
            except Exception:
                continue  # a branch this shape does not admit (64 x 64 warps need 64 | BN): the proposer skips it
            if spec.content_hash() not in seen:
                seen.add(spec.content_hash())
                res = compile_job(job_for(spec, r, "sm_90"), cache=None).info.worst()
                assert res.spill_stores == 0, (e.id, branch, res)
    assert len(seen) >= 3


# ----- results on the CPU emulator (tests/emu runs mma.sync, cvt and cp.async) ---------------------

ODD = (2, 3, 23, 19)  # conv2d's geometry on an input whose every tile is partial
SMALL_TILES = {"BM": 64, "WM": 32, "WN": 32, "BK": 16, "STAGES": 2, "FLUSH": 0}  # 4 warps, 23 k tiles, no flush
EMU_BUILTIN = [("conv2d", ODD, {}), ("conv2d", ODD, SMALL_TILES), ("conv2d_wide", SMALL, {})]


def _emulated(p, defaults: dict[str, int], variant: str = VARIANT,
              spec_of: Callable[[KernelSpec], KernelSpec] = lambda s: s) -> tuple[torch.Tensor, torch.Tensor]:
    """The offered ``variant`` kernel (its default, ``defaults`` on top; as ``spec_of`` changes it) on the emulator:
    (out, PyTorch's)."""
    m = explain(p)
    offered = offer(m, sizes={}, tensors=m.tensor_facts()).get(variant)
    spec = spec_of(family_of(m).build(m, variant, {**offered.defaults, **defaults}))
    model = p.build_model("cpu", 0)
    inputs = p.make_inputs("cpu", 0)
    (ref,) = p.run_reference(model, inputs)
    tensors = {k: v.contiguous() for k, v in p.bindings(model, inputs, [torch.full_like(ref, float("nan"))]).items()}
    emulate(spec, tensors, config=spec.default_config())
    return tensors["out"], ref


needs_emu = pytest.mark.needs_cxx


@needs_emu
@pytest.mark.parametrize("name,shape,defaults", EMU_BUILTIN, ids=["conv2d-odd", "conv2d-odd-small-tiles", "wide"])
def test_builtin_conv_matches_pytorch_on_the_emulator(name, shape, defaults):
    p = load_problem(ProblemRef(source=name, shape=shape))
    out, ref = _emulated(p, defaults)
    res = _check(p, out, ref)
    assert res.ok and res.rel_err < FP32_REL_LIMIT / 10, res.message


@needs_emu
@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_epi_matches_pytorch_on_the_emulator(problems, name):
    p = problems[name]
    out, ref = _emulated(p, {})
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@needs_emu
def test_plain_tf32_fails_conv2d_wide_on_the_emulator():
    # the demonstration that the check sees TF32: the one-term kernel, built on purpose
    p = load_problem(ProblemRef(source="conv2d_wide", shape=SMALL))
    out, ref = _emulated(p, {"TERMS": TERMS_PLAIN})
    res = _check(p, out, ref)
    assert not res.ok and res.rel_err > 10 * FP32_REL_LIMIT, res.message
