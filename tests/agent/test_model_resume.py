"""A model run's journal, resume and re-tune on the CPU (issue 34): the emulator as the launcher, a stand-in timer
that gives each kernel and configuration its own fixed time (so the choice is decided by the times, the same in
every run). A run interrupted mid-way (Ctrl-C at the Nth launch) and resumed evaluates nothing twice and chooses
what an uninterrupted run chooses; a torn last journal line is skipped; a journal handed by anyone that is bad in
any way is refused with one line; ``kerngen replay --tune`` tunes each kernel region again and a region whose
kernel is no longer correct falls back to PyTorch; ``kerngen show`` prints each region's tries as a tree."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.model_journal import RegionFinished, RegionTried, read_model_journal
from kerngen.agent.model_run import MODEL_EVENTS, read_model_run
from kerngen.agent.model_search import retune_model, search_model
from kerngen.errors import JournalError, KerngenError
from kerngen.problems.load import load_problem
from tests.emu.runner import available, run_plan

PLAYBOOK = Path(__file__).resolve().parents[1] / "data" / "playbook"
PROBLEM = PLAYBOOK / "regions_resblock.py"
TUNE = 2
pytestmark = pytest.mark.skipif(not available(), reason="no C++ compiler (g++) for the CPU emulator")


class Stand:
    """The emulator as the launcher (counting launches; Ctrl-C at launch ``stop_at``); the timer: a time fixed by
    the last kernel's source and configuration (between 0.3 and 0.7 ms), 1 ms for a call that launched none."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.launches, self.stop_at, self.last = 0, stop_at, ""

    def launch(self, i, spec, plan, tensors):
        if self.stop_at is not None and self.launches + 1 == self.stop_at:
            raise KeyboardInterrupt
        self.launches += 1
        self.last = spec.source + json.dumps(plan.config, sort_keys=True)
        run_plan(spec, plan, tensors, timeout_s=600)

    def timer(self, fn):
        before = self.launches
        fn()
        if self.launches == before:
            return 1.0
        return 0.3 + int(hashlib.sha256(self.last.encode()).hexdigest()[:6], 16) % 400 / 1000


def search(run_dir: Path, stand: Stand, log=lambda line: None, **kw):
    return search_model(load_problem(str(PROBLEM)), run_dir, device="cpu", launcher=stand.launch, timer=stand.timer,
                        compile=False, log=log, tune=TUNE, **kw)


def tries(run) -> list[list[tuple]]:
    return [[(t.variant, t.config, t.ok, t.kernel_ms, t.parent) for t in r.tried] for r in run.regions]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """An uninterrupted run, and the launch count when its second region's search began."""
    stand, began = Stand(), []
    run_dir = tmp_path_factory.mktemp("runs") / "whole-model"
    run = search(run_dir, stand, log=lambda line: began.append(stand.launches) if line.startswith("[2/") else None)
    return run, run_dir, stand.launches, began[0]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, whole):
    """The same run stopped by Ctrl-C at the first launch of the second try of its second region."""
    _, _, _, second = whole
    stop_at = second + 3  # the second region's first try: 2 launches (checked, timed); the next try's first launch
    run_dir = tmp_path_factory.mktemp("runs") / "cut-model"
    with pytest.raises(KeyboardInterrupt):
        search(run_dir, Stand(stop_at=stop_at))
    return run_dir, stop_at - 1


def test_every_evaluation_is_journaled_as_it_ends(interrupted, whole):
    run_dir, _ = interrupted
    events, torn = read_model_journal(run_dir)
    assert torn == 0 and not (run_dir / "model.json").exists()
    first = whole[0].regions[max(range(2), key=lambda i: whole[0].regions[i].weight)].region  # searched first
    done = [e for e in events if isinstance(e, RegionFinished)]
    assert [e.region for e in done] == [first] and done[0].row.chosen == "kernel"
    later = [e for e in events if isinstance(e, RegionTried) and e.region != first]
    assert len(later) == 1  # the try the interrupt cut short is not there


