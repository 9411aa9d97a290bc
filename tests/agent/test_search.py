"""The tree search on the CPU with the scripted (deterministic) proposer, evaluator and tuner."""

from __future__ import annotations

from kerngen.agent.llm.client import LLMCall, LLMUsage

import math

import pytest

from kerngen.agent.budget import SearchBudget, SearchConfig, StopKind, Usage
from kerngen.agent.journal import read_events
from kerngen.agent.proposer import Branch
from kerngen.agent.replay import replay_run
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner, scripted_spec
from kerngen.agent.context import minimal_context
from kerngen.agent.search import Search, SearchSettings, run_search
from kerngen.agent.tree import load_run
from kerngen.errors import ProblemError
from kerngen.harness.results import EvalResult, Verdict
from kerngen.problems.ref import ProblemRef

REF = ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32")
NO_LIMITS = dict(max_llm_calls=None, max_tokens=None, wall_minutes=None, gpu_minutes=None)


def search(tmp_path, proposer=None, evaluator=None, *, tuner="default", config=None, budget=None, **kw):
    proposer = proposer or ScriptedProposer()
    evaluator = evaluator or ScriptedEvaluator()
    if tuner == "default":
        tuner = ScriptedTuner(evaluator)
    out = run_search(REF, proposer, evaluator, runs_dir=tmp_path, run_id=kw.pop("run_id", "run"),
                     config=config, budget=budget, tuner=tuner, context_factory=minimal_context, **kw)
    return out, proposer, evaluator


def test_branching_beam_and_one_batch_per_round(tmp_path):
    cfg = SearchConfig(beam=2, ideas=3, branches=2, repairs=0)
    out, prop, ev = search(tmp_path, config=cfg, budget=SearchBudget(rounds=3, patience=None, **NO_LIMITS),
                           tuner=None)
    tree = out.tree
    assert set(tree.beams) == {0, 1, 2}
    assert tree.beams[0] == [None]
    for r in (1, 2):
        assert 1 <= len(tree.beams[r]) <= 2
        assert all(b is not None and tree.nodes[b].ok for b in tree.beams[r])
    # K ideas per beam node, M branches per idea
    assert prop.calls["ideas"] == 1 + len(tree.beams[1]) + len(tree.beams[2])
    assert prop.calls["implement"] == 3 * prop.calls["ideas"]
    for (r, pid), ideas in tree.ideas.items():
        assert len(ideas) == 3
        for i in range(3):
            heads = [n for n in tree.nodes.values() if n.round == r and n.parent == pid and n.idea_index == i]
            assert len(heads) == 2
    # all branches of a round in ONE evaluate() call (no repairs, no tuner here)
    assert ev.calls == 3
    for r in range(3):
        assert ev.batches[r] == sum(1 for n in tree.nodes.values() if n.round == r and n.spec is not None)
    # the beam of round r+1 = the best correct nodes after round r
    ranked = sorted((n for n in tree.nodes.values() if n.ok and n.round <= 1), key=lambda n: (n.ms, n.id))
    assert tree.beams[2] == [n.id for n in ranked[:2]]


def test_repairs_only_for_failures_and_at_most_r(tmp_path):
    out, prop, ev = search(tmp_path, config=SearchConfig(repairs=2), budget=SearchBudget(rounds=3, patience=None,
                                                                                         **NO_LIMITS))
    tree = out.tree
    repairs = [n for n in tree.nodes.values() if n.kind == "repair"]
    assert repairs and prop.calls["repair"] == len(repairs)
    for n in repairs:
        head = tree.nodes[n.repair_of]
        assert head.kind == "branch" and head.failed
        assert 1 <= n.attempt <= 2
        assert tree.nodes[n.parent].failed  # a repair answers a failure, linked to it
    for head in (n for n in tree.nodes.values() if n.kind == "branch"):
        chain = [n for n in repairs if n.repair_of == head.id]
        if head.ok or head.spec is None:
            assert not chain  # correct and invalid nodes are never repaired
        elif not any(n.ok for n in chain[:-1]):
            # a failure is repaired until it works or R attempts are spent
            assert chain and (chain[-1].ok or len(chain) == 2)
    verdicts = {n.verdict for n in tree.nodes.values()}
    assert {"ok", "incorrect", "invalid"} <= verdicts
    outcomes = " | ".join(t.outcome for t in tree.tried)
    assert "after 2 repairs" in outcomes


