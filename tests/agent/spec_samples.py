"""Configurations of a spec to compile in a CPU test: a seeded random sample of its tunables'
product that resolves at the given tensors (constraints hold, the plan is within CUDA's limits)."""

from __future__ import annotations

import itertools
import random

from kerngen.errors import SpecError
from kerngen.harness.spec import plan


def sampled_plans(spec, facts, limit: int, seed: int = 0) -> list:
    """Up to ``limit`` resolved plans of ``spec`` at ``facts``, configurations drawn in a seeded order."""
    names = list(spec.tunables)
    combos = list(itertools.product(*(spec.tunables[n] for n in names)))
    random.Random(seed).shuffle(combos)
    out = []
    for combo in combos:
        if len(out) >= limit:
            break
        try:
            out.append(plan.resolve(spec, sizes={}, tensors=facts, config=dict(zip(names, combo))))
        except SpecError:  # a configuration the spec's constraints (or CUDA's limits) refuse at these shapes
            continue
    return out
