"""Degenerate problems: outputs that barely depend on the inputs (cheat 9: hard-coding wins).

Runs the reference twice with the same model and two input seeds. If the outputs are nearly the
same (``||o1 - o2|| / ||o1|| < 1e-3``), or the output is (near) constant, a kernel could return a
constant and pass the check: the problem is degenerate and should be fixed (other input
distribution, other sizes) before a search spends GPU time on it.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

REL_DIFF_MIN = 1e-3  # below this, the output does not depend enough on the input
CONSTANT_STD = 1e-6  # output std below this times max|output| counts as constant
CHUNK = 1 << 24  # output elements compared at once (fp64: 128 MB per side)


class DegeneracyReport(BaseModel):
    degenerate: bool
    reason: str
    rel_diff: float  # ||o1 - o2|| / ||o1|| over all outputs
    output_std: float  # std of the first seed's outputs (all outputs together)


def check_seed_dependence(problem: Any, device: Any = "cpu", seeds: tuple[int, int] = (11, 12)) -> DegeneracyReport:
    """Same model (built from ``seeds[0]``), inputs from each seed: degenerate if the outputs
    barely differ or are (near) constant. ``problem`` is a :class:`~kerngen.problems.problem.Problem`;
    run it at a size the device can afford."""
    import torch

    s1, s2 = seeds
    model = problem.build_model(device, s1)
    o1 = problem.run_reference(model, problem.make_inputs(device, s1))
    o2 = problem.run_reference(model, problem.make_inputs(device, s2))
    stats = _Stats()
    for x, y in zip(o1, o2):
        # chunk by chunk in fp64: KernelBench's 8.6 GB outputs as whole fp64 copies, their
        # difference and masks needed 70 GB and ran the baseline out of memory on an 80 GB GPU
        fx, fy = x.detach().reshape(-1), y.detach().reshape(-1)
        for lo in range(0, fx.numel(), CHUNK):
            stats.add(fx[lo:lo + CHUNK].to(torch.float64), fy[lo:lo + CHUNK].to(torch.float64))
    del o1, o2
    if stats.total and stats.n == 0:
        return DegeneracyReport(degenerate=True, reason="outputs are not finite", rel_diff=float("nan"), output_std=float("nan"))
    norm, diff = math.sqrt(stats.a2), math.sqrt(stats.d2)
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
    std = stats.std()
    scale = max(stats.max_abs, 1e-30)
    n = stats.n

    if n > 1 and std <= CONSTANT_STD * scale:
        return DegeneracyReport(
            degenerate=True, reason=f"output is (near) constant (std {std:.3g})", rel_diff=rel, output_std=std
        )
    if rel < REL_DIFF_MIN:
        return DegeneracyReport(
            degenerate=True,
            reason=f"output barely depends on the input: ||o1-o2||/||o1|| = {rel:.3g} < {REL_DIFF_MIN:g} "
            f"for seeds {s1} and {s2}",
            rel_diff=rel,
            output_std=std,
        )
    return DegeneracyReport(degenerate=False, reason="", rel_diff=rel, output_std=std)


class _Stats:
    """Sums over the elements finite in both outputs, chunk by chunk (fp64). The first output's
    moments are taken about its first chunk's mean, so a near-constant output keeps its digits."""

    def __init__(self) -> None:
        self.total = self.n = 0
        self.a2 = self.d2 = self.max_abs = 0.0
        self.shift: float | None = None
        self.s1 = self.s2 = 0.0  # sums of (a - shift) and its square

    def add(self, a, b) -> None:
        self.total += a.numel()
        finite = a.isfinite() & b.isfinite()
        if not bool(finite.all()):
            a, b = a[finite], b[finite]
        if a.numel() == 0:
            return
        if self.shift is None:
            self.shift = float(a.mean())
        self.n += a.numel()
        self.a2 += float((a * a).sum())
        self.d2 += float(((a - b) ** 2).sum())
        c = a - self.shift
        self.s1 += float(c.sum())
        self.s2 += float((c * c).sum())
        self.max_abs = max(self.max_abs, float(a.abs().max()))

    def std(self) -> float:
        """The sample standard deviation of the first output's finite elements."""
        if self.n < 2:
            return 0.0
        return math.sqrt(max(0.0, (self.s2 - self.s1 * self.s1 / self.n) / (self.n - 1)))
