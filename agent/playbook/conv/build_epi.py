"""Variant builders of the conv_epi family (convolution + fused elementwise epilogue; 1-D as 2-D with
H = 1, groups, dilation): an implicit GEMM per group, a direct convolution and a depthwise kernel.
Each is ``(match, defaults) -> KernelSpec``; the match's facts are read by :mod:`.conv.epi`:

``x`` (the conv's input), ``dims`` (1 or 2), ``C``, ``OC``, ``G`` (groups), ``KH`` ``KW`` ``SH`` ``SW``
``PH`` ``PW`` ``DH`` ``DW`` (a 1-D conv has KH = SH = DH = 1, PH = 0), ``weight``, ``bias`` (dotted
parameter names; bias None without one) and ``epilogue`` (an :class:`~.epilogue.Epilogue`).
Shapes enter as defines over the bound input, so a spec follows the tensors it is resolved against;
the geometry (kernel, stride, padding, dilation, groups) is the module's and is baked in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.chain_ir import INPUT, Chain
from kerngen.agent.playbook.epilogue import EpIndex, Epilogue
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render

__all__ = ["SPEC_PREFIX", "VARIANT_NAMES", "ConvFrame", "as_conv_epi", "conv_epi_depthwise", "conv_epi_direct", "conv_epi_igemm",
           "frame", "operand_checks", "template_vars", "tensor_args"]

SPEC_PREFIX = "playbook-conv-epi-"  # + variant: Family.spec_name's spelling, which the proposer reads back
VARIANT_NAMES = ("igemm", "direct", "depthwise", "tf32x3")  # tf32x3: conv/build_tf32.py (3xTF32 on the tensor cores)
_BN_CHOICES = (128, 96, 64, 48, 32, 16)  # the igemm's channel tile, largest first
_TN_FOR_BN = {128: 8, 96: 12, 64: 8, 48: 6, 32: 4, 16: 4}  # BN / TN = 8 or 16 thread columns


# ---------------------------------------------------------------------------------------------
# geometry shared by the three kernels
def _in_hw(m: FamilyMatch) -> tuple[str | int, str]:
    """(H, W) of the input as expressions over the bound input (H = 1 for a 1-D conv)."""
    x = m.facts.x
    if m.facts.dims == 1:
        return 1, f"{x}.shape[2]"
    return f"{x}.shape[2]", f"{x}.shape[3]"


def _out_hw(m: FamilyMatch) -> tuple[str, str]:
    """(OH, OW) as expressions: floor((in + 2p - d*(k-1) - 1) / s) + 1, as torch computes them."""
    f = m.facts
    h, w = _in_hw(m)
    return (f"(({h}) + {2 * f.PH - f.DH * (f.KH - 1) - 1}) // {f.SH} + 1",
            f"(({w}) + {2 * f.PW - f.DW * (f.KW - 1) - 1}) // {f.SW} + 1")


def _defines(m: FamilyMatch) -> dict[str, str | int]:
    f = m.facts
    x, w = f.x, f.weight
    h, wd = _in_hw(m)
    oh, ow = _out_hw(m)
    return {
        "N_": f"{x}.shape[0]", "C_": f"{x}.shape[1]", "H_": h, "W_": wd, "OC_": f"{w}.shape[0]",
        "G_": f.G, "CG_": f"{x}.shape[1] // {f.G}", "OCG_": f"{w}.shape[0] // {f.G}",
        "KH_": f.KH, "KW_": f.KW, "SH_": f.SH, "SW_": f.SW, "PH_": f.PH, "PW_": f.PW,
        "DH_": f.DH, "DW_": f.DW, "OH_": oh, "OW_": ow,
    }


def _checks(m: FamilyMatch) -> list[str]:
    """What every kernel needs of the bound tensors: the module's geometry and the epilogue's operands."""
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    oh, ow = _out_hw(m)
    kdims = [f"{w}.shape[2] == {f.KW}"] if f.dims == 1 else [f"{w}.shape[2] == {f.KH}",
                                                                  f"{w}.shape[3] == {f.KW}"]
    out = [f"{x}.ndim == {f.dims + 2}", f"{x}.shape[1] == {w}.shape[1] * {g}", f"{w}.shape[0] % {g} == 0",
           *kdims, f"{oh} >= 1", f"{ow} >= 1"]
    return out + operand_checks(m, f"{w}.shape[0]")


def _epilogue(m: FamilyMatch) -> Epilogue:
    return m.facts.epilogue


# the conv bias and the epilogue, as every conv family's match holds them (facts ``bias``, ``epilogue``):
# conv_epi's kernels and conv_nd's (build_nd.py) share these three
def operand_checks(m: FamilyMatch, oc: str) -> list[str]:
    """The bias's and the epilogue's operands' sizes, ``oc`` the output channels (an expression)."""
    out = [f"{m.facts.bias}.numel == {oc}"] if m.facts.bias else []
    for p in _epilogue(m).params:
        want = {EpIndex.channel: oc, EpIndex.scalar: "1", EpIndex.full: "out.numel"}[p.index]
        out.append(f"{p.name}.numel == {want}")
    return out


