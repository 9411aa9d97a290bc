"""``kerngen suite``: the best kernel of each problem against PyTorch eager and torch.compile,
measured side by side on one GPU, the KernelBench metric against both, and why the problems
without a kernel have none.

For each problem the kernel is the best node of the newest run (under ``runs_dir``) whose problem
has the same source (built-in name or file), or the spec given with ``--kernel``. A suite runs only
the problems it is given (built-in names, files or folders named on its command line): a run found
under ``runs_dir`` contributes its kernel, its shape and dtype and, when it has no correct kernel,
why not (:mod:`kerngen.results.suite_runs`), never the problem file its journal names (which is only
compared, by resolved path, to the files given).

Side by side: problems are measured one after the other; a problem's baseline (eager,
torch.compile, in true fp32 and at PyTorch's defaults, the roofline floor), then its kernel, then
the exported op's path beside the kernel (``--no-op``: not) are measured back to back on the one
Evaluator, with the same time budget, before the next problem starts. ``kerngen suite`` gives that
Evaluator one GPU worker, so both run in the same worker process on the same GPU, with the problem
(model, parameters, inputs) loaded once for both. A problem without a kernel is not measured.
:func:`run_suite` is the whole command minus printing; any Evaluator works (tests inject a
deterministic one).

fast_p (KernelBench): the share of problems whose kernel is correct AND more than p times faster
than the reference; fast_0 is the share that is correct. A problem without a correct kernel (none
found, failing now, or PyTorch not measurable) counts as a miss. Two references:

* eager: over every problem.
* torch.compile: over every problem except those whose baseline was measured here and
  torch.compile failed on it: there is no compile time to compare with, and eager is no stand-in
  for it, so such a problem is left out of the torch.compile metrics (``without_reference`` counts
  them); it still counts against eager. A problem without a kernel is not measured, so whether
  torch.compile works on it is not known: it stays in, as a miss.

The geometric mean of the speedups is taken over the correct problems that have a time of the
reference (``geomean_of`` of them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Protocol, Sequence

from pydantic import BaseModel, Field

from kerngen.errors import KerngenError, ProblemError
from kerngen.results.bench_table import ratio
from kerngen.results.suite_runs import (
    WHY_LABELS, FoundKernel, NoKernel, RunIndex, Why, best_in_runs, problem_key, why_baseline_failed,
    why_kernel_failed,
)
from kerngen.harness.evaluator import Candidate, EvalOptions, Evaluator
from kerngen.harness.results import Baseline, EvalResult, OpTiming, Timing
from kerngen.problems.torch_modes import DEFAULTS_LABEL
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef
from kerngen.text import one_line, strict_json

__all__ = [
    "FAST_P", "NO_KERNEL", "ERROR", "RefMetrics", "SuiteMetrics", "SuiteEntry", "SuiteReport", "FoundKernel",
    "NoKernel", "Why", "WHY_LABELS", "fast_p", "geomean", "reference_metrics", "suite_metrics", "problem_key",
    "expand_problems", "best_in_runs", "measure_one", "run_suite",
]

FAST_P = (0.0, 1.0, 1.5, 2.0)
NO_KERNEL = "no_kernel"  # verdict of a problem no run (and no --kernel) gives a correct kernel for
ERROR = "error"  # verdict of a problem whose baseline could not be measured

OnProgress = Callable[[int, str], None]  # (index of the problem now being measured, its label)


class Memo(Protocol):
    """Measurements kept across sittings (:class:`kerngen.results.suite_save.SaveFile`)."""

    reused: int

    def reuse(self, problem: str, found: "FoundKernel", budget_ms: float) -> "SuiteEntry | None": ...

    def record(self, problem: str, found: "FoundKernel", budget_ms: float, entry: "SuiteEntry") -> None: ...


Outcome = tuple[bool, float | None]  # (correct, speedup vs the reference)


# ----- the metric (pure) --------------------------------------------------------------------
class RefMetrics(BaseModel):
    """fast_p and the geometric-mean speedup against one reference."""

    reference: str  # "eager" | "torch.compile"
    problems: int  # the problems counted (the denominator of fast_p)
    without_reference: int = 0  # problems left out: no time of this reference (torch.compile failed)
    correct: int
    fast_p: dict[str, float]  # "0", "1", "1.5", "2" -> share of the counted problems, in [0, 1]
    geomean_speedup: float | None  # over the correct problems counted
    geomean_of: int = 0  # how many speedups the geometric mean is taken over


class SuiteMetrics(BaseModel):
    problems: int
    correct: int
    eager: RefMetrics
    compile: RefMetrics
    compile_defaults: RefMetrics | None = None  # vs torch.compile at PyTorch's defaults (TF32 conv)


def fast_p(outcomes: Sequence[Outcome], p: float) -> float:
    """Share of ``(correct, speedup)`` outcomes that are correct and faster than ``p`` times the
    reference (p = 0: the share that is correct). 0.0 for no outcomes."""
    if not outcomes:
        return 0.0
    hits = sum(1 for ok, s in outcomes if ok and (p == 0 or (s is not None and s > p)))
    return hits / len(outcomes)


def geomean(values: Sequence[float]) -> float | None:
    good = [v for v in values if v > 0 and math.isfinite(v)]
    if not good:
        return None
    return math.exp(sum(math.log(v) for v in good) / len(good))


def reference_metrics(reference: str, outcomes: Sequence[Outcome], without_reference: int = 0,
                      ps: Sequence[float] = FAST_P) -> RefMetrics:
    """The metrics over ``outcomes`` (the problems counted against ``reference``)."""
    speedups = [s for ok, s in outcomes if ok and s is not None and s > 0 and math.isfinite(s)]
    return RefMetrics(
        reference=reference, problems=len(outcomes), without_reference=without_reference,
        correct=sum(1 for ok, _ in outcomes if ok), fast_p={f"{p:g}": fast_p(outcomes, p) for p in ps},
        geomean_speedup=geomean(speedups), geomean_of=len(speedups),
    )


def suite_metrics(entries: Sequence["SuiteEntry"], ps: Sequence[float] = FAST_P) -> SuiteMetrics:
    """Against eager over every entry; against torch.compile over the entries that do not lack a
    compile time (see the module docstring)."""
    compiled = [e for e in entries if not e.compile_missing]
    # at the defaults: the problems measured with them (a saved entry from before they were has none)
    defaults = [e for e in compiled if e.compiled_defaults is not None or e.eager is None]
    return SuiteMetrics(
        problems=len(entries), correct=sum(1 for e in entries if e.correct),
        eager=reference_metrics("eager", [(e.correct, e.speedup_eager) for e in entries], 0, ps),
        compile=reference_metrics("torch.compile", [(e.correct, e.speedup_compile) for e in compiled],
                                  len(entries) - len(compiled), ps),
        compile_defaults=reference_metrics(
            f"torch.compile at {DEFAULTS_LABEL}", [(e.correct, e.speedup_compile_defaults) for e in defaults],
            len(entries) - len(defaults), ps) if any(e.compiled_defaults is not None for e in entries) else None,
    )


# ----- what a suite run produces --------------------------------------------------------------
class SuiteEntry(BaseModel):
    problem: str  # as given (a name or a path)
    ref: ProblemRef  # what was measured (the run's shape and dtype)
    kernel_from: str = ""  # "run <id> node #<n>" or the spec file
    verdict: str  # an EvalResult verdict, "no_kernel" or "error"
    message: str = ""
    why: NoKernel | None = None  # why there is no correct kernel (None when there is one)
    config: dict[str, int] = Field(default_factory=dict)
    kernel: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    compile_error: str = ""  # why torch.compile has no time (baseline measured, compile failed)
    floor_ms: float | None = None
    floor_bound: str = ""
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    # PyTorch at its defaults (cuDNN TF32 convolutions), beside true fp32 (the fields above)
    eager_defaults: Timing | None = None
    compiled_defaults: Timing | None = None
    defaults_label: str = ""
    speedup_eager_defaults: float | None = None
    speedup_compile_defaults: float | None = None
    op: OpTiming | None = None  # the exported op's path timed beside the kernel (kernel: the harness's launcher)
    op_error: str = ""  # why the op's path has no time
    pct_roofline: float | None = None  # the kernel's % of the roofline floor (100: at the floor)
    recorded_ms: float | None = None  # the kernel's median in its run (maybe another GPU)
    recorded_gpu: str = ""

    @property
    def correct(self) -> bool:
        return self.verdict == "ok"

    @property
    def compile_missing(self) -> bool:
        """The baseline was measured and torch.compile has no time in it."""
        return self.eager is not None and self.compiled is None


class SuiteReport(BaseModel):
    gpu: str
    runs_dir: str = ""
    reused: int = 0  # entries measured in an earlier sitting on this GPU model (--save)
    entries: list[SuiteEntry]
    metrics: SuiteMetrics
    without_kernel: dict[str, int] = Field(default_factory=dict)  # Why kind -> problems, most first
    skipped_runs: list[str] = Field(default_factory=list)  # unreadable run folders: "name: error"

    def to_json(self) -> dict:
        """The report as strict JSON data (inf/NaN as null)."""
        return strict_json(self.model_dump(mode="json"))

    def without_kernel_text(self) -> str:
        """``3 no run, 2 every candidate failed, 1 harness could not evaluate`` ("" when none)."""
        return ", ".join(f"{n} {WHY_LABELS[Why(kind)]}" for kind, n in self.without_kernel.items())


def count_why(entries: Sequence[SuiteEntry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in entries:
        if e.why is not None:
            counts[e.why.kind.value] = counts.get(e.why.kind.value, 0) + 1
    order = list(Why)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], order.index(Why(kv[0])))))


# ----- the problems -------------------------------------------------------------------------
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


# ----- measuring ------------------------------------------------------------------------------
def _entry(problem: str, found: FoundKernel, base: Baseline, result: EvalResult) -> SuiteEntry:
    ms = result.timing.median_ms if (result.ok and result.timing) else None
    return SuiteEntry(
        problem=problem, ref=found.ref, kernel_from=found.origin, verdict=result.verdict.value,
        message=result.message, why=None if result.ok else why_kernel_failed(result, found.origin),
        config=result.config or found.config,
        kernel=result.timing if result.ok else None, eager=base.eager, compiled=base.compiled,
        compile_error=one_line(base.compile_error) if base.compiled is None else "",
        floor_ms=base.floor_ms, floor_bound=base.floor_bound,
        speedup_eager=ratio(base.eager.median_ms, ms),
        speedup_compile=ratio(base.compiled.median_ms if base.compiled else None, ms),
        eager_defaults=base.eager_defaults, compiled_defaults=base.compiled_defaults,
        defaults_label=base.defaults_label,
        speedup_eager_defaults=ratio(base.eager_defaults.median_ms if base.eager_defaults else None, ms),
        speedup_compile_defaults=ratio(base.compiled_defaults.median_ms if base.compiled_defaults else None, ms),
        pct_roofline=(100.0 * base.floor_ms / ms) if (ms and base.floor_ms) else None,
        recorded_ms=found.recorded_ms if found.recorded_ms is not None and math.isfinite(found.recorded_ms) else None,
        recorded_gpu=found.recorded_gpu,
    )


def measure_one(problem: str, found: FoundKernel, evaluator: Evaluator, options: EvalOptions | None,
                op: bool = True, with_compile: bool = True) -> SuiteEntry:
    """Baseline and then kernel of one problem on ``evaluator``, back to back (the baseline with
    the kernel's time budget), then, for a correct kernel and an evaluator that can (``time_op``),
    the exported op's path beside the kernel. A problem PyTorch itself cannot run becomes an
    ``error`` entry (the rest of the suite still runs)."""
    try:
        skip = {} if with_compile else {"with_compile": False}  # --no-compile: eager only
        if options is not None:
            base = evaluator.baseline(found.ref, budget_ms=options.budget_ms, **skip)
        else:
            base = evaluator.baseline(found.ref, **skip)
    except KerngenError as exc:
        message = one_line(str(exc))
        return SuiteEntry(problem=problem, ref=found.ref, kernel_from=found.origin, verdict=ERROR,
                          message=message, why=why_baseline_failed(message))
    result = evaluator.evaluate(found.ref, [Candidate(spec=found.spec, config=found.config)], options)[0]
    entry = _entry(problem, found, base, result)
    time_op = getattr(evaluator, "time_op", None)
    if op and result.ok and time_op is not None:
        try:
            entry.op = time_op(found.ref, found.spec, result.config or found.config,
                               budget_ms=(options or EvalOptions()).budget_ms)
        except KerngenError as exc:
            entry.op_error = one_line(str(exc))
    return entry


def run_suite(
    problems: Sequence[str],
    evaluator: Evaluator,
    runs_dir: str | Path = "runs",
    *,
    kernel: KernelSpec | None = None,
    config: dict[str, int] | None = None,
    options: EvalOptions | None = None,
    on_progress: OnProgress | None = None,
    memo: Memo | None = None,
    op: bool = True,
    with_compile: bool = True,
) -> SuiteReport:
    """Measure every problem, one after the other (see the module docstring), and compute the
    suite's metrics. The runs under ``runs_dir`` are read once, before any measurement (not at
    all with ``kernel``). With ``memo``, a problem it holds for the same kernel is not measured
    again, and each one measured is handed to it as soon as it is."""
    index = RunIndex(runs_dir) if kernel is None else None
    entries: list[SuiteEntry] = []
    for i, problem in enumerate(problems):
        if on_progress is not None:
            on_progress(i, problem)
        if index is None:
            assert kernel is not None
            found: FoundKernel | None = FoundKernel(ref=ProblemRef(source=problem), spec=kernel,
                                                    config=dict(config or {}), origin=f"spec {kernel.name}")
        else:
            found = index.kernel(problem)
        if found is None:
            assert index is not None
            why = index.why_none(problem)
            entries.append(SuiteEntry(problem=problem, ref=index.ref(problem), verdict=NO_KERNEL, message=why.text,
                                      why=why))
            continue
        budget_ms = (options or EvalOptions()).budget_ms
        kept = memo.reuse(problem, found, budget_ms) if memo is not None else None
        if kept is not None:
            entries.append(kept)
            continue
        entry = measure_one(problem, found, evaluator, options, op=op, with_compile=with_compile)
        if memo is not None and entry.verdict != ERROR:  # PyTorch failing here may not fail next time
            memo.record(problem, found, budget_ms, entry)
        entries.append(entry)
    if on_progress is not None:
        on_progress(len(problems), "")
    return SuiteReport(gpu=evaluator.gpu_facts().name, runs_dir=str(runs_dir) if index is not None else "",
                       reused=memo.reused if memo is not None else 0, entries=entries, metrics=suite_metrics(entries), without_kernel=count_why(entries),
                       skipped_runs=index.skipped if index is not None else [])
