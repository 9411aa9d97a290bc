"""Profiler feedback in the search (CPU): the best node of each round is profiled once, journaled
(node_profiled), kept on the tree's node, shown in the next round's prompt, in ``kerngen show``
and the report; a resume re-profiles nothing, a replay profiles nothing; a host without ncu
runs the search as before."""

from __future__ import annotations

import logging


from kerngen.agent.budget import SearchBudget
from kerngen.agent.context import minimal_context
from kerngen.agent.journal import NodeProfiled, read_events
from kerngen.agent.llm.proposer import CATEGORY_HELP
from kerngen.agent.llm.prompting import render
from kerngen.agent.proposer import Category
from kerngen.agent.replay import replay_run
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner
from kerngen.agent.search import resume_search, run_search
from kerngen.agent.tree import load_run
from kerngen.harness.results import KernelProfile, ProfileOutcome, StallShare
from kerngen.problems.ref import ProblemRef

REF = ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32")
NO_LIMITS = dict(max_llm_calls=None, max_tokens=None, wall_minutes=None, gpu_minutes=None)
PROFILE = KernelProfile(name="kernel", duration_ms=0.5, dram_pct=78.4, l2_pct=31.0, sm_pct=22.2, tensor_pct=0.0,
                        occupancy_pct=47.9, theoretical_occupancy_pct=50.0, local_bytes=0,
                        stalls=[StallShare(reason="long_scoreboard", cycles=18.3, pct=61.2),
                                StallShare(reason="barrier", cycles=3.6, pct=12.1)])
LINE = ("profile (ncu), 0.5 ms: DRAM 78% of peak, L2 31%, SM 22%, tensor pipe 0%; occupancy 48% (theoretical 50%); "
        "top stalls (% of stall cycles): long_scoreboard 61%, barrier 12%; no local-memory spills")


class ProfilingEvaluator(ScriptedEvaluator):
    """The scripted evaluator with the Profiler capability (what the WorkerPool does with ncu)."""

    def __init__(self, outcome: ProfileOutcome | None = None, **kw) -> None:
        super().__init__(**kw)
        self.outcome = outcome or ProfileOutcome(profiles=[PROFILE], seconds=1.5)
        self.profiled: list[tuple[str, dict[str, int]]] = []

    def profile(self, problem, spec, config=None, *, timeout_s=120.0):
        assert timeout_s > 0
        self.profiled.append((spec.content_hash(), dict(config or {})))
        return self.outcome


