"""``kerngen generate DIR`` / several problems: one search each, a summary, resumable (a finished
problem is not searched again, an interrupted one is resumed in its own folder), one problem's
failure is its row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.search import Search
from kerngen.agent.tree import load_run
from kerngen.cli.batch import Batch, Status, batch_path, metrics_line

DATA = Path(__file__).parents[1] / "data" / "kernelbench"
runner = CliRunner()
SCRIPTED = ("--proposer", "scripted", "--evaluator", "scripted", "--rounds", "1", "--no-tune")


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args), env={"COLUMNS": "220"})


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "kb"
    d.mkdir()
    for name in ("19_ReLU.py", "5_Matrix_scalar_multiplication.py"):
        shutil.copy(DATA / name, d / name)
    (d / "broken.py").write_text("raise ValueError('boom')\n")
    return d


def test_a_folder_gets_one_run_per_problem_and_a_summary(tmp_path):
    d, runs = _folder(tmp_path), tmp_path / "runs"
    res = invoke("generate", str(d), "--runs-dir", str(runs), *SCRIPTED, "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    by = {Path(r["problem"]).name: r for r in rows}
    assert set(by) == {"19_ReLU.py", "5_Matrix_scalar_multiplication.py", "broken.py"}
    assert by["broken.py"]["status"] == "failed" and "boom" in by["broken.py"]["reason"]
    for name in ("19_ReLU.py", "5_Matrix_scalar_multiplication.py"):
        r = by[name]
        assert r["status"] == "finished" and r["run"] and (runs / r["run"] / "events.jsonl").is_file()
        assert load_run(runs / r["run"]).finished is not None
        assert r["best_ms"] is not None and r["vs_eager"] is not None
    state = Batch.model_validate_json(batch_path(sorted(by[n]["problem"] for n in by), runs).read_bytes())
    assert {e.status for e in state.entries} == {Status.finished, Status.failed}
    # the table
    res = invoke("generate", str(d), "--runs-dir", str(runs), *SCRIPTED)
    assert res.exit_code == 0 and "one search per problem" in res.output and "2 of 3 problems" in res.output
    assert "3 ran" in res.output and "vs torch.compile fast_1" in res.output


def test_the_summary_line_counts_a_problem_without_a_kernel_as_a_miss():
    def row(best, eager, compiled):
        return {"best_ms": best, "eager_ms": eager, "compile_ms": compiled, "wall_min": 0.5,
                "vs_eager": eager / best if best else None, "vs_compile": compiled / best if best and compiled else None}

    rows = [row(1.0, 4.0, 2.0), row(2.0, 1.0, 1.0), row(None, 1.0, 1.0), row(1.0, 3.0, None),
            row(None, None, None)]  # the last: the playbook could not search it (no baseline either)
    line = metrics_line(rows)
    # vs eager: 4x and 3x beat it, 0.5x does not, no kernel is a miss: 2 of 5; geomean of 4, 0.5, 3
    assert "5 ran, 2.5 min in all" in line
    assert "vs eager fast_1 0.40 (geomean 1.82x over 3)" in line
    # vs torch.compile: only the problem whose torch.compile failed is left out: 1 of 4; geomean of 2 and 0.5
    assert "vs torch.compile fast_1 0.25 (geomean 1.00x over 2)" in line


def test_running_the_same_command_again_redoes_nothing_and_resumes_the_interrupted(tmp_path, monkeypatch):
    d, runs = _folder(tmp_path), tmp_path / "runs"
    real_run = Search.run
    calls = {"n": 0}

    def interrupted_second(self):
        calls["n"] += 1
        if calls["n"] == 2:  # Ctrl-C in the second problem's search, after its folder exists
            self._open()
            self.journal.close()
            raise KeyboardInterrupt
        return real_run(self)

    monkeypatch.setattr(Search, "run", interrupted_second)
    res = invoke("generate", str(d), "--runs-dir", str(runs), *SCRIPTED)
    assert res.exit_code == 130 and "run the same command again" in res.output
    monkeypatch.setattr(Search, "run", real_run)
    first = sorted(p.name for p in runs.iterdir() if p.name != "batches")
    assert len(first) == 2
    seen = []
    # resumed on "another machine" (an empty trust list): the file is named on this command line, so it runs
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "another-machine"))
    monkeypatch.setattr(Search, "run", lambda self: seen.append((self.settings.mode.value,
                                                                  self.settings.run_dir.name)) or real_run(self))
    res = invoke("generate", str(d), "--runs-dir", str(runs), *SCRIPTED, "--json")
    assert res.exit_code == 0, res.output
    assert [m for m, _ in seen] == ["resume"] and seen[0][1] in first  # only the interrupted one, in its folder
    assert sorted(p.name for p in runs.iterdir() if p.name != "batches") == first  # no new run folder
    rows = json.loads(res.stdout)
    assert sum(r["status"] == "finished" for r in rows) == 2
    seen.clear()
    res = invoke("generate", str(d), "--runs-dir", str(runs), *SCRIPTED, "--fresh", "--json")
    assert res.exit_code == 0 and [m for m, _ in seen] == ["new", "new"]


def test_resume_takes_one_run_only(tmp_path):
    res = invoke("generate", "softmax", "gelu", "--resume", "latest", "--runs-dir", str(tmp_path), *SCRIPTED)
    assert res.exit_code == 2 and "one run" in res.output