class _OneBadBranch(ScriptedProposer):
    def implement(self, ctx, parent, idea, m):
        out = super().implement(ctx, parent, idea, m)
        return [out[0], Branch(error="no JSON in the answer")] + out[2:]


def test_branch_without_spec_is_an_invalid_node(tmp_path):
    out, _, _ = search(tmp_path, _OneBadBranch(), budget=SearchBudget(rounds=2, patience=None, **NO_LIMITS))
    bad = [n for n in out.tree.nodes.values() if n.kind == "branch" and n.branch_index == 1]
    assert bad and all(n.spec is None and n.verdict == "invalid" and n.result is None for n in bad)
    assert all(n.error == "no JSON in the answer" for n in bad)
    assert out.reason.kind is StopKind.rounds  # the search went on
    assert out.best is not None


def test_rounds_budget_and_tuned_parent(tmp_path):
    out, prop, ev = search(tmp_path, budget=SearchBudget(rounds=2, patience=None, **NO_LIMITS))
    assert out.reason.kind is StopKind.rounds and str(out.reason) == "rounds: 2 done"
    finished = load_run(out.run_dir).finished
    assert finished.stop is StopKind.rounds and finished.reason == "rounds: 2 done"
    assert set(out.tree.beams) == {0, 1}
    tuned = [n for n in out.tree.nodes.values() if n.tuned is not None]
    assert tuned and all(n.tuned.config == {"BLOCK": 256} for n in tuned)
    best = out.best
    assert best.config == {"BLOCK": 256} and best.ms < best.result.ms
    # a tuned survivor's config is what the next round builds on
    parent = out.tree.nodes[out.tree.beams[1][0]]
    assert parent.tuned is not None
    run = load_run(out.run_dir)
    spec = (out.run_dir / "best" / "spec.json").read_text()
    assert '"BLOCK": 256' in spec and run.best.id == best.id
    assert (out.run_dir / "best" / "figures.md").read_text().startswith("# Best kernel")


class _MeteredProposer(ScriptedProposer):
    """Drives a usage meter like the LLM proposer: one call and 1000 tokens per question."""

    def __init__(self, usage):
        super().__init__()
        self.usage = usage

    def _tick(self):
        self.usage.on_call(LLMCall(purpose="x", model="m", messages=[],
                                   usage=LLMUsage(prompt_tokens=900, completion_tokens=100, cost_usd=0.002)))

    def ideas(self, ctx, parent, k):
        self._tick()
        return super().ideas(ctx, parent, k)

    def implement(self, ctx, parent, idea, m):
        self._tick()
        return super().implement(ctx, parent, idea, m)

    def repair(self, ctx, failure, attempt):
        self._tick()
        return super().repair(ctx, failure, attempt)


