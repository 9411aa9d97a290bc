"""The tree search over natural-language ideas, journaled, resumable and replayable.

Each round: the best ``B`` nodes so far (the beam; round 0 starts from a seed spec if one is
given, else from nothing) each get ``K`` ideas from the proposer; each idea is implemented ``M``
ways; every branch with a spec becomes a node and all of a round's nodes are evaluated in ONE
``evaluator.evaluate`` call (parallel on all GPUs; under a wall-clock budget, cut into chunks that
each take a small part of it, so that a stop lands in time). Failed nodes get up to ``R``
repairs (each a child node, each wave one batch). The fastest correct nodes of the round (up to ``B``) are
autotuned; their tuned config and result are recorded on the node. Budgets and patience stop it.

Every proposer answer and every result goes to the journal first (:mod:`kerngen.agent.journal`)
and the tree is rebuilt from it (:mod:`kerngen.agent.tree`), so:

* **resume** re-runs the same loop over a journal: recorded answers are reused (no proposer
  call), recorded evaluations and tunings are not redone, recorded rounds are followed as they
  were, and only what has no recorded answer is asked;
* **replay** re-runs a recorded search strictly from its answers (no proposer call) and
  re-evaluates every node on the current GPU (:mod:`kerngen.agent.replay`).

Entry points: :func:`run_search`, :func:`resume_search`.
"""

from __future__ import annotations

import inspect
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from kerngen.agent.budget import (
    SearchBudget, SearchConfig, Usage, exhausted, remaining_wall_s, time_exhausted,
)
from kerngen.agent.journal import (
    BaselineEvent, IdeasEvent, ImplementedEvent, Journal, NodeCreated, NodeEvaluated, NodeTuned,
    RoundFinished, RoundStarted, RunFinished, RunResumed, RunStarted, new_run_id, versions,
)
from kerngen.agent.context import default_context
from kerngen.agent.idea_outcomes import repair_chain, repair_target, tried
from kerngen.agent.problem_data import record_for_run
from kerngen.agent.run_files import write_derived
from kerngen.agent.search_records import (
    answer_items, answers_of, branch_of, gpu_seconds, ideas_of, node_key, recorded_budget,
)
from kerngen.agent.proposer import Branch, Proposer, SearchContext
from kerngen.agent.tree import (
    AnswerBook, Key, Node, Run, Tree, ideas_key, implement_key, load_run, repair_key,
)
from kerngen.errors import JournalError, KerngenError, ProblemError
from kerngen.harness.evaluator import Candidate, EvalOptions, Evaluator
from kerngen.harness.results import Baseline, EvalResult, GpuFacts
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.outcome import TuneOutcome, TunePoint
from kerngen.problems.ref import ProblemRef


# ----- the tuner's interface: THE tuning outcome type (kerngen.harness.tune.outcome) ----------

# a tuner that takes a ``minutes=`` keyword gets what is left of the wall-clock budget
Tuner = Callable[[ProblemRef, KernelSpec, EvalResult], "TuneOutcome | None"]
ContextFactory = Callable[[ProblemRef, GpuFacts, "Baseline | None"], SearchContext]
Mode = Literal["new", "resume", "replay"]


# ----- outcome ------------------------------------------------------------------------------
@dataclass
class SearchOutcome:
    run_dir: Path
    run_id: str
    tree: Tree
    reason: str
    usage: Usage

    @property
    def best(self) -> Node | None:
        return self.tree.best()


class ReplayMissError(KerngenError):
    """A replay was asked a question its journal has no answer for."""


