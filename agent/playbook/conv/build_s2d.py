"""A 2-D convolution on the Hopper GEMM core with no gather: space-to-depth, then shifted rows
(``templates/conv_wgmma_s2d.cu.j2``; variant ``wgmma_s2d`` of conv2d, conv_epi and conv16).

Why: the ``wgmma`` convolution (:mod:`.conv.build_wgmma`) gathers A's im2col k tiles with cp.async, one copy per
position, tap and VEC channels, from 128 producer threads. On the suite's AlexNet layer (3 channels, 11 x 11, stride 4)
that is 121 copies a position a plane, and the kernel ran at 0.66 ms, 1.6x cuDNN fp32, far from the tensor cores'
floor. Here the gather becomes TMA boxes:

- A stride-SH x SW convolution of x equals a stride-1 convolution of its space-to-depth rewrite: xs[n][P][Q][c']
  with c' = (c, rp, rq) holds x[n][c][SH P + rp - PH][SW Q + rq - PW] (C2 = C SH SW channels, zeros outside the image),
  taps KH2 x KW2 = ceil(KH / SH) x ceil(KW / SW), the weights rewritten to match (zeros past KH, KW). The suite's
  3 x 11 x 11 taps at stride 4 become 48 channels x 3 x 3 taps.
- A stride-1 convolution over positions f = oh QQ + ow (QQ = OW + KW2 - 1: each row computed QQ wide, the last
  KW2 - 1 positions discarded) reads, for tap (kh2, kw2), the rows f + kh2 QQ + kw2 of xs seen as a [rows][CP] matrix:
  a tile's A operand for one tap is BM consecutive rows, one TMA box, no index arithmetic per position.

So the producer is one thread issuing two boxes per k tile (a tap's slab of 128 bytes of channels, and the weights'
k tile), as the GEMM core's; the consumers, the ring, 3xTF32 / bf16 / fp16 are the core's. Costs: the pre-pass
writes xs (the stride's phases as channels; the ``wgmma`` variant's pre-pass writes x channels-last too), the
discarded positions ((KW2 - 1) / QQ of the rows: 2 / 57 on the suite), and k steps of zeros where C2 is no multiple
of 8 (tf32; 16 for 16-bit). Groups, dilation, 3-D and transposed convolutions are refused with the reason (the
``wgmma`` variant takes them).
"""

from __future__ import annotations

from collections.abc import Mapping

from kerngen.expr import ExprError, TensorFacts, cdiv, evaluate_bool, evaluate_int
from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.conv.build_epi import SPEC_PREFIX
from kerngen.agent.playbook.conv.build_wgmma import CONV_BNS, MIN_OCG, ConvGemm, conv_gemm, tile_defaults
from kerngen.agent.playbook.entry import A, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.gemm.build_wgmma import (BM, ELEMENT_BYTES, MAX_PREP_ELEMENTS, PAD, REG_BUDGET, REGS,
                                                     SMEM, STAGE_BYTES, TF32_TERMS_TEXT, TUNABLES, Mode, mode_of,
                                                     planes_of)
from kerngen.agent.playbook.terms import TERMS_SPLIT, offer_terms
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render

__all__ = ["CONV2D_S2D_IDEAS", "CONV16_S2D_IDEAS", "CONV_EPI_S2D_IDEAS", "S2D_SPEC_NAMES", "VARIANT", "conv16_s2d",
           "conv_epi_s2d", "conv_s2d_spec", "s2d_geometry"]

VARIANT = "wgmma_s2d"
TEMPLATE = "conv_wgmma_s2d.cu.j2"
KERNEL, XPREP_KERNEL, WPREP_KERNEL = "conv_s2d", "conv_s2d_xprep", "conv_s2d_wprep"
S2D_SPEC_NAMES = {"conv2d": "playbook-conv2d-wgmma-s2d", "conv_epi": SPEC_PREFIX + VARIANT,  # conv_epi's spelling
                  "conv16": "playbook-conv16-wgmma-s2d"}


