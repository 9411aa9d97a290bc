"""``kerngen suite``: the best kernel of each problem against PyTorch eager and torch.compile,
measured side by side on one GPU, and the KernelBench metric over the whole suite.

For each problem the kernel is the best node of the newest run (under ``runs_dir``) whose problem
has the same source (built-in name or file), or the spec given with ``--kernel``. Its baseline and
its evaluation come from one Evaluator (one WorkerPool), so the ratios are taken in one process
run on one GPU. :func:`run_suite` is the whole command minus printing; any Evaluator works
(tests inject a deterministic one).

A suite runs only the problems it is given (built-in names, files or folders named on its command
line): a run found under ``runs_dir`` contributes its kernel and its shape and dtype, never the
problem file its journal names (which is only compared, by resolved path, to the files given).

fast_p (KernelBench): the share of problems whose kernel is correct AND more than p times faster
than PyTorch eager; fast_0 is the share that is correct. A problem without a kernel counts as not
correct.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

from pydantic import BaseModel, Field

from kerngen.agent.journal import has_journal
from kerngen.errors import KerngenError, ProblemError
from kerngen.results.bench_table import ratio
from kerngen.harness.evaluator import Candidate, EvalOptions, Evaluator
from kerngen.harness.results import Baseline, EvalResult, Timing
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef

FAST_P = (0.0, 1.0, 1.5, 2.0)
NO_KERNEL = "no_kernel"  # verdict of a problem no run (and no --kernel) gives a kernel for
ERROR = "error"  # verdict of a problem whose baseline could not be measured

OnProgress = Callable[[int, str], None]  # (index of the problem now being measured, its label)


# ----- the metric (pure) --------------------------------------------------------------------
class SuiteMetrics(BaseModel):
    problems: int
    correct: int
    fast_p: dict[str, float]  # "0", "1", "1.5", "2" -> share of problems in [0, 1]
    geomean_speedup: float | None  # vs eager, over the correct problems


def fast_p(outcomes: Sequence[tuple[bool, float | None]], p: float) -> float:
    """Share of ``(correct, speedup vs eager)`` outcomes that are correct and faster than ``p``
    times eager (p = 0: the share that is correct). 0.0 for no outcomes."""
    if not outcomes:
        return 0.0
    hits = sum(1 for ok, s in outcomes if ok and (p == 0 or (s is not None and s > p)))
    return hits / len(outcomes)


def geomean(values: Sequence[float]) -> float | None:
    good = [v for v in values if v > 0 and math.isfinite(v)]
    if not good:
        return None
    return math.exp(sum(math.log(v) for v in good) / len(good))


def suite_metrics(outcomes: Sequence[tuple[bool, float | None]], ps: Sequence[float] = FAST_P) -> SuiteMetrics:
    speedups = [s for ok, s in outcomes if ok and s is not None]
    return SuiteMetrics(
        problems=len(outcomes),
        correct=sum(1 for ok, _ in outcomes if ok),
        fast_p={f"{p:g}": fast_p(outcomes, p) for p in ps},
        geomean_speedup=geomean(speedups),
    )


# ----- what a suite run produces --------------------------------------------------------------
class SuiteEntry(BaseModel):
    problem: str  # as given (a name or a path)
    ref: ProblemRef  # what was measured (the run's shape and dtype)
    kernel_from: str = ""  # "run <id> node #<n>" or the spec file
    verdict: str  # an EvalResult verdict, "no_kernel" or "error"
    message: str = ""
    config: dict[str, int] = Field(default_factory=dict)
    kernel: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    floor_ms: float | None = None
    floor_bound: str = ""
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    pct_roofline: float | None = None
    recorded_ms: float | None = None  # the kernel's median in its run (maybe another GPU)
    recorded_gpu: str = ""

    @property
    def correct(self) -> bool:
        return self.verdict == "ok"


class SuiteReport(BaseModel):
    gpu: str
    entries: list[SuiteEntry]
    metrics: SuiteMetrics


# ----- finding the kernel of a problem ---------------------------------------------------------
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


def expand_problems(args: Sequence[str]) -> list[str]:
    """Built-in names and .py files as given; a folder becomes its .py files (sorted). No
    argument: every built-in. Raises :class:`ProblemError` for anything else."""
    from kerngen.problems.registry import builtin_names, did_you_mean, is_builtin

    if not args:
        return builtin_names()
    out: list[str] = []
    for arg in args:
        p = Path(arg).expanduser()
        if is_builtin(arg) and "/" not in arg and not arg.endswith(".py"):
            out.append(arg)
        elif p.is_dir():
            files = sorted(str(f) for f in p.glob("*.py") if not f.name.startswith("_"))
            if not files:
                raise ProblemError(f"{arg}: folder holds no .py problem files")
            out.extend(files)
        elif p.is_file() and p.suffix == ".py":
            out.append(str(p))
        else:
            raise ProblemError(f"problem {arg!r} not found: neither a built-in, a .py file nor a folder"
                               f"{did_you_mean(arg)} (built-ins: {', '.join(builtin_names())})")
    return out


def _run_dirs(runs_dir: Path) -> list[Path]:
    if not runs_dir.is_dir():
        return []
    return sorted(p for p in runs_dir.iterdir() if has_journal(p))


def best_in_runs(source: str, runs_dir: str | Path) -> FoundKernel | None:
    """The best node of the newest run (by start time) of ``source`` that has a correct kernel.
    Unreadable run folders are skipped: a suite must not fail on someone else's broken run."""
    from kerngen.agent.tree import load_run

    key = problem_key(source)
    found: list[tuple[float, FoundKernel]] = []
    for path in _run_dirs(Path(runs_dir)):
        try:
            run = load_run(path)
        except KerngenError:
            continue
        if not key or problem_key(run.started.problem.source) != key:
            continue
        best = run.best
        spec = best.best_spec() if best is not None else None
        if best is None or spec is None:
            continue
        # measure the problem as named on the suite's command line (same file), at the run's shape and dtype
        rec = run.started.problem
        ref = ProblemRef(source=source, shape=rec.shape, dtype=rec.dtype)
        kernel = FoundKernel(ref=ref, spec=spec, config=best.config,
                             origin=f"run {run.id} node #{best.id}" + (" [DEMO: scripted toy kernel, made-up "
                                                                       "times]" if run.started.demo else ""),
                             recorded_ms=best.ms,
                             recorded_gpu=run.tree.gpu.name if run.tree.gpu else "")
        found.append((run.started.t, kernel))
    if not found:
        return None
    return max(found, key=lambda item: item[0])[1]


