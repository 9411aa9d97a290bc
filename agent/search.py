"""The tree search over natural-language ideas, journaled, resumable and replayable.

Each round: the best ``B`` nodes so far (the beam; round 0 starts from a seed spec if one is
given, else from nothing) each get ``K`` ideas from the proposer; each idea is implemented ``M``
ways; every branch with a spec becomes a node and all of a round's nodes are evaluated in ONE
``evaluator.evaluate`` call (parallel on all GPUs; under a wall-clock budget, cut into chunks that
each take a small part of it, so that a stop lands in time: :mod:`kerngen.agent.search_measure`).
Failed nodes get up to ``R`` repairs (each a child node, each wave one batch). The fastest correct
nodes of the round (up to ``B``) are autotuned; their tuned config and result are recorded on the
node. Budgets and patience stop it, with a typed :class:`~kerngen.agent.budget.StopReason`.

What a search is (problem, run folder, mode, shape, budget, seed, the record it follows ...) is one settings
object (:mod:`kerngen.agent.search_settings`); the search is ``Search(settings, proposer, evaluator, tuner=...).run()``.

Every proposer answer and every result goes to the journal first (:mod:`kerngen.agent.journal`)
and the tree is rebuilt from it (:mod:`kerngen.agent.tree`), so:

* **resume** re-runs the same loop over a journal: recorded answers are reused (no proposer
  call), recorded evaluations and tunings are not redone, recorded rounds are followed as they
  were, and only what has no recorded answer is asked;
* **replay** re-runs a recorded search strictly from its answers (the record's
  :class:`~kerngen.agent.tree.AnswerBook`: the proposer is asked nothing, a question the record
  has no answer for is not asked) and re-evaluates every node on the current GPU
  (:mod:`kerngen.agent.replay`).

Entry points: :func:`run_search`, :func:`resume_search` (and :func:`kerngen.agent.replay.replay_run`)."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

from kerngen.agent.asking import Question, ask_wave, give_limits
from kerngen.agent.budget import StopKind, StopReason, Usage, exhausted, restore_llm_usage
from kerngen.agent.context import default_context
from kerngen.agent.idea_outcomes import attempt_line, repair_chain, repair_target, tried
from kerngen.agent.journal import (
    BaselineEvent, IdeasEvent, ImplementedEvent, Journal, NodeCreated, RoundFinished, RoundStarted, RunFinished,
    RunResumed, RunStarted, has_journal, new_run_id, versions,
)
from kerngen.agent.problem_data import record_for_run, rerun_ref
from kerngen.agent.proposer import Branch, Failure, Idea, Proposer, SearchContext
from kerngen.agent.run_files import write_derived
from kerngen.agent.search_measure import Measurements
from kerngen.agent.search_records import answer_items, answers_of, branch_of, gpu_seconds, ideas_of, node_key
from kerngen.agent.search_settings import ContextFactory, SearchMode, SearchOutcome, SearchSettings, Tuner
from kerngen.agent.tree import AnswerBook, Node, Run, Tree, ideas_key, implement_key, load_run, repair_key
from kerngen.errors import JournalError, LLMError, ProblemError
from kerngen.harness.evaluator import Evaluator
from kerngen.harness.results import Verdict
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.ref import ProblemRef

__all__ = ["ContextFactory", "Search", "SearchMode", "SearchOutcome", "SearchSettings", "Tuner", "resume_search",
           "run_search"]


class DegenerateProblemError(ProblemError):
    """The problem's output barely depends on its input: any kernel would pass its check."""


