"""What the recorded runs give ``kerngen suite``: each problem's kernel, or why it has none.

:class:`RunIndex` loads every run folder under ``runs_dir`` once (through
:func:`kerngen.agent.tree.load_run`; a run's problem file is never imported) and keeps a small
summary of each: its problem's identity, its best node, how it stopped (``run_finished``: the
text and the :class:`~kerngen.agent.budget.StopKind`, None in older journals) and the verdicts of
its nodes. A problem without a correct kernel gets a :class:`NoKernel`: a :class:`Why` kind to
count and a line to read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from kerngen.agent.budget import StopKind
from kerngen.agent.journal import has_journal
from kerngen.errors import KerngenError
from kerngen.harness.results import EvalResult, Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef
from kerngen.results.show import counts_text, verdict_counts
from kerngen.text import one_line

if TYPE_CHECKING:
    from kerngen.agent.tree import Run


class Why(str, Enum):
    """Why a problem of a suite has no correct kernel (what the summary counts)."""

    no_run = "no_run"  # no run under runs_dir searched this problem
    all_failed = "all_failed"  # the newest run evaluated candidates and every one failed
    no_candidates = "no_candidates"  # the proposer gave none (the playbook: "no variant admits ...")
    none_evaluated = "none_evaluated"  # the run stopped (budget, Ctrl-C, error) or is unfinished before any verdict
    degenerate = "degenerate"  # the run refused the problem: its output barely depends on its input
    harness = "harness"  # the harness could not evaluate (out of GPU memory): in the run, or now
    kernel_failed = "kernel_failed"  # the run's best kernel, measured now, is not correct
    baseline_error = "baseline_error"  # PyTorch itself could not be measured on the problem now


WHY_LABELS: dict[Why, str] = {
    Why.no_run: "no run",
    Why.all_failed: "every candidate failed",
    Why.no_candidates: "no candidates",
    Why.none_evaluated: "no candidate evaluated",
    Why.degenerate: "degenerate problem",
    Why.harness: "harness could not evaluate",
    Why.kernel_failed: "kernel fails now",
    Why.baseline_error: "baseline failed",
}


class NoKernel(BaseModel):
    """Why one problem has no correct kernel in the suite."""

    kind: Why
    text: str  # one line for people
    run: str = ""  # the run it was read from (the newest run of the problem)
    runs: int = 0  # how many runs of the problem there are (none with a correct kernel, for the run kinds)
    stop: StopKind | None = None  # how that run stopped (None: older journal, or unfinished)
    reason: str = ""  # the run's stop reason, as recorded
    verdicts: dict[str, int] = Field(default_factory=dict)  # the run's nodes by verdict ("invalid", "pending" too)
    verdict: str = ""  # the kernel_failed kind: the verdict measured now

    @property
    def label(self) -> str:
        return WHY_LABELS[self.kind]


class FoundKernel(BaseModel):
    ref: ProblemRef
    spec: KernelSpec
    config: dict[str, int] = Field(default_factory=dict)
    origin: str
    recorded_ms: float | None = None
    recorded_gpu: str = ""


def problem_key(source: str) -> str:
    """Identity of a problem source: a built-in name as is, a file as its resolved path ("" for
    a source that names no path at all, e.g. one with a NUL from a hostile journal)."""
    from kerngen.problems.registry import is_builtin

    if not isinstance(source, str) or not source or any(ord(c) < 32 for c in source):
        return ""
    if is_builtin(source) and not source.endswith(".py") and "/" not in source:
        return source
    try:
        return str(Path(source).expanduser().resolve())
    except (OSError, RuntimeError, ValueError):
        return ""


# ----- the runs, read once ----------------------------------------------------------------------
@dataclass
class RunSummary:
    """What the suite needs of one run (the Run itself is not kept: journals can be large)."""

    id: str
    t: float
    key: str  # problem_key of the run's problem
    shape: tuple[int, ...] | None
    dtype: str | None
    best: FoundKernel | None  # its ref is filled in per suite problem (see RunIndex.kernel)
    reason: str | None  # run_finished.reason (None: the run never finished)
    stop: StopKind | None
    verdicts: dict[str, int] = field(default_factory=dict)


def summarize(run: Run) -> RunSummary:
    """The summary of a loaded run."""
    rec = run.started.problem
    best = run.best
    spec = best.best_spec() if best is not None else None
    found = None
    if best is not None and spec is not None:
        demo = " [DEMO: scripted toy kernel, made-up times]" if run.started.demo else ""
        found = FoundKernel(ref=ProblemRef(source=rec.source, shape=rec.shape, dtype=rec.dtype), spec=spec,
                            config=best.config, origin=f"run {run.id} node #{best.id}{demo}",
                            recorded_ms=best.ms if math.isfinite(best.ms) else None,
                            recorded_gpu=run.tree.gpu.name if run.tree.gpu else "")
    fin, t = run.finished, run.started.t
    return RunSummary(
        id=run.id, t=t if math.isfinite(t) else 0.0, key=problem_key(rec.source), shape=rec.shape, dtype=rec.dtype,
        best=found, reason=fin.reason if fin is not None else None, stop=fin.stop if fin is not None else None,
        verdicts=verdict_counts(n.verdict for n in run.nodes.values()),
    )


class RunIndex:
    """Every readable run under ``runs_dir``, summarized, by problem. Unreadable run folders are
    skipped (``skipped``: one line each): a suite must not fail on someone else's broken run."""

    def __init__(self, runs_dir: str | Path) -> None:
        from kerngen.agent.tree import load_run

        self.runs_dir = Path(runs_dir)
        self.by_key: dict[str, list[RunSummary]] = {}
        self.skipped: list[str] = []
        for path in _run_dirs(self.runs_dir):
            try:
                run = load_run(path)
                if run.started.dry_run:  # compiled, nothing measured: not what a suite counts
                    continue
                summary = summarize(run)
            except KerngenError as exc:
                self.skipped.append(one_line(f"{path.name}: {exc}", 300))
                continue
            if summary.key:
                self.by_key.setdefault(summary.key, []).append(summary)

    def runs_of(self, source: str) -> list[RunSummary]:
        """The runs of ``source``, oldest first."""
        key = problem_key(source)
        return sorted(self.by_key.get(key, []), key=lambda s: s.t) if key else []

    def kernel(self, source: str) -> FoundKernel | None:
        """The best node of the newest run of ``source`` that has a correct kernel, to be measured
        as the problem named on the suite's command line (same file) at the run's shape and dtype."""
        with_kernel = [s for s in self.runs_of(source) if s.best is not None]
        if not with_kernel:
            return None
        s = with_kernel[-1]
        assert s.best is not None
        return s.best.model_copy(update={"ref": ProblemRef(source=source, shape=s.shape, dtype=s.dtype)})

    def ref(self, source: str) -> ProblemRef:
        """The problem as its newest run searched it (the default shape and dtype without a run)."""
        runs = self.runs_of(source)
        if not runs:
            return ProblemRef(source=source)
        return ProblemRef(source=source, shape=runs[-1].shape, dtype=runs[-1].dtype)

    def why_none(self, source: str) -> NoKernel:
        """Why ``source`` has no correct kernel in any run (call it when :meth:`kernel` is None)."""
        runs = self.runs_of(source)
        if not runs:
            return NoKernel(kind=Why.no_run, text=f"no run of it under {self.runs_dir}")
        return why_from_run(runs[-1], len(runs))


