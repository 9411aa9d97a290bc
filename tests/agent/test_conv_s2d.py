"""The space-to-depth convolution on the Hopper GEMM core (``wgmma_s2d`` of conv2d, conv_epi and conv16; issue 35),
CPU tier: its plan on the suite's conv2d (both operands by TMA maps, the rewrite's geometry), who is refused and why,
its round-0 idea on Hopper only, NVRTC for sm_90a of sampled configurations with no spills and no wgmma warning, and
both pre-passes on the CPU emulator bit for bit against a PyTorch reference of the rewrite. The GPU tier:
test_gpu_conv_wgmma.py (``space_to_depth``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain, family_of
from kerngen.agent.playbook.conv.build_s2d import WPREP_KERNEL, XPREP_KERNEL
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.playbook.render import MAX_SMEM, render
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import limits_for
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.test_conv_wgmma import _compiles_clean, conv_problem
from tests.agent.test_gemm_wgmma import A100, H100, _ctx, _maps, _resolve, emulate, emulator_available, split

VARIANT = "wgmma_s2d"


def build(m, defaults=None):
    return family_of(m).build(m, VARIANT, defaults)


def test_the_suite_conv2d_plan():
    m = explain(load_problem("conv2d"))  # x (100, 3, 224, 224), 96 x 3 x 11 x 11, stride 4, padding 2
    spec = build(m)
    assert spec.name == "playbook-conv2d-wgmma-s2d" and spec.arch_specific and variant_of_spec(spec) == VARIANT
    # the halo (244 rows of the tile's taps) fits: HALO 1, the pipelined partial sums, 4 stages of B alone
    assert spec.default_config() == {"BN": 96, "WGM": 1, "CWG": 2, "BK": 32, "STAGES": 4, "GROUP_M": 8, "CTAS": 132,
                                     "FLUSH": 2, "TERMS": 3, "HALO": 1, "ROT": 1}
    r = _resolve(spec, m)
    # stride 4: 3 channels x 4 x 4 phases = 48 channels (one full slab of 32 fp32 and one of 16: 2 k steps), 3 x 3
    # taps; xs is 57 x 57 positions an image (55 + 3 - 1), each row of the output computed 57 wide
    geo = {k: r.defines[k] for k in ("KH2_", "KW2_", "PP_", "QQ_", "C2_", "CP_", "NSLAB_", "LASTKS_")}
    assert geo == dict(KH2_=3, KW2_=3, PP_=57, QQ_=57, C2_=48, CP_=48, NSLAB_=2, LASTKS_=2)
    xprep, wprep, main = r.launches
    assert [launch.kernel for launch in r.launches] == [XPREP_KERNEL, WPREP_KERNEL, "conv_s2d"]
    rows, krow = 100 * 57 * 57, 9 * 2 * 32
    assert xprep.grid == (-(-rows * 48 // 4 // 256), 1, 1) and xprep.block == (256, 1, 1)  # a thread 16 bytes
    assert [(s.name, s.size) for s in r.scratch] == [("xs", 2 * rows * 48), ("ws", 2 * 96 * krow)]
    units = 100 * -(-55 * 57 // 128)  # 25 tiles of 128 virtual positions an image, one of 96 channels
    assert main.grid == (min(units, 132), 1, 1) and main.block == (384, 1, 1)
    halo = 2 * 2 * -(-(128 + 2 * 57 + 2) // 64) * 64 * 128  # two slots, two planes, 64-row boxes of 128 bytes
    assert main.shared_mem == 1024 + halo + 4 * 2 * 96 * 32 * 4 + 16 * 4 + 32 <= MAX_SMEM
    assert _maps(main) == [("xs", (64, 32), False, (2, rows, 48)), ("ws", (96, 32), False, (2, 96, krow))]
    shifted = _resolve(spec, m, {"HALO": 0, "FLUSH": 1, "STAGES": 3}).launches[2]  # the boxes of the taps' rows
    assert shifted.shared_mem == 1024 + 3 * 2 * (128 + 96) * 32 * 4 + 48 <= MAX_SMEM
    assert _maps(shifted)[0] == ("xs", (128, 32), False, (2, rows, 48))
    assert [a.name for a in main.args if a.kind != "tensormap"] == ["conv.bias", "out"]
    for instr in ("wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32", "cp.async.bulk.tensor.3d",
                  "setmaxnreg.inc.sync.aligned", "cs_ksteps(w.kt0 + kt)"):
        assert instr in spec.source
    assert "cp.async.ca" not in spec.source  # no gather


@pytest.mark.parametrize("conv, shape, why", [
    ("nn.Conv2d(8, 32, 3, padding=1, groups=2)", (2, 8, 9, 9), "groups 1, dilation 1"),
    ("nn.Conv2d(8, 32, 3, padding=2, dilation=2)", (2, 8, 9, 9), "groups 1, dilation 1"),
])
def test_grouped_and_dilated_convolutions_are_refused_with_the_reason(tmp_path, conv, shape, why):
    m = explain(conv_problem(tmp_path, conv, shape, forward="torch.relu(self.conv(x))"))
    assert m.family == "conv_epi", m.message
    with pytest.raises(ValueError, match=why):
        build(m)
    off = offer(m, sizes={}, tensors=m.tensor_facts(), gpu=limits_for("sm_90"))
    assert why in off.why_not(VARIANT) and "wgmma" in [v.variant for v in off.offered]  # the gathered one takes it


def test_on_hopper_its_idea_is_in_round_0_and_elsewhere_it_is_not_offered():
    prop = PlaybookProposer(load_problem("conv2d"))
    first = prop.ideas(_ctx(prop.match, H100), None, 4)
    assert [prop._by_text[i.text].variant for i in first[:2]] == [VARIANT, "wgmma"]  # measured faster: first
    (branch, *_) = prop.implement(_ctx(prop.match, H100), None, first[0], 1)
    assert branch.spec.name == "playbook-conv2d-wgmma-s2d"
    fresh = PlaybookProposer(load_problem("conv2d"))
    assert all("wgmma" not in fresh._by_text[i.text].variant for i in fresh.ideas(_ctx(fresh.match, A100), None, 20))
    off = offer(prop.match, sizes={}, tensors=prop.match.tensor_facts(), gpu=limits_for("sm_80"))
    assert "a Hopper kernel (sm_90a: wgmma, TMA), not offered for sm_80" in off.why_not(VARIANT)


COMPILED = [  # (problem, configurations): fp32 (3xTF32 and one term), bf16, one consumer (all k steps issued), the
    # halo with FLUSH 2 (the default) and 1, the shifted boxes
    ("conv2d", [{}, {"FLUSH": 1}, {"HALO": 0, "FLUSH": 1, "STAGES": 3}, {"WGM": 2, "BN": 64, "STAGES": 2, "FLUSH": 1},
                {"CWG": 1, "WGM": 2, "FLUSH": 1}]),
    ("conv2d@bfloat16", [{}, {"HALO": 0}, {"BN": 128, "STAGES": 5}, {"CWG": 1, "WGM": 2, "BN": 192}]),
]


@pytest.mark.parametrize("source, asked, want", [
    ("conv2d", {}, {"HALO": 1, "FLUSH": 2, "STAGES": 4}),
    ("conv2d", {"STAGES": 3}, {"HALO": 1, "FLUSH": 2, "STAGES": 3}),  # what is asked stays
    ("conv2d", {"HALO": 0}, {"HALO": 0, "FLUSH": 1, "STAGES": 3}),  # FLUSH 2 only with the halo
    ("conv2d", {"CWG": 1, "WGM": 2}, {"HALO": 1, "FLUSH": 1, "STAGES": 4}),  # and two consumers
    ("conv2d@bfloat16", {}, {"HALO": 0, "FLUSH": 0, "STAGES": 4}),  # 16-bit: measured faster without the halo
    ("conv2d@bfloat16", {"HALO": 1}, {"HALO": 1, "FLUSH": 0, "STAGES": 4}),  # and no partial sums
])
def test_the_halo_and_flush_2_defaults(source, asked, want):
    name, _, dtype = source.partition("@")
    m = explain(load_problem(ProblemRef(source=name, dtype=dtype or None)))
    got = build(m, asked).default_config()
    assert {k: got[k] for k in want} == want


def test_where_the_halo_does_not_fit_the_default_is_the_shifted_boxes(tmp_path):
    # rows 130 + 2 wide: a tile's taps read 128 + 2 * 132 + 2 rows, two slots of them are 224 KB before the ring
    m = explain(conv_problem(tmp_path, "nn.Conv2d(8, 32, 3, padding=1)", (2, 8, 130, 130),
                             forward="torch.relu(self.conv(x))"))
    spec = build(m)
    assert {k: spec.default_config()[k] for k in ("HALO", "FLUSH", "STAGES")} == {"HALO": 0, "FLUSH": 1, "STAGES": 3}
    _resolve(spec, m, {})
    with pytest.raises(Exception, match="constraint"):
        _resolve(spec, m, {"HALO": 1, "FLUSH": 1})


def test_flush_2_is_refused_where_ptxas_serialises_it():
    m = explain(load_problem("conv2d"))
    spec = build(m)
    for cfg in ({"HALO": 0}, {"CWG": 1, "FLUSH": 2}):
        with pytest.raises(Exception, match="FLUSH != 2"):
            _resolve(spec, m, cfg)


@pytest.mark.parametrize("source, configs", COMPILED, ids=[c[0] for c in COMPILED])
def test_it_compiles_for_sm90a_without_spills_or_wgmma_warnings(source, configs):
    name, _, dtype = source.partition("@")
    m = explain(load_problem(ProblemRef(source=name, dtype=dtype or None)))
    for cfg in configs:
        _compiles_clean(build(m), m, cfg)
    if not dtype:
        _compiles_clean(build(m, {"TERMS": 1}), m, {})


# ----- the pre-passes on the CPU emulator ---------------------------------------------------------------------------
def _reference(x: torch.Tensor, w: torch.Tensor, s: tuple[int, int], p: tuple[int, int], o: tuple[int, int],
               cp: int, swe: int) -> tuple[torch.Tensor, torch.Tensor]:
    """xs [N][PP][QQ][CP] and ws [OC][KH2 KW2 NSLAB SWE] as the template's header defines them, from PyTorch ops."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    kh2, kw2 = -(-kh // s[0]), -(-kw // s[1])
    pp, qq = o[0] + kh2 - 1, o[1] + kw2 - 1
    xp = torch.nn.functional.pad(x, (p[1], qq * s[1] - wd - p[1], p[0], pp * s[0] - h - p[0]))  # may crop
    xs = xp.view(n, c, pp, s[0], qq, s[1]).permute(0, 2, 4, 1, 3, 5).reshape(n, pp, qq, c * s[0] * s[1])
    xs = torch.nn.functional.pad(xs, (0, cp - c * s[0] * s[1]))
    wp = torch.nn.functional.pad(w, (0, kw2 * s[1] - kw, 0, kh2 * s[0] - kh))
    c2 = c * s[0] * s[1]
    ws = wp.view(oc, c, kh2, s[0], kw2, s[1]).permute(0, 2, 4, 1, 3, 5).reshape(oc, kh2 * kw2, c2)
    ws = torch.nn.functional.pad(ws, (0, -(-c2 // swe) * swe - c2)).reshape(oc, -1)
    return xs, ws


@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
@pytest.mark.parametrize("mode, c, hw, k, s, p", [
    ("tf32x3", 3, (23, 21), (11, 11), (4, 4), (2, 2)),  # the suite's geometry, smaller
    ("bf16", 5, (13, 11), (5, 4), (3, 2), (1, 2)),  # K no multiple of the stride, odd padding
    ("tf32", 9, (7, 6), (3, 3), (1, 1), (1, 1)),  # stride 1: xs is x channels-last, spatially padded
    ("tf32x3", 40, (5, 7), (3, 3), (2, 2), (0, 1)),  # 160 channels: 5 slabs a tap
])
def test_the_pre_passes_on_the_cpu_emulator(mode, c, hw, k, s, p):
    n, oc = 2, 7
    esz = 2 if mode == "bf16" else 4
    swe = 128 // esz
    o = tuple((hw[i] + 2 * p[i] - k[i]) // s[i] + 1 for i in range(2))
    kh2, kw2 = -(-k[0] // s[0]), -(-k[1] // s[1])
    pp, qq, c2 = o[0] + kh2 - 1, o[1] + kw2 - 1, c * s[0] * s[1]
    cp, nslab = -(-c2 // (16 // esz)) * (16 // esz), -(-c2 // swe)
    planes = 2 if mode == "tf32x3" else 1
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    x, w = torch.randn(n, c, *hw).to(dtype), torch.randn(oc, c, *k).to(dtype)
    xs = torch.full((planes * n * pp * qq * cp,), float("nan"), dtype=dtype)
    ws = torch.full((planes * oc * kh2 * kw2 * nslab * swe,), float("nan"), dtype=dtype)
    src = f"typedef {'unsigned short' if esz == 2 else 'float'} gw_op;\n" + render(
        "_conv_s2d_prep.cuh.j2", mode=mode, xprep_kernel=XPREP_KERNEL, wprep_kernel=WPREP_KERNEL)
    defines = dict(N_=n, C_=c, H_=hw[0], W_=hw[1], OC_=oc, KH_=k[0], KW_=k[1], SH_=s[0], SW_=s[1], PH_=p[0], PW_=p[1],
                   KH2_=kh2, KW2_=kw2, PP_=pp, QQ_=qq, C2_=c2, CP_=cp, NSLAB_=nslab, GW_SWE=swe)
    spec = KernelSpec(source=src, defines=defines, steps=[
        dict(kernel=XPREP_KERNEL, grid=[-(-n * pp * qq * cp // (16 // esz) // 256)], block=[256],
             args=[{"name": "x"}, {"name": "xs"}]),  # a thread per 16 bytes of c'
        dict(kernel=WPREP_KERNEL, grid=[-(-oc * kh2 * kw2 * nslab * swe // 256)], block=[256],
             args=[{"name": "w"}, {"name": "ws"}])])
    emulate(spec, {"x": x, "xs": xs, "w": w, "ws": ws})
    want_x, want_w = _reference(x.float(), w.float(), s, p, o, cp, swe)
    got_x, got_w = xs.float().view(planes, n, pp, qq, cp).numpy(), ws.float().view(planes, oc, -1).numpy()
    for got, want in ((got_x, want_x.numpy()), (got_w, want_w.numpy())):
        if mode == "bf16":
            assert np.array_equal(got[0], want)
            continue
        big, small = split(want)
        assert np.array_equal(got[0], big) and (planes == 1 or np.array_equal(got[1], small))
