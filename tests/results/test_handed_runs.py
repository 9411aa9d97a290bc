"""Run folders someone hands over, second pass (issue #31): a sparse 1 GB journal costs no
memory, a legitimately deep run renders, a run cannot impersonate another in the export cache, a
resume never takes unlimited budgets from a journal, and a batch state file cannot send the batch
out of its runs folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kerngen.results.exported_op as exported_op
from kerngen.agent.budget import SearchBudget
from kerngen.agent.search_records import budget_for_resume
from kerngen.agent.tree import load_run
from kerngen.cli import batch as batch_mod
from tests.cli_output import stderr_of
from tests.results.test_untrusted_folders import base, invoke, ok, one_line_error, read_lines, write_lines  # noqa: F401

GB = 1 << 30


@pytest.fixture(autouse=True)
def _private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KERNGEN_EXPORT_DIR", str(tmp_path / "exports"))


def _copy(origin: Path, runs: Path, name: str) -> Path:
    run = runs / name
    shutil.copytree(origin, run)
    events = read_lines(run)
    events[0]["run_id"] = name
    write_lines(run, events)
    return run


# ----- a sparse 1 GB journal, under a memory limit -------------------------------------------
# In one fresh interpreter: each command once on a normal run (every module loaded), then the
# address space is capped at what it has plus 384 MB, then each command on the sparse journals
# (reading one whole would take more than 1 GB). Prints one JSON line: command -> (exit, stderr).
HOSTILE = textwrap.dedent("""
    import json, resource, sys
    from typer.testing import CliRunner
    from kerngen.cli.app import app
    runs, out = sys.argv[1], sys.argv[2]
    def run(*args):
        r = CliRunner().invoke(app, [*args, "--runs-dir", runs] if args[0] != "export" else [*args])
        return r.exit_code, (r.stderr or "").strip(), r.stdout
    for name in ("good",):
        assert run("show", name)[0] == 0 and run("report", name, "-o", out + "/g.html")[0] == 0
        assert run("export", runs + "/" + name, "--out", out + "/g")[0] == 0 and run("runs")[0] == 0
    size = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")][0] << 10
    resource.setrlimit(resource.RLIMIT_AS, (size + (384 << 20), resource.RLIM_INFINITY))
    res = {"runs": run("runs")}
    for name in ("zeros", "long_line"):
        res["show " + name] = run("show", name)
        res["report " + name] = run("report", name, "-o", out + "/h.html")
        res["export " + name] = run("export", runs + "/" + name, "--out", out + "/" + name)
    print(json.dumps(res))