def why_from_run(run: RunSummary, runs: int = 1) -> NoKernel:
    """Why a run without a correct node has none: how it stopped, and what its candidates did."""
    evaluated = sum(n for v, n in run.verdicts.items() if v != "pending")
    if run.stop is StopKind.harness:
        kind = Why.harness
    elif run.stop is StopKind.degenerate:
        kind = Why.degenerate
    elif evaluated:
        kind = Why.all_failed
    elif run.stop is StopKind.no_candidates:
        kind = Why.no_candidates
    else:
        kind = Why.none_evaluated
    stopped = f"stopped: {run.reason}" if run.reason is not None else "unfinished (no run_finished event)"
    newest = f" (newest of {runs} runs, none with a correct kernel)" if runs > 1 else ""
    text = one_line(f"run {run.id}{newest}: {counts_text(run.verdicts)}; {stopped}")
    return NoKernel(kind=kind, text=text, run=run.id, runs=runs, stop=run.stop, reason=run.reason or "",
                    verdicts=dict(run.verdicts))


def why_kernel_failed(result: EvalResult, origin: str) -> NoKernel:
    """The kernel a run found, measured now, is not correct (or the harness could not evaluate it)."""
    kind = Why.harness if result.verdict is Verdict.harness_error else Why.kernel_failed
    return NoKernel(kind=kind, verdict=result.verdict.value,
                    text=one_line(f"{result.verdict.value} now ({origin}): {result.message or '-'}"))


def why_baseline_failed(message: str) -> NoKernel:
    return NoKernel(kind=Why.baseline_error, text=one_line(f"PyTorch could not be measured: {message}"))


def best_in_runs(source: str, runs_dir: str | Path) -> FoundKernel | None:
    """The best node of the newest run (by start time) of ``source`` that has a correct kernel."""
    return RunIndex(runs_dir).kernel(source)


def _run_dirs(runs_dir: Path) -> list[Path]:
    try:
        return sorted(p for p in runs_dir.iterdir() if has_journal(p))
    except OSError:
        return []