def test_an_interrupted_run_resumed_repeats_nothing_and_chooses_what_a_whole_run_chooses(interrupted, whole, tmp_path):
    full, _, full_launches, _ = whole
    run_dir, before = copy(interrupted[0], tmp_path), interrupted[1]
    stand, lines = Stand(), []
    run = search(run_dir, stand, resume=True, log=lines.append)
    assert stand.launches + before == full_launches  # nothing evaluated twice, nothing lost
    assert run.plan == full.plan and run.check.ok and run.sessions == 2
    assert [(r.chosen, r.variant, r.config, r.chosen_try) for r in run.regions] == \
        [(r.chosen, r.variant, r.config, r.chosen_try) for r in full.regions]
    assert tries(run) == tries(full)  # the recorded tries kept, in the same tree
    assert any(": recorded, correct" in line for line in lines)
    assert read_model_run(run_dir).plan == full.plan


def test_a_torn_last_journal_line_is_skipped(tmp_path, interrupted, whole):
    full, _, _, _ = whole
    run_dir = copy(interrupted[0], tmp_path)
    with (run_dir / MODEL_EVENTS).open("ab") as f:
        f.write(b'{"type": "region_tried", "region": 0, "tried": {"variant": "igemm", "o')  # a kill mid-write
    assert read_model_journal(run_dir)[1] > 0
    run = search(run_dir, Stand(), resume=True)
    assert run.plan == full.plan and tries(run) == tries(full)
    assert read_model_journal(run_dir)[1] == 0  # cut before the resume appended


def copy(run_dir: Path, tmp_path: Path) -> Path:
    """The interrupted run's folder copied (each test resumes its own)."""
    import shutil

    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


def _journal(run_dir: Path, whole_dir: Path, how: str) -> None:
    """A copy of a whole run's journal (no record) made bad in one way."""
    run_dir.mkdir()
    lines = (whole_dir / MODEL_EVENTS).read_text().splitlines()
    first = json.loads(lines[0])
    if how == "types":
        lines[2] = json.dumps({"type": "region_tried", "region": "r0", "tried": {"variant": 3, "ok": "maybe"}})
    elif how == "first":
        lines = lines[1:]
    elif how == "run_id":
        lines[0] = json.dumps(first | {"run_id": "../../etc"})
    elif how == "json":
        lines[3] = "{not json"
    (run_dir / MODEL_EVENTS).write_text("\n".join(lines) + "\n")
    if how == "huge":
        with (run_dir / MODEL_EVENTS).open("r+b") as f:
            f.truncate(300 << 20)  # sparse
    elif how == "symlink":
        os.replace(run_dir / MODEL_EVENTS, run_dir.parent / "elsewhere.jsonl")
        (run_dir / MODEL_EVENTS).symlink_to(run_dir.parent / "elsewhere.jsonl")


