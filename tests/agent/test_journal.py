"""The journal: order, fsync, tolerant loading, corruption, resume after a kill (simulated and real)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kerngen.agent import journal as journal_mod
from kerngen.agent.budget import SearchBudget, SearchConfig
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner
from kerngen.agent.context import minimal_context
from kerngen.agent.search import resume_search, run_search
from kerngen.agent.tree import load_run
from kerngen.errors import JournalError
from kerngen.problems.ref import ProblemRef

REF = ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32")
BUDGET = SearchBudget(rounds=3, patience=2, max_llm_calls=None, max_tokens=None, wall_minutes=None,
                      gpu_minutes=None)


def reference(tmp_path: Path, run_id: str = "ref"):
    ev = ScriptedEvaluator()
    out = run_search(REF, ScriptedProposer(), ev, runs_dir=tmp_path, run_id=run_id, budget=BUDGET,
                     config=SearchConfig(), tuner=ScriptedTuner(ev), context_factory=minimal_context)
    return out


def shape_of(tree):
    rows = []
    for n in sorted(tree.nodes.values(), key=lambda n: n.id):
        rows.append((n.id, n.parent, n.round, n.kind, n.idea.text if n.idea else None, n.idea_index,
                     n.branch_index, n.repair_of, n.attempt, n.spec.content_hash() if n.spec else None,
                     n.verdict, n.ms, n.config, n.tuned.config if n.tuned else None))
    return rows


def test_events_in_order_and_fsynced(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(journal_mod.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    out = reference(tmp_path)
    lines = (out.run_dir / "events.jsonl").read_text().splitlines()
    run = load_run(out.run_dir)
    assert len(run.events) == len(lines)
    assert [e.seq for e in run.events] == list(range(len(lines)))
    types = [e.type for e in run.events]
    assert types[:5] == ["run_started", "baseline", "round_started", "ideas", "implemented"]
    assert types[-1] == "run_finished" and types.count("run_finished") == 1
    assert types.count("round_finished") == types.count("round_started") == 3
    # a node is created before it is evaluated, evaluated before it is tuned
    seen: dict[int, str] = {}
    for e in run.events:
        if e.type == "node_created":
            seen[e.id] = "created"
        elif e.type == "node_evaluated":
            assert seen[e.id] == "created"
            seen[e.id] = "evaluated"
        elif e.type == "node_tuned":
            assert seen[e.id] == "evaluated"
    # one fsync of the journal per event (derived files add their own)
    assert len(synced) >= len(lines)
    st = run.started
    assert st.versions["kerngen"] and st.versions["python"] and "torch" in st.versions and "nvrtc" in st.versions
    assert st.gpu is not None and st.budget == BUDGET
    assert (out.run_dir / "tree.json").is_file() and (out.run_dir / "best" / "spec.json").is_file()
    assert run.best.id == out.best.id


def test_loading_errors(tmp_path):
    out = reference(tmp_path)
    with pytest.raises(JournalError, match="not found"):
        load_run(tmp_path / "nope")
    with pytest.raises(JournalError, match="not found"):
        load_run("nope", runs_dir=tmp_path)
    assert load_run("ref", runs_dir=tmp_path).id == "ref"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(JournalError, match="events.jsonl is missing"):
        load_run(empty)
    bad = tmp_path / "bad"
    shutil.copytree(out.run_dir, bad)
    lines = (bad / "events.jsonl").read_text().splitlines(keepends=True)
    lines[16] = lines[16][: len(lines[16]) // 2] + "\n"
    (bad / "events.jsonl").write_text("".join(lines))
    with pytest.raises(JournalError) as exc:
        load_run(bad)
    assert str(exc.value) == "run bad: events.jsonl line 17 is not valid JSON"
    lines[16] = '{"type": "node_evaluated", "id": "x"}\n'
    (bad / "events.jsonl").write_text("".join(lines))
    with pytest.raises(JournalError, match="line 17 is not a valid node_evaluated event"):
        load_run(bad)


def test_truncated_last_line_is_tolerated(tmp_path):
    out = reference(tmp_path)
    path = out.run_dir / "events.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-40])
    run = load_run(out.run_dir)
    assert run.truncated > 0 and run.finished is None
    assert len(run.events) == data.count(b"\n") - 1


@pytest.mark.parametrize("frac", [0.02, 0.13, 0.31, 0.5, 0.77, 0.96])
def test_resume_after_truncation_finishes_the_same_tree(tmp_path, frac):
    ref = reference(tmp_path)
    full = (ref.run_dir / "events.jsonl").read_bytes()
    cut = int(len(full) * frac)
    if full[cut - 1:cut] == b"\n":
        cut += 7  # always mid-line
    work = tmp_path / "cut"
    work.mkdir()
    (work / "events.jsonl").write_bytes(full[:cut])
    before = load_run(work)
    assert before.truncated > 0
    done = set(before.evaluated)
    tuned_before = set(before.tuned)
    answers_before = len(before.book)

    ev, prop = ScriptedEvaluator(), ScriptedProposer()
    out = resume_search(work, prop, ev, tuner=ScriptedTuner(ev), context_factory=minimal_context)
    assert shape_of(out.tree) == shape_of(ref.tree)
    assert out.reason == ref.reason
    after = load_run(work)
    assert shape_of(after.tree) == shape_of(ref.tree)
    # nothing evaluated twice, nothing journaled re-evaluated
    evaluated_ids = [e.id for e in after.events if e.type == "node_evaluated"]
    assert len(evaluated_ids) == len(set(evaluated_ids))
    newly_tuned = [i for i, t in after.tuned.items() if i not in tuned_before and t.config]
    assert ev.evaluated == len(set(evaluated_ids) - done) + 3 * len(newly_tuned)
    # only unanswered questions were asked
    assert prop.total_calls == len(after.book) - answers_before
    assert after.sessions == 2
    assert [e.type for e in after.events].count("run_resumed") == 1


def test_resume_of_a_finished_run_asks_and_evaluates_nothing(tmp_path):
    ref = reference(tmp_path)
    ev, prop = ScriptedEvaluator(), ScriptedProposer()
    out = resume_search(ref.run_dir, prop, ev, tuner=ScriptedTuner(ev), context_factory=minimal_context)
    assert ev.evaluated == 0 and prop.total_calls == 0
    assert shape_of(out.tree) == shape_of(ref.tree)


def test_resume_with_more_rounds_continues(tmp_path):
    ref = reference(tmp_path)
    n = len(ref.tree.nodes)
    ev, prop = ScriptedEvaluator(), ScriptedProposer()
    more = BUDGET.model_copy(update={"rounds": 4, "patience": None})
    out = resume_search(ref.run_dir, prop, ev, budget=more, tuner=ScriptedTuner(ev), context_factory=minimal_context)
    assert set(out.tree.beams) == {0, 1, 2, 3} and len(out.tree.nodes) > n
    assert prop.calls["ideas"] == len(out.tree.beams[3])


KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    from kerngen.agent.budget import SearchBudget, SearchConfig
    from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner
    from kerngen.agent.context import minimal_context
    from kerngen.agent.search import run_search
    from kerngen.problems.ref import ProblemRef
    ev = ScriptedEvaluator(delay_s=0.02)
    run_search(ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32"), ScriptedProposer(), ev,
               runs_dir=sys.argv[1], run_id="killed",
               budget=SearchBudget(rounds=3, patience=2, max_llm_calls=None, max_tokens=None,
                                   wall_minutes=None, gpu_minutes=None),
               config=SearchConfig(), tuner=ScriptedTuner(ev), context_factory=minimal_context)
    """
)