# ----- the search ---------------------------------------------------------------------------
class Search:
    def __init__(
        self,
        problem: ProblemRef,
        proposer: Proposer,
        evaluator: Evaluator,
        *,
        run_dir: Path,
        mode: Mode = "new",
        config: SearchConfig | None = None,
        budget: SearchBudget | None = None,
        tuner: Tuner | None = None,
        seed_spec: KernelSpec | None = None,
        context_factory: ContextFactory | None = None,
        usage: Usage | None = None,
        record: Run | None = None,
        eval_options: EvalOptions | None = None,
        force: bool = False,
        model: str | None = None,
        listeners: Iterable[Callable[[Any], None]] = (),
        argv: Sequence[str] | None = None,
    ) -> None:
        self.problem = problem
        self.proposer = proposer
        self.evaluator = evaluator
        self.run_dir = Path(run_dir)
        self.mode = mode
        self.config = config or SearchConfig()
        self.budget = budget or SearchBudget()
        self.tuner = tuner
        self.seed_spec = seed_spec
        self.context_factory = context_factory or default_context
        self.usage = usage or Usage()
        self.record = record
        self.eval_options = eval_options
        self.force = force
        self.model = model
        self.extra_listeners = list(listeners)
        raw = list(argv) if argv is not None else list(sys.argv)
        self.argv = (["kerngen"] + raw[1:]) if raw else []  # not the interpreter's paths
        self.strict = mode == "replay"
        self.tree = Tree()
        self.own = AnswerBook()  # answers already in THIS journal
        self.external = record.book if (record is not None and mode == "replay") else AnswerBook()
        self.record_tree = record.tree if record is not None else Tree()
        self.node_by_key: dict[tuple, int] = {}
        self.stop_reason: str | None = None  # set when a budget runs out mid-round
        self.journal: Journal | None = None
        self.ctx: SearchContext | None = None

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
        if self.mode == "resume":
            assert self.record is not None
            journal, events, truncated = Journal.reopen(self.run_dir)
            self.journal = journal
            for ev in events:
                self._on_event(ev)
            self.usage.prior_wall_s = self.record.elapsed_s()
            self.usage.gpu_s = gpu_seconds(events)
            llm = [e for e in events if e.type == "llm_call"]
            if llm:  # running totals; the largest (calls made from threads may land out of order)
                self.usage.calls, self.usage.tokens = max(e.calls for e in llm), max(e.tokens for e in llm)
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
        if (self.run_dir / "events.jsonl").exists():
            raise JournalError(f"run {self.run_dir.name}: already exists; resume it with --resume")
        gpu = self.evaluator.gpu_facts()  # before the folder exists: no GPU, no half-made run
        problem_info = record_for_run(self.problem)  # the problem as data, for show/report/export
        self.journal = Journal(self.run_dir)
        self.journal.listeners.append(self._on_event)
        self.journal.listeners.extend(_guarded(fn) for fn in self.extra_listeners)
        self.usage.listeners.append(self.journal.on_llm_call(self.usage))
        replay_of = None
        if self.mode == "replay" and self.record is not None:
            replay_of = f"{self.record.id} ({self.record.path})"
        self._write(RunStarted(
            run_id=self.run_dir.name, problem=self.problem, config=self.config, budget=self.budget,
            proposer=getattr(self.proposer, "name", type(self.proposer).__name__), model=self.model,
            versions=versions(), gpu=gpu, seed_spec=self.seed_spec, replay_of=replay_of, argv=self.argv,
            problem_info=problem_info,
            demo=getattr(self.proposer, "demo", False) is True or getattr(self.evaluator, "demo", False) is True,
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
            self._finish("interrupted")
            raise
        except BaseException as exc:
            self._finish(f"error: {' '.join(str(exc).split())[:300] or type(exc).__name__}")
            raise
        self._finish(reason)
        assert self.journal is not None
        self.journal.close()
        return SearchOutcome(self.run_dir, self.run_dir.name, self.tree, reason, self.usage)

    def _limit_llm_requests(self) -> None:
        """A proposer that can cap its own HTTP requests (the LLM proposer) gets what is left of
        ``max_llm_calls``: the check before each question cannot see that question's retries or
        parallel branches, the cap can (``usage.calls``: the requests journaled so far)."""
        limit = getattr(self.proposer, "limit_requests", None)
        if callable(limit) and not self.strict:
            cap = self.budget.max_llm_calls
            limit(None if cap is None else max(0, cap - self.usage.calls))

    def _finish(self, reason: str) -> None:
        if self.journal is None:
            return
        best = self.tree.best()
        try:
            self._write(RunFinished(reason=reason, best=best.id if best else None,
                                    best_ms=best.ms if best else None, usage=self.usage.snapshot()))
            self.write_derived()
        finally:
            self.journal.close()

    def _loop(self) -> str:
        gpu = self.tree.gpu or self.evaluator.gpu_facts()
        baseline = self.tree.baseline
        if baseline is None:
            baseline = self.evaluator.baseline(self.problem)
            self._write(BaselineEvent(baseline=baseline))
        if baseline.degenerate and not self.force:
            why = baseline.degenerate_reason or "its output barely depends on its input"
            raise ProblemError(f"problem {self.problem.label()} is degenerate ({why}); use --force to search anyway")
        self.ctx = self.context_factory(self.problem, gpu, baseline)

        if self.seed_spec is not None:
            self._seed()

        stale = 0
        prev_best = math.inf
        r = 0
        while True:
            followed = r in self.record_tree.beams
            if not followed:
                if self.strict:
                    orig = self.record.finished.reason if (self.record and self.record.finished) else "unfinished"
                    return f"replay: end of the record (the original stopped on: {orig})"
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
                return "proposer gave no new candidates"

    def _should_stop(self, r: int, stale: int) -> str | None:
        if self.stop_reason:
            return self.stop_reason
        if r >= self.budget.rounds:
            return f"rounds: {r} done"
        if self.budget.patience is not None and stale >= self.budget.patience:
            return f"patience: no better kernel in {stale} rounds"
        return exhausted(self.budget, self.usage)

    def _beam(self, r: int) -> list[int | None]:
        if r in self.record_tree.beams:
            return list(self.record_tree.beams[r])
        nodes = self.tree.beam(self.config.beam)
        return [n.id for n in nodes] if nodes else [None]

    # ----- asking the proposer ----------------------------------------------------------------
    def _ask(self, key: Key, fn: Callable[[], Any]) -> tuple[Any, bool]:
        """(answer, already journaled here). ``None``: not asked (budget spent, or not recorded
        in a strict replay)."""
        if key in self.own:
            self.usage.reused_answers += 1
            return self.own.get(key), True
        if key in self.external:
            self.usage.reused_answers += 1
            return self.external.get(key), False
        if self.strict:
            return None, False
        if self.stop_reason is None:
            self.stop_reason = exhausted(self.budget, self.usage)
        if self.stop_reason:
            return None, False
        self.usage.proposer_calls += 1
        return fn(), False

    def _summary(self, node_id: int | None):
        return self.tree.summary(self.tree.nodes[node_id]) if node_id is not None else None

    def _ctx(self, r: int) -> SearchContext:
        assert self.ctx is not None
        return self.ctx.model_copy(update={"round": r, "tried": list(self.tree.tried)})

    # ----- a round ----------------------------------------------------------------------------
    def _round(self, r: int, beam: list[int | None]) -> int:
        ctx = self._ctx(r)
        heads: list[int] = []
        for pid in beam:
            parent = self._summary(pid)
            ideas, journaled = self._ask(ideas_key(r, pid), lambda: self.proposer.ideas(ctx, parent, self.config.ideas))
            if ideas is None:
                continue
            ideas = ideas_of(ideas, self.config.ideas)
            if not journaled:
                self._write(IdeasEvent(round=r, parent=pid, ideas=ideas))
            for i, idea in enumerate(ideas):
                key = implement_key(r, pid, i)
                branches, journaled = self._ask(
                    key, lambda: self.proposer.implement(ctx, parent, idea, self.config.branches))
                if branches is None:
                    continue
                branches = [branch_of(b) for b in answer_items(branches)[: self.config.branches]]
                if not journaled:
                    self._write(ImplementedEvent(round=r, parent=pid, idea_index=i, branches=branches))
                for j, br in enumerate(branches):
                    heads.append(self._create(("branch", r, pid, i, j), parent=pid, round=r, kind="branch",
                                              idea=idea, idea_index=i, branch_index=j, branch=br))
        self._evaluate(heads)
        self._repairs(r, heads)
        self._tune_survivors(r, heads)
        return len(heads)

    def _seed(self) -> None:
        assert self.seed_spec is not None
        nid = self._create(("seed",), parent=None, round=0, kind="seed", idea=None, idea_index=None,
                           branch_index=None, branch=Branch(spec=self.seed_spec, notes="seed kernel"))
        self._evaluate([nid])
        self._repairs(0, [nid])
        self._tune_survivors(0, [nid])

    def _create(self, nkey: tuple, *, branch: Branch, **fields: Any) -> int:
        if nkey in self.node_by_key:
            return self.node_by_key[nkey]
        nid = self.tree.next_id()
        error = branch.error if branch.spec is None else ""
        if branch.spec is None and not error:
            error = "the proposer gave no spec"
        self._write(NodeCreated(id=nid, spec=branch.spec, error=error, notes=branch.notes, **fields))
        return nid

    # seconds one candidate is assumed to take (compile, check, bench on one GPU) before any was timed
    PRIOR_EVAL_S = 5.0
    _eval_s = 0.0  # wall seconds spent in evaluator.evaluate() by this session ...
    _eval_n = 0  # ... and the candidates it evaluated in them

    def _evaluate(self, ids: list[int]) -> None:
        """Evaluate the nodes without a result. Under a wall-clock budget the batch is cut into
        chunks (see :meth:`_chunk`) and the budget checked before each one: a stop lands in time.
        Nodes not evaluated when the time (wall or GPU) is spent keep no result: a resume
        evaluates them."""
        todo = [self.tree.nodes[i] for i in ids]
        todo = [n for n in todo if n.spec is not None and n.result is None]
        done: set[int] = set()

        def on_result(batch: list[Node], i: int, res: EvalResult) -> None:
            node = batch[i]
            if node.id in done:
                return
            done.add(node.id)
            self.usage.gpu_s += res.wall_s
            self.usage.evaluations += 1
            self._write(NodeEvaluated(id=node.id, result=res))

        while todo:
            if not self.strict:
                reason = time_exhausted(self.budget, self.usage)
                if reason:
                    self.stop_reason = self.stop_reason or reason
                    return
            n = self._chunk(len(todo))
            batch, todo = todo[:n], todo[n:]
            t0 = time.monotonic()
            results = self.evaluator.evaluate(self.problem, [Candidate(spec=x.spec) for x in batch],
                                              self.eval_options, lambda i, res, b=batch: on_result(b, i, res))
            for i, res in enumerate(results):
                on_result(batch, i, res)
            self._eval_s += time.monotonic() - t0
            self._eval_n += len(batch)

    def _chunk(self, pending: int) -> int:
        """Candidates handed to the evaluator at once: all of them without a wall-clock budget;
        with one, as many as should take at most 5% of it and no more than is left of it (by the
        seconds per candidate seen so far), but one per GPU at least."""
        left = remaining_wall_s(self.budget, self.usage)
        if left is None or self.strict or self.budget.wall_minutes is None:
            return pending
        gpus = max(1, int(self.evaluator.concurrency))
        per = self._eval_s / self._eval_n if self._eval_n else self.PRIOR_EVAL_S / gpus
        target = min(left, 0.05 * self.budget.wall_minutes * 60.0)
        return max(1, min(pending, max(gpus, int(target / max(per, 1e-6)))))

    def _repairs(self, r: int, heads: list[int]) -> None:
        if self.config.repairs <= 0 and not self.strict:
            return
        max_attempts = self.config.repairs
        if self.strict:
            max_attempts = max([k[2] for k in self.external.answers if k[0] == "repair"] + [0])
        ctx = self._ctx(r)
        for attempt in range(1, max_attempts + 1):
            wave: list[int] = []
            for head in heads:
                key = repair_key(head, attempt)
                if ("repair", head, attempt) in self.node_by_key:  # resumed: created, maybe not evaluated
                    wave.append(self.node_by_key[("repair", head, attempt)])
                    continue
                if self.strict:
                    # follow the record: repair what was repaired, whatever the new verdicts
                    if key not in self.external:
                        continue
                    answer, _ = self._ask(key, lambda: None)
                else:
                    target = repair_target(self.tree, head)
                    if target is None:
                        continue
                    spec, result = target.spec, target.result
                    answer, _ = self._ask(key, lambda: self.proposer.repair(ctx, spec, result, attempt))
                if answer is None:
                    continue
                answer = branch_of(answer)
                last = repair_chain(self.tree, head)[-1]
                h = self.tree.nodes[head]
                wave.append(self._create(("repair", head, attempt), parent=last.id, round=r, kind="repair",
                                         idea=h.idea, idea_index=h.idea_index, branch_index=h.branch_index,
                                         repair_of=head, attempt=attempt, branch=answer))
            if not wave:
                break
            self._evaluate(wave)

    def _tune_survivors(self, r: int, heads: list[int]) -> None:
        ids = set()
        for h in heads:
            ids.update(n.id for n in repair_chain(self.tree, h))
        if self.strict:  # follow the record: re-measure what was tuned, at its tuned config
            for i in sorted(ids):
                if self.tree.nodes[i].tuned is None:
                    self._tune_recorded(self.tree.nodes[i])
            return
        survivors = sorted((self.tree.nodes[i] for i in ids if self.tree.nodes[i].ok), key=lambda n: (n.ms, n.id))
        for node in survivors[: self.config.beam]:
            if node.tuned is not None:
                continue
            if self.tuner is None or not self.config.tune:
                continue
            reason = time_exhausted(self.budget, self.usage)
            if reason:
                self.stop_reason = self.stop_reason or reason
                return
            assert node.spec is not None and node.result is not None
            left = remaining_wall_s(self.budget, self.usage)
            if left is not None and _takes_keyword(self.tuner, "minutes"):  # tuning ends with the budget
                # less a margin for the batch in flight when the tuner's deadline passes and for
                # writing the results: the run then ends inside its budget, not just past it
                margin = max(2.0, 0.05 * (self.budget.wall_minutes or 0.0) * 60.0)
                outcome = self.tuner(self.problem, node.spec, node.result, minutes=max(0.0, left - margin) / 60.0)
            else:
                outcome = self.tuner(self.problem, node.spec, node.result)
            if outcome is None:
                self._write(NodeTuned(id=node.id))
                continue
            outcome = TuneOutcome.model_validate(outcome, from_attributes=True)
            self.usage.gpu_s += outcome.gpu_seconds()
            self._write(NodeTuned(id=node.id, config=dict(outcome.config), result=outcome.result,
                                  evaluated=int(outcome.evaluated), curve=list(outcome.curve),
                                  seconds=outcome.seconds))

    def _tune_recorded(self, node: Node) -> None:
        """Replay: re-measure the recorded tuned config (no new tuning)."""
        rec = self.record.tuned.get(node.id) if self.record else None
        if rec is None or rec.config is None or node.spec is None:
            return
        res = self.evaluator.evaluate(self.problem, [Candidate(spec=node.spec, config=rec.config)],
                                      self.eval_options)[0]
        self.usage.gpu_s += res.wall_s
        self._write(NodeTuned(id=node.id, config=dict(rec.config), result=res, evaluated=1,
                              curve=[TunePoint(evals=1, config=dict(rec.config), ms=res.ms if res.ok else None,
                                               verdict=res.verdict.value, wall_s=res.wall_s)]))

    def write_derived(self) -> None:
        write_derived(self.run_dir, self.tree)


def _takes_keyword(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


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
    config: SearchConfig | None = None,
    budget: SearchBudget | None = None,
    tuner: Tuner | None = None,
    seed_spec: KernelSpec | None = None,
    context_factory: ContextFactory | None = None,
    usage: Usage | None = None,
    eval_options: EvalOptions | None = None,
    force: bool = False,
    model: str | None = None,
    listeners: Iterable[Callable[[Any], None]] = (),
) -> SearchOutcome:
    """Run a new search; journal it under ``runs_dir/<run_id>/`` (a new id if none is given)."""
    rid = run_id or new_run_id(problem)
    return Search(problem, proposer, evaluator, run_dir=Path(runs_dir) / rid, config=config, budget=budget,
                  tuner=tuner, seed_spec=seed_spec, context_factory=context_factory, usage=usage,
                  eval_options=eval_options, force=force, model=model, listeners=listeners).run()


def resume_search(
    run: str | Path,
    proposer: Proposer,
    evaluator: Evaluator,
    *,
    runs_dir: str | Path = "runs",
    budget: SearchBudget | None = None,
    tuner: Tuner | None = None,
    context_factory: ContextFactory | None = None,
    usage: Usage | None = None,
    eval_options: EvalOptions | None = None,
    force: bool = False,
    listeners: Iterable[Callable[[Any], None]] = (),
    problem: str | None = None,
) -> SearchOutcome:
    """Continue a journaled run: nothing evaluated is evaluated again, no recorded answer is
    asked again. ``budget`` replaces the recorded one (e.g. more rounds). ``problem``: the problem
    file the caller names (see :func:`kerngen.agent.problem_data.rerun_ref`)."""
    from kerngen.agent.problem_data import rerun_ref

    rec = load_run(run, runs_dir)
    st = rec.started
    ref, _ = rerun_ref(st, problem)  # a run's problem file runs again only when built in, named or unchanged
    return Search(ref, proposer, evaluator, run_dir=rec.path, mode="resume", config=st.config,
                  budget=budget or recorded_budget(rec), tuner=tuner, seed_spec=st.seed_spec,
                  context_factory=context_factory,
                  usage=usage, record=rec, eval_options=eval_options, force=force, model=st.model,
                  listeners=listeners).run()
