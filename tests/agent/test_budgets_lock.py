"""The journal and the budgets hold: one writer per run (a lock, released by the OS on kill -9),
``--minutes T`` ends within 10% of T (checked between evaluations, tuning bounded by what is
left), a resume takes its budgets from the command line, the LLM call count stops the proposer
(failed calls included), and what a model wrote reaches a terminal without control sequences."""

from __future__ import annotations

import functools
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.budget import SearchBudget, SearchConfig, StopKind, Usage, resume_budget
from kerngen.agent.journal import Journal, ensure_unlocked
from kerngen.agent.llm.client import LLMCall, LLMUsage
from kerngen.agent.proposer import Branch
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner
from kerngen.agent.context import minimal_context
from kerngen.agent.search import resume_search, run_search
from kerngen.harness.results import Verdict
from kerngen.agent.tree import load_run
from kerngen.errors import JournalError, KerngenError
from kerngen.problems.ref import ProblemRef
from tests.cli_output import stderr_of

REF = ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32")
NO_LIMITS = dict(max_llm_calls=None, max_tokens=None, wall_minutes=None, gpu_minutes=None)
ROOT = Path(__file__).resolve().parents[2]

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args))


# ----- one writer per run ---------------------------------------------------------------------
SLOW_SEARCH = textwrap.dedent(
    """
    import sys
    from kerngen.agent.budget import SearchBudget, SearchConfig
    from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer, ScriptedTuner
    from kerngen.agent.context import minimal_context
    from kerngen.agent.search import run_search
    from kerngen.problems.ref import ProblemRef
    ev = ScriptedEvaluator(delay_s=0.2)
    run_search(ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32"), ScriptedProposer(), ev,
               runs_dir=sys.argv[1], run_id="busy",
               budget=SearchBudget(rounds=50, patience=None, max_llm_calls=None, max_tokens=None,
                                   wall_minutes=None, gpu_minutes=None),
               config=SearchConfig(), tuner=ScriptedTuner(ev), context_factory=minimal_context)
    """
)


def _node_ids(run_dir: Path) -> tuple[list[int], list[int]]:
    run = load_run(run_dir)
    created = [e.id for e in run.events if e.type == "node_created"]
    evaluated = [e.id for e in run.events if e.type == "node_evaluated"]
    return created, evaluated


