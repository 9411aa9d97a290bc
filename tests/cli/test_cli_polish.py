"""What a new user hit on the command line (issue 13): one-line budget errors, Ctrl-C that says how
to resume, files that follow the umask, --version, -h, examples in every help, ``kerngen runs``,
``latest``, ``--json`` on show and playbook, "did you mean", and ``kerngen problems`` with a bad
file among good ones. CPU only."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.budget import StopKind
from kerngen.agent.tree import LATEST, latest_run, load_run, resolve_run
from kerngen.errors import JournalError
from tests.cli_output import stderr_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (ROOT / "runs").iterdir() if (p / "events.jsonl").is_file())

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args))


def one_error_line(res) -> str:
    err = stderr_of(res).strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error:"), err
    return err


# ----- budgets ------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, field", [(("--minutes", "-1"), "--minutes"), (("--minutes", "0"), "--minutes"),
                                          (("--gpu-minutes", "-1"), "--gpu-minutes")])
def test_bad_budget_is_one_line_exit_2(tmp_path, flags, field):
    res = invoke("generate", "softmax", *flags, "--evaluator", "scripted", "--runs-dir", str(tmp_path))
    assert res.exit_code == 2, res.output
    assert field in one_error_line(res)
    assert not any(tmp_path.iterdir())  # refused before a run folder exists
    res = invoke("generate", "--resume", "nothing-here", *flags, "--runs-dir", str(tmp_path))
    assert res.exit_code == 2 and field in one_error_line(res)


# ----- Ctrl-C -------------------------------------------------------------------------------
def test_ctrl_c_names_the_run_and_how_to_resume(tmp_path, monkeypatch):
    from kerngen.agent.scripted import ScriptedEvaluator

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ScriptedEvaluator, "baseline", interrupted)
    res = invoke("generate", "softmax", "--proposer", "scripted", "--evaluator", "scripted",
                 "--runs-dir", str(tmp_path))
    assert res.exit_code == 130
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    err = stderr_of(res)
    assert "interrupted" in err and run_dir.name in err
    assert f"kerngen generate --resume {run_dir.name} --runs-dir {tmp_path}" in " ".join(err.split())
    finished = load_run(run_dir).finished
    assert finished.reason == "interrupted" and finished.stop is StopKind.interrupted


def test_ctrl_c_in_any_command_exits_130_with_a_word(monkeypatch):
    import kerngen.cli.search as search_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search_cli, "render", interrupted)  # what `kerngen show` calls
    res = invoke("show", str(SHIPPED[0]))
    assert res.exit_code == 130 and "interrupted" in stderr_of(res)


# ----- umask --------------------------------------------------------------------------------
def test_atomic_writes_follow_the_umask(tmp_path):
    from kerngen.harness.atomic import file_mode, process_umask, write_atomic

    mask = os.umask(0o022)
    os.umask(mask)
    assert process_umask() == mask
    write_atomic(tmp_path / "a" / "report.html", "x")
    mode = (tmp_path / "a" / "report.html").stat().st_mode & 0o777
    assert mode == file_mode() == 0o666 & ~mask
    if mask == 0o022:
        assert mode == 0o644
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")]


def test_report_is_readable_by_others_under_umask_022(tmp_path):
    from kerngen.harness.atomic import process_umask

    if process_umask() != 0o022:
        pytest.skip("the process umask is not 022")
    out = tmp_path / "r.html"
    res = invoke("report", str(SHIPPED[0]), "-o", str(out))
    assert res.exit_code == 0, res.output
    assert out.stat().st_mode & 0o777 == 0o644


# ----- --version, -h, examples --------------------------------------------------------------
def test_version_and_short_help():
    from kerngen import __version__

    res = invoke("--version")
    assert res.exit_code == 0 and res.output.strip() == f"kerngen {__version__}"
    res = invoke("-h")
    assert res.exit_code == 0 and "generate" in res.output and "runs" in res.output


def test_every_command_has_h_and_examples():
    names = list(kerngen.cli.app.COMMANDS)
    assert {"generate", "show", "runs", "replay", "report", "export", "problems", "playbook", "bench"} <= set(names)
    for name in names:
        res = invoke(name, "-h")
        assert res.exit_code == 0, (name, res.output)
        assert "Examples:" in res.output and f"kerngen {name}" in res.output, name


# ----- kerngen runs and latest --------------------------------------------------------------
def _runs_copy(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    for p in SHIPPED:
        shutil.copytree(p, runs / p.name)
    return runs


def test_runs_lists_every_run_and_a_corrupt_one(tmp_path):
    runs = _runs_copy(tmp_path)
    bad = runs / "broken"
    bad.mkdir()
    (bad / "events.jsonl").write_text("{not json\n")
    (runs / "not-a-run").mkdir()  # no journal: not listed
    res = invoke("runs", "--runs-dir", str(runs), "--width", "160")
    assert res.exit_code == 0, res.output
    for p in SHIPPED:
        assert p.name in res.output
    assert "broken" in res.output and "corrupt" in res.output and "not valid JSON" in res.output
    assert "not-a-run" not in res.output
    assert "NVIDIA H200" in res.output and "finished" in res.output and "unfinished" in res.output
    assert "38.77x" in res.output  # the layernorm run vs eager

    res = invoke("runs", "--runs-dir", str(runs), "--json")
    assert res.exit_code == 0, res.output
    rows = {r["run"]: r for r in json.loads(res.output)}
    assert rows["broken"]["state"] == "corrupt"
    lay = rows["20261123-023704-layernorm-d003"]
    assert lay["state"] == "finished" and lay["gpu"] == "NVIDIA H200" and lay["best_ms"] > 0
    assert lay["speedup_eager"] > 1 and lay["speedup_compile"] > 1
    # 80 columns (a pipe): the run ids stay whole
    res = invoke("runs", "--runs-dir", str(runs), "--width", "80")
    assert all(p.name in res.output for p in SHIPPED)


def test_runs_never_imports_a_problem_file(tmp_path):
    runs = _runs_copy(tmp_path)
    target = tmp_path / "touched"
    prob = tmp_path / "evil.py"
    prob.write_text(f"open({str(target)!r}, 'w').write('x')\n")
    run = runs / SHIPPED[-1].name
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    first["problem"]["source"] = str(prob)
    lines[0] = json.dumps(first) + "\n"
    (run / "events.jsonl").write_text("".join(lines))
    res = invoke("runs", "--runs-dir", str(runs))
    assert res.exit_code == 0, res.output
    assert not target.exists()


def test_runs_in_an_empty_or_missing_folder(tmp_path):
    res = invoke("runs", "--runs-dir", str(tmp_path / "none"))
    assert res.exit_code == 0 and "no runs" in res.output


def test_latest_is_the_newest_run(tmp_path):
    runs = _runs_copy(tmp_path)
    newest = max(SHIPPED, key=lambda p: load_run(p).started.t)
    assert latest_run(runs).name == newest.name
    assert resolve_run(LATEST, runs).name == newest.name
    res = invoke("show", "latest", "--runs-dir", str(runs), "--width", "160")
    assert res.exit_code == 0 and newest.name in res.output
    res = invoke("show", "latest", "--runs-dir", str(runs), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["run_id"] == newest.name and data["nodes"] and data["status"] == "finished"
    assert data["best_figures"]["speedup_eager"] > 1
    out = tmp_path / "latest.html"
    res = invoke("report", "latest", "--runs-dir", str(runs), "-o", str(out))
    assert res.exit_code == 0 and out.is_file()
    with pytest.raises(JournalError, match="no runs"):
        latest_run(tmp_path / "empty")
    res = invoke("show", "latest", "--runs-dir", str(tmp_path / "empty"))
    assert res.exit_code == 2 and "no runs" in one_error_line(res)


def test_generate_resume_latest(tmp_path):
    res = invoke("generate", "softmax", "--proposer", "scripted", "--evaluator", "scripted", "--rounds", "1",
                 "--runs-dir", str(tmp_path))
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    res = invoke("generate", "--resume", "latest", "--rounds", "2", "--evaluator", "scripted",
                 "--runs-dir", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "(resumed)" in res.output and load_run(run_dir).sessions == 2


def test_a_folder_named_latest_comes_first(tmp_path):
    runs = _runs_copy(tmp_path)
    shutil.copytree(SHIPPED[0], runs / "latest")
    assert resolve_run("latest", runs) == runs / "latest"


# ----- playbook --json ----------------------------------------------------------------------
def test_playbook_json(tmp_path):
    res = invoke("playbook", "softmax", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["family"] == "softmax" and data["variants"] and data["ideas"][0]["text"]
    out = tmp_path / "spec.json"
    res = invoke("playbook", "softmax", "--json", "-o", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["wrote"] == str(out) and data["configurations"] > 1 and out.is_file()


# ----- did you mean, problems A B -----------------------------------------------------------
def test_did_you_mean():
    from kerngen.problems.registry import close_builtins, did_you_mean

    assert close_builtins("softmx") == ["softmax"]
    assert "layernorm" in close_builtins("layer_norm")
    assert did_you_mean("zzzzzz") == "" and did_you_mean("a/softmx") == ""
    res = invoke("generate", "softmx", "--evaluator", "scripted")
    assert res.exit_code == 2 and "did you mean 'softmax'?" in one_error_line(res)


def test_problems_describes_the_good_files_when_one_is_bad(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise ValueError('boom')\n")
    res = invoke("problems", "softmax", str(bad), "gelu", "softmx")
    assert res.exit_code == 2  # the guard: one line per bad file, then one for the count
    assert "softmax(x, dim=1)" in res.stdout and "gelu" in res.stdout
    err = stderr_of(res)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 3 and "boom" in lines[0] and "did you mean 'softmax'?" in lines[1] and "2 of 4" in lines[2]
    res = invoke("problems", "softmax", str(bad), "--json")
    assert res.exit_code == 2 and "1 of 2" in stderr_of(res)
    assert [d["name"] for d in json.loads(res.stdout)] == ["softmax"]