""")


def test_a_sparse_journal_costs_no_memory(tmp_path, base):  # noqa: F811 - the fixture
    runs = tmp_path / "runs"
    _copy(base, runs, "good")
    zeros = runs / "zeros"
    zeros.mkdir()
    with open(zeros / "events.jsonl", "wb") as fh:  # 1 GB, sparse: 4 KB on disk
        fh.truncate(GB)
    long_line = _copy(base, runs, "long_line")
    with open(long_line / "events.jsonl", "r+b") as fh:  # a valid start, then 200 MB without a newline
        fh.seek(0, os.SEEK_END)
        fh.truncate(fh.tell() + (200 << 20))
    proc = subprocess.run([sys.executable, "-c", HOSTILE, str(runs), str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    code, _, listing = res.pop("runs")
    assert code == 0 and "good" in listing and "is 1073741824 bytes, more than the 268435456" in listing, listing
    for cmd, (code, err, _) in res.items():
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error:"), (cmd, code, err)
        assert "events.jsonl" in err and ("268435456" in err or "33554432 bytes an event" in err), (cmd, err)


# ----- a deep run renders --------------------------------------------------------------------
def test_a_run_300_deep_renders(tmp_path, base):  # noqa: F811
    run = _copy(base, tmp_path / "runs", "deep")
    events = read_lines(run)
    created = next(e for e in events if e["type"] == "node_created" and e.get("spec"))
    evaluated = next(e for e in events if e["type"] == "node_evaluated" and e["result"]["verdict"] == "ok")
    head = [e for e in events if e["type"] in ("run_started", "baseline")]
    chain = []
    for i in range(400):  # each node refines the one before: depth 400
        chain.append({**created, "id": i, "parent": i - 1 if i else None, "round": i, "kind": "branch"})
        chain.append({**evaluated, "id": i})
    write_lines(run, head + chain)
    ok(invoke("report", run, "-o", tmp_path / "deep.html"))
    html = (tmp_path / "deep.html").read_text()
    assert html.count('<li class="node">') == 400 and html.count("<ul") - 1 == html.count("</ul>") - 1
    ok(invoke("show", run))
    ok(invoke("runs", "--runs-dir", tmp_path / "runs"))
    ok(invoke("export", run, "--out", tmp_path / "exported"))


# ----- the export cache ----------------------------------------------------------------------
def test_a_handed_run_cannot_plant_its_kernel_for_a_genuine_one(tmp_path, base, monkeypatch):  # noqa: F811
    runs = tmp_path / "runs"
    genuine = _copy(base, runs, "genuine")
    events = read_lines(genuine)
    best = load_run(genuine).best
    hostile = tmp_path / "handed" / "genuine"  # the same run id, its own kernel
    shutil.copytree(genuine, hostile)
    for e in events:
        if e["type"] == "node_created" and e["id"] == best.id:
            e["spec"]["source"] = "// PLANTED\n" + e["spec"]["source"]
    write_lines(hostile, events)
    monkeypatch.setattr(exported_op, "op_of_manifest", lambda manifest, **how: Path(manifest))  # where it loads from
    planted = exported_op.load_op(hostile)
    loaded = exported_op.load_op(genuine)
    assert planted.parent != loaded.parent
    sources = "".join(p.read_text() for p in loaded.parent.glob("*.cu"))
    assert sources and "PLANTED" not in sources
    assert exported_op.load_op(genuine) == loaded  # the cache still serves the genuine run


# ----- a resume's budget ---------------------------------------------------------------------
def _unlimited(run: Path, branches: int = 3000) -> None:
    events = read_lines(run)
    events[0]["budget"] = SearchBudget.unlimited(rounds=3000).model_dump()
    events[0]["config"]["branches"] = branches
    events = [e for e in events if e["type"] != "run_finished"]  # interrupted: a resume continues it
    write_lines(run, events)


def test_a_resume_takes_no_unlimited_budget_from_a_journal(tmp_path, base):  # noqa: F811
    run = _copy(base, tmp_path / "runs", "handed")
    _unlimited(run)
    b = budget_for_resume(load_run(run), {})
    d = SearchBudget()
    assert b.rounds == d.rounds and b.max_llm_calls == d.max_llm_calls and b.max_tokens == d.max_tokens
    assert b.patience == d.patience and b.gpu_minutes is not None and b.wall_minutes is not None
    assert budget_for_resume(load_run(run), {"max_llm_calls": 7, "rounds": 9}).max_llm_calls == 7
    # a journal that asks for less keeps its lower limits
    events = read_lines(run)
    events[0]["budget"].update(rounds=1, max_llm_calls=3)
    write_lines(run, events)
    low = budget_for_resume(load_run(run), {})
    assert low.rounds == 1 and low.max_llm_calls == 3


def test_a_resumed_llm_run_recording_many_branches_sends_at_most_the_default_calls(tmp_path, base, monkeypatch):  # noqa: F811
    """The issue's run recorded 3000 branches (3002 requests in 90 s); 250 are enough to pass the
    default 200 calls and keep the test short (each node is an fsync'd journal line)."""
    from tests.fakes.llm_server import ChatServer, Reply

    run = _copy(base, tmp_path / "runs", "handed")
    _unlimited(run, branches=250)
    events = read_lines(run)
    events[0].update(proposer="llm", model="m")
    write_lines(run, events)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0123456789")

    def answer(req):
        fmt = (req.body or {}).get("response_format") or {}
        if fmt.get("json_schema", {}).get("name") == "IdeaList":
            return Reply.completion(json.dumps({"ideas": [{"text": f"idea {i}", "category": "memory_access"}
                                                          for i in range(3)]}))
        return Reply.completion("no kernel today")  # unreadable: nothing to compile, the model is asked again

    with ChatServer() as server:
        server.default = answer
        res = invoke("generate", "--resume", "handed", "--runs-dir", tmp_path / "runs", "--evaluator", "scripted",
                     "--base-url", server.url, "--minutes", "0.3")
        sent = len(server.chat_requests)
    assert res.exit_code == 0, (res.output, stderr_of(res))
    assert "it records beam 1, ideas 2, branches 250" in res.output and "rounds 3000" in res.output
    assert "This session runs under rounds 5, max_llm_calls 200" in " ".join(res.output.split())
    # the 3000 branches asked for far more; the default budget stopped them
    assert SearchBudget().max_llm_calls // 2 <= sent <= SearchBudget().max_llm_calls, sent


# ----- a batch state file --------------------------------------------------------------------
@pytest.mark.parametrize("attack", ["parent", "absolute", "symlinked_folder", "symlinked_journal", "stranger"])
def test_a_batch_state_cannot_lead_out_of_its_runs_folder(tmp_path, base, attack):  # noqa: F811
    runs = tmp_path / "runs"
    victim = _copy(base, tmp_path / "mine", "victim")  # the user's other run
    before = (victim / "events.jsonl").read_bytes()
    problems = ["softmax", "gelu"]
    state = batch_mod.Batch(problems=problems, entries=[batch_mod.Entry(problem=p) for p in problems])
    entry = state.entries[0]
    entry.status = batch_mod.Status.running
    if attack == "parent":
        entry.run = "../mine/victim"
    elif attack == "absolute":
        entry.run = str(victim)
    elif attack == "symlinked_folder":
        entry.run = "linked"
        runs.mkdir(parents=True)
        (runs / "linked").symlink_to(victim)
    elif attack == "symlinked_journal":
        entry.run = "inside"
        (runs / "inside").mkdir(parents=True)
        (runs / "inside" / "events.jsonl").symlink_to(victim / "events.jsonl")
    else:
        entry.problem = "/etc/passwd"
    path = batch_mod.batch_path(problems, runs)
    batch_mod.save(state, path)
    res = invoke("generate", *problems, "--runs-dir", runs, "--proposer", "scripted", "--evaluator", "scripted")
    err = one_line_error(res, "batch state", "--fresh")
    assert str(path) in err
    assert (victim / "events.jsonl").read_bytes() == before


def test_an_oversized_batch_state_is_refused(tmp_path):
    runs = tmp_path / "runs"
    path = batch_mod.batch_path(["softmax", "gelu"], runs)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as fh:
        fh.truncate(batch_mod.MAX_BATCH_BYTES + 1)
    res = invoke("generate", "softmax", "gelu", "--runs-dir", runs, "--proposer", "scripted", "--evaluator", "scripted")
    one_line_error(res, "batch state", str(batch_mod.MAX_BATCH_BYTES))
