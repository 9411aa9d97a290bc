"""The conv_nd family's builder (``(match, defaults) -> KernelSpec``): a direct 3-D convolution or
transposed convolution (1-D and 2-D as 3-D with leading sizes 1), groups, dilation, output padding,
with the conv bias and the traced elementwise epilogue fused before the store. The match's facts
(made by :mod:`.fam_conv_nd`): ``dims``, ``transposed``, ``C``, ``OC``, ``G``, ``K S P D OP`` (3-tuples),
``x``, ``weight``, ``bias`` (None without one), ``epilogue``, ``kind``. Input sizes enter as defines
over the bound input; the geometry is the module's and is baked in."""

from __future__ import annotations

import math

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.epilogue import EpIndex, Epilogue
from kerngen.agent.playbook.match import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render

__all__ = ["conv_nd_direct"]

KERNEL = "conv_nd_direct"


def _spatial_in(m: FamilyMatch) -> list[str]:
    """(D, H, W) of the input as expressions over the bound input (1 for the missing dims)."""
    x, dims = m.facts["x"], m.facts["dims"]
    return ["1"] * (3 - dims) + [f"{x}.shape[{2 + i}]" for i in range(dims)]


def _spatial_out(m: FamilyMatch) -> list[str]:
    f = m.facts
    outs = []
    for i, k, s, p, d, op in zip(_spatial_in(m), f["K"], f["S"], f["P"], f["D"], f["OP"]):
        if f["transposed"]:
            outs.append(f"(({i}) - 1) * {s} + {d * (k - 1) + op + 1 - 2 * p}")
        else:
            outs.append(f"(({i}) + {2 * p - d * (k - 1) - 1}) // {s} + 1")
    return outs


def conv_nd_direct(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, w, g = f["x"], f["weight"], f["G"]
    ep: Epilogue = f["epilogue"]
    (din, hin, win), (dout, hout, wout) = _spatial_in(m), _spatial_out(m)
    oc = f"{w}.shape[1] * {g}" if f["transposed"] else f"{w}.shape[0]"  # transposed weights: [C][OC/G][k...]
    ocg = f"({oc}) // {g}"
    defines: dict[str, str | int] = {
        "N_": f"{x}.shape[0]", "C_": f"{x}.shape[1]", "D_": din, "H_": hin, "W_": win, "OC_": oc,
        "CG_": f"{x}.shape[1] // {g}", "OCG_": ocg, "OD_": dout, "OH_": hout, "OW_": wout,
        "TRANSPOSED": int(f["transposed"]),
        **{f"{a}{axis}_": v for a, t in (("K", f["K"]), ("S", f["S"]), ("P", f["P"]), ("L", f["D"]))
           for axis, v in zip("DHW", t)},
        # a transposed conv's taps that can reach an output: every S / gcd(S, L)-th (see the template)
        **{f"Q{axis}_": s // math.gcd(s, d) for axis, s, d in zip("DHW", f["S"], f["D"])},
    }
    total = f"{x}.shape[0] * (({oc}) // OCT) * ({dout}) * ({hout}) * ({wout})"
    kdims = [f"{w}.shape[{2 + i}] == {k}" for i, k in enumerate(f["K"][3 - f["dims"]:])]
    checks = [f"{x}.ndim == {f['dims'] + 2}", f"{x}.shape[1] % {g} == 0", *kdims,
              f"{w}.shape[0] == {x}.shape[1]" if f["transposed"] else f"{w}.shape[1] * {g} == {x}.shape[1]",
              f"({dout}) >= 1 and ({hout}) >= 1 and ({wout}) >= 1"]
    if f.get("bias"):
        checks.append(f"{f['bias']}.numel == {oc}")
    for p in ep.params:
        want = {EpIndex.channel: oc, EpIndex.scalar: "1", EpIndex.full: "out.numel"}[p.index]
        checks.append(f"{p.name}.numel == {want}")
    src = render("conv_nd_direct.cu.j2", kernel=KERNEL, has_bias=bool(f.get("bias")),
                 ep_statements=list(ep.statements), ep_expr=ep.expr, n_ep=len(ep.params))
    bias = [f["bias"]] if f.get("bias") else []
    args = [{"name": n} for n in (x, w, *bias, "out")] + [{"name": p.name} for p in ep.params]
    geometry = "x".join(map(str, f["K"][3 - f["dims"]:]))
    fused = f" + {ep.formula} fused before the store" if not ep.empty else ""
    return make_spec(
        "playbook-conv-nd-direct",
        f"direct {f['kind']} ({geometry} kernel, groups {g}){fused}: one thread per output position and OCT "
        "channels of one group, consecutive threads on consecutive output columns, each input value loaded once "
        "for the OCT channels" + (", input positions (o + p - k*d) / s where they divide exactly"
                                  if f["transposed"] else ""),
        src, dict(BLOCK=[128, 256, 512], OCT=[1, 2, 4, 8]), pick(defaults, dict(BLOCK=256, OCT=1)),
        defines=defines,
        constraints=[*checks, f"({ocg}) % OCT == 0", f"cdiv({total}, BLOCK) < 2**31"],
        steps=[dict(kernel=KERNEL, grid=[f"cdiv({total}, BLOCK)"], block=["BLOCK"], args=args)],
    )
