"""Variant builders of the conv2d families: direct, implicit GEMM, conv+relu+maxpool."""

from __future__ import annotations


from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render


# ---------------------------------------------------------------------------------------------
# convolutions
def _conv_out_exprs(m: FamilyMatch) -> tuple[str, str]:
    """(OH, OW) of the conv as expressions over the bound input's shape."""
    f, x = m.facts, m.x.name
    return (f"({x}.shape[2] + {2 * f.PH} - {f.KH}) // {f.SH} + 1",
            f"({x}.shape[3] + {2 * f.PW} - {f.KW}) // {f.SW} + 1")


def _conv_defines(m: FamilyMatch) -> dict[str, str | int]:
    f = m.facts
    x = m.x.name
    w = f.weight
    return {
        "N_": f"{x}.shape[0]", "C_": f"{x}.shape[1]", "H_": f"{x}.shape[2]", "W_": f"{x}.shape[3]",
        "OC_": f"{w}.shape[0]", "KH_": f.KH, "KW_": f.KW, "SH_": f.SH, "SW_": f.SW,
        "PH_": f.PH, "PW_": f.PW,
        "OH_": _conv_out_exprs(m)[0], "OW_": _conv_out_exprs(m)[1],
    }


def _conv_checks(m: FamilyMatch) -> list[str]:
    f = m.facts
    x, w = m.x.name, f.weight
    return [f"{x}.ndim == 4", f"{x}.shape[1] == {w}.shape[1]", f"{w}.shape[2] == {f.KH}", f"{w}.shape[3] == {f.KW}",
            f"{x}.shape[0] <= 65535", f"{_conv_out_exprs(m)[0]} >= 1", f"{_conv_out_exprs(m)[1]} >= 1"]


