"""The conv_nd family's builder (``(match, defaults) -> KernelSpec``): a direct 3-D convolution or
transposed convolution (1-D and 2-D as 3-D with leading sizes 1), groups, dilation, output padding,
with the conv bias and the traced elementwise epilogue fused before the store. The match's facts
(made by :mod:`.conv.nd`): ``dims``, ``transposed``, ``C``, ``OC``, ``G``, ``K S P D OP`` (3-tuples),
``x``, ``weight``, ``bias`` (None without one), ``epilogue``, ``kind``. Input sizes enter as defines
over the bound input; the geometry is the module's and is baked in."""

from __future__ import annotations

import math

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.conv.build_epi import operand_checks, template_vars, tensor_args
from kerngen.agent.playbook.conv.build_tf32 import igemm_spec
from kerngen.agent.playbook.conv.build_wgmma import VARIANT as WGMMA, ConvGemm, conv_wgmma_spec
from kerngen.agent.playbook.epilogue import Epilogue
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render

__all__ = ["conv_nd_direct", "conv_nd_tf32x3", "conv_nd_wgmma"]

KERNEL = "conv_nd_direct"


def _spatial_in(m: FamilyMatch) -> list[str]:
    """(D, H, W) of the input as expressions over the bound input (1 for the missing dims)."""
    x, dims = m.facts.x, m.facts.dims
    return ["1"] * (3 - dims) + [f"{x}.shape[{2 + i}]" for i in range(dims)]


def _spatial_out(m: FamilyMatch) -> list[str]:
    f = m.facts
    outs = []
    for i, k, s, p, d, op in zip(_spatial_in(m), f.K, f.S, f.P, f.D, f.OP):
        if f.transposed:
            outs.append(f"(({i}) - 1) * {s} + {d * (k - 1) + op + 1 - 2 * p}")
        else:
            outs.append(f"(({i}) + {2 * p - d * (k - 1) - 1}) // {s} + 1")
    return outs


def _oc(m: FamilyMatch) -> str:
    """The output channels as an expression (transposed weights are [C][OC/G][k...])."""
    f = m.facts
    return f"{f.weight}.shape[1] * {f.G}" if f.transposed else f"{f.weight}.shape[0]"


def _checks(m: FamilyMatch) -> list[str]:
    """What every kernel needs of the bound tensors: the module's geometry and the epilogue's operands."""
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    dout, hout, wout = _spatial_out(m)
    kdims = [f"{w}.shape[{2 + i}] == {k}" for i, k in enumerate(f.K[3 - f.dims:])]
    return [f"{x}.ndim == {f.dims + 2}", f"{x}.shape[1] % {g} == 0", *kdims,
            f"{w}.shape[0] == {x}.shape[1]" if f.transposed else f"{w}.shape[1] * {g} == {x}.shape[1]",
            f"({dout}) >= 1 and ({hout}) >= 1 and ({wout}) >= 1", *operand_checks(m, _oc(m))]


def _what(m: FamilyMatch) -> str:
    f = m.facts
    ep: Epilogue = f.epilogue
    geometry = "x".join(map(str, f.K[3 - f.dims:]))
    fused = f" + {ep.formula} fused before the store" if not ep.empty else ""
    return f"{f.kind} ({geometry} kernel, groups {f.G}){fused}"


