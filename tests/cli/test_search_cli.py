"""``kerngen generate / show / replay`` through typer's CliRunner and one real subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.tree import load_run
from tests.cli_output import stderr_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (ROOT / "runs").iterdir() if (p / "events.jsonl").is_file())

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args))



def test_shipped_run_loads_and_shows():
    assert SHIPPED, "a recorded run ships in runs/"
    run = load_run(SHIPPED[0])
    assert run.finished is not None and run.best is not None
    assert (SHIPPED[0] / "README.md").read_text().count("scripted") >= 2
    res = invoke("show", str(SHIPPED[0]), "--width", "200")
    assert res.exit_code == 0, res.output
    idea = next(iter(run.tree.ideas.values()))[0].text
    assert idea[:60] in res.output
    for word in ("ok", "incorrect", "repair", "x eager", "regs", "memory_access", "<- best"):
        assert word in res.output


def test_show_by_id_under_runs_dir():
    res = invoke("show", SHIPPED[0].name, "--runs-dir", str(SHIPPED[0].parent), "--width", "160")
    assert res.exit_code == 0 and "round 0" in res.output


def test_missing_run_is_one_line_exit_2(tmp_path):
    res = invoke("show", "no-such-run", "--runs-dir", str(tmp_path))
    assert res.exit_code == 2
    err = stderr_of(res).strip()
    assert err.startswith("error:") and "no-such-run" in err and len(err.splitlines()) == 1


def test_corrupt_journal_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(SHIPPED[0], bad)
    lines = (bad / "events.jsonl").read_text().splitlines(keepends=True)
    lines[2] = "{not json\n"
    (bad / "events.jsonl").write_text("".join(lines))
    for cmd in (("show", str(bad)), ("replay", str(bad), "--evaluator", "scripted"),
                ("generate", "--resume", str(bad), "--evaluator", "scripted")):
        res = invoke(*cmd)
        assert res.exit_code == 2, cmd
        err = stderr_of(res).strip()
        assert "line 3 is not valid JSON" in err and len(err.splitlines()) == 1


def test_generate_resume_replay_scripted(tmp_path):
    res = invoke("generate", "softmax", "--shape", "4096x65536", "--dtype", "fp32", "--proposer", "scripted",
                 "--evaluator", "scripted", "--rounds", "2", "--beam", "1", "--ideas", "2", "--branches", "2",
                 "--runs-dir", str(tmp_path))
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = load_run(run_dir)
    assert run.started.config.beam == 1 and run.started.budget.rounds == 2
    assert "stopped: rounds: 2 done" in res.output
    # one more round on resume; earlier nodes are not re-evaluated
    n_eval = sum(e.type == "node_evaluated" for e in run.events)
    res = invoke("generate", "--resume", run_dir.name, "--runs-dir", str(tmp_path), "--rounds", "3",
                 "--evaluator", "scripted")
    assert res.exit_code == 0, res.output
    run2 = load_run(run_dir)
    ids = [e.id for e in run2.events if e.type == "node_evaluated"]
    assert len(ids) == len(set(ids)) > n_eval and 2 in run2.tree.beams and run2.sessions == 2
    res = invoke("replay", str(run_dir), "--runs-dir", str(tmp_path), "--evaluator", "scripted")
    assert res.exit_code == 0, res.output
    assert "recorded" in res.output and "0 proposer calls" in res.output
    replays = [p for p in tmp_path.iterdir() if "replay" in p.name]
    assert len(replays) == 1 and load_run(replays[0]).started.replay_of.startswith(run.id)


def test_generate_unknown_problem_exit_2(tmp_path):
    res = invoke("generate", "no_such_problem_xyz", "--proposer", "scripted", "--runs-dir", str(tmp_path))
    assert res.exit_code == 2
    assert len(stderr_of(res).strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing half-made


def test_generate_needs_a_problem(tmp_path):
    res = invoke("generate", "--runs-dir", str(tmp_path))
    assert res.exit_code == 2 and "PROBLEM" in stderr_of(res)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU error")
def test_replay_without_gpu_is_a_clear_error(tmp_path):
    res = invoke("replay", str(SHIPPED[0]), "--runs-dir", str(tmp_path))
    assert res.exit_code == 2 and "GPU" in stderr_of(res)
    assert not list(tmp_path.iterdir())


def test_subprocess_exit_code_and_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kerngen", "show", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "kerngen", "show", str(SHIPPED[0]), "--width", "160"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "round 0" in proc.stdout


def test_live_view_renders_on_a_terminal(tmp_path):
    import io

    from rich.console import Console

    from kerngen.results.live import LiveView
    from kerngen.agent.scripted import ScriptedEvaluator, ScriptedProposer
    from kerngen.agent.budget import SearchBudget
    from kerngen.agent.context import minimal_context
    from kerngen.agent.search import run_search
    from kerngen.problems.ref import ProblemRef

    buf = io.StringIO()
    view = LiveView(Console(file=buf, force_terminal=True, width=100), total_rounds=1)
    assert view.enabled
    with view:
        run_search(ProblemRef(source="softmax"), ScriptedProposer(), ScriptedEvaluator(), runs_dir=tmp_path,
                   budget=SearchBudget(rounds=1), context_factory=minimal_context, listeners=[view])
    assert view.evaluated > 0 and "best" in buf.getvalue()
    assert not LiveView(Console(file=io.StringIO())).enabled  # not a terminal: off


def test_generate_with_unreachable_endpoint_is_one_line_exit_2(tmp_path):
    import os
    import subprocess
    import sys

    from tests.fakes.llm_server import closed_port

    url = f"http://127.0.0.1:{closed_port()}/v1"
    env = dict(os.environ, OPENAI_API_KEY="sk-never-printed")
    proc = subprocess.run(
        [sys.executable, "-m", "kerngen", "generate", "softmax", "--proposer", "llm", "--model", "m",
         "--base-url", url, "--runs-dir", str(tmp_path), "--dry-run"],  # no GPU here: the endpoint comes next
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "cannot reach" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "sk-never-printed" not in proc.stderr + proc.stdout
    assert not any(tmp_path.iterdir()), "no run folder for a search that never started"


def test_generate_with_wrong_key_is_one_line_exit_2(tmp_path):
    import os
    import subprocess
    import sys

    from tests.fakes.llm_server import ChatServer, Reply

    with ChatServer() as server:
        server.default = Reply.error(401, "Incorrect API key provided: sk-wrong-key")
        env = dict(os.environ, OPENAI_API_KEY="sk-wrong-key")
        proc = subprocess.run(
            [sys.executable, "-m", "kerngen", "generate", "softmax", "--proposer", "llm", "--model", "m",
             "--base-url", server.url, "--runs-dir", str(tmp_path), "--dry-run"],  # no GPU: the endpoint next
            capture_output=True, text=True, env=env, timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert "authentication" in proc.stderr.lower() and "sk-wrong-key" not in proc.stderr + proc.stdout