def s2d_geometry(c: ConvGemm, esize: int) -> dict[str, str | int]:
    """The rewrite's defines (conv_wgmma_s2d.cu.j2's header): taps KH2_ x KW2_, xs's PP_ x QQ_ positions, its C2_
    channels padded to CP_ (16 bytes), NSLAB_ slabs of 128 bytes a tap, LASTKS_ k steps in a tap's last slab.
    ValueError for a convolution it does not rewrite."""
    d = c.defines
    if c.g != 1 or c.flip or (d["DH_"], d["DW_"]) != (1, 1) or d["D_"] != 1 or d["KD_"] != 1:
        raise ValueError("space-to-depth takes a plain 2-D convolution (groups 1, dilation 1, not transposed); "
                         "the wgmma variant takes this one")
    sh, sw, kh, kw = (int(d[k]) for k in ("SH_", "SW_", "KH_", "KW_"))
    kh2, kw2 = cdiv(kh, sh), cdiv(kw, sw)
    swe, kstep = 128 // esize, 8 if esize == 4 else 16
    c2 = f"({c.x}.shape[1] * {sh * sw})"
    nslab = f"cdiv({c2}, {swe})"
    return dict(KH2_=kh2, KW2_=kw2, PP_=f"({d['OH_']}) + {kh2 - 1}", QQ_=f"({d['OW_']}) + {kw2 - 1}", C2_=c2,
                CP_=f"round_up({c2}, {PAD[esize]})", NSLAB_=nslab,
                LASTKS_=f"cdiv({c2} - {swe} * ({nslab} - 1), {kstep})")


# where ptxas keeps FLUSH 2's products overlapped with the adds: elsewhere (HALO 0, or one consumer) it serialises
# every wgmma (C7514, "non wgmma instructions reading accumulator registers"), so the constraint refuses it there
FLUSH2_ONLY = "FLUSH != 2 or (HALO == 1 and CWG == 2)"


def halo_smem(geo: dict[str, str | int], planes: int) -> str:
    """HALO 1's shared memory (the template's CS_RING ...): two halo slots of the tile's rows plus the taps' shifts
    in 64-row boxes of 128 bytes a plane, the ring of B's k tiles, the 1 KB alignment skip, the mbarriers."""
    rows = f"({BM} + {int(geo['KH2_']) - 1} * ({geo['QQ_']}) + {int(geo['KW2_']) - 1})"
    return f"(1024 + 2 * {planes} * cdiv({rows}, 64) * 8192 + STAGES * {planes} * BN * 128 + 16 * STAGES + 32)"


def _fits(smem: str, cfg: dict[str, int], facts: Mapping[str, TensorFacts] | None) -> bool:
    """``cfg`` (HALO 1) passes the spec's shared-memory, register and FLUSH 2 constraints at the bound tensors."""
    try:
        return bool(facts) and evaluate_int(smem, {**facts, **cfg}) <= MAX_SMEM and evaluate_bool(
            f"({REGS} <= {REG_BUDGET}) and ({FLUSH2_ONLY})", cfg)
    except ExprError:
        return False


def _halo_defaults(smem: str, cfg: dict[str, int], asked: Mapping[str, int], facts: Mapping[str, TensorFacts] | None,
                   half: bool) -> dict[str, int]:
    """In fp32, HALO 1 where its shared memory fits at the bound tensors and ``cfg`` (``smem``: :func:`halo_smem`),
    else 0 (also when the shapes are unknown: HALO 0 fits wherever the spec does), with the pipelined partial sums
    (FLUSH 2) and 4 stages where they fit; 16-bit: HALO 0. What ``asked`` names stays. One H200, 2026-11-29, the
    suite conv2d (plan ms, one run each): fp32 HALO 1 FLUSH 2 STAGES 4 0.390, HALO 0 FLUSH 1 0.398 (the default
    before), HALO 1 FLUSH 1 0.449, HALO 0 FLUSH 2 0.432 (ptxas serialises it: :data:`FLUSH2_ONLY`); KernelBench
    level-2 1 (no halo fits) FLUSH 1 3.46 ms, FLUSH 2 3.86; bf16 HALO 0 0.136, HALO 1 0.145 (in an earlier run, with
    the slower x pre-pass, 0.165 both)."""
    halo = asked.get("HALO", 0 if half else int(_fits(smem, {**cfg, "HALO": 1}, facts)))
    out = {"HALO": halo}
    if halo and not half:
        if _fits(smem, {**cfg, "HALO": 1, "FLUSH": 2}, facts):
            out["FLUSH"] = 2
        if "STAGES" not in asked and _fits(smem, {**cfg, **out, "STAGES": 4}, facts):
            out["STAGES"] = 4
    return out


