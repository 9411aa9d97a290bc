"""Playbook family (registry) ``pool``: one max or average pooling over 1, 2 or 3 spatial dims
(``nn.MaxPool1d/2d/3d``, ``nn.AvgPool1d/2d/3d`` or their functional forms with literal arguments)
applied to one fp32 input, and nothing around it.

The geometry (kernel size, stride, padding, dilation, ceil_mode, count_include_pad) is read from
the meta-built module, or from the call's literal arguments; the output shape the problem reports
must be the one PyTorch's formula gives for it. A forward where the pool is one op of several is
not this family's (None: a chain family or the fused conv + relu + max-pool may take it); a single
pool this family cannot serve (return_indices, divisor_override, adaptive, LP or fractional
pooling, a dtype other than fp32) raises :class:`NotCovered`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kerngen.agent.playbook.build_pool import pool_window
from kerngen.agent.playbook.entry import PAR, A, Entry, M
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.forward_source import UNKNOWN, kwarg, module_of
from kerngen.agent.playbook.match import FamilyMatch, Read
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FAMILY", "PoolGeometry", "output_size", "recognise"]

NAME = "pool"
POOL_MODULES = {f"{kind}Pool{n}d": (mode, n) for kind, mode in (("Max", "max"), ("Avg", "avg")) for n in (1, 2, 3)}
POOL_FUNCTIONS = {f"{mode}_pool{n}d": (mode, n) for mode in ("max", "avg") for n in (1, 2, 3)}
FUNCTIONAL_PREFIXES = ("F.", "torch.", "nn.functional.", "torch.nn.functional.")
# pooling this family has no kernel for: a problem that is only one of these is refused with a reason
OTHER_POOLS = ("AdaptiveAvgPool", "AdaptiveMaxPool", "adaptive_avg_pool", "adaptive_max_pool", "LPPool", "lp_pool",
               "FractionalMaxPool", "fractional_max_pool", "MaxUnpool", "max_unpool", "max_pool1d_with_indices",
               "max_pool2d_with_indices", "max_pool3d_with_indices")
# functional signatures after the input: argument name -> position in the call
MAX_ARGS = {"kernel_size": 1, "stride": 2, "padding": 3, "dilation": 4, "ceil_mode": 5, "return_indices": 6}
AVG_ARGS = {"kernel_size": 1, "stride": 2, "padding": 3, "ceil_mode": 4, "count_include_pad": 5, "divisor_override": 6}


@dataclass(frozen=True)
class PoolGeometry:
    """One pooling op: ``mode`` "max" or "avg", ``nd`` spatial dims, per-dim tuples (outermost
    spatial dim first)."""

    mode: str
    nd: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool
    count_include_pad: bool

    def facts(self) -> dict[str, Any]:
        return dict(mode=self.mode, nd=self.nd, kernel=self.kernel, stride=self.stride, padding=self.padding,
                    dilation=self.dilation, ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad)


def output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: floor (or ceil) of the window count, and in ceil mode no
    window may start in the right padding."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _tuple(value: Any, n: int, what: str) -> tuple[int, ...]:
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


def _from_module(mod: Any, mode: str, nd: int) -> PoolGeometry:
    if getattr(mod, "return_indices", False):
        raise NotCovered("max pooling with return_indices=True (two outputs) is not covered by the playbook")
    if getattr(mod, "divisor_override", None) is not None:
        raise NotCovered("average pooling with divisor_override is not covered by the playbook")
    kernel = _tuple(mod.kernel_size, nd, "kernel_size")
    stride = _tuple(mod.stride if mod.stride not in (None, (), []) else mod.kernel_size, nd, "stride")
    return PoolGeometry(mode, nd, kernel, stride, _tuple(mod.padding, nd, "padding"),
                        _tuple(getattr(mod, "dilation", 1), nd, "dilation"), bool(mod.ceil_mode),
                        bool(getattr(mod, "count_include_pad", True)))


def _from_call(node: Any, mode: str, nd: int, model: Any) -> PoolGeometry:
    positions = MAX_ARGS if mode == "max" else AVG_ARGS
    args = {name: kwarg(node, name, pos, model=model) for name, pos in positions.items()}
    if any(v is UNKNOWN for v in args.values()) or args["kernel_size"] is None:
        raise NotCovered(f"cannot read the {mode}_pool{nd}d arguments from the source (not literals)")
    if args.get("return_indices"):
        raise NotCovered("max pooling with return_indices=True (two outputs) is not covered by the playbook")
    if args.get("divisor_override") is not None:
        raise NotCovered("average pooling with divisor_override is not covered by the playbook")
    stride = args["stride"] if args["stride"] not in (None, (), []) else args["kernel_size"]
    cip = args.get("count_include_pad")
    return PoolGeometry(mode, nd, _tuple(args["kernel_size"], nd, "kernel_size"), _tuple(stride, nd, "stride"),
                        _tuple(args["padding"] or 0, nd, "padding"), _tuple(args.get("dilation") or 1, nd, "dilation"),
                        bool(args["ceil_mode"]), True if cip is None else bool(cip))


def _check(g: PoolGeometry) -> None:
    if any(v < 1 for v in g.kernel + g.stride + g.dilation) or any(p < 0 for p in g.padding):
        raise NotCovered("pooling with a kernel, stride or dilation below 1 or a negative padding")
    if any(2 * p > k for p, k in zip(g.padding, g.kernel)):
        raise NotCovered("pooling padding larger than half the kernel (PyTorch refuses it too)")


def recognise(r: Read) -> FamilyMatch | None:
    pools = [(k, c, n) for k, c, n in r.kinds if k in POOL_MODULES or k in POOL_FUNCTIONS]
    others = [k for k, _, _ in r.kinds if k.startswith(OTHER_POOLS)]
    if len(r.kinds) != 1 or r.fwd.binops or not (pools or others):
        return None  # no pooling, or a pooling among other ops: another family's (a chain, conv+relu+pool)
    if others:
        raise NotCovered(f"{others[0]} is not covered by the playbook (it has max and average pooling with fixed "
                         "windows only)")
    kind, callee, node = pools[0]
    mode, nd = POOL_MODULES.get(kind) or POOL_FUNCTIONS[kind]
    mod = module_of(r.model, callee)
    if mod is not None:
        geo = _from_module(mod, mode, nd)
    elif callee.startswith(FUNCTIONAL_PREFIXES) and kind in POOL_FUNCTIONS:
        geo = _from_call(node, mode, nd, r.model)
    else:
        raise NotCovered(f"cannot read the {kind} geometry (model did not build on the meta device)")
    _check(geo)
    if len(r.match.inputs) != 1 or r.match.params:
        raise NotCovered("the playbook's pooling takes one input tensor and no parameters")
    x, out = r.match.inputs[0], r.out
    if x.dtype != "float32" or out.dtype != "float32":
        raise NotCovered(f"the playbook's pooling is fp32 only (input {x.dtype}, output {out.dtype})")
    if len(x.shape) not in (nd + 1, nd + 2) or len(out.shape) != len(x.shape):
        raise NotCovered(f"{kind} input of rank {len(x.shape)}: expected {nd + 1} or {nd + 2} dims")
    lead = len(x.shape) - nd
    want = tuple(output_size(n, *a, geo.ceil_mode) for n, *a in
                 zip(x.shape[lead:], geo.kernel, geo.stride, geo.padding, geo.dilation))
    if out.shape != x.shape[:lead] + want:
        raise NotCovered(f"{kind} output shape {out.shape} is not PyTorch's {x.shape[:lead] + want}")
    if any(w < 1 for w in want):
        raise NotCovered(f"{kind} has an empty output")
    r.match.facts = geo.facts()
    return r.match


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

FAMILY: Family | None = Family(name=NAME, recognise=recognise, variants={"window": pool_window}, ideas=IDEAS)
