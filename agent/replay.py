"""Replay a recorded search: the same questions answered from the journal (no LLM call), every
node re-evaluated on the current GPU, recorded and new times side by side.

The replay follows the record strictly: the same beams, the same answers, the same repairs, the
recorded tuned configs re-measured (no new tuning). So the replayed tree has the same node ids,
ideas and specs; only the measurements are new. The replay is a new run folder whose
``run_started`` names the original (``replay_of``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from kerngen.agent.budget import SearchBudget, Usage
from kerngen.agent.proposer import Branch, Idea, NodeSummary, SearchContext
from kerngen.agent.search import ContextFactory, ReplayMissError, Search, SearchOutcome
from kerngen.agent.tree import AnswerBook, Key, Run, ideas_key, implement_key, load_run, repair_key
from kerngen.harness.evaluator import EvalOptions, Evaluator
from kerngen.harness.results import EvalResult
from kerngen.harness.spec.spec import KernelSpec
from kerngen.agent.journal import new_run_id


class ReplayProposer:
    """A proposer that answers from a journal, keyed per question (see
    :class:`~kerngen.agent.tree.AnswerBook`): ``("ideas", round, parent)``,
    ``("implement", round, parent, idea_index)``, ``("repair", node, attempt)``. A question with
    no recorded answer raises :class:`ReplayMissError`. It never calls an LLM."""

    name = "replay"

    def __init__(self, book: AnswerBook, origin: str = "", run: Run | None = None) -> None:
        self.book = book
        self.origin = origin
        self.run = run
        self.answered = 0
        self.misses = 0

    def answer(self, key: Key) -> Any:
        if key not in self.book:
            self.misses += 1
            raise ReplayMissError(f"replay of {self.origin or 'run'}: no recorded answer for {key}")
        self.answered += 1
        return self.book.get(key)

    def ideas(self, ctx: SearchContext, parent: NodeSummary | None, k: int) -> list[Idea]:
        return list(self.answer(ideas_key(ctx.round, parent.node_id if parent else None)))

    def implement(self, ctx: SearchContext, parent: NodeSummary | None, idea: Idea, m: int) -> list[Branch]:
        pid = parent.node_id if parent else None
        ideas = self.answer(ideas_key(ctx.round, pid))
        for i, recorded in enumerate(ideas):
            if recorded.text == idea.text:
                return list(self.answer(implement_key(ctx.round, pid, i)))
        raise ReplayMissError(f"replay of {self.origin or 'run'}: idea {idea.text[:60]!r} was not recorded")

    def repair(self, ctx: SearchContext, spec: KernelSpec, result: EvalResult, attempt: int) -> Branch:
        if self.run is not None:
            h = spec.content_hash()
            for node in self.run.nodes.values():
                if node.spec is not None and node.spec.content_hash() == h:
                    head = node.repair_of if node.repair_of is not None else node.id
                    if repair_key(head, attempt) in self.book:
                        return self.answer(repair_key(head, attempt))
        raise ReplayMissError(f"replay of {self.origin or 'run'}: no recorded repair {attempt} of that spec")


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
    from kerngen.agent.problem_data import rerun_ref
    from kerngen.agent.safe_paths import check_name

    orig = run if isinstance(run, Run) else load_run(run, runs_dir)
    st = orig.started
    ref, _ = rerun_ref(st, problem)
    proposer = ReplayProposer(orig.book, origin=orig.id, run=orig)
    if run_id is None:
        stamp_slug, tag = new_run_id(ref).rsplit("-", 1)
        run_id = f"{stamp_slug}-replay-{tag}"
    rid = check_name(run_id, "run id")
    search = Search(
        ref, proposer, evaluator, run_dir=Path(runs_dir) / rid, mode="replay", config=st.config,
        budget=SearchBudget.unlimited(), tuner=None, seed_spec=st.seed_spec, context_factory=context_factory,
        usage=Usage(), record=orig, eval_options=eval_options, force=True, model=st.model, listeners=listeners,
    )
    outcome = search.run()
    rows = compare(orig, outcome)
    return ReplayOutcome(original=orig, outcome=outcome, rows=rows,
                         proposer_calls=proposer.misses + outcome.usage.proposer_calls)


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


def replay_table(rep: ReplayOutcome) -> Any:
    from rich.table import Table
    from rich.text import Text

    from kerngen.redact import printable

    o_gpu = rep.original.tree.gpu.name if rep.original.tree.gpu else "?"
    n_gpu = rep.outcome.tree.gpu.name if rep.outcome.tree.gpu else "?"
    t = Table(title=Text(printable(f"replay of {rep.original.id}: recorded on {o_gpu} vs now on {n_gpu}")))
    for col, just in (("node", "right"), ("kind", "left"), ("idea", "left"), ("recorded", "left"),
                      ("rec ms", "right"), ("now", "left"), ("now ms", "right"), ("rec/now", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rep.rows:
        idea = printable(" ".join(r.idea.split()))  # a model's text: no markup, no control sequences
        t.add_row(str(r.node), r.kind, Text((idea[:48] + "...") if len(idea) > 51 else idea), r.recorded_verdict,
                  _ms(r.recorded_ms), r.new_verdict, _ms(r.new_ms), f"{r.ratio:.2f}" if r.ratio else "")
    return t


def _ms(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else "-"