def conv_s2d_spec(c: ConvGemm, dtype: str, defaults: dict[str, int], name: str, tf32: bool = False,
                  facts: Mapping[str, TensorFacts] | None = None) -> KernelSpec:
    """The space-to-depth convolution of ``c`` in ``dtype`` (fp32: 3xTF32; ``tf32``: checked at --precision tf32,
    TERMS 1 and 3 offered). No split-K: an output of fewer tiles than the grid leaves SMs idle (the gathered ``wgmma``
    variant splits K there). ``facts``: the bound tensors now, for HALO's default (:func:`_halo_defaults`)."""
    terms = defaults.get("TERMS", TERMS_SPLIT)
    if dtype != "float32" and terms != TERMS_SPLIT:
        raise ValueError(f"TERMS {terms}: 3 (3xTF32) or, for fp32 problems, 1 (plain TF32)")
    mode = mode_of(dtype, terms, tf32)
    half = mode in (Mode.bf16, Mode.f16)
    esize, planes = ELEMENT_BYTES[mode], planes_of(mode)
    swe = 128 // esize
    geo = s2d_geometry(c, esize)
    x, w = c.x, c.weight
    n = f"{x}.shape[0]"
    rows = f"{n} * ({geo['PP_']}) * ({geo['QQ_']})"  # xs's rows: positions of every image
    krow = f"{geo['KH2_'] * geo['KW2_']} * {geo['NSLAB_']} * {swe}"  # ws's row: taps x slabs x 128 bytes
    fpi = f"({c.defines['OH_']}) * ({geo['QQ_']})"  # virtual positions of an image
    units = f"{n} * cdiv({fpi}, {BM}) * cdiv({c.oc}, BN)"
    tv = c.template_vars
    src = render(TEMPLATE, kernel=KERNEL, xprep_kernel=XPREP_KERNEL, wprep_kernel=WPREP_KERNEL, mode=mode.value,
                 out_dtype=dtype, has_bias=tv["has_bias"], statements=tv["ep_statements"], expr=tv["ep_expr"],
                 n_ep=tv["n_ep"], bns=CONV_BNS)
    tunables = {k: list(v) for k, v in TUNABLES.items()}
    # FLUSH 1 or 2 in fp32, as the core: without it the suite's error against fp64 was 3.2e-6 relative, 9x PyTorch
    # fp32's (with it 2.3e-7), and no faster (H200, 2026-11-29); FLUSH 2 pipelines it (_halo_defaults)
    tunables.update(BN=list(CONV_BNS), BK=[swe], FLUSH=[0] if half else [1, 2], TERMS=[terms])
    tunables.update(HALO=[0, 1], ROT=[0, 1])
    base = {**tile_defaults(half, c.ocg), "BK": swe, "ROT": 1}
    halo = halo_smem(geo, planes)
    d = pick(defaults, {**base, **_halo_defaults(halo, pick(defaults, base), defaults, facts, half)})
    offer_terms(tunables, d, defaults, mode is Mode.tf32_terms)
    smem = f"({halo} if HALO else {SMEM.format(stage=STAGE_BYTES.format(planes=planes, bm=BM, esize=esize))})"
    xs_size, ws_size = f"{planes} * {rows} * {geo['CP_']}", f"{planes} * ({c.oc}) * {krow}"
    op = "float32" if esize == 4 else dtype
    amap = {"kind": "tensormap", "name": "xs", "box_rows": f"(64 if HALO else {BM})", "box_cols": swe, "swizzle": 128,
            "full_width": False, "view": [planes, rows, geo["CP_"]]}
    bmap = {"kind": "tensormap", "name": "ws", "box_rows": "BN", "box_cols": swe, "swizzle": 128,
            "full_width": False, "view": [planes, c.oc, krow]}
    constraints = [*c.checks, f"{c.oc} >= {MIN_OCG}", f"{x}.numel < 2**31", f"{rows} < 2**31",
                   f"{xs_size} + {ws_size} <= {MAX_PREP_ELEMENTS}", f"{units} < 2**31",
                   f"{smem} <= {MAX_SMEM}", f"{REGS} <= {REG_BUDGET}", FLUSH2_ONLY]
    what = {Mode.bf16: "bf16", Mode.f16: "fp16", Mode.tf32x3: "fp32 at fp32 accuracy (3xTF32: big + small tf32 "
            "planes written by the pre-passes, small*big + big*small + big*big per k8 step)",
            Mode.tf32: "fp32 as plain TF32 (one term: NOT fp32 accurate)", Mode.tf32_terms: TF32_TERMS_TEXT}[mode]
    epi_args = [*([{"name": c.bias}] if c.bias else []), {"name": "out"}, *({"name": e} for e in c.eps)]
    steps = [dict(kernel=XPREP_KERNEL, grid=[f"cdiv({rows} * {geo['CP_']} // {PAD[esize]}, 256)"], block=[256],
                  args=[{"name": x}, {"name": "xs"}]),
             dict(kernel=WPREP_KERNEL, grid=[f"cdiv(({c.oc}) * {krow}, 256)"], block=[256],
                  args=[{"name": w}, {"name": "ws"}]),
             dict(kernel=KERNEL, grid=[f"min({units}, CTAS)"], block=["128 * (CWG + 1)"], shared_mem=smem,
                  args=[amap, bmap, *epi_args])]
    return make_spec(
        name,
        f"{c.what} on Hopper (sm_90a), {what}, with no gather: a pre-pass rewrites x space-to-depth (the stride's "
        "phases as channels, so the convolution is one of stride 1 over ceil(K / stride) taps) into rows of "
        "positions, each image's rows computed the rewrite's width wide; for each tap a tile's A is a run of "
        "consecutive rows shifted by the tap, one TMA box, as is the weights' k tile; one producer thread, STAGES "
        "slots, CWG consumer warpgroups on wgmma m64nBN, the conv bias and epilogue in fp32 registers before the "
        "NCHW store of the positions inside the output",
        src, tunables, d, arch_specific=True, defines=dict(c.defines, **geo),
        scratch=[dict(name="xs", dtype=op, size=xs_size), dict(name="ws", dtype=op, size=ws_size)],
        constraints=constraints, steps=steps,
    )


