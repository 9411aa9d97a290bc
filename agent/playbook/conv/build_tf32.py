"""fp32 convolution on the tensor cores at fp32 accuracy: an implicit GEMM with split-precision TF32
products ("3xTF32"), the ``tf32x3`` variant of the built-in ``conv2d`` family, of ``conv_epi``
(conv1d/conv2d with groups, dilation and a fused elementwise epilogue) and, through :func:`igemm_spec`, of
``conv_nd`` (3-D and transposed convolutions: :mod:`.conv.build_nd`).

GEMM view per group: M = N*OH*OW output positions, N = OC/groups, K = C/groups*KH*KW. A is gathered
from the input on the fly (4-byte zero-filling cp.async: padding, the last rows and the k padding
are zeros); B is the weight [OC][K], packed once per call into a zero-padded [G][OCGP][KP] scratch so
that every copy of it is an aligned 16-byte cp.async. The inner loop (hi/lo split, three mma.sync
m16n8k8 products per fp32 product, per-k-tile fp32 flush, cp.async ring) is the GEMM's
(the shared ``agent/playbook/templates/_tf32x3_mma.cuh.j2``); the template is ``templates/conv_tf32x3_igemm.cu.j2``.

Tunables: BM x BN block tile, BK k tile (16 or 32: the padded rows keep the fragment loads and the
gather's copies conflict-free), WM x WN warp tile (WM % 16, WN % 8), STAGES, FLUSH (as the GEMM's)
and TERMS. At the default precision TERMS 3 is the only value offered; TERMS 1 (plain TF32) exists there to
show that the fp32 check rejects it: build with ``{"TERMS": 1}`` (tests/agent/test_gpu_conv_tf32.py does, on
``conv2d_wide``). At ``--precision tf32`` TERMS is tunable over 1 and 3 and 1 is the default (:mod:`..terms`).
Two terms are never offered: dropping a
cross term (a_lo*b_hi or a_hi*b_lo) leaves one operand rounded to TF32, a relative error of up to
2**-11 per product, as far from the 1e-5 check as plain TF32 (tests/agent/test_fam_conv_tf32.py
models it).
"""

from __future__ import annotations

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.conv.build_epi import SPEC_PREFIX, frame
from kerngen.agent.playbook.gemm.build_tf32 import THREADS, mma_limits
from kerngen.agent.playbook.entry import A, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render
from kerngen.agent.playbook.terms import TERMS_SPLIT, offer_terms

__all__ = ["CONV2D_IDEAS", "CONV2D_SPEC_NAME", "CONV_EPI_IDEAS", "DEFAULTS", "VARIANT", "conv_epi_tf32x3", "igemm_spec",
           "ideas", "smem_bytes"]

VARIANT = "tf32x3"
CONV2D_SPEC_NAME = "playbook-conv2d-tf32x3"
TEMPLATE = "conv_tf32x3_igemm.cu.j2"
KERNEL_PACK, KERNEL_MAIN = "conv_tf32x3_pack", "conv_tf32x3_igemm"

# STAGES slots of A's tile (BM rows) and B's (BN rows) of BK + 8 floats, and the rows' table (16 bytes a row)
SMEM = "4 * STAGES * (BM + BN) * (BK + 8) + 16 * BM"
_BN_CHOICES = (128, 96, 64, 32, 16)  # the channel tile, largest first

# untuned for the conv (no GPU yet): the GEMM's BK and FLUSH (gemm/build_tf32.DEFAULTS) with a third ring slot, as
# the 4-byte gathers of A have longer latencies than the GEMM's 16-byte copies; the tile is _tile's
DEFAULTS = dict(BK=32, STAGES=3, TERMS=TERMS_SPLIT, FLUSH=1)
TUNABLES = dict(BM=[64, 128, 256], BK=[16, 32], WM=[16, 32, 64], WN=[16, 32, 48, 64, 96], STAGES=[2, 3, 4],
                TERMS=[TERMS_SPLIT], FLUSH=[0, 1])


def smem_bytes(cfg: dict[str, int]) -> int:
    """Shared memory of one block of the main kernel at ``cfg`` (the spec's SMEM, in Python)."""
    return 4 * cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * (cfg["BK"] + 8) + 16 * cfg["BM"]


