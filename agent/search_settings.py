"""What a search is, what it is given and what it gives back.

:class:`SearchSettings` is one typed record of a search: the problem, the run folder, the mode
(:class:`SearchMode`: a new run, a resume of a journaled one, a replay of a recorded one), the
shape and budget, the seed kernel, the recorded run a resume or replay follows, the evaluation
options, ``force``, the model's name and the command line. Its constructors fill what a record
holds (a resume and a replay take the recorded config, seed and model; a resume the recorded
budget unless given another), so no caller re-lists those fields:

    SearchSettings.new(problem, run_dir, config=..., budget=...)
    SearchSettings.resume(record, problem, budget=...)
    SearchSettings.replay(record, problem, run_dir)

The search is then ``Search(settings, proposer, evaluator, tuner=..., ...)``
(:mod:`kerngen.agent.search`); what it gives back is a :class:`SearchOutcome`, whose ``reason``
is a typed :class:`~kerngen.agent.budget.StopReason`. A tuner follows :class:`Tuner`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Protocol, Sequence

from kerngen.agent.budget import SearchBudget, SearchConfig, StopReason, Usage
from kerngen.agent.proposer import SearchContext
from kerngen.agent.search_records import recorded_budget
from kerngen.agent.tree import Node, Run, Tree
from kerngen.harness.evaluator import EvalOptions
from kerngen.harness.results import Baseline, EvalResult, GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.outcome import TuneOutcome
from kerngen.problems.ref import ProblemRef

ContextFactory = Callable[[ProblemRef, GpuFacts, "Baseline | None"], SearchContext]


class Tuner(Protocol):
    """Autotunes one correct node: THE tuning outcome (:mod:`kerngen.harness.tune.outcome`: the
    best config, its result, the curve), or None when there is nothing to tune or nothing better.

    ``minutes``: what the search has left of its wall-clock budget, less a margin, or None when
    it has no wall-clock budget; a tuner ends by then (it may stop sooner by its own cap)."""

    def __call__(self, problem: ProblemRef, spec: KernelSpec, result: EvalResult, *,
                 minutes: float | None) -> TuneOutcome | None: ...


class SearchMode(Enum):
    new = "new"  # a new run folder and journal
    resume = "resume"  # go on in a journaled run: recorded answers and measurements are reused
    replay = "replay"  # a new run that follows a recorded one strictly, re-measuring every node


def command_line(argv: Sequence[str] | None = None) -> tuple[str, ...]:
    """The command line a run records: ``kerngen`` and the arguments (``sys.argv`` when none is
    given), never the interpreter's paths."""
    raw = list(argv) if argv is not None else list(sys.argv)
    return ("kerngen", *raw[1:]) if raw else ()


@dataclass(frozen=True)
class SearchSettings:
    """One search. ``record``: the journaled run a resume continues or a replay follows (None for
    a new run). Build it with :meth:`new`, :meth:`resume` or :meth:`replay`."""

    problem: ProblemRef
    run_dir: Path
    mode: SearchMode = SearchMode.new
    config: SearchConfig = field(default_factory=SearchConfig)
    budget: SearchBudget = field(default_factory=SearchBudget)
    seed_spec: KernelSpec | None = None
    record: Run | None = None
    eval_options: EvalOptions | None = None
    force: bool = False
    model: str | None = None
    argv: tuple[str, ...] = field(default_factory=command_line)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        if (self.mode is SearchMode.new) != (self.record is None):
            raise ValueError(f"a {self.mode.value} search takes {'no' if self.record is None else 'a'} record")

    @property
    def replaying(self) -> bool:
        """A replay follows its record strictly: answers only from it, no budget but the record."""
        return self.mode is SearchMode.replay

    @classmethod
    def new(cls, problem: ProblemRef, run_dir: str | Path, *, config: SearchConfig | None = None,
            budget: SearchBudget | None = None, seed_spec: KernelSpec | None = None,
            eval_options: EvalOptions | None = None, force: bool = False, model: str | None = None,
            argv: Sequence[str] | None = None) -> "SearchSettings":
        """A new run journaled in ``run_dir`` (which must not hold a journal yet)."""
        return cls(problem, Path(run_dir), SearchMode.new, config or SearchConfig(), budget or SearchBudget(),
                   seed_spec, None, eval_options, force, model, command_line(argv))

    @classmethod
    def resume(cls, record: Run, problem: ProblemRef, *, budget: SearchBudget | None = None,
               eval_options: EvalOptions | None = None, force: bool = False, model: str | None = None,
               argv: Sequence[str] | None = None) -> "SearchSettings":
        """Go on in ``record``'s folder with its config and seed kernel. ``budget`` replaces the
        recorded one (its latest session's); ``model``: the recorded one unless given.
        ``problem``: the run's problem as the caller resolved it
        (:func:`kerngen.agent.problem_data.rerun_ref`)."""
        st = record.started
        return cls(problem, record.path, SearchMode.resume, st.config, budget or recorded_budget(record),
                   st.seed_spec, record, eval_options, force, model or st.model, command_line(argv))

    @classmethod
    def replay(cls, record: Run, problem: ProblemRef, run_dir: str | Path, *,
               eval_options: EvalOptions | None = None, argv: Sequence[str] | None = None) -> "SearchSettings":
        """A new run in ``run_dir`` that follows ``record`` (its config, seed kernel, beams and
        answers), with no budget but the record's end, on a problem that may be degenerate (it
        was searched already)."""
        st = record.started
        return cls(problem, Path(run_dir), SearchMode.replay, st.config, SearchBudget.unlimited(), st.seed_spec,
                   record, eval_options, True, st.model, command_line(argv))


@dataclass
class SearchOutcome:
    run_dir: Path
    run_id: str
    tree: Tree
    reason: StopReason
    usage: Usage

    @property
    def best(self) -> Node | None:
        return self.tree.best()
