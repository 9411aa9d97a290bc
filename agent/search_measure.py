"""What a search measures: nodes evaluated (in chunks under a wall-clock budget) and survivors
tuned (within what is left of it), every result journaled as it comes.

A round's nodes go to the evaluator in ONE ``evaluate`` call (parallel on all GPUs), except under
a wall-clock budget: then the batch is cut into chunks that each take a small part of it, and the
budget is checked before each one, so that a stop lands in time (a batch of 200 candidates could
otherwise run minutes past it). Nodes not evaluated when the time (wall or GPU) is spent keep no
result: a resume evaluates them. The tuner is told what is left of the wall-clock budget, less a
margin, for the same reason. A replay evaluates every node and re-measures each recorded tuned
config: no chunks, no budget, no new tuning.

After a round, the best node of the round is profiled (:meth:`Measurements.profile_best`) where
the evaluator can (:class:`~kerngen.harness.evaluator.Profiler`: Nsight Compute on the GPU host):
once per node, in rounds this session runs (a resume re-profiles nothing), its seconds counted as
GPU time. Without a profiler, or where the host has no ncu, the search is what it was before.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from kerngen.agent.budget import StopKind, StopReason, Usage, remaining_wall_s, time_exhausted
from kerngen.agent.idea_outcomes import repair_chain
from kerngen.agent.journal import NodeEvaluated, NodeProfiled, NodeTuned
from kerngen.agent.search_settings import SearchSettings, Tuner
from kerngen.agent.tree import Node, Tree
from kerngen.harness.evaluator import Candidate, EvalOptions, Evaluator
from kerngen.harness.results import EvalResult, KernelProfile, ProfileOutcome, Verdict
from kerngen.harness.tune.outcome import TuneOutcome, TunePoint

log = logging.getLogger(__name__)


class Measurements:
    """Evaluates and tunes the nodes of one search's ``tree``; ``write`` journals an event (and
    through the journal's listeners updates the tree). Each method that may stop for time gives
    back the :class:`~kerngen.agent.budget.StopReason` (else None); the search keeps the first."""

    # seconds one candidate is assumed to take (compile, check, bench on one GPU) before any was timed
    PRIOR_EVAL_S = 5.0
    PROFILE_TIMEOUT_S = 120.0  # the most one profile may take (ncu replays every kernel per metric pass)
    PROFILE_MIN_S = 20.0  # under a wall-clock budget: with less left than this, no profile is started

    def __init__(self, settings: SearchSettings, evaluator: Evaluator, tuner: Tuner | None, usage: Usage,
                 tree: Tree, write: Callable[[Any], Any]) -> None:
        self.settings = settings
        self.evaluator = evaluator
        self.tuner = tuner
        self.usage = usage
        self.tree = tree
        self.write = write
        self.eval_s = 0.0  # wall seconds spent in evaluator.evaluate() by this session ...
        self.eval_n = 0  # ... and the candidates it evaluated in them
        self.profiling = True  # False once the evaluator said this host cannot profile

    # ----- evaluation -------------------------------------------------------------------------
    def evaluate(self, ids: list[int]) -> StopReason | None:
        """Evaluate the nodes without a result. Under a wall-clock budget the batch is cut into
        chunks (see :meth:`chunk`) and the budget checked before each one: a stop lands in time."""
        s = self.settings
        todo = [self.tree.nodes[i] for i in ids]
        todo = [n for n in todo if n.spec is not None and n.result is None]
        done: set[int] = set()
        harness: list[str] = []
        cancelled: list[int] = []

        def on_result(batch: list[Node], i: int, res: EvalResult) -> None:
            node = batch[i]
            if node.id in done:
                return
            done.add(node.id)
            if res.verdict is Verdict.cancelled:  # the deadline came first: no result (a resume evaluates it)
                cancelled.append(node.id)
                return
            self.usage.gpu_s += res.wall_s
            if res.verdict is Verdict.harness_error:
                # not the kernel's verdict: the node keeps no result (a resume, e.g. on a larger GPU,
                # evaluates it) and the search stops with the harness's own reason
                harness.append(res.message)
                return
            self.usage.evaluations += 1
            self.write(NodeEvaluated(id=node.id, result=res))

        while todo:
            if not s.replaying:
                reason = time_exhausted(s.budget, self.usage)
                if reason:
                    return reason
            n = self.chunk(len(todo))
            batch, todo = todo[:n], todo[n:]
            t0 = time.monotonic()
            results = self.evaluator.evaluate(s.problem, [Candidate(spec=x.spec) for x in batch], self.options(),
                                              lambda i, res, b=batch: on_result(b, i, res))
            for i, res in enumerate(results):
                on_result(batch, i, res)
            self.eval_s += time.monotonic() - t0
            self.eval_n += len(batch)
            if harness:
                return StopReason(StopKind.harness, f"the harness could not evaluate a candidate: {harness[0]}"[:500])
            if cancelled:
                return StopReason(StopKind.wall_minutes, f"budget: {self.usage.wall_s / 60:.2f} wall minutes "
                                  f"(max {s.budget.wall_minutes:g}; {len(cancelled)} candidates left for a resume)")
        return None

    def options(self) -> EvalOptions | None:
        """The evaluation options, with the wall-clock budget's end, less what one candidate
        takes, as the evaluator's deadline: nothing is compiled or started past it, so a chunk
        whose candidates took longer than foreseen still ends in time (those in flight finish
        about when the budget does)."""
        s = self.settings
        left = remaining_wall_s(s.budget, self.usage)
        if left is None or s.replaying:
            return s.eval_options
        gpus = max(1, int(self.evaluator.concurrency))
        one = self.eval_s / self.eval_n * gpus if self.eval_n else self.PRIOR_EVAL_S
        deadline = time.monotonic() + left - min(self.margin_s(), one)
        return (s.eval_options or EvalOptions()).model_copy(update={"deadline": deadline})

    def margin_s(self) -> float:
        """Seconds kept at the end of a wall-clock budget for what is in flight when the deadline
        passes (one candidate per GPU, a tuning batch) and for writing the results."""
        return max(2.0, 0.05 * (self.settings.budget.wall_minutes or 0.0) * 60.0)

    def chunk(self, pending: int) -> int:
        """Candidates handed to the evaluator at once: all of them without a wall-clock budget;
        with one, as many as should take at most 5% of it and no more than is left of it (by the
        seconds per candidate seen so far), but one per GPU at least."""
        budget = self.settings.budget
        left = remaining_wall_s(budget, self.usage)
        if left is None or self.settings.replaying or budget.wall_minutes is None:
            return pending
        gpus = max(1, int(self.evaluator.concurrency))
        per = self.eval_s / self.eval_n if self.eval_n else self.PRIOR_EVAL_S / gpus
        target = min(left, 0.05 * budget.wall_minutes * 60.0)
        return max(1, min(pending, max(gpus, int(target / max(per, 1e-6)))))

    # ----- tuning -----------------------------------------------------------------------------
    def tune_survivors(self, heads: list[int]) -> StopReason | None:
        """Tune the fastest correct nodes of the round (up to the beam) that ``heads`` and their
        repairs hold; a replay re-measures what the record tuned instead."""
        s = self.settings
        ids = set()
        for h in heads:
            ids.update(n.id for n in repair_chain(self.tree, h))
        if s.replaying:  # follow the record: re-measure what was tuned, at its tuned config
            for i in sorted(ids):
                if self.tree.nodes[i].tuned is None:
                    self.tune_recorded(self.tree.nodes[i])
            return None
        survivors = sorted((self.tree.nodes[i] for i in ids if self.tree.nodes[i].ok), key=lambda n: (n.ms, n.id))
        for node in survivors[: s.config.beam]:
            if node.tuned is not None or self.tuner is None or not s.config.tune:
                continue
            reason = time_exhausted(s.budget, self.usage)
            if reason:
                return reason
            assert node.spec is not None and node.result is not None
            left = remaining_wall_s(s.budget, self.usage)
            minutes = None
            if left is not None:  # tuning ends with the budget
                # less a margin for the batch in flight when the tuner's deadline passes and for
                # writing the results: the run then ends inside its budget, not just past it
                minutes = max(0.0, left - self.margin_s()) / 60.0
            outcome = self.tuner(s.problem, node.spec, node.result, minutes=minutes)
            if outcome is None:
                self.write(NodeTuned(id=node.id))
                continue
            outcome = TuneOutcome.model_validate(outcome, from_attributes=True)
            self.usage.gpu_s += outcome.gpu_seconds()
            self.write(NodeTuned(id=node.id, config=dict(outcome.config), result=outcome.result,
                                 evaluated=int(outcome.evaluated), curve=list(outcome.curve), seconds=outcome.seconds))
        return None

    def tune_recorded(self, node: Node) -> None:
        """Replay: re-measure the recorded tuned config (no new tuning)."""
        record = self.settings.record
        rec = record.tuned.get(node.id) if record is not None else None
        if rec is None or rec.config is None or node.spec is None:
            return
        res = self.evaluator.evaluate(self.settings.problem, [Candidate(spec=node.spec, config=rec.config)],
                                      self.settings.eval_options)[0]
        self.usage.gpu_s += res.wall_s
        self.write(NodeTuned(id=node.id, config=dict(rec.config), result=res, evaluated=1,
                             curve=[TunePoint(evals=1, config=dict(rec.config), ms=res.ms if res.ok else None,
                                              verdict=res.verdict.value, wall_s=res.wall_s)]))

    # ----- profiling --------------------------------------------------------------------------
    def profile_best(self, round_: int) -> None:
        """Profile the fastest correct node of ``round_`` at its best config, once, and journal
        it (:class:`~kerngen.agent.journal.NodeProfiled`): the next prompts show its metrics.
        Nothing happens in a replay, without a profiler, for a node already profiled, in a round
        an earlier session finished, or when the time budget is spent; a host that cannot profile
        (no ncu) is logged once and not asked again. Never raises."""
        s = self.settings
        profile = getattr(self.evaluator, "profile", None)
        if not callable(profile) or not self.profiling or s.replaying or round_ in self.tree.rounds_finished:
            return
        node = self.round_best(round_)
        if node is None or node.profile is not None or node.spec is None:
            return
        if time_exhausted(s.budget, self.usage):
            return
        timeout = self.PROFILE_TIMEOUT_S
        left = remaining_wall_s(s.budget, self.usage)
        if left is not None:  # the profile ends inside the budget, less the margin tuning keeps
            timeout = min(timeout, left - self.margin_s())
            if timeout < self.PROFILE_MIN_S:
                return
        config = dict(node.config)
        started = time.monotonic()
        try:
            outcome = _outcome(profile(s.problem, node.spec, config, timeout_s=timeout))
        except Exception as exc:  # noqa: BLE001 - profiling is feedback: its fault never stops a search
            outcome = ProfileOutcome(error=f"profiler error: {type(exc).__name__}: {exc}"[:300])
        if not outcome.available:
            self.profiling = False
            log.warning("no profiler feedback in this search: %s", outcome.error or "ncu not available")
            return
        seconds = outcome.seconds or round(time.monotonic() - started, 3)
        self.usage.gpu_s += seconds
        self.write(NodeProfiled(id=node.id, config=config, profiles=outcome.profiles,
                                error=" ".join(outcome.error.split())[:400], seconds=seconds))

    def round_best(self, round_: int) -> Node | None:
        """The fastest correct node created in ``round_`` (ties: the older)."""
        done = [n for n in self.tree.nodes.values() if n.round == round_ and n.ok]
        return min(done, key=lambda n: (n.ms, n.id), default=None)


def _outcome(value: Any) -> ProfileOutcome:
    """What a profiler gave back as THE outcome type: a ProfileOutcome (or one alike), or a bare
    list of kernel profiles."""
    if isinstance(value, ProfileOutcome):
        return value
    if isinstance(value, (list, tuple)):
        return ProfileOutcome(profiles=[KernelProfile.model_validate(p, from_attributes=True) for p in value])
    return ProfileOutcome.model_validate(value, from_attributes=True)