def conv2d_direct(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, w = m.x.name, f.weight
    has_b = bool(f.bias)
    kernel = "conv2d_direct"
    src = render("conv2d_direct.cu.j2", kernel=kernel, has_bias=has_b)
    oc = f.OC
    ocb = next((v for v in (48, 32, 64, 16, 96) if oc % v == 0), 4 if oc % 4 == 0 else 0)
    if not ocb:
        ocb = 4
    oct_ = 16 if ocb % 16 == 0 else (8 if ocb % 8 == 0 else 4)
    d = pick(defaults, dict(TW=16, TH=8, PTY=4, OCB=ocb, OCT=oct_, CCH=1))
    c = f.C
    cpatch = "SH_ * SW_ * cdiv((TH - 1) * SH_ + KH_, SH_) * cdiv((TW - 1) * SW_ + KW_, SW_)"
    smem = f"4 * (round_up(CCH * {cpatch}, 4) + CCH * KH_ * KW_ * OCB)"
    smem_c = smem.replace("SH_", str(f.SH)).replace("SW_", str(f.SW)).replace("KH_", str(f.KH)).replace("KW_", str(f.KW))
    args = [{"name": x}, {"name": w}] + ([{"name": f.bias}] if has_b else []) + [{"name": "out"}]
    ocbs = sorted({v for v in (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, oc) if oc % v == 0 and v % 4 == 0 and v <= 256})
    return make_spec(
        "playbook-conv2d-direct",
        "direct conv2d: TH x TW output tile x OCB channels per block, OCT x PTY outputs per thread in "
        "registers, input patch in shared memory split by stride phase (conflict-free), weights as "
        "[c][kh][kw][oc] float4 broadcasts",
        src,
        dict(TW=[8, 14, 16, 28, 32], TH=[4, 8, 16], PTY=[1, 2, 4, 8], OCB=ocbs or [4], OCT=[4, 8, 12, 16],
             CCH=sorted({1, c}) if c <= 4 else [1]),
        d,
        defines=_conv_defines(m),
        constraints=_conv_checks(m) + [
            f"{w}.shape[0] % OCB == 0", "OCB % OCT == 0", "OCT % 4 == 0", "TH % PTY == 0",
            "TW * (TH // PTY) * (OCB // OCT) <= 1024", "TW * (TH // PTY) * (OCB // OCT) >= 32",
            f"{x}.shape[1] % CCH == 0", f"{smem_c} <= {MAX_SMEM}", "OCT * PTY <= 96",
        ],
        steps=[dict(kernel=kernel,
                    grid=["cdiv(OW_, TW) * cdiv(OH_, TH)", "OC_ // OCB", "N_"],
                    block=["TW", "TH // PTY", "OCB // OCT"], shared_mem=smem, args=args)],
    )


def conv2d_igemm(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, w = m.x.name, f.weight
    has_b = bool(f.bias)
    kp, km = "conv2d_pack", "conv2d_igemm"
    src = render("conv2d_igemm.cu.j2", kernel_pack=kp, kernel_main=km, has_bias=has_b)
    oc = f.OC
    bn = next((v for v in (96, 64, 128, 48, 32) if oc % v == 0), 32)
    # default: the optimum of an exhaustive tuning (1152 configs) on an H200 at the suite's shape,
    # 0.6225 ms = 1.72x eager; shapes whose OC does not split by 96 fall back to TN 8
    d = pick(defaults, dict(BM=128, BN=bn, TM=8, TN=12 if bn % 12 == 0 else 8, BK=16, STAGES=4, MIN_BLOCKS=1))
    defs = _conv_defines(m)
    k_ = f"{x}.shape[1] * {f.KH} * {f.KW}"
    defs.update(K_=k_, KP=f"round_up({k_}, BK)", OCP=f"round_up({w}.shape[0], BN)")
    nt = "(BM // TM) * (BN // TN)"
    smem = f"4 * STAGES * BK * (BM + BN) + 8 * round_up({k_}, BK)"
    oh, ow = _conv_out_exprs(m)
    m_tot = f"{x}.shape[0] * ({oh}) * ({ow})"
    args = [{"name": x}, {"name": "wt"}, {"name": "ktab"}] + ([{"name": f.bias}] if has_b else []) + [{"name": "out"}]
    return make_spec(
        "playbook-conv2d-igemm",
        "conv2d as an implicit GEMM (M = N*OH*OW positions, N = OC, K = C*KH*KW): the im2col tile of x "
        "gathered straight into shared memory with zero-filling 4-byte cp.async (padding never "
        "branches), weights packed once per call to [K][OC] and streamed with 16-byte cp.async, a "
        "STAGES-deep pipeline, TM x TN FFMA register tile per thread",
        src,
        dict(BM=[64, 128, 256], BN=[32, 48, 64, 96, 128], TM=[4, 8], TN=[4, 6, 8, 12], BK=[8, 16, 32],
             STAGES=[2, 3, 4], MIN_BLOCKS=[1, 2]),
        d,
        defines=defs,
        scratch=[dict(name="wt", dtype="float32", size=f"round_up({k_}, BK) * round_up({w}.shape[0], BN)"),
                 dict(name="ktab", dtype="int32", size=f"2 * round_up({k_}, BK)")],
        constraints=_conv_checks(m) + [
            "BM % TM == 0", "TM % 4 == 0", "BN % TN == 0", "TN % 2 == 0", "BN % 4 == 0",
            f"{nt} % BM == 0", f"{nt} <= 1024", f"{nt} * MIN_BLOCKS <= 2048",
            f"{smem} <= {MAX_SMEM}", f"{smem} * MIN_BLOCKS <= {MAX_SMEM}",
            f"{x}.shape[0] * {x}.shape[1] * {x}.shape[2] * {x}.shape[3] < 2**31",
            f"{m_tot} * {w}.shape[0] < 2**31", f"round_up({w}.shape[0], BN) // BN <= 65535",
        ],
        steps=[dict(kernel=kp, grid=[f"cdiv(round_up({k_}, BK) * round_up({w}.shape[0], BN), 256)"], block=[256],
                    args=[{"name": w}, {"name": "wt"}, {"name": "ktab"}]),
               dict(kernel=km, grid=[f"cdiv({m_tot}, BM)", f"round_up({w}.shape[0], BN) // BN"], block=[nt],
                    shared_mem=smem, args=args)],
    )


def conv_relu_pool(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, w = m.x.name, f.weight
    has_b = bool(f.bias)
    kernel = "conv_relu_maxpool"
    src = render("conv_relu_pool.cu.j2", kernel=kernel, has_bias=has_b)
    oc = f.OC
    ocb = next((v for v in (64, 32, 16, 48, 8, 4) if oc % v == 0), 4)
    oct_ = 16 if ocb % 16 == 0 else (8 if ocb % 8 == 0 else 4)
    d = pick(defaults, dict(PTW=16, PTH=8, OCB=ocb, OCT=oct_))
    defs = _conv_defines(m)
    pk, ps = f.PK, f.PS
    oh, ow = _conv_out_exprs(m)
    poh, pow_ = f"({oh} - {pk}) // {ps} + 1", f"({ow} - {pk}) // {ps} + 1"
    defs.update(PK_=pk, PS_=ps, POH_=poh, POW_=pow_)
    pr = f"(((PTH - 1) * {ps} + {pk}) - 1) * {f.SH} + {f.KH}"
    pc = f"(((PTW - 1) * {ps} + {pk}) - 1) * {f.SW} + {f.KW}"
    smem = f"4 * ({x}.shape[1] * {f.KH} * {f.KW} * OCB + {x}.shape[1] * ({pr}) * ({pc} + 1))"
    args = [{"name": x}, {"name": w}] + ([{"name": f.bias}] if has_b else []) + [{"name": "out"}]
    ocbs = sorted({v for v in (4, 8, 16, 32, 64, 128, oc) if oc % v == 0 and v % 4 == 0 and v <= 256})
    return make_spec(
        "playbook-conv-relu-maxpool",
        "conv2d + relu + max-pool fused: each thread keeps the PKxPK conv outputs under one pooled "
        "output for OCT channels in registers and writes max(relu); input rows reused across taps in "
        "registers; patch and weights in shared memory",
        src,
        dict(PTW=[4, 8, 16, 32], PTH=[1, 2, 4, 8, 16], OCB=ocbs or [4], OCT=[4, 8, 16]),
        d,
        defines=defs,
        constraints=_conv_checks(m) + [
            f"{w}.shape[0] % OCB == 0", "OCB % OCT == 0", "OCT % 4 == 0",
            "PTW * PTH * (OCB // OCT) <= 1024", "PTW * PTH * (OCB // OCT) >= 32", f"{smem} <= {MAX_SMEM}",
            f"{poh} >= 1", f"{pow_} >= 1",
        ],
        steps=[dict(kernel=kernel, grid=["cdiv(POW_, PTW) * cdiv(POH_, PTH)", "OC_ // OCB", "N_"],
                    block=["PTW", "PTH", "OCB // OCT"], shared_mem=smem, args=args)],
    )
