"""The Hopper GEMM core under the other contractions (issue 35), CPU tier: the ``wgmma`` variants of conv2d, conv_epi,
conv_tail and conv_nd (fp32 as 3xTF32; conv_nd: 3-D and stride-1 transposed convolutions), of the conv16 family
(conv_epi's convolutions in bf16/fp16) and gemm_rows' ``wgmma_*``
(the core's GEMM, then the row kernel): offered on sm_90 only with their idea first in round 0, their plans (pre-passes,
scratch, the weights' TMA map, the copy width VEC), the constraints on shared memory and registers, NVRTC for sm_90a
of sampled configurations with no spills and no wgmma warning, and the convolution's pre-passes on the CPU emulator
against a PyTorch reference of the layouts. The GPU tier: test_gpu_conv_wgmma.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain, family_of
from kerngen.agent.playbook.conv.build_wgmma import WPREP_KERNEL, XPREP_KERNEL, vec_default
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.playbook.render import MAX_SMEM, render
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import admissible, limits_for
from kerngen.problems.dtype_copy import dtype_copy, dtype_copy_name
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.test_gemm_wgmma import A100, H100, _admits, _ctx, _maps, _resolve, emulate, emulator_available, split
from tests.agent.family_checks import forward_problem
from tests.resources import kernelbench

KB = kernelbench()
needs_kb = pytest.mark.skipif(not (KB / "level2").is_dir(), reason="no KernelBench files")


def build(m, variant="wgmma", defaults=None):
    return family_of(m).build(m, variant, defaults)


def kb_problem(tmp_path, name: str, dtype: str = "float32"):
    """A KernelBench file, or its copy in ``dtype`` as ``kerngen problems --to-dtype`` writes it."""
    path = KB / name
    if dtype != "float32":
        path = tmp_path / dtype_copy_name(KB / name, dtype)
        path.write_text(dtype_copy(KB / name, dtype))
    return load_problem(str(path))


def conv_problem(tmp_path, conv: str, x: tuple[int, ...], dtype: str = "float32", forward: str = "self.conv(x)"):
    return forward_problem(tmp_path, forward, {"x": x}, init=f"self.conv = {conv}", dtype=dtype, make="randn")


# ----- who gets it --------------------------------------------------------------------------------------------
CASES = [  # (problem, family, spec name, variant)
    ("conv2d", "conv2d", "playbook-conv2d-wgmma-s2d", "wgmma_s2d"),  # space-to-depth first (test_conv_s2d.py)
    ("level1/54_conv_standard_3D__square_input__square_kernel.py", "conv_nd", "playbook-conv-nd-wgmma", "wgmma"),
    ("level2/17_Conv2d_InstanceNorm_Divide.py", "conv_tail", "playbook-conv-tail-wgmma", "wgmma"),
    ("level2/1_Conv2D_ReLU_BiasAdd.py", "conv_epi", "playbook-conv-epi-wgmma_s2d", "wgmma_s2d"),
    ("level2/1_Conv2D_ReLU_BiasAdd.py@bfloat16", "conv16", "playbook-conv16-wgmma-s2d", "wgmma_s2d"),
    ("level2/99_Matmul_GELU_Softmax.py", "gemm_rows", "playbook-gemm-rows-wgmma-streamed", "wgmma_streamed"),
]


@needs_kb
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_on_hopper_its_idea_comes_first_and_elsewhere_it_is_not_offered(tmp_path, case):
    source, family, name, variant = case
    file, _, dtype = source.partition("@")

    def problem():
        return load_problem(ProblemRef(source=file)) if "/" not in file else kb_problem(tmp_path, file, dtype or
                                                                                        "float32")
    prop = PlaybookProposer(problem())
    assert prop.match is not None and prop.match.family == family
    (first,) = prop.ideas(_ctx(prop.match, H100), None, 1)
    (branch, *_) = prop.implement(_ctx(prop.match, H100), None, first, 1)
    assert branch.spec.name == name and branch.spec.arch_specific and variant_of_spec(branch.spec) == variant
    fresh = PlaybookProposer(problem())
    ideas = fresh.ideas(_ctx(fresh.match, A100), None, 20)
    assert all("wgmma" not in fresh._by_text[i.text].variant for i in ideas)
    off = offer(prop.match, sizes={}, tensors=prop.match.tensor_facts(), gpu=limits_for("sm_80"))
    assert "a Hopper kernel (sm_90a: wgmma, TMA), not offered for sm_80" in off.why_not(variant)
    if family == "conv16":  # nothing else serves 16-bit convolutions: not offered off Hopper, and why
        assert not off.offered and "not offered for sm_80" in off.reason


def test_16bit_convolutions_are_the_conv16_familys(tmp_path):
    m = explain(load_problem(ProblemRef(source="conv2d", dtype="bfloat16")))
    assert m.family == "conv16" and m.facts.dtype == "bfloat16"
    m16 = explain(conv_problem(tmp_path, "nn.Conv1d(32, 64, 5, padding=2)", (2, 32, 50), "float16",
                               "torch.relu(self.conv(x)) * 2"))
    assert m16.family == "conv16" and "m64n64k16.f32.f16.f16" in build(m16).source
    assert explain(load_problem(ProblemRef(source="conv2d"))).family == "conv2d"  # fp32 stays where it was


# ----- plans ----------------------------------------------------------------------------------------------------
def test_vec_trades_copies_against_channel_padding():
    # 3 fp32 channels: 16-byte copies with a fourth of zeros (measured 1.6x faster than 4-byte copies on the suite conv2d)
    assert vec_default(3, 4) == 4 and vec_default(20, 4) == 4
    assert vec_default(64, 4) == 4 and vec_default(64, 2) == 8  # 16-byte copies
    assert vec_default(6, 4) == 2 and vec_default(9, 4) == 2 and vec_default(7, 4) == 4 and vec_default(3, 2) == 4 and vec_default(30, 2) == 8


def test_the_suite_conv2d_plan():
    m = explain(load_problem("conv2d"))  # x (100, 3, 224, 224), 96 x 3 x 11 x 11, stride 4, padding 2
    spec = build(m)
    assert spec.default_config() == {"BN": 96, "WGM": 1, "CWG": 2, "BK": 32, "STAGES": 3, "GROUP_M": 8, "CTAS": 132,
                                     "FLUSH": 1, "TERMS": 3, "VEC": 4}
    r = _resolve(spec, m)
    xprep, wprep, main = r.launches
    assert [launch.kernel for launch in r.launches] == [XPREP_KERNEL, WPREP_KERNEL, "conv_wgmma"]
    # 3 channels a position padded to 4 (VEC 4): the flat pre-pass, one thread per element of the first plane
    assert xprep.grid == (100 * 224 * 224 * 4 // 256, 1, 1) and xprep.block == (256, 1, 1)
    k = 11 * 11 * 4  # CGP 4: K = 484, a multiple of 4 already (16 bytes)
    assert [(s.name, s.size) for s in r.scratch] == [("xs", 2 * 100 * 224 * 224 * 4), ("ws", 2 * 96 * k)]
    assert r.defines["KR"] == k and r.defines["KPAD"] == k and r.defines["CGP"] == 4
    assert main.grid == (132, 1, 1) and main.block == (384, 1, 1)
    assert main.shared_mem == 1024 + 3 * 2 * (128 + 96) * 32 * 4 + 48
    assert _maps(main) == [("ws", (96, 32), False, (2, 96, k))]
    assert [a.name for a in main.args if a.kind != "tensormap"] == ["xs", "conv.bias", "out"]
    for instr in ("wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32", "cp.async.ca.shared.global",
                  "fence.proxy.async.shared::cta", "cp.async.bulk.tensor.3d", "setmaxnreg.inc.sync.aligned"):
        assert instr in spec.source
    assert _admits(spec, m, {"VEC": 1}) and _resolve(spec, m, {"VEC": 1}).defines["KPAD"] == 364  # 363 padded


@needs_kb
def test_conv_epi_groups_dilation_1d_and_bf16_plans(tmp_path):
    m = explain(kb_problem(tmp_path, "level2/1_Conv2D_ReLU_BiasAdd.py"))  # 64 -> 128 channels, 3 x 3, + bias
    r = _resolve(build(m), m)
    assert r.launches[0].grid == (128 * 128 // 32, 64 // 32, 128) and r.launches[0].block == (32, 8, 1)  # tiles
    assert "ep0[ch]" in build(m).source and r.launches[2].args[-1].name == "bias"  # the epilogue's tensor last
    g = explain(conv_problem(tmp_path, "nn.Conv2d(6, 36, 3, stride=2, padding=2, dilation=2, groups=2)",
                             (2, 6, 19, 23)))
    assert g.family == "conv_epi"
    rg = _resolve(build(g), g)
    assert rg.defines["CGP"] == 4 and rg.defines["KPAD"] == 36  # 3 channels a group padded to 4 (VEC 4): K 36
    assert _maps(rg.launches[2]) == [("ws", (64, 32), False, (2 * 2, 18, 36))]  # plane x group outer
    r1 = _resolve(build(g), g, {"VEC": 1})
    assert r1.defines["CGP"] == 3 and r1.defines["KPAD"] == 28  # VEC 1: K 27 padded to 28 (16 bytes)
    one = explain(conv_problem(tmp_path, "nn.Conv1d(32, 64, 5, padding=2)", (2, 32, 50)))
    assert one.family == "conv_epi" and _resolve(build(one), one).defines["H_"] == 1
    bf = explain(kb_problem(tmp_path, "level2/1_Conv2D_ReLU_BiasAdd.py", "bfloat16"))
    spec = build(bf)
    rb = _resolve(spec, bf)
    assert spec.default_config()["VEC"] == 8 and spec.tunables["FLUSH"] == [0] and spec.tunables["BK"] == [64, 128]
    assert [(s.name, s.dtype) for s in rb.scratch] == [("xs", "bfloat16"), ("ws", "bfloat16")]
    assert "m64n128k16.f32.bf16.bf16" in spec.source and "cp.async.cg.shared.global" in spec.source
    depthwise = explain(conv_problem(tmp_path, "nn.Conv2d(32, 32, 3, groups=32)", (2, 32, 20, 20)))
    assert not _admits(build(depthwise), depthwise, {})  # one channel a group: the depthwise kernel's


def test_conv_nd_3d_and_stride_1_transposed(tmp_path):
    m = explain(conv_problem(tmp_path, "nn.Conv3d(6, 20, 3, stride=(1, 2, 2), padding=1, dilation=(2, 1, 1))",
                             (2, 6, 9, 11, 13), forward="torch.tanh(self.conv(x))"))
    assert m.family == "conv_nd"
    spec = build(m)
    r = _resolve(spec, m)
    assert spec.name == "playbook-conv-nd-wgmma" and "CW_KVOL - 1 - rs" not in spec.source
    assert (r.defines["D_"], r.defines["KD_"], r.defines["DD_"], r.defines["OD_"], r.defines["KR"]) == (9, 3, 2, 7, 27 * 6)
    # K 162 -> 164; 6 k tiles of 32 for 5 output tiles: split in 2 slices of 3 (fp32 partials of the 2 x 20 x 7 x 6 x 7)
    assert [(s.name, s.size) for s in r.scratch] == [("xs", 2 * 2 * 9 * 11 * 13 * 6), ("ws", 2 * 20 * 164),
                                                    ("partials", 2 * 2 * 20 * 7 * 6 * 7)]
    _compiles_clean(spec, m, {})
    t = explain(conv_problem(tmp_path, "nn.ConvTranspose2d(8, 48, (3, 5), padding=(1, 2), dilation=(2, 1), groups=2)",
                             (2, 8, 13, 17), forward="self.conv(x) * 2"))
    spec = build(t)
    rt = _resolve(spec, t)
    # the convolution of the flipped weights: padding d*(k-1)-p, output (i-1) + d*(k-1) - 2p + 1
    assert "CW_KVOL - 1 - rs" in spec.source and (rt.defines["PH_"], rt.defines["PW_"]) == (3, 2)
    assert (rt.defines["OH_"], rt.defines["OW_"], rt.defines["OCG_"]) == (15, 17, 24)
    assert _maps(rt.launches[2]) == [("ws", (64, 32), False, (2 * 2, 24, 60))]  # K 15 taps x 4 channels
    _compiles_clean(spec, t, {"VEC": 2})
    strided = explain(conv_problem(tmp_path, "nn.ConvTranspose2d(8, 48, 3, stride=2)", (2, 8, 13, 17)))
    off = offer(strided, sizes={}, tensors=strided.tensor_facts(), gpu=limits_for("sm_90"))
    assert "output phases are the tf32x3 variant's" in off.why_not("wgmma")


def test_constraints_bound_shared_memory_and_registers():
    m = explain(load_problem("conv2d"))
    spec = build(m)
    assert not _admits(spec, m, {"BN": 256})  # FLUSH: 2 x 128 accumulators
    assert not _admits(spec, m, {"BN": 128, "STAGES": 4})  # 4 x 64 KB > 227 KB
    counted = admissible(spec, sizes={}, tensors=m.tensor_facts(), gpu=limits_for("sm_90"))
    assert counted.count > 100
    for cfg in counted.configs:
        full = spec.full_config(cfg)
        assert 1024 + full["STAGES"] * 2 * (64 * full["WGM"] * full["CWG"] + full["BN"]) * full["BK"] * 4 + \
            16 * full["STAGES"] <= MAX_SMEM
        assert full["WGM"] * full["BN"] // 2 * 2 + 40 <= (232 if full["CWG"] == 2 else 255)


# ----- NVRTC for sm_90a -------------------------------------------------------------------------------------------
def _compiles_clean(spec, m, cfg: dict) -> None:
    job = job_for(spec, _resolve(spec, m, cfg), "sm_90")
    assert job.arch == "sm_90a"
    got = compile_job(job, cache=None)
    for name, res in got.info.kernels.items():
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_bytes == 0, (cfg, name, res)
    for warning in ("C7510", "C7512", "C7515", "C7517", "serialized", "warpgroup.wait is injected"):
        assert warning not in got.info.log, (cfg, got.info.log[-800:])


COMPILED = {  # problem -> sampled configurations: defaults, each knob moved, the register-tightest ones
    "conv2d": [{}, {"VEC": 4}, {"VEC": 2, "BN": 64, "WGM": 2, "STAGES": 2}, {"CWG": 1, "BN": 64, "WGM": 2},
               {"BK": 64, "STAGES": 2, "BN": 64}, {"TERMS": 1}],
    "conv2d@bfloat16": [{}, {"BN": 256, "VEC": 2}, {"CWG": 1, "WGM": 2, "BN": 192, "STAGES": 3},
                        {"BK": 128, "STAGES": 2, "VEC": 8}],
    "conv1d@float16": [{}, {"WGM": 2, "BN": 64}],
}


@pytest.mark.parametrize("key", list(COMPILED))
def test_it_compiles_for_sm90a_without_spills_or_wgmma_warnings(tmp_path, key):
    source, _, dtype = key.partition("@")
    if source == "conv1d":
        m = explain(conv_problem(tmp_path, "nn.Conv1d(48, 72, 5, stride=2, padding=2, dilation=3)", (3, 48, 101),
                                 dtype, "torch.nn.functional.gelu(self.conv(x)) + 1"))
    else:
        m = explain(load_problem(ProblemRef(source=source, dtype=dtype or None)))
    for cfg in COMPILED[key]:
        defaults = {k: v for k, v in cfg.items() if k == "TERMS"}
        _compiles_clean(build(m, "wgmma", defaults), m, {k: v for k, v in cfg.items() if k not in defaults})


@needs_kb
def test_gemm_rows_wgmma_plan_and_compile():
    m = explain(load_problem(str(KB / "level2/30_Gemm_GroupNorm_Hardtanh.py")))  # 1024 x 8192 @ 8192^2, GroupNorm
    spec = build(m, "wgmma_staged", {"BN": 64})
    r = _resolve(spec, m)
    assert [launch.kernel for launch in r.launches] == ["gemm_wgmma_prep", "gemm_wgmma_prep", "gemm_wgmma",
                                                        "gemm_rows_tail"]
    assert [s.name for s in r.scratch] == ["a_prep", "b_prep", "gemm_out"] and spec.arch_specific
    assert r.launches[2].args[2].name == "gemm.bias" and r.launches[2].args[3].name == "gemm_out"  # into scratch
    assert [a.name for a in r.launches[3].args][0] == "gemm_out"
    _compiles_clean(spec, m, {"BN": 64, "WGM": 2, "STAGES": 2, "BLOCK": 256})


# ----- the pre-passes on the CPU emulator -------------------------------------------------------------------------
@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
@pytest.mark.parametrize("mode, narrow, groups, vec, flip", [("tf32x3", True, 1, 1, False), ("tf32x3", False, 2, 4, False),
                                                             ("bf16", False, 1, 8, False), ("tf32", True, 3, 2, False),
                                                             ("tf32x3", True, 2, 2, True), ("f16", False, 1, 4, True)])
def test_the_pre_passes_on_the_cpu_emulator(mode, narrow, groups, vec, flip):
    """x to channels-last [plane][N][D][H][W][G][CGP] and the weights to [plane][G][OCG][KPAD] in the (kd, kh, kw, c)
    order (flip: a transposed conv's [C][OCG][k...], swapped and flipped), zero padded, split into big + small tf32
    planes (tf32x3), as the template's own kernels write them."""
    n, c, d, h, w, oc, kd, kh, kw = 2, 5 * groups, 3, 7, 9, 4 * groups, 2, 3, 2
    cg, ocg = c // groups, oc // groups
    cgp = -(-cg // vec) * vec
    esz = 4 if mode.startswith("tf32") else 2
    kvol = kd * kh * kw
    kr = kvol * cgp
    kpad = -(-kr // (16 // esz)) * (16 // esz)
    planes = 2 if mode == "tf32x3" else 1
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(mode, torch.float32)
    x = torch.randn(n, c, d, h, w).to(dtype)
    wt = torch.randn(*((c, ocg) if flip else (oc, cg)), kd, kh, kw).to(dtype)
    xs = torch.full((planes * n * d * h * w * groups * cgp,), float("nan"), dtype=dtype)
    ws = torch.full((planes * oc * kpad,), float("nan"), dtype=dtype)
    src = f"typedef {'unsigned short' if esz == 2 else 'float'} gw_op;\n" + render(
        "_conv_wgmma_prep.cuh.j2", mode=mode, narrow=narrow, flip=flip, xprep_kernel=XPREP_KERNEL,
        wprep_kernel=WPREP_KERNEL)
    gc, sp = groups * cgp, d * h * w
    defines = dict(N_=n, C_=c, OC_=oc, CG_=cg, OCG_=ocg, CGP=cgp, KR=kr, KPAD=kpad, CW_GC=gc, CW_SP=sp,
                   CW_KVOL=kvol, CW_PLANE=n * sp * gc)
    xgrid = [-(-n * sp * gc // 256), 1, 1] if narrow else [-(-sp // 32), -(-gc // 32), n]
    spec = KernelSpec(source=src, defines=defines, steps=[
        dict(kernel=XPREP_KERNEL, grid=xgrid, block=[256] if narrow else [32, 8], args=[{"name": "x"}, {"name": "xs"}]),
        dict(kernel=WPREP_KERNEL, grid=[-(-oc * kpad // 256)], block=[256], args=[{"name": "w"}, {"name": "ws"}])])
    emulate(spec, {"x": x, "xs": xs, "w": wt, "ws": ws})
    # the references: channels last, each group's channels padded; the convolution's weights [OC][CG][k...] (a
    # transposed conv's: group g's [CG][OCG] block swapped and flipped), as (oc, kd, kh, kw, c) padded, K padded
    want_x = torch.nn.functional.pad(x.float().view(n, groups, cg, d, h, w).permute(0, 3, 4, 5, 1, 2), (0, cgp - cg))
    conv_w = wt.float()
    if flip:
        conv_w = conv_w.view(groups, cg, ocg, kd, kh, kw).transpose(1, 2).flip(3, 4, 5).reshape(oc, cg, kd, kh, kw)
    want_w = torch.nn.functional.pad(conv_w.permute(0, 2, 3, 4, 1), (0, cgp - cg)).reshape(oc, kr)
    want_w = torch.nn.functional.pad(want_w, (0, kpad - kr))
    got_x = xs.float().view(planes, n, d, h, w, groups, cgp).numpy()
    got_w = ws.float().view(planes, groups, ocg, kpad).numpy()
    for got, want in ((got_x, want_x.numpy()), (got_w, want_w.view(groups, ocg, kpad).numpy())):
        if esz == 2:
            assert np.array_equal(got[0], want)
            continue
        big, small = split(want)
        assert np.array_equal(got[0], big) and (planes == 1 or np.array_equal(got[1], small))


# ----- the ring's protocol: producer lag against the consumers' slot release ---------------------------------
def _lag(source: str, flush: int, stages: int) -> int:
    """CW_LAG as the rendered kernel defines it for this FLUSH and STAGES."""
    import re

    m = re.search(r"#if FLUSH\s*#define CW_LAG \((.+?)\)\s*#else\s*#define CW_LAG \((.+?)\)\s*#endif", source)
    assert m, "the kernel defines no CW_LAG per FLUSH"
    return int(eval(m.group(1 if flush else 2), {"STAGES": stages}))  # noqa: S307 - "STAGES - 1" from our template


def _ring_finishes(tiles: int, stages: int, lag: int, flush: bool) -> bool:
    """The producer/consumer protocol of conv_wgmma.cu.j2 and the core's consumer, stepped until both finish or
    neither can move (a deadlock: on the GPU the consumer's wait gives up after ~1 s and the output is wrong).
    Producer, per tile t: wait until slot t % STAGES is free (tile t - STAGES released), issue t, then arrive on
    tile t - lag (its copies landed); at the end arrive on the rest. Consumer, per tile k: wait for tile k's
    arrival; with FLUSH release k at once, without it release k - 1 (the wgmma group before completed)."""
    full, released = [False] * tiles, [False] * tiles
    p = c = 0
    p_done = c_done = False
    while not (p_done and c_done):
        moved = False
        if not p_done:
            if p < tiles and (p < stages or released[p - stages]):
                if p >= lag:
                    full[p - lag] = True
                p, moved = p + 1, True
            elif p == tiles:
                full[:] = [True] * tiles
                p_done = moved = True
        if not c_done:
            if c < tiles and full[c]:
                if flush:
                    released[c] = True
                elif c > 0:
                    released[c - 1] = True
                c, moved = c + 1, True
            elif c == tiles:
                released[tiles - 1] = True
                c_done = moved = True
        if not moved:
            return False
    return True


def test_the_gather_never_waits_on_a_slot_the_consumer_holds(tmp_path):
    """bf16/fp16 convolutions came out wrong on the GPU wherever a block had more than STAGES k tiles: the gather
    arrived STAGES - 1 tiles late while a consumer without FLUSH holds one slot more than it waits for, so the two
    waited on each other. The lag the rendered kernel uses finishes at every STAGES, tile count and FLUSH, and the
    old lag deadlocks in the same model (the model can tell)."""
    m = explain(conv_problem(tmp_path, "nn.Conv2d(20, 70, 3, padding=1)", (2, 20, 33, 29), "bfloat16"))
    source = build(m).source
    for flush in (0, 1):
        for stages in (2, 3, 4, 5, 6):
            lag = _lag(source, flush, stages)
            assert 0 <= lag < stages
            for tiles in (1, stages - 1, stages, stages + 1, 3 * stages + 2):
                assert _ring_finishes(tiles, stages, lag, bool(flush)), (flush, stages, tiles, lag)
    assert not _ring_finishes(9, 4, 3, flush=False)  # the old lag without FLUSH
    assert _ring_finishes(9, 4, 3, flush=True)