def conv_nd_direct(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    (din, hin, win), (dout, hout, wout) = _spatial_in(m), _spatial_out(m)
    oc = _oc(m)
    ocg = f"({oc}) // {g}"
    defines: dict[str, str | int] = {
        "N_": f"{x}.shape[0]", "C_": f"{x}.shape[1]", "D_": din, "H_": hin, "W_": win, "OC_": oc,
        "CG_": f"{x}.shape[1] // {g}", "OCG_": ocg, "OD_": dout, "OH_": hout, "OW_": wout,
        "TRANSPOSED": int(f.transposed),
        **{f"{a}{axis}_": v for a, t in (("K", f.K), ("S", f.S), ("P", f.P), ("L", f.D))
           for axis, v in zip("DHW", t)},
        # a transposed conv's taps that can reach an output: every S / gcd(S, L)-th (see the template)
        **{f"Q{axis}_": s // math.gcd(s, d) for axis, s, d in zip("DHW", f.S, f.D)},
    }
    total = f"{x}.shape[0] * (({oc}) // OCT) * ({dout}) * ({hout}) * ({wout})"
    src = render("conv_nd_direct.cu.j2", kernel=KERNEL, **template_vars(m))
    return make_spec(
        "playbook-conv-nd-direct",
        f"direct {_what(m)}: one thread per output position and OCT "
        "channels of one group, consecutive threads on consecutive output columns, each input value loaded once "
        "for the OCT channels" + (", input positions (o + p - k*d) / s where they divide exactly"
                                  if f.transposed else ""),
        src, dict(BLOCK=[128, 256, 512], OCT=[1, 2, 4, 8]), pick(defaults, dict(BLOCK=256, OCT=1)),
        defines=defines,
        constraints=[*_checks(m), f"({ocg}) % OCT == 0", f"cdiv({total}, BLOCK) < 2**31"],
        steps=[dict(kernel=KERNEL, grid=[f"cdiv({total}, BLOCK)"], block=["BLOCK"], args=tensor_args(m, x, w))],
    )


def conv_nd_tf32x3(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """The 3xTF32 implicit GEMM (:func:`.conv.build_tf32.igemm_spec`) for a 3-D convolution or a transposed
    one. Of stride 1, a transposed conv is the convolution of x with the weights swapped to [OC][CG] and
    flipped along every axis, padding d*(k-1)-p on the low side (the high side's d*(k-1)-p+op comes from
    the output size; the gather zero-fills both). With a stride it scatters; split by the output's phase
    (o mod s per axis) it is one stride-1 convolution per phase over that phase's taps (``phased`` in
    the template: J = ceil(k / q) taps of dilation d / gcd(s, d), q = s / gcd(s, d), zero weights where
    a phase has fewer)."""
    f = m.facts
    x, w, g = f.x, f.weight, f.G
    (din, hin, win), (dout, hout, wout) = _spatial_in(m), _spatial_out(m)
    oc = _oc(m)
    phased = f.transposed and set(f.S) != {1}
    vol = f.dims == 3 or phased
    defines: dict[str, str | int] = {
        "N_": f"{x}.shape[0]", "C_": f"{x}.shape[1]", "H_": hin, "W_": win, "OC_": oc, "G_": g,
        "CG_": f"{x}.shape[1] // {g}", "OCG_": f"({oc}) // {g}", "OH_": hout, "OW_": wout,
    }
    if phased:
        gcd = [math.gcd(s, d) for s, d in zip(f.S, f.D)]
        step = [s // c for s, c in zip(f.S, gcd)]
        taps = [-(-k // q) for k, q in zip(f.K, step)]
        geo = dict(K=taps, S=(1, 1, 1), P=(0, 0, 0), D=[d // c for d, c in zip(f.D, gcd)])
        phases = f.S[0] * f.S[1] * f.S[2]
        positions = f"cdiv({dout}, {f.S[0]}) * cdiv({hout}, {f.S[1]}) * cdiv({wout}, {f.S[2]})"
    else:
        stride = (1, 1, 1) if f.transposed else f.S
        pad = tuple(d * (k - 1) - p for k, p, d in zip(f.K, f.P, f.D)) if f.transposed else f.P
        geo = dict(K=f.K, S=stride, P=pad, D=f.D)
        phases, positions = 1, f"({dout}) * ({hout}) * ({wout})"
    defines.update({f"{a}{axis}_": v for a in "KSPD" for axis, v in zip("DHW", geo[a]) if vol or axis != "D"})
    if vol:
        defines.update({"D_": din, "OD_": dout})
    if phased:
        defines.update({f"T{a}{axis}_": v for a, t in (("K", f.K), ("S", f.S), ("P", f.P), ("L", f.D),
                                                       ("Q", step)) for axis, v in zip("DHW", t)}, NPH=phases)
    kvol = geo["K"][0] * geo["K"][1] * geo["K"][2]
    # the rows' and the k table's sentinels (2**30 and 0x3fffffff) stay outside the volume
    if phased:  # an input origin is u + base - (J-1)*d: within the sum of each axis's k*d + p + s of u
        margin = sum(abs(k * d) + abs(p) + s for k, d, p, s in zip(f.K, f.D, f.P, f.S))
        limits = [f"({din}) + {margin} < 2**30", f"({dout}) + {margin} < 2**30"]
    elif vol:
        limits = [f"({din}) + {abs(geo['P'][0])} < 2**30", f"({dout}) * {geo['S'][0]} + {abs(geo['P'][0])} < 2**30"]
    else:  # the k table packs (kh*DH) << 16 | kw*DW; its padding rows sit at kh*DH = 0x7fff
        limits = [f"({hin}) + {abs(geo['P'][1])} < 32767", f"({hout}) + {abs(geo['P'][1])} < 32767",
                  f"{(geo['K'][1] - 1) * geo['D'][1]} < 32767", f"{(geo['K'][2] - 1) * geo['D'][2]} < 65536"]
    how = (f" (stride {f.S[3 - f.dims:]}: {phases} phases, each a stride-1 convolution of its taps)" if phased
           else " (stride 1: the convolution of the flipped weights)" if f.transposed else "")
    return igemm_spec(
        "playbook-conv-nd-tf32x3", _what(m) + how, template_vars(m), defaults, x=x, g=g, ocg_n=f.OC // g,
        ocg=f"(({oc}) // {g})", k_=f"({x}.shape[1] // {g}) * {kvol}", positions=positions, defines=defines,
        args=tensor_args(m, x, "wt", "ktab"), weight=w, vol=vol, flip=f.transposed and not phased, phases=phases,
        checks=[*_checks(m), f"{x}.shape[1] // {g} >= 2"],  # one channel a group: the direct kernel's
        ktab_limits=limits, tf32=m.tf32)


def conv_nd_wgmma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """The wgmma implicit GEMM (:mod:`.conv.build_wgmma`, Hopper only) of a 3-D convolution or of a transposed one of
    stride 1 (the convolution of its weights swapped and flipped, padding d*(k-1)-p on the low side, as
    :func:`conv_nd_tf32x3` explains). A strided transposed conv's output phases are the tf32x3 variant's alone."""
    f = m.facts
    if f.transposed and set(f.S) != {1}:
        raise ValueError("a strided transposed convolution: its output phases are the tf32x3 variant's, not wgmma's")
    x, g = f.x, f.G
    (din, hin, win), (dout, hout, wout) = _spatial_in(m), _spatial_out(m)
    oc = _oc(m)
    stride = (1, 1, 1) if f.transposed else f.S
    pad = tuple(d * (k - 1) - p for k, p, d in zip(f.K, f.P, f.D)) if f.transposed else f.P
    defines: dict[str, str | int] = {
        "N_": f"{x}.shape[0]", "C_": f"{x}.shape[1]", "D_": din, "H_": hin, "W_": win, "OC_": oc, "G_": g,
        "CG_": f"{x}.shape[1] // {g}", "OCG_": f"({oc}) // {g}", "OD_": dout, "OH_": hout, "OW_": wout,
        **{f"{a}{axis}_": v for a, t in (("K", f.K), ("S", stride), ("P", pad), ("D", f.D))
           for axis, v in zip("DHW", t)},
    }
    c = ConvGemm(_what(m) + (" (stride 1: the convolution of the flipped weights)" if f.transposed else ""),
                 template_vars(m), defines, _checks(m), x, f.weight, f.bias,
                 tuple(p.name for p in f.epilogue.params), g, f.C // g, f.OC // g, oc, f.K[0] * f.K[1] * f.K[2],
                 f"({dout}) * ({hout}) * ({wout})", flip=f.transposed)
    return conv_wgmma_spec(c, "float32", defaults, f"playbook-conv-nd-{WGMMA}", m.tf32, m.tensor_facts())