def test_llm_call_and_token_budgets(tmp_path):
    usage = Usage()
    out, prop, _ = search(tmp_path, _MeteredProposer(usage), usage=usage,
                          budget=SearchBudget(rounds=5, patience=None, max_llm_calls=6, max_tokens=None,
                                              wall_minutes=None, gpu_minutes=None))
    assert out.reason.kind is StopKind.llm_calls and str(out.reason).startswith("budget: 6 LLM requests (max 6")
    assert prop.total_calls == 6 and usage.calls == 6 and usage.tokens == 6000
    assert usage.cost_usd == pytest.approx(0.012) and usage.snapshot()["cost_usd"] == pytest.approx(0.012)
    events = load_run(out.run_dir).events
    llm = [e for e in events if e.type == "llm_call"]
    assert len(llm) == 6 and llm[-1].tokens == 6000 and llm[0].record["purpose"] == "x"

    usage2 = Usage()
    out2, prop2, _ = search(tmp_path, _MeteredProposer(usage2), usage=usage2, run_id="tok",
                            budget=SearchBudget(rounds=5, patience=None, max_llm_calls=None, max_tokens=2500,
                                                wall_minutes=None, gpu_minutes=None))
    assert out2.reason.kind is StopKind.tokens and prop2.total_calls == 3


def test_wall_and_gpu_budgets(tmp_path):
    out, prop, ev = search(tmp_path, budget=SearchBudget(rounds=5, wall_minutes=1e-9, patience=None))
    assert out.reason.kind is StopKind.wall_minutes and prop.total_calls == 0 and not out.tree.nodes
    assert "wall minutes" in str(out.reason)
    out, prop, ev = search(tmp_path, run_id="gpu", budget=SearchBudget(rounds=5, gpu_minutes=0.001, patience=None))
    assert out.reason.kind is StopKind.gpu_minutes and ev.calls >= 1
    assert str(out.reason).startswith("budget: ") and "GPU minutes (max 0.001, --gpu-minutes)" in str(out.reason)


class _FlatEvaluator(ScriptedEvaluator):
    """Every correct kernel takes the same time: nothing ever improves after round 0."""

    def evaluate_one(self, cand):
        res = super().evaluate_one(cand)
        if res.ok:
            res.timing.median_ms = 0.9
        return res


def test_patience_stops_early(tmp_path):
    out, _, _ = search(tmp_path, evaluator=_FlatEvaluator(), tuner=None,
                       budget=SearchBudget(rounds=10, patience=2, **NO_LIMITS))
    assert out.reason.kind is StopKind.patience and str(out.reason) == "patience: no better kernel in 2 rounds"
    assert set(out.tree.beams) == {0, 1, 2}  # round 0 improves (from nothing), 1 and 2 do not


def test_tried_ideas_reach_later_rounds(tmp_path):
    out, prop, _ = search(tmp_path, budget=SearchBudget(rounds=3, patience=None, **NO_LIMITS))
    assert prop.seen_tried[0] == []
    round0 = {i.text for i in out.tree.ideas[(0, None)]}
    assert all(round0 <= set(seen) for seen in prop.seen_tried[1:])
    tried = load_run(out.run_dir).tree.tried
    assert len(tried) == sum(len(v) for v in out.tree.ideas.values())
    assert all(t.outcome for t in tried)
    assert any(t.outcome.startswith("ok") for t in tried)


def test_seed_kernel_starts_round_zero(tmp_path):
    seed = scripted_spec(1.5, name="seed")
    out, prop, _ = search(tmp_path, seed_spec=seed, budget=SearchBudget(rounds=1, patience=None, **NO_LIMITS))
    node0 = out.tree.nodes[0]
    assert node0.kind == "seed" and node0.ok and node0.spec.content_hash() == seed.content_hash()
    assert out.tree.beams[0] == [0]
    assert all(n.parent == 0 for n in out.tree.nodes.values() if n.kind == "branch")


def test_degenerate_problem_refused_unless_forced(tmp_path):
    with pytest.raises(ProblemError, match="degenerate"):
        search(tmp_path, evaluator=ScriptedEvaluator(degenerate=True))
    run = load_run(tmp_path / "run")
    assert run.finished is not None and run.finished.stop is StopKind.degenerate
    assert run.finished.reason.startswith("error: ") and "degenerate" in run.finished.reason
    out, _, _ = search(tmp_path, evaluator=ScriptedEvaluator(degenerate=True), force=True, run_id="forced",
                       budget=SearchBudget(rounds=1))
    assert out.best is not None