class RecordingProposer(ScriptedProposer):
    """Renders the real ideas prompt for every parent it is asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: dict[tuple[int, int | None], str] = {}

    def ideas(self, ctx, parent, k):
        self.prompts[(ctx.round, parent.node_id if parent else None)] = render(
            "ideas", ctx=ctx, parent=parent, k=k, structured=True, clip_limit=24_000,
            categories=[(c.value, CATEGORY_HELP[c]) for c in Category])
        return super().ideas(ctx, parent, k)


def _search(tmp_path, evaluator, proposer=None, rounds=3, run_id="run"):
    proposer = proposer or RecordingProposer()
    out = run_search(REF, proposer, evaluator, runs_dir=tmp_path, run_id=run_id, tuner=ScriptedTuner(evaluator),
                     budget=SearchBudget(rounds=rounds, patience=None, **NO_LIMITS), context_factory=minimal_context)
    return out, proposer


def _profiled(run_dir) -> list[NodeProfiled]:
    return [e for e in read_events(run_dir)[0] if isinstance(e, NodeProfiled)]


def test_best_node_of_each_round_is_profiled_once_and_shown_to_the_model(tmp_path):
    ev = ProfilingEvaluator()
    out, prop = _search(tmp_path, ev)
    events = _profiled(out.run_dir)
    tree = out.tree
    # one profile per round at most: the round's fastest correct node, at its best (tuned) config
    assert 1 <= len(events) <= 3 and len({e.id for e in events}) == len(events)
    for e in events:
        node = tree.nodes[e.id]
        same_round = [n for n in tree.nodes.values() if n.round == node.round and n.ok]
        assert node.id == min(same_round, key=lambda n: (n.ms, n.id)).id
        assert e.config == node.config and e.profiles == [PROFILE] and e.seconds == 1.5 and e.error == ""
        assert node.profile == e  # the tree keeps it on the node
    assert len(ev.profiled) == len(events)
    assert [c for _, c in ev.profiled] == [tree.nodes[e.id].config for e in events]
    assert out.usage.gpu_s >= 1.5 * len(events)  # counted in the GPU-time budget
    # the next round's prompt shows the profile of its parent
    r0 = events[0]
    parent_prompt = prop.prompts.get((1, r0.id))
    assert parent_prompt is not None and LINE in parent_prompt
    assert prop.prompts[(0, None)].count("profile (ncu)") == 0  # nothing profiled yet
    summary = tree.summary(tree.nodes[r0.id])
    assert summary is not None and summary.profile == [PROFILE]
    assert tree.to_json()["nodes"][r0.id]["profile"]["kernels"][0]["dram_pct"] == 78.4


def test_show_and_report_say_it(tmp_path):
    from kerngen.results.report import render as report
    from kerngen.results.show import profile_text, render as show
    from rich.console import Console

    ev = ProfilingEvaluator()
    out, _ = _search(tmp_path, ev, rounds=1)
    run = load_run(out.run_dir)
    (node,) = [n for n in run.nodes.values() if n.profile is not None]
    text = profile_text(node.profile)
    assert text.startswith("profile (ncu): 0.5 ms: DRAM 78% of peak")
    console = Console(width=400, record=True)
    console.print(show(run))
    assert "profile (ncu): 0.5 ms: DRAM 78% of peak" in console.export_text()
    html = report(run)
    assert "profile (ncu): 0.5 ms: DRAM 78% of peak" in html


def test_resume_profiles_nothing_again_and_replay_profiles_nothing(tmp_path):
    ev = ProfilingEvaluator()
    out, _ = _search(tmp_path, ev, rounds=2)
    before = _profiled(out.run_dir)
    assert before
    again_ev = ProfilingEvaluator()
    resume_search(tmp_path / "run", RecordingProposer(), again_ev, runs_dir=tmp_path, tuner=ScriptedTuner(again_ev),
                  budget=SearchBudget(rounds=3, patience=None, **NO_LIMITS), context_factory=minimal_context)
    after = _profiled(out.run_dir)
    assert after[: len(before)] == before
    assert len(after) - len(before) == len(again_ev.profiled) <= 1  # round 2 only
    assert len({e.id for e in after}) == len(after)
    # resuming a finished run's rounds: nothing more
    third = ProfilingEvaluator()
    resume_search(tmp_path / "run", RecordingProposer(), third, runs_dir=tmp_path, tuner=ScriptedTuner(third),
                  budget=SearchBudget(rounds=3, patience=None, **NO_LIMITS), context_factory=minimal_context)
    assert third.profiled == [] and _profiled(out.run_dir) == after
    replayer = ProfilingEvaluator()
    rep = replay_run(out.run_dir, replayer, runs_dir=tmp_path, context_factory=minimal_context)
    assert replayer.profiled == [] and _profiled(rep.run_dir) == []


def test_without_a_profiler_or_ncu_the_search_is_as_before(tmp_path, caplog):
    plain, _ = _search(tmp_path, ScriptedEvaluator(), run_id="plain")
    assert _profiled(plain.run_dir) == []
    none = ProfilingEvaluator(ProfileOutcome(available=False, error="ncu (Nsight Compute) not found"))
    with caplog.at_level(logging.INFO, logger="kerngen"):
        out, prop = _search(tmp_path, none, run_id="no-ncu")
    assert len(none.profiled) == 1  # asked once, then never again
    assert _profiled(out.run_dir) == [] and all("profile (ncu)" not in p for p in prop.prompts.values())
    lines = [r for r in caplog.records if "profiler" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno < logging.ERROR
    assert [n.id for n in out.tree.ranked()] == [n.id for n in plain.tree.ranked()]  # the same search


class BrokenProfiler(ProfilingEvaluator):
    def profile(self, problem, spec, config=None, *, timeout_s=120.0):
        self.profiled.append((spec.content_hash(), dict(config or {})))
        raise RuntimeError("ncu vanished")


def test_a_failed_profile_is_a_record_never_a_crash(tmp_path):
    failing = ProfilingEvaluator(ProfileOutcome(error="ncu did not finish within 120 s (killed)", seconds=120.0))
    out, prop = _search(tmp_path, failing, rounds=2, run_id="failing")
    events = _profiled(out.run_dir)
    assert events and all(e.profiles == [] and "did not finish" in e.error for e in events)
    assert out.tree.nodes[events[0].id].profile.error.startswith("ncu did not finish")
    assert all("profile (ncu)" not in p for p in prop.prompts.values())
    broken = BrokenProfiler()
    out, _ = _search(tmp_path, broken, rounds=2, run_id="broken")
    events = _profiled(out.run_dir)
    assert events and all(e.error == "profiler error: RuntimeError: ncu vanished" for e in events)
    assert out.best is not None
