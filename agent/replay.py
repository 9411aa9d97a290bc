"""Replay a recorded search: the same questions answered from the journal (no LLM call), every
node re-evaluated on the current GPU, recorded and new times side by side.

The replay follows the record strictly: the same beams, the same answers, the same repairs, the
recorded tuned configs re-measured (no new tuning). So the replayed tree has the same node ids,
ideas and specs; only the measurements are new. The replay is a new run folder whose
``run_started`` names the original (``replay_of``).

There is one mechanism: the search in replay mode (:meth:`SearchSettings.replay
<kerngen.agent.search_settings.SearchSettings.replay>`) answers every question from the record's
:class:`~kerngen.agent.tree.AnswerBook` and has no proposer to ask; a question the record has no
answer for is not asked (that branch is simply not there). The table of a replay is
:mod:`kerngen.results.replay_table`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from kerngen.agent.journal import new_run_id
from kerngen.agent.problem_data import rerun_ref
from kerngen.agent.safe_paths import check_name
from kerngen.agent.search import Search
from kerngen.agent.search_settings import ContextFactory, SearchOutcome, SearchSettings
from kerngen.agent.tree import Run, load_run
from kerngen.harness.evaluator import EvalOptions, Evaluator


@dataclass
class ReplayRow:
    node: int
    idea: str
    kind: str
    recorded_verdict: str
    recorded_ms: float
    new_verdict: str
    new_ms: float

    @property
    def ratio(self) -> float | None:
        if math.isfinite(self.recorded_ms) and math.isfinite(self.new_ms) and self.new_ms > 0:
            return self.recorded_ms / self.new_ms
        return None


@dataclass
class ReplayOutcome:
    original: Run
    outcome: SearchOutcome
    rows: list[ReplayRow] = field(default_factory=list)
    proposer_calls: int = 0

    @property
    def run_dir(self) -> Path:
        return self.outcome.run_dir


def replay_run(
    run: str | Path | Run,
    evaluator: Evaluator,
    *,
    runs_dir: str | Path = "runs",
    run_id: str | None = None,
    context_factory: ContextFactory | None = None,
    eval_options: EvalOptions | None = None,
    listeners: Iterable[Callable[[Any], None]] = (),
    problem: str | None = None,
) -> ReplayOutcome:
    """Re-run ``run`` from its journal on ``evaluator``; journal it as a new run in ``runs_dir``.

    The run's problem file runs again only when it is a built-in, the file ``problem`` the caller
    names, or unchanged since the run started (:func:`kerngen.agent.problem_data.rerun_ref`);
    otherwise :class:`~kerngen.errors.ProblemError` before anything runs."""
    orig = run if isinstance(run, Run) else load_run(run, runs_dir)
    ref, _ = rerun_ref(orig.started, problem)
    if run_id is None:
        stamp_slug, tag = new_run_id(ref).rsplit("-", 1)
        run_id = f"{stamp_slug}-replay-{tag}"
    settings = SearchSettings.replay(orig, ref, Path(runs_dir) / check_name(run_id, "run id"),
                                     eval_options=eval_options)
    outcome = Search(settings, None, evaluator, context_factory=context_factory, listeners=listeners).run()
    return ReplayOutcome(original=orig, outcome=outcome, rows=compare(orig, outcome),
                         proposer_calls=outcome.usage.proposer_calls)


def compare(orig: Run, outcome: SearchOutcome) -> list[ReplayRow]:
    rows = []
    for nid in sorted(orig.nodes):
        old = orig.nodes[nid]
        new = outcome.tree.nodes.get(nid)
        rows.append(ReplayRow(
            node=nid, idea=(old.idea.text if old.idea else "(seed)" if old.kind == "seed" else ""),
            kind=old.kind if old.kind != "repair" else f"repair {old.attempt}",
            recorded_verdict=old.verdict, recorded_ms=old.ms,
            new_verdict=new.verdict if new else "missing", new_ms=new.ms if new else math.inf,
        ))
    return rows