def test_replay_reproduces_the_tree_without_proposer_calls(tmp_path):
    out, prop, _ = search(tmp_path, seed_spec=scripted_spec(1.4), budget=SearchBudget(rounds=3, patience=None,
                                                                                      **NO_LIMITS))
    new_gpu = ScriptedEvaluator(gpu_name="another GPU", scale=0.8)
    rep = replay_run(out.run_dir, new_gpu, runs_dir=tmp_path, context_factory=minimal_context)
    assert rep.proposer_calls == 0 and rep.outcome.usage.proposer_calls == 0
    orig, new = load_run(out.run_dir), load_run(rep.run_dir)
    assert new.started.replay_of.startswith(orig.id)
    assert sorted(orig.nodes) == sorted(new.nodes)
    for nid, a in orig.nodes.items():
        b = new.nodes[nid]
        assert (a.parent, a.kind, a.idea, a.idea_index, a.branch_index, a.repair_of, a.attempt) == \
               (b.parent, b.kind, b.idea, b.idea_index, b.branch_index, b.repair_of, b.attempt)
        assert (a.spec.content_hash() if a.spec else None) == (b.spec.content_hash() if b.spec else None)
        assert a.verdict == b.verdict
        if a.ok:
            assert b.ms == pytest.approx(a.ms * 0.8)  # re-measured on the "new GPU"
        assert (a.tuned is None) == (b.tuned is None or b.tuned.config is None)
    assert new.tree.gpu.name == "another GPU"
    assert new_gpu.evaluated == sum(1 for n in orig.nodes.values() if n.spec) + sum(
        1 for n in orig.nodes.values() if n.tuned and n.tuned.config)
    rows = {r.node: r for r in rep.rows}
    assert all(math.isclose(r.ratio, 1.25) for r in rows.values() if r.ratio)


def test_replay_follows_the_record_even_when_verdicts_change(tmp_path):
    out, _, _ = search(tmp_path, budget=SearchBudget(rounds=2, patience=None, **NO_LIMITS))

    class AllFail(ScriptedEvaluator):
        def evaluate_one(self, cand):
            res = super().evaluate_one(cand)
            res.verdict, res.timing = Verdict.incorrect, None
            return res

    rep = replay_run(out.run_dir, AllFail(), runs_dir=tmp_path, context_factory=minimal_context)
    assert sorted(rep.outcome.tree.nodes) == sorted(load_run(out.run_dir).nodes)
    assert rep.proposer_calls == 0 and rep.outcome.best is None


class _Counting(ScriptedProposer):
    """Counts every question it is asked (``total_calls``)."""


def test_a_replay_answers_from_the_record_and_asks_nothing(tmp_path):
    """One replay mechanism: the search answers every question from the record's AnswerBook; the
    proposer is asked nothing, and a question the record has no answer for is not asked."""
    out, _, _ = search(tmp_path, config=SearchConfig(repairs=0),
                       budget=SearchBudget(rounds=1, patience=None, **NO_LIMITS))
    run = load_run(out.run_dir)
    assert run.book.answers.keys() >= {("ideas", 0, None), ("implement", 0, None, 1)}
    # the record without its answer to "implement idea 1 of round 0" (as a run killed in the middle
    # of its last round may be): the replay has no branch of that idea
    del run.book.answers[("implement", 0, None, 1)]
    assert any(n.idea_index == 1 for n in run.nodes.values())
    proposer = _Counting()
    settings = SearchSettings.replay(run, REF, tmp_path / "replayed")
    rep = Search(settings, proposer, ScriptedEvaluator(), context_factory=minimal_context).run()
    assert proposer.total_calls == 0 and rep.usage.proposer_calls == 0
    assert rep.reason.kind is StopKind.end_of_record
    assert str(rep.reason) == f"replay: end of the record (the original stopped on: {run.finished.reason})"
    replayed = load_run(rep.run_dir)
    assert replayed.started.proposer == "replay" and replayed.started.replay_of.startswith(run.id)
    assert not any(n.idea_index == 1 for n in replayed.nodes.values())
    specs = lambda nodes: sorted((n.idea_index, n.spec.content_hash() if n.spec else "") for n in nodes)  # noqa: E731
    assert specs(replayed.nodes.values()) == specs(n for n in run.nodes.values() if n.idea_index != 1)
    events, _ = read_events(rep.run_dir)
    assert not [e for e in events if e.type == "implemented" and (e.round, e.parent, e.idea_index) == (0, None, 1)]
    # and a replay needs no proposer at all (replay_run gives none)
    again = Search(SearchSettings.replay(run, REF, tmp_path / "again"), None, ScriptedEvaluator(),
                   context_factory=minimal_context).run()
    assert sorted(again.tree.nodes) == sorted(replayed.nodes)