def _tile(ocg: int) -> dict[str, int]:
    """BM, BN, WM, WN for a group of ``ocg`` output channels: the widest channel tile that pads them by
    at most 1/8, blocks of 128 rows, warps of 64 x 32 (the GEMM's tuned warp tile, FLUSH 1: 128
    accumulator floats), 32 x BN below 64 channels."""
    bn = next((v for v in _BN_CHOICES if -(-ocg // v) * v * 8 <= ocg * 9), 16)
    return dict(BM=128, BN=bn, WM=64, WN=32) if bn >= 64 else dict(BM=128, BN=bn, WM=32, WN=bn)


def _bns(ocg: int) -> list[int]:
    """Channel tiles worth tuning: padding the group's channels by at most 1/4, 16 only for narrow groups."""
    return [v for v in _BN_CHOICES if -(-ocg // v) * v * 4 <= ocg * 5 and (v >= 32 or ocg <= 16)] or [16]


def conv_epi_tf32x3(m: FamilyMatch, defaults: dict[str, int], name: str = SPEC_PREFIX + VARIANT) -> KernelSpec:
    """The 3xTF32 implicit GEMM for a conv_epi match (facts of :mod:`.conv.epi`)."""
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    fr = frame(m)
    oh, ow = fr.out_hw
    return igemm_spec(
        name, fr.what, fr.template_vars, defaults, x=x, g=g, ocg_n=f.OC // g, ocg=f"({w}.shape[0] // {g})",
        k_=f"({x}.shape[1] // {g}) * {f.KH} * {f.KW}", positions=f"({oh}) * ({ow})", defines=fr.defines,
        args=fr.args(x, "wt", "ktab"), weight=w, vol=False, flip=False, phases=1,
        checks=fr.checks + [f"{w}.shape[1] >= 2"],  # one input channel per group (depthwise): the depthwise kernel's
        # the k table packs (kh*DH) << 16 | kw*DW; its padding rows sit at kh*DH = 0x7fff, outside the image
        ktab_limits=[f"({fr.in_h}) + {f.PH} < 32767", f"{(f.KH - 1) * f.DH} < 32767",
                     f"{(f.KW - 1) * f.DW} < 65536"], tf32=m.tf32)


def igemm_spec(name: str, what: str, template_vars: dict, defaults: dict[str, int], *, x: str, g: int, ocg_n: int,
               ocg: str, k_: str, positions: str, defines: dict[str, str | int], args: list[dict], weight: str,
               vol: bool, flip: bool, phases: int, checks: list[str], ktab_limits: list[str],
               tf32: bool = False) -> KernelSpec:
    """The 3xTF32 implicit GEMM's spec for any convolution the template covers: ``positions`` output
    positions an image (an expression), ``k_`` the GEMM's K and ``ocg`` the channels of a group
    (expressions), ``ocg_n`` the latter's value (the tile), ``vol`` the 3-D gather, ``flip`` a
    transposed conv's weights, ``phases`` > 1 a strided transposed conv's phases (one GEMM each;
    ``positions`` then the largest phase's; see the template); ``checks`` the caller's constraints on
    the tensors, ``ktab_limits`` what the k table's packing needs of the geometry; ``tf32``: checked at
    ``--precision tf32`` (TERMS 1 offered, the default)."""
    src = render(TEMPLATE, kernel_pack=KERNEL_PACK, kernel_main=KERNEL_MAIN, vol=vol, flip=flip, phased=phases > 1,
                 **template_vars)
    d = pick(defaults, {**DEFAULTS, **_tile(ocg_n)})
    tunables = dict(TUNABLES, BN=_bns(ocg_n))
    terms = offer_terms(tunables, d, defaults, tf32)
    defs = dict(defines, K_=k_, KP=f"round_up({k_}, BK)", OCGP=f"round_up({ocg}, BN)")
    m_tot = f"{x}.shape[0] * {positions}"
    blocks = f"cdiv({m_tot}, BM) * (round_up({ocg}, BN) // BN)"
    wt_size = f"{phases * g} * round_up({ocg}, BN) * round_up({k_}, BK)"
    return make_spec(
        name,
        f"{what} as an implicit GEMM per group on the tensor cores at fp32 accuracy (3xTF32): the im2col "
        "tile of x gathered with zero-filling 4-byte cp.async, weights packed once per call to [group][OC][K] "
        + ("(a transposed conv's flipped and swapped) " if flip else "") +
        "and streamed with 16-byte cp.async through a STAGES-deep ring, operands split into tf32 hi + lo, "
        + (f"one GEMM per stride phase ({phases} of them, each a stride-1 convolution of its taps), " if phases > 1 else "")
        + "lo*hi + hi*lo + hi*hi per k8 step with mma.sync m16n8k8, per-k-tile fp32 partial sums (FLUSH), the "
        "bias and epilogue applied in registers before the store" + terms,
        src,
        tunables,
        d,
        defines=defs,
        scratch=[dict(name="wt", dtype="float32", size=wt_size),
                 dict(name="ktab", dtype="int32", size=f"{4 if vol else 2} * round_up({k_}, BK)")],
        constraints=checks + [
            *mma_limits(8, 16, SMEM),
            f"{x}.numel < 2**31", f"{m_tot} < 2**31", f"{blocks} < 2**31", f"{wt_size} < 2**31", f"{phases * g} <= 65535",
            *ktab_limits,
        ],
        steps=[dict(kernel=KERNEL_PACK, grid=[f"cdiv({wt_size}, 256)"], block=[256],
                    args=[{"name": weight}, {"name": "wt"}, {"name": "ktab"}]),
               dict(kernel=KERNEL_MAIN, grid=[blocks, 1, phases * g], block=[THREADS], shared_mem=SMEM, args=args)],
    )


# ---------------------------------------------------------------------------------------------
# ideas: the conv2d family's and conv_epi's (the same kernel, the epilogue fused in the latter)
_AFTER = frozenset({VARIANT})
_WIDE_WARPS = {"BM": 64, "WM": 32, "WN": 32, "FLUSH": 1}  # two blocks an SM: more warps to hide the gathers
_NO_FLUSH = {"FLUSH": 0, "WM": 64, "WN": 64, "BK": 16, "STAGES": 4}  # 64 x 64 warp tiles fit only with FLUSH 0
_TEXT = ("Run the convolution's implicit GEMM on the tensor cores with split-precision TF32 (3xTF32): three "
         "TF32 products per fp32 product. Each operand is split into tf32 hi + lo (the low part holds the "
         "mantissa bits TF32 drops) and lo*hi + hi*lo + hi*hi are accumulated with mma.sync m16n8k8 in fp32, "
         "per-k-tile partial sums added with round-to-nearest: fp32 accuracy at tensor-core speed. The im2col "
         "tile of x is gathered with zero-filling 4-byte cp.async (padding never branches), the weights are "
         "packed once per call to [OC][K] and streamed with 16-byte cp.async through a multi-stage ring")
_EFFECT = ("the tensor cores instead of FFMA: the 3xTF32 GEMM measured 1.15x cuBLAS fp32 at 4096^3 on an H100; "
           "the gathers of A cost more than a GEMM's loads when C is small")


def ideas(prefix: str, fused: str) -> tuple[Entry, ...]:
    return (
        Entry(f"{prefix}-tf32x3", _TEXT + fused + ".", P, _EFFECT, VARIANT, ({}, {"STAGES": 4, "BK": 16}),
              round0=True),
        Entry(f"{prefix}-tf32x3-warps", "Re-shape the 3xTF32 convolution's block: a shorter block (BM 64) of "
              "32 x 32 warp tiles leaves room for two blocks per SM, so more warps cover the latency of the "
              "gathers; or 64 x 64 warp tiles accumulating straight in the mma accumulator (twice the mma work "
              "per fragment load, kept only if the fp32 check still passes).", PAR, "0-20%", VARIANT,
              (_WIDE_WARPS, _NO_FLUSH), after=_AFTER),
        Entry(f"{prefix}-tf32x3-pipeline", "Retune the cp.async ring of the 3xTF32 convolution: more stages or "
              "a shorter k tile (BK 16 also pads K less), so more gathered tiles are in flight while the tensor "
              "cores work.", A, "0-10%", VARIANT, ({"STAGES": 4}, {"STAGES": 2, "BK": 16}), after=_AFTER),
    )


CONV2D_IDEAS = ideas("conv", "")
CONV_EPI_IDEAS = ideas("cepi", "; the conv bias and the elementwise epilogue are applied to the accumulators "
                                "before the only store")
