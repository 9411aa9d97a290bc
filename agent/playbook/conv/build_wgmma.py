"""Convolutions on the Hopper GEMM core (sm_90a: wgmma + TMA, :mod:`.gemm.build_wgmma`): the ``wgmma`` variant of
``conv2d`` and ``conv_epi`` (fp32 as 3xTF32, at fp32 accuracy) and of ``conv16`` (the same convolutions in bf16 /
fp16). ``templates/conv_wgmma.cu.j2`` (its header gives the plan): a pre-pass writes x channels-last with each
group's channels padded to CGP (a multiple of VEC) and, in the tf32 modes, split into big + small planes; a second
one writes the weights K-major in the same k order (kh, kw, c); the core's persistent kernel then gathers A's im2col
k tiles with zero-filling cp.async of VEC channels into the 128-byte swizzled layout, loads B's with TMA, multiplies
on wgmma and applies the conv's bias and epilogue before the store.

VEC (elements per copy: 4, 8 or 16 bytes) trades copies per k tile against the channel padding: the default is the
widest whose padding of a group's channels is at most 1/8 (C = 3: one fp32 channel a copy, not 4 with a fourth of
zeros), the tuner may move it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kerngen.expr import ExprError, TensorFacts, evaluate_int

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.conv.build_epi import SPEC_PREFIX, frame
from kerngen.agent.playbook.entry import A, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.conv.split_wgmma import SUM_KERNEL, fill_defaults, split_plan
from kerngen.agent.playbook.gemm.build_tf32 import split_k_of
from kerngen.agent.playbook.gemm.build_wgmma import (BM, DEFAULTS, ELEMENT_BYTES, MAX_PREP_ELEMENTS, PAD, REG_BUDGET,
                                                     REGS, SMEM, STAGE_BYTES, TF32_TERMS_TEXT, TUNABLES, Mode, mode_of,
                                                     planes_of)
from kerngen.agent.playbook.terms import TERMS_SPLIT, offer_terms
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render

__all__ = ["FLAT_3D", "ConvGemm", "conv_gemm", "CONV16_IDEAS", "CONV2D_IDEAS", "CONV2D_SPEC_NAME", "CONV_EPI_IDEAS", "CONV_EPI_SPEC_NAME", "VARIANT",
           "conv16_wgmma", "conv_epi_wgmma", "conv_wgmma_spec", "tile_defaults", "vec_default", "vec_values"]

VARIANT = "wgmma"
TEMPLATE = "conv_wgmma.cu.j2"
KERNEL, XPREP_KERNEL, WPREP_KERNEL = "conv_wgmma", "conv_wgmma_xprep", "conv_wgmma_wprep"
CONV2D_SPEC_NAME, CONV_EPI_SPEC_NAME = f"playbook-conv2d-{VARIANT}", SPEC_PREFIX + VARIANT
CONV16_SPEC_NAME = f"playbook-conv16-{VARIANT}"
# B (the weights) is K-major, so any multiple of 8 rows is a valid tile (the core's 64-column steps come from its
# MN-major B); 96 fits the 96 channels of AlexNet-like first layers without a fourth of padding
CONV_BNS = (64, 96, 128, 192, 256)
MIN_OCG = 16  # output channels of a group below which a 64-column wgmma tile is mostly padding (depthwise: no)


def vec_values(esize: int) -> list[int]:
    """Elements of one gather copy: 4, 8 and 16 bytes."""
    return [b // esize for b in (4, 8, 16) if b >= esize]


def vec_default(cg: int, esize: int) -> int:
    """The widest copy whose padding of ``cg`` channels is at most 1/8, else the least padding (widest on ties);
    then a wider one still if it pads at most 1/3 and at least halves the gather's copies: with few channels the
    copy count outweighs the padded K (the suite's conv2d, 3 fp32 channels: VEC 4, padded to 4, 0.664 ms against
    VEC 1's 1.060, one H200, 2026-11-28)."""
    vals = vec_values(esize)
    pad = {v: -(-cg // v) * v for v in vals}
    fine = [v for v in vals if pad[v] * 8 <= cg * 9]
    base = max(fine) if fine else min(vals, key=lambda v: (pad[v], -v))
    wider = [v for v in vals if v > base and pad[v] * 3 <= cg * 4 and 2 * -(-cg // v) <= -(-cg // base)]
    return max(wider, default=base)


def tile_defaults(half: bool, ocg: int) -> dict[str, int]:
    """Untuned (no GPU yet): the core's, BN the narrowest tile that holds a group's channels up to 128 (256 for
    16-bit), so that few columns are padding."""
    cap = 256 if half else 128
    bn = next((v for v in CONV_BNS if v >= ocg), cap) if ocg <= cap else cap
    return dict(DEFAULTS["16" if half else "32"], BN=bn)


@dataclass(frozen=True)
class ConvGemm:
    """A convolution as the wgmma implicit GEMM sees it (any family's facts, read by its hook): ``what`` (one line),
    ``template_vars`` (the epilogue's: has_bias, ep_statements, ep_expr, n_ep), ``defines`` (the geometry: N_ C_ D_ H_
    W_ OC_ G_ CG_ OCG_ K/S/P/D{D,H,W}_ OD_ OH_ OW_, 1 and 0 for absent axes), ``checks`` (the bound tensors'),
    the input ``x``, ``weight``, ``bias`` (or None), the epilogue's tensors ``eps``, groups ``g``, ``cg`` / ``ocg``
    (a group's input / output channels now), ``oc`` (the output channels, an expression), ``kvol`` (taps),
    ``positions`` (output positions of an image, an expression), ``flip`` (a transposed conv's weights)."""

    what: str
    template_vars: dict[str, Any]
    defines: dict[str, str | int]
    checks: list[str]
    x: str
    weight: str
    bias: str | None
    eps: tuple[str, ...]
    g: int
    cg: int
    ocg: int
    oc: str
    kvol: int
    positions: str
    flip: bool = False


FLAT_3D = dict(D_=1, KD_=1, SD_=1, PD_=0, DD_=1, OD_=1)  # a 1-D or 2-D convolution as a 3-D one


def conv_gemm(m: FamilyMatch) -> ConvGemm:
    """A conv_epi match (facts of :mod:`.conv.epi`) as a :class:`ConvGemm`."""
    f, fr = m.facts, frame(m)
    oh, ow = fr.out_hw
    return ConvGemm(fr.what, fr.template_vars, {**fr.defines, **FLAT_3D}, fr.checks, f.x, f.weight, f.bias,
                    tuple(p.name for p in f.epilogue.params), f.G, f.C // f.G, f.OC // f.G, f"{f.weight}.shape[0]",
                    f.KH * f.KW, f"({oh}) * ({ow})")


def conv_wgmma_spec(c: ConvGemm, dtype: str, defaults: dict[str, int], name: str, tf32: bool = False,
                    facts: Mapping[str, TensorFacts] | None = None) -> KernelSpec:
    """The wgmma implicit GEMM of convolution ``c`` in ``dtype``; ``tf32``: checked at ``--precision tf32`` (fp32:
    TERMS 1 and 3 offered, 1 by default). ``facts``: the bound tensors now, for the defaults of an output of too few
    tiles to fill the GPU (:func:`.conv.split_wgmma.fill_defaults`: split-K or one consumer); ``SPLIT_K`` > 1 (asked
    or so chosen) makes the split-K plan (:func:`.conv.split_wgmma.split_plan`)."""
    terms = defaults.get("TERMS", TERMS_SPLIT)
    if dtype != "float32" and terms != TERMS_SPLIT:
        raise ValueError(f"TERMS {terms}: 3 (3xTF32) or, for fp32 problems, 1 (plain TF32)")
    mode = mode_of(dtype, terms, tf32)
    half = mode in (Mode.bf16, Mode.f16)
    esize = ELEMENT_BYTES[mode]
    planes = planes_of(mode)
    x, w, g = c.x, c.weight, c.g
    ocg, cg = f"(({c.oc}) // {g})", f"({x}.shape[1] // {g})"
    cgp = f"round_up({cg}, VEC)"
    kr = f"{c.kvol} * {cgp}"
    kpad = f"round_up({kr}, {PAD[esize]})"
    sp = f"({x}.numel // ({x}.shape[0] * {x}.shape[1]))"  # input positions of an image
    m_tot = f"{x}.shape[0] * {c.positions}"
    tv = c.template_vars
    vec = vec_default(c.cg, esize)
    narrow = g * -(-c.cg // vec) * vec < 32  # the flat x pre-pass (both are correct at any shape; this one is faster)
    base = {**tile_defaults(half, c.ocg), "VEC": vec}
    cfg, rows = pick(defaults, base), _rows_now(m_tot, facts)
    fill = fill_defaults(cfg, defaults, g, rows, c.ocg, c.kvol * -(-c.cg // cfg["VEC"]) * cfg["VEC"]) \
        if "SPLIT_K" not in defaults and rows else {}
    split = split_k_of({**defaults, **fill})  # the GEMM's split values: ValueError for another
    units = f"{g} * cdiv({m_tot}, {BM}) * cdiv({ocg}, BN)" + (" * SPLIT_K" if split > 1 else "")
    src = render(TEMPLATE, kernel=KERNEL, xprep_kernel=XPREP_KERNEL, wprep_kernel=WPREP_KERNEL, narrow=narrow,
                 flip=c.flip, mode=mode.value, out_dtype=dtype, has_bias=tv["has_bias"],
                 statements=tv["ep_statements"], expr=tv["ep_expr"], n_ep=tv["n_ep"], bns=CONV_BNS, a_mn=False,
                 b_mn=False, split_k=False, split=split > 1, sum_kernel=SUM_KERNEL)
    tunables = {k: list(v) for k, v in TUNABLES.items()}
    tunables.update(BN=list(CONV_BNS), BK=[64, 128] if half else [32, 64], FLUSH=[0] if half else [1],
                    TERMS=[terms], VEC=vec_values(esize))
    d = pick({**defaults, **fill}, base)
    offer_terms(tunables, d, defaults, mode is Mode.tf32_terms)
    smem = SMEM.format(stage=STAGE_BYTES.format(planes=planes, bm=BM, esize=esize))
    xs_size = f"{planes} * {x}.shape[0] * {sp} * {g} * {cgp}"
    ws_size = f"{planes} * ({c.oc}) * {kpad}"
    op = "float32" if esize == 4 else dtype
    tmap = {"kind": "tensormap", "name": "ws", "box_rows": "BN", "box_cols": 128 // esize, "swizzle": 128,
            "full_width": False, "view": [f"{planes} * {g}", ocg, kpad]}
    constraints = [  # the shape's limits first, so that a shape none admits is refused for its own reason
        *c.checks, f"{ocg} >= {MIN_OCG}", f"{x}.numel < 2**31", f"{xs_size} + {ws_size} <= {MAX_PREP_ELEMENTS}",
        f"{m_tot} < 2**31", f"{units} < 2**31", f"{x}.shape[0] <= 65535", f"cdiv({g} * {cgp}, 32) <= 65535",
        f"{smem} <= {MAX_SMEM}", f"{REGS} <= {REG_BUDGET}",
    ]
    what = {Mode.bf16: "bf16", Mode.f16: "fp16", Mode.tf32x3: "fp32 at fp32 accuracy (3xTF32: x and the weights "
            "split into big + small tf32 planes by the pre-passes, small*big + big*small + big*big per k8 step)",
            Mode.tf32: "fp32 as plain TF32 (one term: NOT fp32 accurate)", Mode.tf32_terms: TF32_TERMS_TEXT}[mode]
    total = f"{x}.shape[0] * ({c.oc}) * {c.positions}"  # outputs (NCHW)
    epi_args = [*([{"name": c.bias}] if c.bias else []), {"name": "out"}, *({"name": e} for e in c.eps)]
    main = dict(kernel=KERNEL, grid=[f"min({units}, CTAS)"], block=["128 * (CWG + 1)"], shared_mem=smem,
                args=[{"name": "xs"}, tmap, *epi_args])
    steps = [dict(kernel=XPREP_KERNEL, grid=[f"cdiv({x}.shape[0] * {sp} * {g} * {cgp}, 256)"], block=[256],
                  args=[{"name": x}, {"name": "xs"}]) if narrow else
             dict(kernel=XPREP_KERNEL, grid=[f"cdiv({sp}, 32)", f"cdiv({g} * {cgp}, 32)", f"{x}.shape[0]"],
                  block=[32, 8], args=[{"name": x}, {"name": "xs"}]),
             dict(kernel=WPREP_KERNEL, grid=[f"cdiv(({c.oc}) * {kpad}, 256)"], block=[256],
                  args=[{"name": w}, {"name": "ws"}]), main]
    scratch = [dict(name="xs", dtype=op, size=xs_size), dict(name="ws", dtype=op, size=ws_size)]
    split_text = ""
    if split > 1:
        split_text = split_plan(steps, scratch, constraints, tunables, d, split=split, total=total,
                                ktiles=f"cdiv({kpad}, BK)", epi_args=epi_args)
    return make_spec(
        name,
        f"{c.what} as an implicit GEMM per group on Hopper (sm_90a), {what}: pre-passes write x channels-last "
        "(each group's channels padded to a multiple of VEC) and the weights K-major in the (kd, kh, kw, c) order"
        + (" (a transposed conv's swapped and flipped)" if c.flip else "") + "; a "
        "persistent grid of one block per SM over GROUP_M-grouped tiles; the producer warpgroup gathers the im2col "
        "k tiles of A with zero-filling cp.async of VEC channels into 128-byte-swizzled shared memory (arriving on "
        "the slot's mbarrier once they landed, after a proxy fence) while its thread 0 loads B's tiles by TMA, "
        "STAGES slots deep; CWG consumer warpgroups multiply with wgmma m64nBN straight from shared memory, the conv "
        "bias and epilogue in fp32 registers before the store" + split_text,
        src, tunables, d, arch_specific=True, defines=dict(c.defines, CGP=cgp, KR=kr, KPAD=kpad),
        scratch=scratch, constraints=constraints, steps=steps,
    )


def _rows_now(rows: str, facts: Mapping[str, TensorFacts] | None) -> int:
    """The GEMM's rows (output positions of all images) at the bound tensors; 0 when unknown."""
    try:
        return evaluate_int(rows, facts) if facts else 0
    except ExprError:  # an expression these facts cannot resolve: no shape-based default
        return 0


def conv_epi_wgmma(m: FamilyMatch, defaults: dict[str, int], name: str = CONV_EPI_SPEC_NAME) -> KernelSpec:
    return conv_wgmma_spec(conv_gemm(m), "float32", defaults, name, m.tf32, m.tensor_facts())


def conv16_wgmma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    return conv_wgmma_spec(conv_gemm(m), m.facts.dtype, defaults, CONV16_SPEC_NAME, facts=m.tensor_facts())


# ---------------------------------------------------------------------------------------------
# ideas (Hopper only: coverage offers a *wgmma* variant on sm_90 alone; first in round 0 there)
_AFTER = frozenset({VARIANT})
_CORE = ("on Hopper's wgmma GEMM core as an implicit GEMM per group: pre-passes write x channels-last (each "
         "group's channels padded to a multiple of the copy width) and the weights K-major; a persistent grid of "
         "one block per SM walks the output tiles in grouped order; a producer warpgroup gathers the im2col k tiles "
         "of x with zero-filling cp.async straight into 128-byte-swizzled shared memory (padding never branches) "
         "while TMA brings the weights' tiles, a 3-4 deep mbarrier ring; two consumer warpgroups multiply with wgmma "
         "straight from shared memory and apply the conv bias and epilogue to the fp32 accumulators before the store")
_TF32 = (" fp32 stays fp32-accurate: the pre-passes split x and the weights into big + small tf32 planes, every k8 "
         "step multiplies small*big, big*small, then big*big, and each k tile's products are added into the fp32 "
         "sum with round to nearest (FLUSH).")


def ideas(prefix: str, first: str, effect: str, tf32: bool) -> tuple[Entry, ...]:
    """The round-0 entry and the refinements of a conv family's wgmma variant."""
    tiles: tuple[dict, ...] = (({"BN": 64, "WGM": 2, "STAGES": 2}, {"BN": 64}, {"CWG": 1, "BN": 64, "WGM": 2}) if tf32 else
                               ({"BN": 128, "WGM": 2}, {"BN": 128}, {"CWG": 1, "BN": 128, "WGM": 2}))
    stages: tuple[dict, ...] = (({"STAGES": 2}, {"STAGES": 4, "BN": 64}) if tf32 else
                                ({"STAGES": 3}, {"STAGES": 5, "BN": 128}, {"BK": 128, "STAGES": 2}))
    return (
        Entry(f"{prefix}-wgmma", first + _CORE + "." + (_TF32 if tf32 else ""), P, effect, VARIANT,
              ({}, {"GROUP_M": 16}), round0=True),
        Entry(f"{prefix}-wgmma-tile", "Re-shape the wgmma convolution's tile: two m64 blocks a consumer over fewer "
              "channels, a narrower channel tile for groups of few channels, or one consumer.", PAR, "0-20%",
              VARIANT, tiles, after=_AFTER),
        Entry(f"{prefix}-wgmma-pipeline", "Retune the wgmma convolution's ring: more slots keep more gathered k "
              "tiles in flight (the gather's latency is longer than TMA's); fewer slots free shared memory for a wider "
              "tile.", A, "0-10%", VARIANT, stages, after=_AFTER),
        Entry(f"{prefix}-wgmma-copies", "Change the width of the gather's copies (VEC channels of one tap a copy: "
              "4, 8 or 16 bytes): wider copies are fewer instructions for the producer, narrower ones pad the "
              "channels less.", A, "0-15% where the producer limits", VARIANT,
              ({"VEC": 4 if tf32 else 8}, {"VEC": 2 if tf32 else 4}), after=_AFTER),
    )


_EFFECT = ("target >= 3.5x eager fp32 on the suite conv2d; measured 1.61x there (mma.sync 3xTF32: 1.55x) and "
           "slower than mma.sync on KernelBench level-2 54, one H200, 2026-11-28")
CONV2D_IDEAS = ideas("conv", "Run the fp32 convolution at fp32 accuracy (3xTF32) ", _EFFECT, tf32=True)
CONV_EPI_IDEAS = ideas("cepi", "Run the fp32 convolution with its fused epilogue at fp32 accuracy (3xTF32) ",
                       _EFFECT, tf32=True)
CONV16_IDEAS = ideas("conv16", "Run the bf16/fp16 convolution with its fused epilogue (fp32 accumulation, one "
                     "rounding at the store) ", "the tensor cores at their 16-bit rate where eager runs cuDNN's; "
                     "not yet measured on a GPU", tf32=False)