def test_settings_fill_what_the_record_holds(tmp_path):
    seed = scripted_spec(1.4)
    cfg = SearchConfig(beam=1, ideas=2, branches=1, repairs=0)
    budget = SearchBudget(rounds=1, patience=None, **NO_LIMITS)
    out, _, _ = search(tmp_path, config=cfg, budget=budget, seed_spec=seed, model="m1")
    run = load_run(out.run_dir)
    resumed = SearchSettings.resume(run, REF)
    assert (resumed.mode.value, resumed.run_dir, resumed.config, resumed.budget, resumed.model) == \
           ("resume", run.path, cfg, budget, "m1")
    assert resumed.seed_spec.content_hash() == seed.content_hash() and resumed.record is run
    more = SearchBudget(rounds=3)
    assert SearchSettings.resume(run, REF, budget=more, model="m2").budget == more
    replay = SearchSettings.replay(run, REF, tmp_path / "r")
    assert replay.replaying and replay.force and replay.config == cfg and replay.budget == SearchBudget.unlimited()
    new = SearchSettings.new(REF, tmp_path / "n", argv=["/usr/bin/kerngen", "generate", "softmax"])
    assert new.mode.value == "new" and new.record is None and new.argv == ("kerngen", "generate", "softmax")
    with pytest.raises(ValueError):
        Search(new, None, ScriptedEvaluator())  # only a replay searches without a proposer


class OutOfMemoryEvaluator(ScriptedEvaluator):
    """The harness runs out of GPU memory on every candidate (KernelBench at its own size)."""

    def evaluate(self, problem, candidates, options=None, on_result=None):
        self.calls += 1
        return [EvalResult(verdict=Verdict.harness_error, message="harness error: out of GPU memory: 12 GB")
                for _ in candidates]


def test_the_harness_out_of_memory_stops_the_search_and_blames_no_kernel(tmp_path):
    from kerngen.agent.search import resume_search

    ev = OutOfMemoryEvaluator()
    out, prop, _ = search(tmp_path, evaluator=ev, budget=SearchBudget(rounds=3, patience=None, **NO_LIMITS))
    assert out.reason.kind is StopKind.harness and "out of GPU memory" in out.reason.text
    assert ev.calls == 1 and prop.calls["repair"] == 0  # no repair of a kernel that did nothing wrong
    run = load_run(tmp_path / "run")
    assert run.finished.stop is StopKind.harness
    pending = [n for n in run.nodes.values() if n.spec is not None]
    assert pending and all(n.result is None for n in pending)  # no verdict recorded against the kernels
    # on a GPU where it fits, a resume evaluates exactly those nodes
    again = resume_search(tmp_path / "run", ScriptedProposer(), ScriptedEvaluator(), runs_dir=tmp_path,
                          budget=SearchBudget(rounds=1, patience=None, **NO_LIMITS), context_factory=minimal_context)
    assert all(again.tree.nodes[n.id].result is not None for n in pending)