def template_vars(m: FamilyMatch) -> dict[str, Any]:
    """The epilogue's template variables (conv_epi_macros.cu.j2) and whether there is a bias."""
    ep = _epilogue(m)
    return dict(has_bias=bool(m.facts.bias), ep_statements=list(ep.statements), ep_expr=ep.expr,
                n_ep=len(ep.params))


def tensor_args(m: FamilyMatch, *head: str) -> list[dict[str, Any]]:
    """Launch arguments: ``head`` tensors, the conv's bias, ``out``, then the epilogue's operands."""
    bias = [m.facts.bias] if m.facts.bias else []
    return [{"name": n} for n in (*head, *bias, "out")] + [{"name": p.name} for p in _epilogue(m).params]


def _what(m: FamilyMatch) -> str:
    f = m.facts
    ep = _epilogue(m)
    kind = "conv1d" if f.dims == 1 else "conv2d"
    extra = [s for s, on in ((f"groups {f.G}", f.G > 1), (f"dilation {f.DH}x{f.DW}",
                                                                 (f.DH, f.DW) != (1, 1))) if on]
    fused = f" + {ep.formula} fused before the store" if not ep.empty else ""
    return f"{kind}{' (' + ', '.join(extra) + ')' if extra else ''}{fused}"


@dataclass(frozen=True)
class ConvFrame:
    """What any kernel of a conv_epi match shares, for builders outside this module (the 3xTF32
    convolution of :mod:`.conv.build_tf32`): the geometry defines, the checks of the bound tensors,
    the epilogue's template variables, a one-line description, (OH, OW) and H as expressions."""

    defines: dict[str, str | int]
    checks: list[str]
    template_vars: dict[str, Any]
    what: str
    out_hw: tuple[str, str]
    in_h: str | int
    match: FamilyMatch

    def args(self, *head: str) -> list[dict[str, Any]]:
        """Launch arguments: ``head`` tensors, the conv's bias, ``out``, then the epilogue's operands."""
        return tensor_args(self.match, *head)


def frame(m: FamilyMatch) -> ConvFrame:
    return ConvFrame(_defines(m), _checks(m), template_vars(m), _what(m), _out_hw(m), _in_hw(m)[0], m)


def as_conv_epi(m: FamilyMatch) -> FamilyMatch:
    """The built-in ``conv2d`` family's match (groups 1, dilation 1, no epilogue) as a conv_epi one: the conv2d
    family's kernels are conv_epi's (:mod:`.conv.conv2d`)."""
    f = m.facts
    lead = f.weight.rsplit(".", 1)[0]
    facts = f.model_copy(update=dict(x=m.x.name, dims=2, G=1, DH=1, DW=1, epilogue=Epilogue(lead, Chain((), INPUT), ())))
    return FamilyMatch("conv_epi", m.inputs, m.params, m.outputs, facts, precision=m.precision)