@pytest.mark.parametrize("how", ["types", "first", "run_id", "json", "huge", "symlink"])
def test_a_bad_journal_is_refused_with_one_line(tmp_path, whole, how):
    run_dir = tmp_path / "bad-model"
    _journal(run_dir, whole[1], how)
    res = CliRunner().invoke(kerngen.cli.app.app, ["generate", str(PROBLEM), "--as-model", "--resume", str(run_dir)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert MODEL_EVENTS in res.output or "symbolic link" in res.output


@pytest.mark.parametrize("how", ["variant", "config", "region"])
def test_a_journal_naming_what_the_model_does_not_offer_is_refused(tmp_path, whole, how):
    """What a journal names is looked up in the plan's own offer, never built from its text."""
    run_dir = tmp_path / "odd-model"
    run_dir.mkdir()
    lines = (whole[1] / MODEL_EVENTS).read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if '"region_finished"' in line)
    ev = json.loads(lines[k])
    if how == "variant":
        ev["row"]["variant"] = "a_kernel_from_elsewhere"
    elif how == "config":
        ev["row"]["config"] = {**ev["row"]["config"], "BM": 4096}
    else:
        ev["region"] = 99
    lines[k] = json.dumps(ev)
    (run_dir / MODEL_EVENTS).write_text("\n".join(lines[:k + 1]) + "\n")
    stand = Stand()
    with pytest.raises(JournalError) as err:
        search(run_dir, stand, resume=True)
    assert "\n" not in str(err.value) and stand.launches == 0


def test_show_runs_and_resume_of_an_interrupted_or_finished_run(interrupted, whole, tmp_path):
    run_dir, _ = interrupted
    cli = CliRunner()
    res = cli.invoke(kerngen.cli.app.app, ["show", str(run_dir)])
    assert res.exit_code == 2 and "--resume" in res.output and len(res.output.strip().splitlines()) == 1
    rows = json.loads(cli.invoke(kerngen.cli.app.app, ["runs", "--runs-dir", str(run_dir.parent), "--json"]).output)
    assert any(r.get("kind") == "model" and r["status"].startswith("interrupted") for r in rows)
    res = cli.invoke(kerngen.cli.app.app, ["generate", str(PROBLEM), "--as-model", "--resume", str(whole[1])])
    assert res.exit_code == 2 and "finished" in res.output
    res = cli.invoke(kerngen.cli.app.app, ["show", str(whole[1]), "--width", "200"])
    assert res.exit_code == 0 and "└── " in res.output and " *" in res.output  # a tune's configurations under it


def test_replay_tune_tunes_each_kernel_region_again_and_keeps_the_plan_correct(whole, tmp_path):
    full, _, _, _ = whole
    stand, lines = Stand(), []
    new = retune_model(full, load_problem(str(PROBLEM)), tmp_path / "again", device="cpu", launcher=stand.launch,
                       timer=stand.timer, compile=False, log=lines.append, tune=TUNE)
    assert new.replay_of == full.id and new.retuned and new.check.ok and new.timing is not None
    for r, old in zip(new.regions, full.regions):
        assert r.tried[0].variant == old.variant and r.tried[0].config == old.config  # from the recorded kernel
        assert [t.parent for t in r.tried[1:TUNE + 1]] == [0] * TUNE  # its tune, before the other variants
    assert new.changed == []  # the same times here: the same choice
    assert read_model_run(tmp_path / "again").retuned
    events, _ = read_model_journal(tmp_path / "again")
    assert events[0].replay_of == full.id and sum(isinstance(e, RegionTried) for e in events) > 0


def test_replay_tune_falls_back_where_the_recorded_kernel_is_no_longer_correct(whole, tmp_path, monkeypatch):
    import kerngen.agent.model_region as mr

    full, _, _, _ = whole
    real = mr.kernel_step

    def wrong(region, variant, sizes, defaults=None):  # "this GPU": region 1's kernels read the input, not r0's output
        step = real(region, variant, sizes, defaults)
        if region.index == 1:
            step = step.model_copy(update={"bindings": {**step.bindings, "relu": "x"}})
        return step

    monkeypatch.setattr(mr, "kernel_step", wrong)
    stand = Stand()
    new = retune_model(full, load_problem(str(PROBLEM)), tmp_path / "here", device="cpu", launcher=stand.launch,
                       timer=stand.timer, compile=False, log=lambda line: None, tune=TUNE)
    r1 = new.regions[1]
    assert r1.chosen == "pytorch" and "no variant was correct" in r1.why and new.changed == [1]
    assert new.regions[0].chosen == "kernel" and new.check.ok  # the plan stays correct


def test_replay_tune_refuses_a_record_of_another_problem(whole, tmp_path):
    full, _, _, _ = whole
    with pytest.raises(KerngenError, match="sha256"):
        retune_model(full.model_copy(update={"problem_sha256": "0" * 64}), load_problem(str(PROBLEM)), tmp_path / "x",
                     device="cpu", launcher=Stand().launch, timer=Stand().timer)