# ----- measuring ------------------------------------------------------------------------------
def _entry(problem: str, found: FoundKernel, base: Baseline, result: EvalResult) -> SuiteEntry:
    ms = result.timing.median_ms if (result.ok and result.timing) else None
    return SuiteEntry(
        problem=problem, ref=found.ref, kernel_from=found.origin, verdict=result.verdict.value,
        message=result.message, config=result.config or found.config,
        kernel=result.timing if result.ok else None, eager=base.eager, compiled=base.compiled,
        floor_ms=base.floor_ms, floor_bound=base.floor_bound,
        speedup_eager=ratio(base.eager.median_ms, ms),
        speedup_compile=ratio(base.compiled.median_ms if base.compiled else None, ms),
        pct_roofline=(100.0 * base.floor_ms / ms) if (ms and base.floor_ms) else None,
        recorded_ms=found.recorded_ms if found.recorded_ms is not None and math.isfinite(found.recorded_ms) else None,
        recorded_gpu=found.recorded_gpu,
    )


def measure_one(problem: str, found: FoundKernel, evaluator: Evaluator, options: EvalOptions | None) -> SuiteEntry:
    """Baseline and kernel of one problem on ``evaluator``. A problem PyTorch itself cannot run
    becomes an ``error`` entry (the rest of the suite still runs)."""
    try:
        base = evaluator.baseline(found.ref)
    except KerngenError as exc:
        return SuiteEntry(problem=problem, ref=found.ref, kernel_from=found.origin, verdict=ERROR,
                          message=" ".join(str(exc).split()))
    result = evaluator.evaluate(found.ref, [Candidate(spec=found.spec, config=found.config)], options)[0]
    return _entry(problem, found, base, result)


def run_suite(
    problems: Sequence[str],
    evaluator: Evaluator,
    runs_dir: str | Path = "runs",
    *,
    kernel: KernelSpec | None = None,
    config: dict[str, int] | None = None,
    options: EvalOptions | None = None,
    on_progress: OnProgress | None = None,
) -> SuiteReport:
    """Measure every problem (see the module docstring) and compute the suite's metrics."""
    entries: list[SuiteEntry] = []
    for i, problem in enumerate(problems):
        if on_progress is not None:
            on_progress(i, problem)
        found = _kernel_for(problem, runs_dir, kernel, config)
        if found is None:
            entries.append(SuiteEntry(problem=problem, ref=ProblemRef(source=problem), verdict=NO_KERNEL,
                                      message=f"no run under {runs_dir} has a correct kernel for it"))
            continue
        entries.append(measure_one(problem, found, evaluator, options))
    if on_progress is not None:
        on_progress(len(problems), "")
    metrics = suite_metrics([(e.correct, e.speedup_eager) for e in entries])
    return SuiteReport(gpu=evaluator.gpu_facts().name, entries=entries, metrics=metrics)


def _kernel_for(problem: str, runs_dir: str | Path, kernel: KernelSpec | None,
                config: dict[str, int] | None) -> FoundKernel | None:
    if kernel is not None:
        return FoundKernel(ref=ProblemRef(source=problem), spec=kernel, config=dict(config or {}),
                           origin=f"spec {kernel.name}")
    return best_in_runs(problem, runs_dir)
