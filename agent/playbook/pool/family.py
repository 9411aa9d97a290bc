"""Playbook family ``pool``: one max or average pooling over 1, 2 or 3 spatial dims (``nn.MaxPool1d/2d/3d``,
``nn.AvgPool1d/2d/3d`` or their functional forms) applied to one fp32 input, and nothing around it.

The geometry (kernel size, stride, padding, dilation, ceil_mode, count_include_pad) is read from the traced
op's arguments; the output shape the problem reports
must be the one PyTorch's formula gives for it. A forward where the pool is one op of several is
not this family's (None: a chain family or the fused conv + relu + max-pool may take it); a single
pool this family cannot serve (return_indices, divisor_override, adaptive, LP or fractional
pooling, a dtype other than fp32) raises :class:`NotCovered`.
"""

from __future__ import annotations

from kerngen.agent.playbook.pool.build import pool_window
from kerngen.agent.playbook.entry import PAR, A, Entry, M
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["POOL", "PoolFacts", "output_size"]

NAME = "pool"
POOLS = {f"{mode}_pool{n}d": (mode, n) for mode in ("max", "avg") for n in (1, 2, 3)}
# pooling this family has no kernel for: a graph that is only one of these is refused with a reason
OTHER_POOLS = ("adaptive_avg_pool", "adaptive_max_pool", "max_pool1d_with_indices", "max_pool2d_with_indices",
               "max_pool3d_with_indices", "fractional_max_pool", "max_unpool", "lp_pool")


class PoolFacts(Facts):
    """One pooling op: ``mode`` "max" or "avg", ``nd`` spatial dims, per-dim tuples (outermost spatial dim
    first)."""

    mode: str
    nd: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool
    count_include_pad: bool


def output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: floor (or ceil) of the window count, and in ceil mode no
    window may start in the right padding."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _tuple(value: object, n: int, what: str) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise NotCovered(f"pooling {what} {value!r} is not an integer")
    if isinstance(value, int):
        return (value,) * n
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if len(value) == n:
            return tuple(value)
        if len(value) == 1:
            return (value[0],) * n
    raise NotCovered(f"cannot read the pooling {what} {value!r} for {n} spatial dims")


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    others = [n.op for n in live if n.op.startswith(OTHER_POOLS)]
    pools = [n for n in live if n.op in POOLS]
    if others and len(live) <= 2:  # the pool, or its (values, indices) pair and one of them
        if "with_indices" in others[0]:
            raise NotCovered("max pooling with return_indices=True (two outputs) is not covered by the playbook")
        raise NotCovered(f"{others[0]} is not covered by the playbook (it has max and average pooling with fixed "
                         "windows only)")
    if len(live) != 1 or not pools:
        return None  # no pooling, or a pooling among other ops: another family's (a chain, conv+relu+pool)
    n = pools[0]
    mode, nd = POOLS[n.op]
    if n.get("divisor_override") is not None:
        raise NotCovered("average pooling with divisor_override is not covered by the playbook")
    kernel = _tuple(n["kernel_size"], nd, "kernel_size")
    stride = _tuple(n["stride"] if n["stride"] not in (None, (), []) else n["kernel_size"], nd, "stride")
    geo = PoolFacts(mode=mode, nd=nd, kernel=kernel, stride=stride, padding=_tuple(n["padding"], nd, "padding"),
                    dilation=_tuple(n.get("dilation", 1), nd, "dilation"), ceil_mode=bool(n["ceil_mode"]),
                    count_include_pad=bool(n.get("count_include_pad", True)))
    if any(v < 1 for v in geo.kernel + geo.stride + geo.dilation) or any(p < 0 for p in geo.padding):
        raise NotCovered("pooling with a kernel, stride or dilation below 1 or a negative padding")
    if any(2 * p > k for p, k in zip(geo.padding, geo.kernel)):
        raise NotCovered("pooling padding larger than half the kernel (PyTorch refuses it too)")
    if len(g.inputs) != 1 or g.params:
        raise NotCovered("the playbook's pooling takes one input tensor and no parameters")
    x, out = g.inputs[0], g.out
    kind = n.module_type or n.op
    if x.dtype != "float32" or out.dtype != "float32":
        raise NotCovered(f"the playbook's pooling is fp32 only (input {x.dtype}, output {out.dtype})")
    if len(x.shape) not in (nd + 1, nd + 2) or len(out.shape) != len(x.shape):
        raise NotCovered(f"{kind} input of rank {len(x.shape)}: expected {nd + 1} or {nd + 2} dims")
    lead = len(x.shape) - nd
    want = tuple(output_size(s, *a, geo.ceil_mode) for s, *a in
                 zip(x.shape[lead:], geo.kernel, geo.stride, geo.padding, geo.dilation))
    if out.shape != x.shape[:lead] + want:
        raise NotCovered(f"{kind} output shape {out.shape} is not PyTorch's {x.shape[:lead] + want}")
    if any(w < 1 for w in want):
        raise NotCovered(f"{kind} has an empty output")
    return FamilyMatch.of(g, geo)


IDEAS = (
    Entry("pool-window", "One thread per OPD x OPH x OPT block of outputs (OPT consecutive along the innermost "
          "dim, so a warp's loads and stores walk the rows together): each input row of the outputs' windows is "
          "loaded once into registers and feeds every output whose window covers it (overlapping windows, "
          "stride < kernel, share their loads), max/sum in fp32 registers, one store per output. Threads whose "
          "whole footprint is inside the input skip every bounds check.", M,
          "one DRAM read of the input and one write of the output when L1/L2 catch the rows shared by "
          "neighbouring threads: ~70-90% of bandwidth", "window", ({}, {"OPT": 2}), round0=True),
    Entry("pool-rows-reuse", "More outputs per thread along the outer spatial dims (OPH rows, OPD slices): rows "
          "shared by overlapping windows in H and D are read once per thread instead of once per output row, "
          "cutting L1/L2 traffic by up to KH/SH.", M, "5-40% where windows overlap in H or D; none otherwise",
          "window", ({"OPH": 4}, {"OPH": 2, "OPD": 2}, {"OPH": 1}), after=frozenset({"window"})),
    Entry("pool-wider", "Change the outputs per thread along the innermost dim: wider (OPT 8-16) re-uses more of "
          "each loaded row and keeps more loads in flight, narrower (OPT 1-2) gives more threads and coalesced "
          "stores.", A, "0-20%", "window", ({"OPT": 8}, {"OPT": 16}, {"OPT": 1}), after=frozenset({"window"})),
    Entry("pool-block", "Re-size the block (64-1024 threads): small blocks keep more independent warps per SM "
          "when registers run short; large ones help the L1 share rows between neighbouring warps.", PAR, "0-5%",
          "window", ({"BLOCK": 128}, {"BLOCK": 512}), after=frozenset({"window"})),
    Entry("pool-stream", "Streaming stores (st.global.cs, evict-first) so that the output does not push the "
          "input rows that later windows re-read out of L2.", M, "0-5%", "window", ({"CACHE_HINT": 1},),
          after=frozenset({"window"})),
)

POOL = Family(name=NAME, leads=frozenset({Lead.pool}), recognise=_recognise,
              constraints=("one max or average pool", "nothing else", "of the one forward input"),
              variants={"window": pool_window}, ideas=IDEAS)
