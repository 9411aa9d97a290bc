"""The first problem of a folder gets the same budget as the rest (issue 37): the search's
wall-clock budget counts from the moment its baseline is known, so starting the GPU workers,
measuring the GPU and timing PyTorch (torch.compile's first compile in a fresh worker above all)
are charged to no problem. Here a stand-in evaluator takes seconds for its facts and baseline."""

from __future__ import annotations

import time

from kerngen.agent.budget import SearchBudget, SearchConfig, Usage
from kerngen.agent.context import minimal_context
from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer
from kerngen.agent.search import run_search
from kerngen.agent.tree import load_run
from kerngen.problems.ref import ProblemRef

REF = ProblemRef(source="softmax", shape=(4096, 65536), dtype="float32")
SLOW_START_S = 2.0  # a worker's start and the GPU's facts, then PyTorch's baseline


class SlowToStart(ScriptedEvaluator):
    def gpu_facts(self):
        time.sleep(SLOW_START_S / 2)
        return super().gpu_facts()

    def baseline(self, problem, **kw):
        time.sleep(SLOW_START_S / 2)
        return super().baseline(problem, **kw)


def test_the_baseline_and_the_start_are_not_charged_to_the_search(tmp_path):
    ev = SlowToStart(delay_s=0.05)
    budget = SearchBudget(rounds=50, patience=None, max_llm_calls=None, max_tokens=None, gpu_minutes=None,
                          wall_minutes=2.5 / 60)  # 2.5 s: less than the start and baseline with a margin
    usage = Usage()
    t0 = time.monotonic()
    out = run_search(REF, ScriptedProposer(), ev, runs_dir=tmp_path, run_id="first", usage=usage,
                     config=SearchConfig(beam=1, ideas=2, branches=2, repairs=0), budget=budget, tuner=None,
                     context_factory=minimal_context)
    took = time.monotonic() - t0
    assert ev.evaluated >= 4, out.reason  # candidates were evaluated, not the budget spent before them
    assert took >= SLOW_START_S + 2.0  # the whole budget after the slow start
    run = load_run(out.run_dir)
    assert run.finished is not None and run.finished.usage["wall_s"] < 2.5 + 1.0
    assert run.elapsed_s() < took - SLOW_START_S / 2 + 0.5  # what show and a resume count: the search's own


def test_a_resumed_search_counts_its_sessions_without_their_baselines(tmp_path):
    ev = SlowToStart()
    budget = SearchBudget(rounds=1, patience=None, max_llm_calls=None, max_tokens=None, gpu_minutes=None,
                          wall_minutes=1.0)
    out = run_search(REF, ScriptedProposer(), ev, runs_dir=tmp_path, run_id="r", usage=Usage(),
                     config=SearchConfig(beam=1, ideas=1, branches=1, repairs=0), budget=budget, tuner=None,
                     context_factory=minimal_context)
    run = load_run(out.run_dir)
    assert run.elapsed_s() < SLOW_START_S / 2  # the baseline's second is not in it