# ----- the search ---------------------------------------------------------------------------
class Search:
    """One search over ``settings``. ``proposer``: asked for ideas, implementations and repairs
    (None only in a replay, which asks nothing); ``tuner``: tunes each round's survivors (None:
    no tuning); ``context_factory``: what the proposer is told of the problem and GPU;
    ``usage``: the meter the budgets read (an LLM proposer drives the same one); ``listeners``:
    see every journaled event (a live view)."""

    def __init__(
        self,
        settings: SearchSettings,
        proposer: Proposer | None,
        evaluator: Evaluator,
        *,
        tuner: Tuner | None = None,
        context_factory: ContextFactory | None = None,
        usage: Usage | None = None,
        listeners: Iterable[Callable[[Any], None]] = (),
    ) -> None:
        if proposer is None and not settings.replaying:
            raise ValueError("only a replay searches without a proposer")
        self.settings = settings
        self.problem = settings.problem
        self.run_dir = settings.run_dir
        self.config = settings.config
        self.budget = settings.budget
        self.record = settings.record
        self.proposer = proposer
        self.evaluator = evaluator
        self.context_factory = context_factory or default_context
        self.usage = usage or Usage()
        self.extra_listeners = list(listeners)
        self.strict = settings.replaying
        self.tree = Tree()
        self.own = AnswerBook()  # answers already in THIS journal
        self.external = self.record.book if (self.record is not None and self.strict) else AnswerBook()
        self.record_tree = self.record.tree if self.record is not None else Tree()
        self.node_by_key: dict[tuple, int] = {}
        self.stop_reason: StopReason | None = None  # set when a budget runs out mid-round
        self.journal: Journal | None = None
        self.ctx: SearchContext | None = None
        self.measurements = Measurements(settings, evaluator, tuner, self.usage, self.tree, self._write)

    # ----- plumbing ---------------------------------------------------------------------------
    def _on_event(self, ev: Any) -> None:
        self.tree.apply(ev)
        if isinstance(ev, NodeCreated):
            self.node_by_key[node_key(ev)] = ev.id
        for key, answer in answers_of(ev):
            self.own.answers[key] = answer

    def _write(self, ev: Any) -> Any:
        assert self.journal is not None
        return self.journal.append(ev)

    def _open(self) -> None:
        if self.settings.mode is SearchMode.resume:
            assert self.record is not None
            journal, events, truncated = Journal.reopen(self.run_dir)
            self.journal = journal
            for ev in events:
                self._on_event(ev)
            self.usage.prior_wall_s = self.record.elapsed_s()
            self.usage.gpu_s = gpu_seconds(events)
            restore_llm_usage(self.usage, events)
            for fn in self.extra_listeners:  # let a live view catch up with what is recorded
                for ev in events:
                    _safe(fn, ev)
            journal.listeners.append(self._on_event)
            journal.listeners.extend(_guarded(fn) for fn in self.extra_listeners)
            self.usage.listeners.append(journal.on_llm_call(self.usage))
            gpu = self.evaluator.gpu_facts()
            self._write(RunResumed(session=self.record.sessions, versions=versions(), gpu=gpu, budget=self.budget,
                                   truncated_bytes=truncated))
            return
        if has_journal(self.run_dir):
            raise JournalError(f"run {self.run_dir.name}: already exists; resume it with --resume")
        gpu = self.evaluator.gpu_facts()  # before the folder exists: no GPU, no half-made run
        problem_info = record_for_run(self.problem)  # the problem as data, for show/report/export
        self.journal = Journal(self.run_dir)
        self.journal.listeners.append(self._on_event)
        self.journal.listeners.extend(_guarded(fn) for fn in self.extra_listeners)
        self.usage.listeners.append(self.journal.on_llm_call(self.usage))
        s = self.settings
        replay_of, proposer = None, getattr(self.proposer, "name", type(self.proposer).__name__)
        if self.strict and self.record is not None:  # the answers come from the record, not a proposer
            replay_of, proposer = f"{self.record.id} ({self.record.path})", "replay"
        dry = getattr(self.evaluator, "dry_run", None)  # the GPU preset a dry run compiles for
        self._write(RunStarted(
            run_id=self.run_dir.name, problem=self.problem, config=self.config, budget=self.budget,
            proposer=proposer, model=s.model, versions=versions(), gpu=gpu, seed_spec=s.seed_spec,
            replay_of=replay_of, argv=list(s.argv), problem_info=problem_info,
            demo=(not self.strict and getattr(self.proposer, "demo", False) is True)
            or getattr(self.evaluator, "demo", False) is True,
            dry_run=dry if isinstance(dry, str) else None,
        ))

    # ----- the run ----------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        try:
            self._open()
        except BaseException:
            if self.journal is not None:  # e.g. no GPU on resume: let go of the run's lock
                self.journal.close()
            raise
        self._limit_llm_requests()
        try:
            reason = self._loop()
        except KeyboardInterrupt:
            abandon = getattr(self.proposer, "abandon", None)  # answers in flight (paid for) journaled first
            if callable(abandon) and not self.strict:
                abandon()
            self._finish(StopReason(StopKind.interrupted, "interrupted"))
            raise
        except BaseException as exc:
            kind = StopKind.degenerate if isinstance(exc, DegenerateProblemError) else StopKind.error
            text = f"error: {' '.join(str(exc).split())[:300] or type(exc).__name__}"
            if isinstance(exc, LLMError):  # e.g. the key was revoked mid-search: the endpoint's own words
                kind, text = StopKind.llm_error, f"LLM endpoint: {' '.join(str(exc).split())[:300]}"
            self._finish(StopReason(kind, text))
            raise
        self._finish(reason)
        assert self.journal is not None
        self.journal.close()
        return SearchOutcome(self.run_dir, self.run_dir.name, self.tree, reason, self.usage)

    def _limit_llm_requests(self) -> None:
        """See :func:`kerngen.agent.asking.give_limits` (a replay asks nothing)."""
        if not self.strict:
            give_limits(self.proposer, self.budget, self.usage)

    def _finish(self, reason: StopReason) -> None:
        if self.journal is None:
            return
        best = self.tree.best()
        try:
            self._write(RunFinished(reason=reason.text, stop=reason.kind, best=best.id if best else None,
                                    best_ms=best.ms if best else None, usage=self.usage.snapshot()))
            self.write_derived()
        finally:
            self.journal.close()

    def _loop(self) -> StopReason:
        gpu = self.tree.gpu or self.evaluator.gpu_facts()
        baseline = self.tree.baseline
        if baseline is None:
            baseline = self.evaluator.baseline(self.problem)
            self._write(BaselineEvent(baseline=baseline))
        self.usage.start_clock()  # the wall-clock budget is the search's: nothing before this point counts
        if baseline.degenerate and not self.settings.force:
            why = baseline.degenerate_reason or "its output barely depends on its input"
            raise DegenerateProblemError(f"problem {self.problem.label()} is degenerate ({why}); "
                                         "use --force to search anyway")
        self.ctx = self.context_factory(self.problem, gpu, baseline)

        if self.settings.seed_spec is not None:
            self._seed(self.settings.seed_spec)

        stale = 0
        prev_best = math.inf
        r = 0
        while True:
            followed = r in self.record_tree.beams
            if not followed:
                if self.strict:
                    orig = self.record.finished.reason if (self.record and self.record.finished) else "unfinished"
                    return StopReason(StopKind.end_of_record,
                                      f"replay: end of the record (the original stopped on: {orig})")
                reason = self._should_stop(r, stale)
                if reason:
                    return reason
            beam = self._beam(r)
            if r not in self.tree.beams:
                self._write(RoundStarted(round=r, beam=beam))
            created = self._round(r, beam)
            best = self.tree.best()
            best_ms = best.ms if best else math.inf
            recorded = self.tree.rounds_finished.get(r)
            if recorded is not None:
                improved = recorded.improved
            else:
                improved = best_ms < prev_best * (1 - self.budget.min_gain) if math.isfinite(best_ms) else False
                self._write(RoundFinished(round=r, best=best.id if best else None,
                                          best_ms=best_ms if math.isfinite(best_ms) else None, improved=improved,
                                          tried=tried(self.tree, r), usage=self.usage.snapshot()))
            self.write_derived()
            prev_best = min(prev_best, best_ms)
            stale = 0 if improved else stale + 1
            r += 1
            if self.stop_reason:
                return self.stop_reason
            if created == 0 and not followed:
                idle = self._proposer_stop(idle=True)  # e.g. the LLM endpoint's error, unreadable ideas
                if idle is not None:
                    return idle
                why = getattr(self.proposer, "reason", "")  # e.g. the playbook: no variant admits the shape
                text = "proposer gave no new candidates" + (f": {why}" if isinstance(why, str) and why else "")
                return StopReason(StopKind.no_candidates, text)

    def _should_stop(self, r: int, stale: int) -> StopReason | None:
        if self.stop_reason:
            return self.stop_reason
        if r >= self.budget.rounds:
            return StopReason(StopKind.rounds, f"rounds: {r} done")
        if self.budget.patience is not None and stale >= self.budget.patience:
            return StopReason(StopKind.patience, f"patience: no better kernel in {stale} rounds")
        return exhausted(self.budget, self.usage)

    def _beam(self, r: int) -> list[int | None]:
        if r in self.record_tree.beams:
            return list(self.record_tree.beams[r])
        nodes = self.tree.beam(self.config.beam) or self._unmeasured()[: self.config.beam]
        return [n.id for n in nodes] if nodes else [None]

    def _unmeasured(self) -> list[Node]:
        """Kernels compiled, never run (a dry run): the seed, then the latest round's first, so
        that a dry run expands what a GPU run would (its prompts show them "not measured")."""
        nodes = [n for n in self.tree.nodes.values() if n.result is not None and n.result.verdict is Verdict.not_run]
        return sorted(nodes, key=lambda n: (n.kind != "seed", -n.round, n.id))

    # ----- asking the proposer ----------------------------------------------------------------
    def _ask_wave(self, questions: list[Question]) -> None:
        """See :func:`kerngen.agent.asking.ask_wave`. A budget the proposer met while the wave
        was in flight (its client kept a request back) stops the search, by name."""
        ask_wave(questions, own=self.own, external=self.external, usage=self.usage, may_ask=self._may_ask,
                 concurrency=max(1, int(getattr(self.proposer, "concurrency", 1) or 1)))
        if not self.strict:
            self._stop(self._proposer_stop())

    def _may_ask(self) -> bool:
        if self.strict:
            return False
        self._stop(exhausted(self.budget, self.usage))
        self._stop(self._proposer_stop())  # e.g. the LLM client kept a request back: a budget
        return self.stop_reason is None

    def _proposer_stop(self, idle: bool = False) -> StopReason | None:
        """Why the proposer says the search should stop (``idle``: the round produced nothing)."""
        reason = getattr(self.proposer, "stop_reason", None)
        got = reason(idle=idle) if callable(reason) and not self.strict else None
        return got if isinstance(got, StopReason) else None

    def _stop(self, reason: StopReason | None) -> None:
        """A budget ran out mid-round: the first reason is the one the search stops on."""
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason

    def _question(self, method: str, *args: Any) -> Callable[[], Any]:
        """How to ask the proposer's ``method`` (only called when the answer is not recorded: a
        replay, which has no proposer, never calls it)."""
        def ask() -> Any:
            assert self.proposer is not None  # only a replay has none, and a replay asks nothing
            return getattr(self.proposer, method)(*args)
        return ask

    def _summary(self, node_id: int | None):
        return self.tree.summary(self.tree.nodes[node_id]) if node_id is not None else None

    def _ctx(self, r: int) -> SearchContext:
        assert self.ctx is not None
        return self.ctx.model_copy(update={"round": r, "tried": list(self.tree.tried)})

    # ----- a round ----------------------------------------------------------------------------
    def _round(self, r: int, beam: list[int | None]) -> int:
        """Ideas for every beam node (one wave), implementations of every idea (one wave), then
        the nodes, created in a fixed order (beam, idea, branch) whatever order answers came in."""
        ctx = self._ctx(r)
        parents = {pid: self._summary(pid) for pid in beam}
        ideas: dict[int | None, list[Idea]] = {}
        branches: dict[tuple[int | None, int], list[Branch]] = {}

        def got_ideas(pid: int | None, answer: Any, journaled: bool) -> None:
            if answer is not None:
                ideas[pid] = ideas_of(answer, self.config.ideas)
                if not journaled:
                    self._write(IdeasEvent(round=r, parent=pid, ideas=ideas[pid]))

        def got_branches(pid: int | None, i: int, answer: Any, journaled: bool) -> None:
            if answer is not None:
                # up to twice the branches: an answer may hold a second spec (a sibling)
                branches[pid, i] = [branch_of(b) for b in answer_items(answer)[: 2 * self.config.branches]]
                if not journaled:
                    self._write(ImplementedEvent(round=r, parent=pid, idea_index=i, branches=branches[pid, i]))

        self._ask_wave([(ideas_key(r, pid), self._question("ideas", ctx, parents[pid], self.config.ideas),
                         partial(got_ideas, pid)) for pid in beam])
        self._ask_wave([(implement_key(r, pid, i),
                         self._question("implement", ctx, parents[pid], idea, self.config.branches),
                         partial(got_branches, pid, i))
                        for pid in beam for i, idea in enumerate(ideas.get(pid, []))])
        heads: list[int] = []
        for pid in beam:
            for i, idea in enumerate(ideas.get(pid, [])):
                for j, br in enumerate(branches.get((pid, i), [])):
                    heads.append(self._create(("branch", r, pid, i, j), parent=pid, round=r, kind="branch",
                                              idea=idea, idea_index=i, branch_index=j, branch=br))
        self._measure(heads, r)
        return len(heads)

    def _seed(self, spec: KernelSpec) -> None:
        nid = self._create(("seed",), parent=None, round=0, kind="seed", idea=None, idea_index=None,
                           branch_index=None, branch=Branch(spec=spec, notes="seed kernel"))
        self._measure([nid], 0)

    def _measure(self, heads: list[int], r: int) -> None:
        """Evaluate the new nodes, repair the failures, tune the survivors."""
        self._evaluate(heads)
        self._repairs(r, heads)
        if self.stop_reason is None or self.stop_reason.kind is not StopKind.harness:
            self._stop(self.measurements.tune_survivors(heads))
            self.measurements.profile_best(r)  # where ncu is: the metrics the next round's prompt shows

    def _evaluate(self, ids: list[int]) -> None:
        self._stop(self.measurements.evaluate(ids))

    def _create(self, nkey: tuple, *, branch: Branch, **fields: Any) -> int:
        if nkey in self.node_by_key:
            return self.node_by_key[nkey]
        nid = self.tree.next_id()
        error = branch.error if branch.spec is None else ""
        if branch.spec is None and not error:
            error = "the proposer gave no spec"
        self._write(NodeCreated(id=nid, spec=branch.spec, error=error, notes=branch.notes,
                                answer=branch.answer if branch.spec is None else "", **fields))
        return nid

    def _repairs(self, r: int, heads: list[int]) -> None:
        if self.config.repairs <= 0 and not self.strict:
            return
        max_attempts = self.config.repairs
        if self.strict:
            max_attempts = max([k[2] for k in self.external.answers if k[0] == "repair"] + [0])
        ctx = self._ctx(r)
        for attempt in range(1, max_attempts + 1):
            wave: dict[int, int] = {}  # head -> its repair node of this attempt
            answers: dict[int, Branch] = {}
            questions: list[Question] = []
            for head in heads:
                key = repair_key(head, attempt)
                if ("repair", head, attempt) in self.node_by_key:  # resumed: created, maybe not evaluated
                    wave[head] = self.node_by_key[("repair", head, attempt)]
                    continue
                done = partial(self._got_repair, answers, head)
                if self.strict:
                    # follow the record: repair what was repaired, whatever the new verdicts
                    if key in self.external:
                        questions.append((key, lambda: None, done))
                    continue
                target = repair_target(self.tree, head)
                if target is not None:
                    questions.append((key, self._question("repair", ctx, self._failure(target, head), attempt),
                                      done))
            self._ask_wave(questions)
            for head in heads:  # created in the order of the heads, whatever order the answers came in
                if head in answers:
                    last = repair_chain(self.tree, head)[-1]
                    h = self.tree.nodes[head]
                    wave[head] = self._create(("repair", head, attempt), parent=last.id, round=r, kind="repair",
                                              idea=h.idea, idea_index=h.idea_index, branch_index=h.branch_index,
                                              repair_of=head, attempt=attempt, branch=answers[head])
            if not wave:
                break
            self._evaluate([wave[h] for h in heads if h in wave])

    @staticmethod
    def _got_repair(answers: dict[int, Branch], head: int, answer: Any, journaled: bool) -> None:
        if answer is not None:
            answers[head] = branch_of(answer)

    def _failure(self, target: Node, head: int) -> Failure:
        """What the repair of ``head``'s chain is shown: the failed kernel and its evidence, or
        the unreadable answer and why; the idea and the parent of the branch."""
        h = self.tree.nodes[head]
        parent = self._summary(h.parent) if h.parent is not None else None
        history = [attempt_line(n) for n in repair_chain(self.tree, head) if n.id != target.id]
        if target.spec is None:
            return Failure(answer=target.answer, error=target.error, idea=h.idea, parent=parent, history=history)
        return Failure(spec=target.spec, result=target.result, idea=h.idea, parent=parent, history=history)

    def write_derived(self) -> None:
        write_derived(self.run_dir, self.tree)