def conv_epi_s2d(m: FamilyMatch, defaults: dict[str, int], name: str = S2D_SPEC_NAMES["conv_epi"]) -> KernelSpec:
    return conv_s2d_spec(conv_gemm(m), "float32", defaults, name, m.tf32, m.tensor_facts())


def conv16_s2d(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return conv_s2d_spec(conv_gemm(m), m.facts.dtype, defaults, S2D_SPEC_NAMES["conv16"], facts=m.tensor_facts())


_AFTER = frozenset({VARIANT})
_TEXT = ("with no gather on Hopper's wgmma GEMM core: a pre-pass rewrites x space-to-depth (the stride's phases become "
         "channels, so the convolution has stride 1 and ceil(K / stride) taps a side) into rows of positions; a "
         "tile's A for one tap is then a run of consecutive rows (the positions shifted by the tap), one TMA box (where "
         "the tile's rows for all its taps fit in shared memory, loaded once and read by each tap at its shift), and "
         "the weights' k tile another: one producer thread feeds a 3-4 deep mbarrier ring, two consumer warpgroups "
         "multiply with wgmma and apply the conv bias and epilogue before the store")


def ideas(prefix: str, first: str, effect: str, other: dict[str, int]) -> tuple[Entry, ...]:
    """The round-0 entry and the refinements of a conv family's space-to-depth variant. Round 0 measures the default
    and ``other``: the halo or the shifted boxes, whichever the default is not (:func:`_halo_defaults`)."""
    return (
        Entry(f"{prefix}-wgmma-s2d", first + _TEXT + ".", P, effect, VARIANT, ({}, other), round0=True),
        Entry(f"{prefix}-s2d-tile", "Re-shape the space-to-depth convolution's tile: two m64 blocks a consumer, a "
              "narrower channel tile, or one consumer.", PAR, "0-20%", VARIANT,
              ({"WGM": 2, "BN": 64, "STAGES": 2}, {"BN": 64, "STAGES": 4}, {"CWG": 1, "WGM": 2}), after=_AFTER),
        Entry(f"{prefix}-s2d-order", "Walk the space-to-depth convolution's tiles in larger groups of rows (the "
              "shifted boxes of neighbouring tiles share rows in L2) or with fewer resident blocks.", A, "0-5%",
              VARIANT, ({"GROUP_M": 16}, {"CTAS": 114}), after=_AFTER),
    )


_EFFECT = ("one H200, 2026-11-29: the suite conv2d (3 channels, k11 s4) 0.34-0.36 ms against the gathered wgmma's "
           "0.66 (3.0-3.2x eager fp32), in bf16 0.14 against 0.40; stride 1, 64 channels: KernelBench level-2 1 3.36 "
           "against 5.36 ms, level-1 55 5.91 against 10.30; slower on level-2 87 in a short search")
_SHIFTED = {"HALO": 0, "FLUSH": 1, "STAGES": 3}  # fp32 without the halo (FLUSH 2 needs it)
CONV2D_S2D_IDEAS = ideas("conv", "Run the fp32 convolution at fp32 accuracy (3xTF32) ", _EFFECT, _SHIFTED)
CONV_EPI_S2D_IDEAS = ideas("cepi", "Run the fp32 convolution with its fused epilogue at fp32 accuracy (3xTF32) ",
                           _EFFECT, _SHIFTED)
CONV16_S2D_IDEAS = ideas("conv16", "Run the bf16/fp16 convolution with its fused epilogue ", _EFFECT, {"HALO": 1})