def test_a_second_process_appending_to_a_run_is_refused_until_the_first_dies(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SEARCH, str(runs)], cwd=ROOT)
    events = runs / "busy" / "events.jsonl"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if events.exists() and events.read_bytes().count(b"\n") >= 8:
                break
            assert proc.poll() is None, "the slow search ended before the test could join it"
            time.sleep(0.02)
        # a second process: `kerngen generate --resume` of the same run, refused with one line
        second = subprocess.run(
            [sys.executable, "-m", "kerngen", "generate", "--resume", "busy", "--runs-dir", str(runs),
             "--evaluator", "scripted"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        err = second.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "another kerngen process is appending to it" in err
        # and the library path (this process) too, even past the early check of the CLI
        ev = ScriptedEvaluator()
        with pytest.raises(JournalError, match="another kerngen process is appending"):
            resume_search(runs / "busy", ScriptedProposer(), ev, tuner=ScriptedTuner(ev),
                          context_factory=minimal_context)
        with pytest.raises(JournalError):
            ensure_unlocked(runs / "busy")
        assert proc.poll() is None  # the first one was not disturbed
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # a crash: the OS drops its lock
        proc.wait(timeout=30)
    created, evaluated = _node_ids(runs / "busy")
    assert len(created) == len(set(created)) and created == sorted(created)
    # the crashed run resumes (the lock died with its process) and stays consistent
    ev = ScriptedEvaluator()
    out = resume_search(runs / "busy", ScriptedProposer(), ev, tuner=ScriptedTuner(ev),
                        budget=SearchBudget(rounds=2, patience=None, **NO_LIMITS), context_factory=minimal_context)
    created, evaluated = _node_ids(out.run_dir)
    assert len(created) == len(set(created)) and len(evaluated) == len(set(evaluated))
    assert set(evaluated) <= set(created)
    ensure_unlocked(out.run_dir)  # released at the end of the search


def test_lock_held_for_the_life_of_the_journal_in_one_process(tmp_path):
    j = Journal(tmp_path / "r")
    with pytest.raises(JournalError, match="appending"):
        Journal(tmp_path / "r")
    j.close()
    Journal(tmp_path / "r").close()  # released on close


def test_resume_without_a_gpu_lets_go_of_the_lock(tmp_path):
    out, _, _ = _search(tmp_path, budget=SearchBudget(rounds=1, patience=None, **NO_LIMITS))

    class NoGPU(ScriptedEvaluator):
        def gpu_facts(self):
            raise KerngenError("no CUDA device visible")

    with pytest.raises(KerngenError, match="no CUDA"):
        resume_search(out.run_dir, ScriptedProposer(), NoGPU(), context_factory=minimal_context)
    ensure_unlocked(out.run_dir)


# ----- --minutes T ends within 10% of T -----------------------------------------------------
def _search(tmp_path, proposer=None, evaluator=None, *, tuner="default", budget=None, config=None, **kw):
    evaluator = evaluator or ScriptedEvaluator()
    if tuner == "default":
        tuner = ScriptedTuner(evaluator)
    out = run_search(REF, proposer or ScriptedProposer(), evaluator, runs_dir=tmp_path, run_id=kw.pop("run_id", "run"),
                     budget=budget, config=config, tuner=tuner, context_factory=minimal_context, **kw)
    return out, proposer, evaluator


def test_wall_budget_ends_within_ten_percent_with_slow_evaluations_and_tuning(tmp_path, monkeypatch):
    """Evaluations of 0.1 s each, rounds of ~20 candidates, the production tuner adapter
    (agent/proposers.make_tuner over harness/tuner.tune): the search ends within 10% of 10 s."""
    from kerngen.cli.compose import make_tuner
    from kerngen.harness.tune import tuner as tuner_mod

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    # no NVRTC in the tuner's resource probe: the fake evaluator's timing is the only clock
    monkeypatch.setattr(tuner_mod, "tune", functools.partial(tuner_mod.tune, probe=None))
    ev = ScriptedEvaluator(delay_s=0.1)
    limit_s = 10.0
    budget = SearchBudget(rounds=1000, patience=None, max_llm_calls=None, max_tokens=None,
                          wall_minutes=limit_s / 60.0, gpu_minutes=None)
    usage = Usage()
    t0 = time.monotonic()
    out, _, _ = _search(tmp_path, evaluator=ev, tuner=make_tuner(ev, REF, ev.gpu_facts(), minutes=3.0),
                        budget=budget, config=SearchConfig(beam=2, ideas=3, branches=3, repairs=1), usage=usage)
    took = time.monotonic() - t0
    assert out.reason.kind is StopKind.wall_minutes
    # within 10% either way: the evaluator's deadline ends a chunk about one candidate before the end
    assert 0.9 * limit_s <= usage.wall_s and took <= 1.1 * limit_s, (took, out.reason)
    assert ev.evaluated > 40  # it did work up to the end: several rounds and tunings
    tuned = [n for n in out.tree.nodes.values() if n.tuned is not None and n.tuned.config]
    assert tuned


def test_stop_between_evaluations_leaves_the_rest_to_a_resume(tmp_path):
    """A budget that runs out in the middle of a batch: the nodes not evaluated have no result,
    and a resume evaluates them (once)."""
    ev = ScriptedEvaluator(delay_s=0.05)
    budget = SearchBudget(rounds=3, patience=None, max_llm_calls=None, max_tokens=None, wall_minutes=0.02,
                          gpu_minutes=None)
    out, _, _ = _search(tmp_path, evaluator=ev, tuner=None, budget=budget,
                        config=SearchConfig(beam=2, ideas=3, branches=4, repairs=0))
    assert out.reason.kind is StopKind.wall_minutes
    pending = [n.id for n in out.tree.nodes.values() if n.spec is not None and n.result is None]
    assert pending, "the budget should have cut a batch"
    assert max(ev.batches) < 12  # cut into chunks, not one batch of the whole round
    ev2 = ScriptedEvaluator()
    more = SearchBudget(rounds=1, patience=None, **NO_LIMITS)
    out2 = resume_search(out.run_dir, ScriptedProposer(), ev2, budget=more, context_factory=minimal_context)
    _, evaluated = _node_ids(out2.run_dir)
    assert len(evaluated) == len(set(evaluated))
    assert all(out2.tree.nodes[i].result is not None for i in pending)


class SlowingEvaluator(ScriptedEvaluator):
    """Fast for the first candidates (so the search plans large chunks), then 0.5 s each: only the
    deadline the search passes (``EvalOptions.deadline``) can end such a chunk in time."""

    def __init__(self) -> None:
        super().__init__()
        self.deadlines: list[float | None] = []

    def evaluate_one(self, cand):
        time.sleep(0.0 if self.evaluated < 6 else 0.5)
        return super().evaluate_one(cand)

    def evaluate(self, problem, candidates, options=None, on_result=None):
        self.deadlines.append(options.deadline if options is not None else None)
        return super().evaluate(problem, candidates, options, on_result)


def test_the_search_passes_its_deadline_and_a_slow_chunk_still_ends_in_time(tmp_path):
    ev = SlowingEvaluator()
    limit_s = 4.0
    budget = SearchBudget(rounds=1000, patience=None, max_llm_calls=None, max_tokens=None,
                          wall_minutes=limit_s / 60.0, gpu_minutes=None)
    usage = Usage()
    t0 = time.monotonic()
    out, _, _ = _search(tmp_path, evaluator=ev, tuner=None, budget=budget, usage=usage,
                        config=SearchConfig(beam=3, ideas=4, branches=4, repairs=0))
    took = time.monotonic() - usage.t0  # the budget's clock starts once the baseline is known
    assert took <= 1.1 * limit_s, (took, out.reason)
    assert out.reason.kind is StopKind.wall_minutes and "left for a resume" in out.reason.text
    # every call carried the budget's end less the margin (2 s here): never past the budget's end (its
    # clock starts once the baseline is known: usage.t0)
    assert t0 <= usage.t0 and ev.deadlines and all(d is not None and d <= usage.t0 + limit_s for d in ev.deadlines)
    cancelled = [n for n in out.tree.nodes.values() if n.spec is not None and n.result is None]
    assert cancelled  # not run, no verdict recorded against them: a resume evaluates them
    assert all(n.result is None or n.result.verdict is not Verdict.cancelled for n in out.tree.nodes.values())


def test_tuner_gets_what_is_left_of_the_wall_budget(tmp_path):
    seen: list[float | None] = []

    class Tuner(ScriptedTuner):
        def __call__(self, problem, spec, result, *, minutes):
            seen.append(minutes)
            return super().__call__(problem, spec, result, minutes=minutes)

    ev = ScriptedEvaluator()
    budget = SearchBudget(rounds=1, patience=None, max_llm_calls=None, max_tokens=None, wall_minutes=5.0,
                          gpu_minutes=None)
    _search(tmp_path, evaluator=ev, tuner=Tuner(ev), budget=budget)
    assert seen and all(m is not None and 4.5 < m <= 5.0 for m in seen)


def test_make_tuner_caps_its_time_by_what_the_search_has_left(monkeypatch):
    from kerngen.cli import compose as proposers
    from kerngen.harness.tune import tuner as tuner_mod

    got: list[float | None] = []

    def fake_tune(*args, minutes=None, **kw):
        got.append(minutes)
        raise RuntimeError("stop here")

    monkeypatch.setattr(tuner_mod, "tune", fake_tune)
    monkeypatch.setattr(tuner_mod, "TuneCache", lambda: None, raising=False)
    ev = ScriptedEvaluator()
    run = proposers.make_tuner(ev, REF, ev.gpu_facts(), minutes=3.0)
    from kerngen.agent.scripted import scripted_spec

    spec = scripted_spec(1.0)
    for left in (0.5, 10.0, None):
        with pytest.raises(RuntimeError):
            run(REF, spec, None, minutes=left)
    assert got == [0.5, 3.0, 3.0]
    assert run(REF, spec, None, minutes=-0.1) is None  # nothing left: no tuning at all


# ----- a resume takes its budgets from the command line --------------------------------------
def _resumed_budgets(run_dir: Path) -> list[SearchBudget]:
    return [e.budget for e in load_run(run_dir).events if e.type == "run_resumed"]


def test_resume_takes_budgets_from_the_command_line(tmp_path):
    common = ("--evaluator", "scripted", "--runs-dir", str(tmp_path))
    res = invoke("generate", "softmax", "--proposer", "scripted", "--rounds", "1", "--beam", "1", "--ideas", "1",
                 "--branches", "1", "--minutes", "0.0001", *common)
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    first = load_run(run_dir)
    # the tiny recorded budget or its one round stopped it (which one comes first depends on whether the
    # problem is already loaded in this process: the wall budget is checked between evaluations)
    assert first.finished is not None and len(first.nodes) <= 1
    assert first.finished.stop in (StopKind.wall_minutes, StopKind.rounds)
    assert "wall minutes" in first.finished.reason or first.finished.reason == "rounds: 1 done"
    spent_min = first.elapsed_s() / 60.0
    # given on the command line: they win over the recorded ones; --minutes is for this session
    res = invoke("generate", "--resume", run_dir.name, "--rounds", "2", "--max-llm-calls", "50", "--minutes", "2",
                 "--patience", "3", *common)
    assert res.exit_code == 0, res.output + stderr_of(res)
    run = load_run(run_dir)
    (b,) = _resumed_budgets(run_dir)
    assert b.rounds == 2 and b.max_llm_calls == 50 and b.patience == 3
    assert spent_min + 2.0 <= b.wall_minutes <= spent_min + 2.0 + 1e-6
    assert run.nodes and run.finished.stop is StopKind.rounds  # it ran: 2 more minutes, not 0.0001 total
    assert run.finished.reason == "rounds: 2 done"
    # a later resume without options keeps the latest recorded budget (not the one the run started with)
    res = invoke("generate", "--resume", run_dir.name, *common)
    assert res.exit_code == 0, res.output
    b2 = _resumed_budgets(run_dir)[-1]
    assert b2.rounds == 2 and b2.max_llm_calls == 50 and b2.wall_minutes == pytest.approx(b.wall_minutes)
    # a bad value is one line, exit 2, for a new run and for a resume
    for args in (("generate", "softmax", "--proposer", "scripted", "--minutes", "0", *common),
                 ("generate", "--resume", run_dir.name, "--minutes", "-1", *common)):
        res = invoke(*args)
        assert res.exit_code == 2, res.output
        err = stderr_of(res).strip()
        assert len(err.splitlines()) == 1 and "bad --minutes" in err


def test_resume_budget_rules():
    recorded = SearchBudget(rounds=5, max_llm_calls=10, wall_minutes=30, gpu_minutes=20)
    b = resume_budget(recorded, {"rounds": 7, "wall_minutes": 1.0, "gpu_minutes": None},
                      spent_wall_s=600.0, spent_gpu_s=60.0)
    assert b.rounds == 7 and b.max_llm_calls == 10 and b.wall_minutes == pytest.approx(11.0)
    assert b.gpu_minutes == 20  # not given: the recorded total
    with pytest.raises(KerngenError, match="bad --rounds"):
        resume_budget(recorded, {"rounds": -1}, spent_wall_s=0, spent_gpu_s=0)


# ----- LLM calls: the count stops the proposer, failed calls included -------------------------
class _FailingLLM(ScriptedProposer):
    """Like the LLM proposer when the endpoint fails: each question reports a failed call with
    two HTTP attempts, and implement/repair answer Branch(error=...)."""

    def __init__(self, usage):
        super().__init__()
        self.usage = usage

    def _fail(self):
        self.usage.on_call(LLMCall(purpose="x", model="m", messages=[], attempts=2, error="HTTP 500",
                                   usage=LLMUsage()))

    def ideas(self, ctx, parent, k):
        self._fail()
        self._fail()  # the proposer retries once with the reason
        return super().ideas(ctx, parent, k)

    def implement(self, ctx, parent, idea, m):
        self.calls["implement"] += 1
        self._fail()
        return [Branch(error="LLM call failed: HTTP 500") for _ in range(m)]


def test_llm_call_budget_counts_requests_of_failed_calls(tmp_path):
    usage = Usage()
    usage.on_call(LLMCall(purpose="x", model="m", messages=[], attempts=3))
    usage.on_call(LLMCall(purpose="x", model="m", messages=[], attempts=0, error="refused"))
    assert usage.calls == 4

    usage = Usage()
    prop = _FailingLLM(usage)
    budget = SearchBudget(rounds=50, patience=None, max_llm_calls=9, max_tokens=None, wall_minutes=None,
                          gpu_minutes=None)
    out, _, _ = _search(tmp_path, prop, tuner=None, budget=budget, usage=usage,
                        config=SearchConfig(beam=1, ideas=3, branches=1, repairs=0))
    # ideas: 2 failed calls of 2 requests = 4; implement 1, 2, 3 (+2 each) = 10 (8 < 9 let the
    # third one ask); nothing after it: the next question, of round 1, is not asked
    assert out.reason.kind is StopKind.llm_calls and str(out.reason).startswith("budget: 10 LLM requests (max 9")
    assert prop.total_calls == 4 and usage.calls == 10 and set(out.tree.beams) == {0}
    llm = [e for e in load_run(out.run_dir).events if e.type == "llm_call"]
    assert llm[-1].calls == 10 and all(e.record["error"] == "HTTP 500" for e in llm)


# ----- text from a model reaches a terminal without control sequences -----------------------
EVIL = "bad\x1b]52;c;ZXZpbA==\x07 \x1b[2J\x1b[H [/oops] \u202eevil"


def test_live_view_prints_model_text_without_control_sequences():
    from rich.console import Console

    from kerngen.agent.journal import NodeCreated, NodeEvaluated
    from kerngen.results.live import LiveView
    from kerngen.harness.results import EvalResult, Verdict

    buf = io.StringIO()
    view = LiveView(Console(file=buf, force_terminal=True, width=120), total_rounds=1)
    with view:
        view(NodeCreated(id=0, parent=None, round=0))
        view(NodeEvaluated(id=0, result=EvalResult(verdict=Verdict.compile_error, message=EVIL, spec_hash="x")))
    text = buf.getvalue()
    assert "compile_error: bad" in text and "[/oops]" in text
    for seq in ("]52;", "\x07", "\x1b[2J", "\x1b[H", "\u202e"):
        assert seq not in text


def test_cli_error_lines_have_no_control_sequences(tmp_path):
    # kerngen/cli/app.py main(): a KerngenError of a command not wrapped by _guard (bench)
    proc = subprocess.run([sys.executable, "-m", "kerngen", "bench", EVIL], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    err = proc.stderr
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    for seq in ("\x1b", "\x07", "\u202e"):
        assert seq not in err
    # kerngen/cli/search.py _guard: a run that does not exist, named with control sequences
    res = invoke("show", str(tmp_path / EVIL))
    assert res.exit_code == 2
    assert "\x1b" not in stderr_of(res) and "\x07" not in stderr_of(res)