def _guarded(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    return lambda ev: _safe(fn, ev)


def _safe(fn: Callable[[Any], None], ev: Any) -> None:
    try:
        fn(ev)
    except Exception:  # noqa: BLE001 - a view must never stop a search
        pass


# ----- entry points -------------------------------------------------------------------------
def run_search(
    problem: ProblemRef,
    proposer: Proposer,
    evaluator: Evaluator,
    *,
    runs_dir: str | Path = "runs",
    run_id: str | None = None,
    tuner: Tuner | None = None,
    context_factory: ContextFactory | None = None,
    usage: Usage | None = None,
    listeners: Iterable[Callable[[Any], None]] = (),
    **settings: Any,
) -> SearchOutcome:
    """Run a new search; journal it under ``runs_dir/<run_id>/`` (a new id if none is given).
    ``settings``: those of :meth:`SearchSettings.new` (config, budget, seed_spec, eval_options,
    force, model, argv)."""
    run_dir = Path(runs_dir) / (run_id or new_run_id(problem))
    return Search(SearchSettings.new(problem, run_dir, **settings), proposer, evaluator, tuner=tuner,
                  context_factory=context_factory, usage=usage, listeners=listeners).run()


def resume_search(
    run: str | Path | Run,
    proposer: Proposer,
    evaluator: Evaluator,
    *,
    runs_dir: str | Path = "runs",
    problem: str | None = None,
    tuner: Tuner | None = None,
    context_factory: ContextFactory | None = None,
    usage: Usage | None = None,
    listeners: Iterable[Callable[[Any], None]] = (),
    **settings: Any,
) -> SearchOutcome:
    """Continue a journaled run: nothing evaluated is evaluated again, no recorded answer is
    asked again. ``settings``: those of :meth:`SearchSettings.resume` (``budget`` replaces the
    recorded one, e.g. more rounds; eval_options, force, model, argv). ``problem``: the problem
    file the caller names (see :func:`kerngen.agent.problem_data.rerun_ref`)."""
    rec = run if isinstance(run, Run) else load_run(run, runs_dir)
    ref, _ = rerun_ref(rec.started, problem)  # a run's problem file runs again only when built in, named or unchanged
    return Search(SearchSettings.resume(rec, ref, **settings), proposer, evaluator, tuner=tuner,
                  context_factory=context_factory, usage=usage, listeners=listeners).run()