@pytest.mark.parametrize("after_lines", [25, 90])
def test_kill_9_then_resume(tmp_path, after_lines):
    ref = reference(tmp_path)
    runs = tmp_path / "k"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(runs)])
    events = runs / "killed" / "events.jsonl"
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            if events.exists() and events.read_bytes().count(b"\n") >= after_lines:
                break
            if proc.poll() is not None:
                pytest.fail("the scripted search finished before it could be killed")
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = load_run(runs / "killed")
    assert before.finished is None
    ev, prop = ScriptedEvaluator(), ScriptedProposer()
    out = resume_search("killed", prop, ev, runs_dir=runs, tuner=ScriptedTuner(ev), context_factory=minimal_context)
    assert shape_of(out.tree) == shape_of(ref.tree)
    ids = [e.id for e in load_run(runs / "killed").events if e.type == "node_evaluated"]
    assert len(ids) == len(set(ids))
    assert ev.evaluated < sum(1 for n in ref.tree.nodes.values() if n.spec) + 3 * len(ref.tree.nodes)


def test_resume_sweep_over_many_cut_points(tmp_path):
    """Cut the journal mid-line after every 9th event; each resume ends with the reference tree."""
    ref = reference(tmp_path)
    full = (ref.run_dir / "events.jsonl").read_bytes()
    ends = [i + 1 for i, b in enumerate(full) if b == 0x0A]
    want = shape_of(ref.tree)
    for k, end in enumerate(ends[2:-1:9]):
        work = tmp_path / f"sweep{k}"
        work.mkdir()
        (work / "events.jsonl").write_bytes(full[: end + 11])
        ev = ScriptedEvaluator()
        out = resume_search(work, ScriptedProposer(), ev, tuner=ScriptedTuner(ev), context_factory=minimal_context)
        assert shape_of(out.tree) == want, f"cut after byte {end + 11}"


def test_run_finished_records_the_kind_of_stop_and_older_journals_still_read(tmp_path):
    from kerngen.agent.budget import StopKind, StopReason

    reason = StopReason(StopKind.rounds, "rounds: 3 done")
    assert str(reason) == "rounds: 3 done" and f"stopped: {reason}" == "stopped: rounds: 3 done"
    assert journal_mod.parse_event({"type": "run_finished", "reason": "rounds: 3 done"}).stop is None  # older
    assert journal_mod.parse_event({"type": "run_finished", "reason": "x", "stop": "rounds"}).stop is StopKind.rounds
    assert journal_mod.parse_event({"type": "run_finished", "reason": "x", "stop": "a later kind"}).stop is None
    out = reference(tmp_path)
    assert load_run(out.run_dir).finished.stop is out.reason.kind


def test_the_journal_is_peeked_at_through_the_journal_module(tmp_path):
    assert not journal_mod.has_journal(tmp_path) and journal_mod.started_at(tmp_path) == 0.0
    assert not journal_mod.is_appending(tmp_path)
    out = reference(tmp_path)
    assert journal_mod.has_journal(out.run_dir) and not journal_mod.is_appending(out.run_dir)
    assert journal_mod.started_at(out.run_dir) == load_run(out.run_dir).started.t
    with journal_mod.Journal.reopen(out.run_dir)[0]:
        assert journal_mod.is_appending(out.run_dir)
