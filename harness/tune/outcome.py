"""THE tuning outcome: what a tuner hands the search, what the journal's ``node_tuned`` records,
and what ``show``, ``report`` and a resume read back. One type for all of them.

:class:`TunePoint` is one configuration tried, in order: its config, its time (None when it
failed), its verdict, the worker's wall seconds, and the running ``evals`` / ``seconds`` /
``best_ms`` (best so far). Journals written before this type hold one of two partial shapes:

* the real tuner's ``{"evals", "seconds", "best_ms"}`` (no config, no per-config time);
* the scripted tuner's ``{"config", "ms", "verdict", "wall_s"}`` (no running figures).

:data:`TuneCurve` reads both (and the full shape): it fills ``evals`` from the position and
``best_ms`` from the running minimum of the correct times, so every reader sees one shape.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_serializer

from kerngen.harness.results import EvalResult


class TunePoint(BaseModel):
    """One configuration the tuner tried (see the module docstring for the older shapes)."""

    model_config = ConfigDict(extra="ignore")

    evals: int = 0  # results so far, this one included (1-based)
    seconds: float | None = None  # since the tuning began (None: not recorded)
    best_ms: float | None = None  # best correct time so far (None / inf: nothing correct yet)
    config: dict[str, int] | None = None  # None in the real tuner's older journals
    ms: float | None = None  # this config's time; None when it failed (or not recorded)
    verdict: str = ""  # "" when not recorded
    wall_s: float | None = None  # the worker's wall seconds of this evaluation
    cached: bool = False  # taken from the tuning cache, not measured on this run

    @field_serializer("best_ms", "ms")
    def _finite(self, value: float | None) -> float | None:  # inf/NaN are not JSON: None
        return value if value is not None and math.isfinite(value) else None

    @property
    def ok(self) -> bool:
        """A correct measurement of this config (False when the journal did not record one)."""
        return self.ms is not None and math.isfinite(self.ms) and self.verdict in ("", "ok")


def fill_curve(points: list[TunePoint]) -> list[TunePoint]:
    """``evals`` from the position and ``best_ms`` from the running minimum where missing."""
    best = math.inf
    out = []
    for i, p in enumerate(points):
        if p.ok:
            best = min(best, p.ms)  # type: ignore[type-var]
        upd: dict[str, Any] = {}
        if p.evals <= 0:
            upd["evals"] = i + 1
        if p.best_ms is None and math.isfinite(best):
            upd["best_ms"] = best
        elif p.best_ms is not None and math.isfinite(p.best_ms):
            best = min(best, p.best_ms)
        out.append(p.model_copy(update=upd) if upd else p)
    return out


TuneCurve = Annotated[list[TunePoint], AfterValidator(fill_curve)]


class TuneOutcome(BaseModel):
    """What a tuner returns to the search when it found a correct configuration."""

    config: dict[str, int]
    result: EvalResult
    evaluated: int
    curve: TuneCurve = Field(default_factory=list)
    seconds: float = 0.0  # wall seconds the tuning took (0: not recorded)

    def gpu_seconds(self) -> float:
        return tune_seconds(self.seconds, self.curve, self.result, self.evaluated)


def tune_seconds(seconds: float | None, curve: list[TunePoint], result: EvalResult | None, evaluated: int) -> float:
    """GPU seconds a tuning spent: its recorded seconds, else the workers' wall seconds of its
    curve, else the result's wall seconds times the configurations evaluated."""
    if isinstance(seconds, (int, float)) and seconds > 0:
        return float(seconds)
    walls = [p.wall_s for p in curve if p.wall_s is not None]
    if walls:
        return float(sum(walls))
    return float(getattr(result, "wall_s", 0.0) or 0.0) * max(1, int(evaluated or 1))


__all__ = ["TuneCurve", "TuneOutcome", "TunePoint", "fill_curve", "tune_seconds"]
