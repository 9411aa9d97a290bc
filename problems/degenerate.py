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
    a = torch.cat([o.detach().reshape(-1).to(torch.float64) for o in o1])
    b = torch.cat([o.detach().reshape(-1).to(torch.float64) for o in o2])
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool(finite.all()):
        if not bool(finite.any()):
            return DegeneracyReport(degenerate=True, reason="outputs are not finite", rel_diff=float("nan"), output_std=float("nan"))
        a, b = a[finite], b[finite]
    norm = float(torch.linalg.vector_norm(a))
    diff = float(torch.linalg.vector_norm(a - b))
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
    std = float(a.std()) if a.numel() > 1 else 0.0
    scale = max(float(a.abs().max()) if a.numel() else 0.0, 1e-30)

    if a.numel() > 1 and std <= CONSTANT_STD * scale:
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
