"""Where a model run's budget goes and how a region is tuned (issue 34).

**The budget.** A region's weight is its share of the eager step time times the gain still possible there: its
time over its roofline floor, ``share * (1 - floor / eager)`` (the FLOPs its eager steps do, counted by
``torch.utils.flop_counter``, and the bytes it must at least move: what it reads from outside and writes, at the
GPU's data-sheet peaks, :mod:`kerngen.harness.gpu.roofline`). A region with no known floor (a GPU with no data
sheet, the CPU) counts its whole time as possible gain. Regions are searched heaviest first; each gets the time
left times its weight over the weight of the regions not yet searched, so what one region leaves unused goes to
the rest.

**The tune.** The region's best correct variant at a few more configurations of its spec's tunables: the default's
neighbours (one tunable changed) first, then a seeded sample of the rest, each statically pruned (constraints,
plans that do not resolve, threads and shared memory over the GPU's limits: :func:`kerngen.harness.tune.prune.
static_prune`) before it costs a launch; each is checked and timed like a variant.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Mapping

from kerngen.expr import TensorFacts
from kerngen.harness.gpu.roofline import roof
from kerngen.harness.model.execute import PlanRunner
from kerngen.harness.model.plan import arg_refs
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.prune import enumerate_configs, static_prune

__all__ = ["Floor", "RegionBudget", "region_floor", "tune_configs", "weight"]

SAMPLE = 512  # configurations examined (statically) per tune: the space of a GEMM is 36,864


@dataclass(frozen=True)
class Floor:
    """A region's roofline floor on this GPU (``ms`` None: not known) and what it counts."""

    ms: float | None
    bound: str = ""
    flops: float = 0.0
    min_bytes: int = 0


def region_floor(runner: PlanRunner, region: int, env: dict[str, Any], device: Any, facts: GpuFacts | None,
                 dtype: str) -> Floor:
    """The floor of region ``region`` of ``runner``'s (eager) plan, from its steps run once more on ``env`` (the
    eager run's values) under a FLOP counter; its bytes: the tensors it reads from outside and its last value."""
    from torch.utils.flop_counter import FlopCounterMode

    steps = [i for i, s in enumerate(runner.plan.steps) if s.region == region]
    if not steps:
        return Floor(None)
    made = {runner.plan.steps[i].node for i in steps}
    mine = dict(env)
    counter = FlopCounterMode(display=False)
    with counter:
        for i in steps:
            runner.run_step(i, mine, device)
    reads = {r for i in steps for r in arg_refs(runner.plan.steps[i].args)} - made
    last = runner.plan.steps[steps[-1]].node
    nbytes = sum(_nbytes(env.get(r)) for r in reads) + _nbytes(mine.get(last))
    flops = float(counter.get_total_flops())
    if facts is None:
        return Floor(None, flops=flops, min_bytes=nbytes)
    r = roof(flops or None, nbytes or None, dtype, facts)
    return Floor(r.ms, r.bound, flops, nbytes)


def weight(share: float, eager_ms: float, floor: Floor) -> float:
    """The region's share of the eager time times the fraction of its time over its floor."""
    if floor.ms is None or eager_ms <= 0:
        return share
    return share * max(0.0, 1.0 - floor.ms / eager_ms)


class RegionBudget:
    """``deadline(region)``: when region ``region``'s search must stop; the time left over from the regions
    searched before it is split again over the rest by their weights."""

    def __init__(self, weights: Mapping[int, float], seconds: float) -> None:
        self.left = dict(weights)
        self.end = time.monotonic() + seconds

    @property
    def over(self) -> bool:
        return time.monotonic() > self.end

    def deadline(self, region: int) -> float:
        now = time.monotonic()
        total = sum(self.left.values())
        mine = self.left.pop(region, 0.0)
        part = mine / total if total > 0 else 1.0 / max(1, len(self.left) + 1)
        return min(self.end, now + max(0.0, self.end - now) * part)


def tune_configs(spec: KernelSpec, default: dict[str, int], sizes: Mapping[str, Any],
                 tensors: Mapping[str, Any], facts: GpuFacts, count: int, seed: int = 0) -> list[dict[str, int]]:
    """Up to ``count`` configurations of ``spec`` other than ``default`` that survive static pruning at these
    tensors' shapes: the default's one-tunable neighbours first (shuffled, seeded), then a seeded sample."""
    if count <= 0:
        return []
    rng = random.Random(seed)
    neighbours = [{**default, k: v} for k, vs in spec.tunables.items() for v in vs if v != default.get(k)]
    rng.shuffle(neighbours)
    rest = [c for c in enumerate_configs(spec, seed=seed, limit=SAMPLE) if c != default]
    rng.shuffle(rest)
    seen: set[tuple] = {tuple(sorted(default.items()))}
    ordered = []
    for c in (*neighbours, *rest):
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            ordered.append(c)
    shapes = {n: TensorFacts(tuple(t.shape)) for n, t in tensors.items()}
    out: list[dict[str, int]] = []
    for start in range(0, len(ordered), 64):  # prune in slices: enough survivors are usually among the first
        kept, _ = static_prune(spec, ordered[start:start + 64], sizes=sizes, tensors=shapes, gpu=facts)
        out.extend(c for c, _ in kept)
        if len(out) >= count:
            break
    return out[:count]


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if hasattr(t, "element_size") else 0
