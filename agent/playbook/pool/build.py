"""Variant builder of the ``pool`` family (:mod:`.pool.family`): ``window``, one thread per block of
outputs with the windows' rows in registers (``pool_window.cu.j2``).

1-D and 2-D pooling run as 3-D with size-1 outer dims (kernel 1, stride 1, no padding): one
template, one kernel shape. The geometry is rendered into the source as constants (every span and
tap of the unrolled loops is then known to the compiler); the tensor sizes enter as ``defines``
over the bound tensors, so the spec follows the shapes it is resolved against.
"""

from __future__ import annotations

from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render, three

__all__ = ["pool_window", "window_defaults"]

MAX_OUTPUTS_PER_THREAD = 32  # accumulators in registers; past this the kernel spills
MAX_ROW_SPAN = 64  # one input row's values a thread holds at once


def _span(n_out: int, k: int, s: int, d: int) -> int:
    return (n_out - 1) * s + (k - 1) * d + 1


def _overlaps(k: int, s: int, d: int) -> bool:
    """Neighbouring windows share input positions (a wider thread re-uses loads)."""
    return s < (k - 1) * d + 1


def window_defaults(facts: Any) -> dict[str, int]:
    """Outputs per thread: wide along W where windows overlap there (a 1-D pool has only W), a few
    rows along H where they overlap in H; slices along D stay 1 (the L1/L2 catch those)."""
    nd = facts.nd
    _, kh, kw = three(facts.kernel, 1)
    _, sh, sw = three(facts.stride, 1)
    _, dh, dw = three(facts.dilation, 1)
    if _overlaps(kw, sw, dw):
        opt = 8 if nd == 1 else 4
    else:
        opt = 2
    while opt > 1 and _span(opt, kw, sw, dw) > MAX_ROW_SPAN:
        opt //= 2
    oph = 2 if nd >= 2 and _overlaps(kh, sh, dh) else 1
    return dict(BLOCK=256, OPT=opt, OPH=oph, OPD=1, CACHE_HINT=0)


def pool_window(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    x, nd = m.x, f.nd
    k, s = three(f.kernel, 1), three(f.stride, 1)
    p, d = three(f.padding, 0), three(f.dilation, 1)
    rank = len(x.shape)
    lead = rank - nd
    # the input's and the output's spatial dims as (depth, height, width); missing outer dims are 1
    ins = ["1"] * (3 - nd) + [f"{x.name}.shape[{i}]" for i in range(lead, rank)]
    outs = ["1"] * (3 - nd) + [f"out.shape[{i}]" for i in range(lead, rank)]
    planes = f"({x.name}.numel // ({ins[0]} * {ins[1]} * {ins[2]}))"
    groups = [f"cdiv({outs[0]}, OPD)", f"cdiv({outs[1]}, OPH)", f"cdiv({outs[2]}, OPT)"]
    total = f"({planes} * {groups[0]} * {groups[1]} * {groups[2]})"
    kernel = f"{f.mode}_pool{nd}d"
    src = render("pool_window.cu.j2", kernel=kernel, mode=f.mode, k=k, s=s, p=p, d=d,
                 count_include_pad=bool(f.count_include_pad))
    d0 = pick(defaults, window_defaults(f))
    # PyTorch's output size per spatial dim: the kernel trusts OD/OH/OW, so the shapes must agree
    shape_ok = []
    for i in range(nd):
        n, o = f"{x.name}.shape[{lead + i}]", f"out.shape[{lead + i}]"
        ki, si, pi, di = f.kernel[i], f.stride[i], f.padding[i], f.dilation[i]
        cnt = f"(({n} + {2 * pi - di * (ki - 1) - 1 + (si - 1 if f.ceil_mode else 0)}) // {si} + 1)"
        if f.ceil_mode:
            cnt = f"({cnt} - 1 if ({cnt} - 1) * {si} >= {n} + {pi} else {cnt})"
        shape_ok.append(f"{o} == {cnt}")
    what = "max (NaN-propagating)" if f.mode == "max" else (
        "average (divisor with padding)" if f.count_include_pad else "average (divisor without padding)")
    return make_spec(
        "playbook-pool-window",
        f"{what} pooling {nd}-D, kernel {f.kernel} stride {f.stride} padding {f.padding} dilation "
        f"{f.dilation}{' ceil_mode' if f.ceil_mode else ''}: a thread per OPD x OPH x OPT outputs, each "
        "input row under their windows loaded once into registers and folded into every output it feeds; "
        "threads inside the input skip the bounds checks",
        src,
        dict(BLOCK=[64, 128, 256, 512, 1024], OPT=[1, 2, 4, 8, 16], OPH=[1, 2, 4] if nd >= 2 else [1],
             OPD=[1, 2] if nd == 3 else [1], CACHE_HINT=[0, 1]),
        d0,
        defines={"ID": ins[0], "IH": ins[1], "IW": ins[2], "OD": outs[0], "OH": outs[1], "OW": outs[2],
                 "NDG": groups[0], "NHG": groups[1], "NWG": groups[2], "TOTAL": total},
        # several outputs a thread along a dim of one output (a 1-D pool's H and D) would only add dead work
        constraints=[*shape_ok, f"OPH == 1 or {outs[1]} > 1", f"OPD == 1 or {outs[0]} > 1",
                     f"{total} < 2**31 - 1024", f"OPD * OPH * OPT <= {MAX_OUTPUTS_PER_THREAD}",
                     f"(OPT - 1) * {s[2]} + {(k[2] - 1) * d[2] + 1} <= {MAX_ROW_SPAN}",
                     f"{ins[0]} * {ins[1]} * {ins[2]} < 2**31", f"{outs[0]} * {outs[1]} * {outs[2]} < 2**31"],
        steps=[dict(kernel=kernel, grid=[f"cdiv({total}, BLOCK)"], block=["BLOCK"],
                    args=[{"name": x.name}, {"name": "out"}])],
    )