# ---------------------------------------------------------------------------------------------
# implicit GEMM (one GEMM per group)
def _igemm_tile(ocg: int) -> tuple[int, int, int, int]:
    """(BM, BN, TM, TN): the widest channel tile that pads the group's OCG channels by <= 1/8."""
    bn = next((v for v in _BN_CHOICES if -(-ocg // v) * v * 8 <= ocg * 9), 16)
    return (64, bn, 4, _TN_FOR_BN[bn]) if bn == 16 else (128, bn, 8, _TN_FOR_BN[bn])


def _igemm_bns(ocg: int) -> list[int]:
    """Channel tiles worth tuning: padding the group's channels by <= 1/4, 16 only for narrow groups
    (a tile's columns are its reuse of each gathered A element)."""
    return [v for v in _BN_CHOICES if -(-ocg // v) * v * 4 <= ocg * 5 and (v >= 32 or ocg <= 16)] or [16]


def conv_epi_igemm(m: FamilyMatch, defaults: dict[str, int], name: str = SPEC_PREFIX + "igemm") -> KernelSpec:
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    kp, km = "conv_epi_pack", "conv_epi_igemm"
    src = render("conv_epi_igemm.cu.j2", kernel_pack=kp, kernel_main=km, **template_vars(m))
    bm, bn, tm, tn = _igemm_tile(f.OC // g)
    # BK 16, STAGES 4: the built-in conv2d igemm's tuned optimum (H200, 1152 configs). ASYNC is fixed per spec
    # (one value): cp.async is the fast path, plain loads (ASYNC 0) are for the CPU emulator, not worth tuning
    d = pick(defaults, dict(BM=bm, BN=bn, TM=tm, TN=tn, BK=16, STAGES=4, MIN_BLOCKS=1, ASYNC=1))
    defs = _defines(m)
    k_ = f"({x}.shape[1] // {g}) * {f.KH} * {f.KW}"
    ocg = f"({w}.shape[0] // {g})"
    defs.update(K_=k_, KP=f"round_up({k_}, BK)", OCGP=f"round_up({ocg}, BN)")
    nt = "(BM // TM) * (BN // TN)"
    smem = f"4 * STAGES * BK * (BM + BN) + 8 * round_up({k_}, BK)"
    oh, ow = _out_hw(m)
    m_tot = f"{x}.shape[0] * ({oh}) * ({ow})"
    h, _ = _in_hw(m)
    return make_spec(
        name,
        f"{_what(m)} as an implicit GEMM per group (M = N*OH*OW positions, N = OC/groups, K = C/groups*KH*KW): "
        "the dilated im2col tile of x gathered straight into shared memory (zero-filling 4-byte cp.async, or "
        "plain loads with ASYNC 0), weights packed once per call to [group][K][OC], a STAGES-deep pipeline, "
        "TM x TN FFMA register tile per thread, the epilogue applied in registers before the store",
        src,
        dict(BM=[64, 128, 256], BN=_igemm_bns(f.OC // g), TM=[4, 8], TN=[4, 6, 8, 12], BK=[8, 16, 32],
             STAGES=[2, 3, 4], MIN_BLOCKS=[1, 2], ASYNC=[d["ASYNC"]]),
        d,
        defines=defs,
        scratch=[dict(name="wt", dtype="float32", size=f"{g} * round_up({k_}, BK) * round_up({ocg}, BN)"),
                 dict(name="ktab", dtype="int32", size=f"2 * round_up({k_}, BK)")],
        constraints=_checks(m) + [
            f"{w}.shape[1] >= 2",  # one input channel per group (depthwise) is the depthwise kernel's
            "BM % TM == 0", "TM % 4 == 0", "BN % TN == 0", "TN % 2 == 0", "BN % 4 == 0",
            f"{nt} % BM == 0", f"{nt} <= 1024", f"{nt} * MIN_BLOCKS <= 2048",
            f"{smem} <= {MAX_SMEM}", f"{smem} * MIN_BLOCKS <= {MAX_SMEM}",
            f"{x}.numel < 2**31", f"{m_tot} < 2**31", f"round_up({ocg}, BN) // BN <= 65535", f"{g} <= 65535",
            # the k table packs (kh*DH) << 16 | kw*DW; its padding rows sit at kh*DH = 0x7fff, outside the image
            f"({h}) + {f.PH} < 32767", f"{(f.KH - 1) * f.DH} < 32767", f"{(f.KW - 1) * f.DW} < 65536",
        ],
        steps=[dict(kernel=kp, grid=[f"cdiv({g} * round_up({k_}, BK) * round_up({ocg}, BN), 256)"], block=[256],
                    args=[{"name": w}, {"name": "wt"}, {"name": "ktab"}]),
               dict(kernel=km, grid=[f"cdiv({m_tot}, BM)", f"round_up({ocg}, BN) // BN", g], block=[nt],
                    shared_mem=smem, args=tensor_args(m, x, "wt", "ktab"))],
    )


# ---------------------------------------------------------------------------------------------
# direct convolution
def conv_epi_direct(m: FamilyMatch, defaults: dict[str, int], name: str = SPEC_PREFIX + "direct",
                    plain: bool = False) -> KernelSpec:
    """``plain``: the built-in conv2d family's kernel (one group, no epilogue; see the template)."""
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    kernel = "conv_epi_direct"
    src = render("conv_epi_direct.cu.j2", kernel=kernel, plain=plain, **template_vars(m))
    ocg = f.OC // g
    ocb = next((v for v in (48, 32, 64, 16, 96) if ocg % v == 0), 8 if ocg % 8 == 0 else 4)
    oct_ = 16 if ocb % 16 == 0 else (8 if ocb % 8 == 0 else 4)
    if f.dims == 1:  # one output row: a thread's registers span columns instead
        d = pick(defaults, dict(TW=32, TH=1, PTY=1, PTX=4, OCB=ocb, OCT=oct_, CCH=1))
        shape = dict(TW=[16, 32, 64, 128], TH=[1], PTY=[1], PTX=[1, 2, 4, 8])
    else:
        d = pick(defaults, dict(TW=16, TH=8, PTY=4, PTX=1, OCB=ocb, OCT=oct_, CCH=1))
        # 14 and 28: tiles that fit outputs of 55 or 56 columns (the built-in conv2d_wide's) with no idle lanes
        shape = dict(TW=[8, 14, 16, 28, 32], TH=[4, 8, 16], PTY=[1, 2, 4, 8], PTX=[1, 2, 4])
    sh, sw, kh, kw, dh, dw = f.SH, f.SW, f.KH, f.KW, f.DH, f.DW
    pr = f"((TH - 1) * {sh} + {(kh - 1) * dh + 1})"
    pc = f"((TW * PTX - 1) * {sw} + {(kw - 1) * dw + 1})"
    cpatch = f"{sh * sw} * cdiv({pr}, {sh}) * cdiv({pc}, {sw})"
    smem = f"4 * (round_up(CCH * {cpatch}, 4) + CCH * {kh * kw} * OCB)"
    oh, ow = _out_hw(m)
    ocbs = sorted({v for v in (8, 16, 24, 32, 48, 64, 96, 128) if ocg % v == 0} | ({ocg} if ocg % 4 == 0 and ocg <= 256
                                                                               else set()))
    cg = f.C // g
    nthreads = "TW * (TH // PTY) * (OCB // OCT)"
    return make_spec(
        name,
        f"direct {_what(m)}: TH x TW*PTX output tile x OCB channels of one group per block, OCT x PTY x PTX "
        "outputs per thread in registers, input patch in shared memory split by stride phase (conflict-free "
        "for any stride and dilation), weights as [c][kh][kw][oc] float4 broadcasts, epilogue before the store",
        src,
        dict(**shape, OCB=ocbs or [4], OCT=[4, 8, 12, 16] if any(v % 12 == 0 for v in ocbs) else [4, 8, 16],
             CCH=sorted({1, cg}) if cg <= 4 else [1]),
        d,
        defines=_defines(m),
        constraints=_checks(m) + [
            f"{w}.shape[1] >= 2",  # one input channel per group (depthwise) is the depthwise kernel's
            f"({w}.shape[0] // {g}) % OCB == 0", "OCB % OCT == 0", "OCT % 4 == 0", "TH % PTY == 0",
            f"TH <= max(1, {oh})", f"{nthreads} <= 1024", f"{nthreads} >= 32",
            f"({x}.shape[1] // {g}) % CCH == 0", f"{smem} <= {MAX_SMEM}", "OCT * PTY * PTX <= 96",
            f"{x}.shape[0] <= 65535", f"{w}.shape[0] // OCB <= 65535",
        ],
        steps=[dict(kernel=kernel,
                    grid=["cdiv(OW_, TW * PTX) * cdiv(OH_, TH)", "OC_ // OCB", "N_"],
                    block=["TW", "TH // PTY", "OCB // OCT"], shared_mem=smem, args=tensor_args(m, x, w))],
    )


# ---------------------------------------------------------------------------------------------
# depthwise
def conv_epi_depthwise(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, w = f.x, f.weight
    kernel = "conv_epi_depthwise"
    src = render("conv_epi_depthwise.cu.j2", kernel=kernel, **template_vars(m))
    sh, sw, kh, kw, dh, dw = f.SH, f.SW, f.KH, f.KW, f.DH, f.DW
    if f.dims == 1:
        base = dict(BX=128, BY=1, PTX=4, PTY=1)
    else:
        base = dict(BX=32, BY=8, PTX=4, PTY=4)
    base["VEC"] = int((base["PTX"] * sw) % 4 == 0)
    d = pick(defaults, base)
    defs = _defines(m)
    defs["MULT_"] = f"{w}.shape[0] // {x}.shape[1]"
    oh, ow = _out_hw(m)
    seg = f"((PTX - 1) * {sw} + {(kw - 1) * dw + 1})"
    segv = f"(round_up({seg}, 4) if VEC else {seg})"
    pc = f"((BX * PTX - 1) * {sw} + {(kw - 1) * dw + 1})"
    pcp = f"round_up(max({pc}, (BX - 1) * PTX * {sw} + {segv}), 4)"
    pr = f"((BY * PTY - 1) * {sh} + {(kh - 1) * dh + 1})"
    smem = f"4 * {pr} * {pcp}"
    blocks = f"{x}.shape[0] * {w}.shape[0] * cdiv({oh}, BY * PTY) * cdiv({ow}, BX * PTX)"
    return make_spec(
        SPEC_PREFIX + "depthwise",
        f"depthwise {_what(m)}: a (BY*PTY) x (BX*PTX) output tile of one (n, channel) plane per block, the "
        "zero-padded input patch in shared memory, PTY x PTX outputs per thread, each distinct patch row read "
        "once per thread (float4 with VEC) and reused by every tap that needs it, epilogue before a float4 store",
        src,
        dict(BX=[8, 16, 32, 64, 128, 256], BY=[1] if f.dims == 1 else [1, 2, 4, 8, 16], PTX=[1, 2, 4, 8],
             PTY=[1] if f.dims == 1 else [1, 2, 4, 8], VEC=[0, 1]),
        d,
        defines=defs,
        constraints=_checks(m) + [
            f"{w}.shape[1] == 1",  # one input channel per group (with _checks: groups == C)
            "BX * BY <= 1024", "BX * BY >= 32", f"VEC == 0 or (PTX * {sw}) % 4 == 0",
            f"BY * PTY <= max(1, {oh})", "PTX * PTY <= 32", f"{smem} <= {MAX_SMEM}", f"{blocks} < 2**31",
            f"{kh * kw} <= 128",  # the taps live in registers
        ],
        steps=[dict(kernel=kernel, grid=[blocks], block=["BX", "BY"], shared_mem=smem,
                    args=tensor_args(m, x, w))],
    )
