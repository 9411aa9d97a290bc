"""A dry run (``kerngen generate --dry-run``: real compiles, nothing run) is a run like the others:
listed by ``kerngen runs`` and reached as ``latest``, marked as a dry run, resumed as one, never
counted by a suite; no table of it prints nan (issue 37)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.tree import load_run
from kerngen.cli.batch import render_summary
from kerngen.results.suite_runs import RunIndex
from tests.cli_output import stderr_of

ROOT = Path(__file__).resolve().parents[2]
KB = ROOT / "tests" / "data" / "kernelbench"
runner = CliRunner()
SMALL = ["--shape", "64x256", "--proposer", "scripted", "--rounds", "1", "--ideas", "1", "--branches", "1",
         "--repairs", "0"]


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args), env={"COLUMNS": "200"})


def _dry_run(runs: Path) -> Path:
    res = invoke("generate", "softmax", "--dry-run", *SMALL, "--runs-dir", str(runs))
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in runs.iterdir() if (p / "events.jsonl").is_file()]
    return run_dir


def test_a_dry_run_is_listed_marked_and_latest(tmp_path):
    run_dir = _dry_run(tmp_path)
    assert load_run(run_dir).started.dry_run == "h100"
    res = invoke("runs", "--runs-dir", str(tmp_path), "--width", "120")
    assert res.exit_code == 0 and run_dir.name in res.output and "none (dry" in res.output
    (row,) = json.loads(invoke("runs", "--runs-dir", str(tmp_path), "--json").output)
    assert row["dry_run"] == "h100" and row["best_ms"] is None
    res = invoke("show", "latest", "--runs-dir", str(tmp_path))
    assert res.exit_code == 0 and run_dir.name in res.output and "DRY RUN" in res.output
    assert "nan" not in res.output.lower()


def test_an_interrupted_dry_run_resumes_as_a_dry_run(tmp_path):
    run_dir = _dry_run(tmp_path)
    journal = run_dir / "events.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["type"] == "run_finished"
    journal.write_text("".join(lines[:-1]))  # as a Ctrl-C before the end leaves it: unfinished
    res = invoke("generate", "--resume", "latest", "--runs-dir", str(tmp_path), "--rounds", "2")
    assert res.exit_code == 0, res.output + stderr_of(res)
    run = load_run(run_dir)
    assert run.sessions == 2 and run.finished is not None and run.started.dry_run == "h100"
    assert all(n.verdict in ("not_run", "invalid_spec", "compile_error", "pending") for n in run.nodes.values())
    assert "dry run (no GPU" in res.output  # the summary of a dry run, though --dry-run was not repeated


def test_dry_run_does_not_continue_a_run_that_measured(tmp_path):
    shipped = ROOT / "runs" / "20261123-020550-rmsnorm-1d34"
    shutil.copytree(shipped, tmp_path / shipped.name)
    res = invoke("generate", "--dry-run", "--resume", "latest", "--runs-dir", str(tmp_path))
    err = stderr_of(res)
    assert res.exit_code == 2 and "ran on a GPU" in err and "leave --dry-run out" in err


def test_a_dry_run_left_in_the_old_dry_run_folder_is_listed_marked_and_reached(tmp_path):
    """Before issue 37 dry runs went to runs/dry-run/<id>, and their journals had no ``dry_run``:
    such a run is listed by `runs` (marked, its preset read from its GPU facts), reached by id and
    as latest, shown as a dry run and resumed as one."""
    fresh = _dry_run(tmp_path / "made")
    old = tmp_path / "runs" / "dry-run" / fresh.name
    old.parent.mkdir(parents=True)
    shutil.move(str(fresh), old)
    journal = old / "events.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    del first["dry_run"]  # as the old versions wrote it
    journal.write_text(json.dumps(first) + "\n" + "".join(lines[1:]))
    runs = tmp_path / "runs"
    (row,) = json.loads(invoke("runs", "--runs-dir", str(runs), "--json").output)
    assert row["dry_run"] == "h100" and row["path"] == str(old) and row["state"] == "finished"
    res = invoke("runs", "--runs-dir", str(runs), "--width", "120")
    assert res.exit_code == 0 and old.name in res.output and "none (dry" in res.output
    for ref in ("latest", old.name):
        res = invoke("show", ref, "--runs-dir", str(runs))
        assert res.exit_code == 0 and old.name in res.output and "DRY RUN" in res.output, res.output
    journal.write_text(journal.read_text().rsplit("\n", 2)[0] + "\n")  # its last event gone: unfinished
    res = invoke("generate", "--resume", old.name, "--runs-dir", str(runs), "--rounds", "2")
    assert res.exit_code == 0, res.output + stderr_of(res)
    assert "dry run (no GPU" in res.output and load_run(old).started.dry_run == "h100"


def test_a_suite_never_counts_a_dry_run(tmp_path):
    _dry_run(tmp_path)
    index = RunIndex(tmp_path)
    assert index.by_key == {} and index.skipped == []


def test_a_folder_dry_run_prints_no_nan_and_no_fast_p(tmp_path):
    d = tmp_path / "kb"
    d.mkdir()
    for name in ("19_ReLU.py", "100_HingeLoss_cuda.py"):
        shutil.copy(KB / name, d / name)
    runs = tmp_path / "runs"
    res = invoke("generate", str(d), "--dry-run", "--proposer", "playbook", "--rounds", "1", "--ideas", "1",
                 "--branches", "1", "--runs-dir", str(runs))
    assert res.exit_code == 0, res.output + stderr_of(res)
    out = res.output
    assert "nan" not in out.lower() and "fast_1" not in out and "dry run" in out
    assert "19_ReLU" in out and "100_HingeLoss_cuda" in out and out.count("finished") == 2
    assert len([p for p in runs.iterdir() if (p / "events.jsonl").is_file()]) == 2  # both listed by `runs`
    assert all("dry-run" in p.name for p in (runs / "batches").iterdir())  # apart from a measuring batch


def test_the_batch_summary_folds_long_names_at_80_columns():
    name = "20_ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd"
    rows = [{"problem": f"/kb/level2/{name}.py", "status": "finished", "run": "r", "reason": "budget: 0.42 wall "
             "minutes (max 0.4)", "wall_min": 0.42, "best_ms": 1.2345, "eager_ms": 122.0, "compile_ms": 1.5,
             "vs_eager": 98.83, "vs_compile": 1.21, "vs_compile_defaults": None}]
    console = Console(width=80, record=True)
    console.print(render_summary(rows, 0.4, 60))
    text = console.export_text()
    assert "…" not in text and "1.2345" in text and "98.83x" in text and "1.21x" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    lines = text.splitlines()
    width = next(line for line in lines if "stop / why" in line).index("status")
    first_column = "".join(line[:width].strip() for line in lines)
    assert name in first_column  # folded over lines, whole
