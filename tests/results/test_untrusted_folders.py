"""Run folders and export folders are data (issue 12, class 3): no command imports a Python file
that a run or an export folder carries, no name from a journal or a manifest leads out of its
folder, text from a model reaches the terminal without control sequences, and bad data ends in
one line and exit code 2, never in a traceback.

Every folder here carries a ``.py`` that creates a canary file when imported."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen
import kerngen.cli.app
from kerngen.agent.tree import load_run
from kerngen.errors import KerngenError
from kerngen.problems.load import clear_cache
from tests.cli_output import stderr_of

runner = CliRunner()

EVIL = '''"""A problem that no command may import unless the user names it. <script>alert(1)</script>"""
import pathlib

pathlib.Path({canary!r}).write_text("imported")

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(8, 100)]


def get_init_inputs():
    return []
'''


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, [str(a) for a in args])


def ok(res) -> None:
    assert res.exit_code == 0, (res.output, res.exception)


def one_line_error(res, *words: str) -> str:
    """Exit 2, one line on stderr, no traceback (no exception but the exit)."""
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    err = stderr_of(res).strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


@pytest.fixture(autouse=True)
def _private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KERNGEN_EXPORT_DIR", str(tmp_path / "cache" / "deep" / "exports"))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A small scripted run of the built-in softmax (made by this version: it records its problem)."""
    runs = tmp_path_factory.mktemp("base")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNGEN_CACHE_DIR", str(runs / "cache"))
        res = invoke("generate", "softmax", "--shape", "8x100", "--proposer", "scripted", "--evaluator", "scripted",
                     "--rounds", "2", "--beam", "1", "--ideas", "2", "--branches", "1", "--runs-dir", runs / "runs")
    ok(res)
    (run,) = (runs / "runs").iterdir()
    assert load_run(run).started.problem_info is not None and load_run(run).best is not None
    return run


def read_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def write_lines(run: Path, events: list[dict]) -> None:
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def hostile_run(tmp_path: Path, base: Path, *, record: bool) -> tuple[Path, Path]:
    """(a copy of ``base`` whose journal names ``problem.py`` inside the folder, the canary path).
    ``record``: the journal carries a self-consistent record of that file (its true sha256)."""
    run = tmp_path / "runs" / "hostile"
    shutil.copytree(base, run)
    canary = tmp_path / "CANARY"
    evil = run / "problem.py"
    evil.write_text(EVIL.format(canary=str(canary)))
    events = read_lines(run)
    st = events[0]
    st["run_id"] = "hostile"
    st["problem"] = {"source": str(evil), "shape": None, "dtype": None}
    if record:
        info = st["problem_info"]
        info["info"].update(name="problem", path=str(evil), builtin=False, ref=st["problem"], shape=None)
        info["source"] = evil.read_text()
        info["sha256"] = hashlib.sha256(evil.read_bytes()).hexdigest()
    else:
        st.pop("problem_info")  # a run from before kerngen recorded its problem
    write_lines(run, events)
    return run, canary


@pytest.mark.parametrize("record", [False, True], ids=["old-journal", "self-consistent-record"])
def test_no_command_imports_the_problem_file_a_run_names(tmp_path, base, record):
    run, canary = hostile_run(tmp_path, base, record=record)
    journal = (run / "events.jsonl").read_bytes()

    ok(invoke("show", run, "--width", "200"))
    res = invoke("report", run, "-o", tmp_path / "r.html")
    ok(res)
    html = (tmp_path / "r.html").read_text()
    assert "<script>" not in html
    assert ("no command may import" in html) == record  # the recorded source, escaped

    res = invoke("export", run, "--out", tmp_path / "out")
    if record:
        ok(res)  # from the recorded shapes and dtypes
        assert sorted(p.suffix for p in (tmp_path / "out").iterdir()) == [".cu", ".cubin", ".json", ".py"]
    else:
        one_line_error(res, "records no data of its problem", "does not import")

    res = invoke("suite", "--runs-dir", run.parent, "--evaluator", "scripted", "--json")
    ok(res)  # the built-ins, measured; the run's file is not one of them
    assert '"verdict": "no_kernel"' in res.stdout

    one_line_error(invoke("replay", run, "--runs-dir", tmp_path / "replays", "--evaluator", "scripted"),
                   "--problem FILE")
    assert not (tmp_path / "replays").exists()
    one_line_error(invoke("generate", "--resume", run, "--evaluator", "scripted", "--rounds", "3"),
                   "kerngen generate FILE --resume")
    assert (run / "events.jsonl").read_bytes() == journal

    if record:
        import torch

        op = kerngen.load(run)  # exported into the cache from the record, built by kerngen's own code
        assert tuple(op(torch.empty(8, 100, device="meta")).shape) == (8, 100)
    else:
        with pytest.raises(KerngenError, match="records no data"):
            kerngen.load(run)
    assert not canary.exists()


def test_a_named_problem_file_runs_and_says_so(tmp_path, base):
    run, canary = hostile_run(tmp_path, base, record=True)
    res = invoke("replay", run, "--problem", run / "problem.py", "--runs-dir", tmp_path / "replays",
                 "--evaluator", "scripted")
    ok(res)
    assert f"problem file: {(run / 'problem.py').resolve()} (named on the command line)" in res.stdout
    assert canary.exists()  # the user named it: it ran
    canary.unlink()
    clear_cache()  # each command is a process of its own: it loads the file afresh
    res = invoke("generate", run / "problem.py", "--resume", run, "--evaluator", "scripted", "--rounds", "3")
    ok(res)
    assert "named on the command line" in res.stdout and canary.exists()


def test_an_unchanged_problem_file_of_a_run_made_here_runs_again(tmp_path, monkeypatch):
    mine = tmp_path / "mine.py"
    canary = tmp_path / "ran"
    mine.write_text(EVIL.format(canary=str(canary)))
    runs = tmp_path / "runs"
    ok(invoke("generate", mine, "--proposer", "scripted", "--evaluator", "scripted", "--rounds", "1", "--beam", "1",
              "--ideas", "1", "--branches", "1", "--runs-dir", runs))
    (run,) = runs.iterdir()
    res = invoke("generate", "--resume", run, "--evaluator", "scripted", "--rounds", "2")
    ok(res)
    assert "(unchanged since the run started)" in res.stdout
    ok(invoke("replay", run, "--runs-dir", tmp_path / "replays", "--evaluator", "scripted"))

    # the same run folder and file on another machine: the journal's own record is not enough
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "elsewhere"))
    one_line_error(invoke("generate", "--resume", run, "--evaluator", "scripted", "--rounds", "3"),
                   "never ran it on this machine")
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))

    mine.write_text(mine.read_text() + "\n# edited\n")
    one_line_error(invoke("generate", "--resume", run, "--evaluator", "scripted", "--rounds", "3"),
                   "changed since run")
    one_line_error(invoke("replay", run, "--runs-dir", tmp_path / "replays", "--evaluator", "scripted"),
                   "changed since run")
    res = invoke("generate", mine, "--resume", run, "--evaluator", "scripted", "--rounds", "3")
    ok(res)
    assert "changed since the run recorded it" in res.stdout


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("run_id", ["../../x", "/tmp/kerngen-abs-x", "a\x00b", "..", "a/b", "x\x1b]52;c;e\x07"])
def test_a_run_id_cannot_leave_its_folder(tmp_path, base, run_id):
    run = tmp_path / "w" / "runs" / "evil"
    shutil.copytree(base, run)
    events = read_lines(run)
    events[0]["run_id"] = run_id
    write_lines(run, events)
    before = _tree(tmp_path)
    for cmd in (("show", run), ("report", run), ("export", run, "--out", tmp_path / "w" / "out"),
                ("replay", run, "--runs-dir", tmp_path / "w" / "runs", "--evaluator", "scripted"),
                ("generate", "--resume", run, "--evaluator", "scripted")):
        err = one_line_error(invoke(*cmd), "run_id")
        assert "\x1b" not in err and "\x00" not in err
    with pytest.raises(KerngenError, match="run_id"):
        kerngen.load(run)
    assert _tree(tmp_path) == before  # nothing written anywhere
    assert not Path("/tmp/kerngen-abs-x-node0").exists()


@pytest.fixture
def export_dir(tmp_path, base) -> tuple[Path, Path]:
    """(an export of the base run whose generated module, and a stray .py, create a canary, the canary)."""
    out = tmp_path / "export"
    ok(invoke("export", base, "--out", out, "--name", "untrusted_demo"))
    canary = tmp_path / "CANARY"
    code = f"import pathlib\npathlib.Path({str(canary)!r}).write_text('imported')\n"
    for name in ("untrusted_demo.py", "__init__.py", "evil.py"):
        (out / name).write_text(code)
    return out, canary


def test_loading_an_export_imports_nothing_from_it(export_dir):
    import torch

    out, canary = export_dir
    op = kerngen.load(out)
    assert op is kerngen.load(out / "untrusted_demo.json")  # registered once per process
    assert tuple(torch.ops.kerngen.untrusted_demo(torch.empty(8, 100, device="meta")).shape) == (8, 100)
    assert tuple(op(torch.empty(8, 100, device="meta")).shape) == (8, 100)
    with pytest.raises(ValueError, match="CUDA tensors only"):
        kerngen.load(out, strict=True)(torch.randn(8, 100))  # never to the kernel; strict: no fallback either
    kerngen.load(out)
    one_line_error(invoke("show", out), "events.jsonl is missing")
    one_line_error(invoke("export", out, "--out", out.parent / "o"), "events.jsonl is missing")
    assert not canary.exists()


def test_loading_an_export_in_a_fresh_process_imports_nothing(export_dir):
    out, canary = export_dir
    code = ("import sys, torch, kerngen; op = kerngen.load(sys.argv[1]); "
            "print(tuple(op(torch.empty(8, 100, device='meta')).shape))")
    path = os.pathsep.join(filter(None, [str(out), os.environ.get("PYTHONPATH")]))  # the folder importable, too
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, cwd=out,
                          env={**os.environ, "PYTHONPATH": path}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(8, 100)" and not canary.exists()


@pytest.mark.parametrize("field,value,words", [
    ("cubin_file", "../../outside.cubin", "file name"),
    ("source_file", "/etc/passwd", "file name"),
    ("name", "../x", "op name"),
    ("name", "x; import os", "op name"),
    ("arch", "sm_90 --include-path=/", "arch"),
    ("op", "kerngen::other", "op"),
    ("arg_names", ["x y"], "argument name"),
])
def test_a_manifest_cannot_name_anything_outside(export_dir, field, value, words):
    out, canary = export_dir
    manifest = out / "untrusted_demo.json"
    data = json.loads(manifest.read_text())
    data[field] = value
    manifest.write_text(json.dumps(data))
    from kerngen.results.manifest import read_manifest

    with pytest.raises(KerngenError, match=words):
        read_manifest(manifest)
    with pytest.raises(KerngenError) as info:
        kerngen.load(manifest)
    assert len(str(info.value).splitlines()) == 1
    assert not canary.exists()


def test_an_export_file_that_links_outside_is_refused(export_dir, tmp_path):
    from kerngen.results.exported_op import ExportedKernel

    out, canary = export_dir
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x7fELF secret")
    cubin = next(out.glob("*.cubin"))
    cubin.unlink()
    cubin.symlink_to(secret)
    with pytest.raises(KerngenError, match="leads outside"):
        ExportedKernel(out / "untrusted_demo.json").cubin_for("sm_90")
    # a manifest that is itself a link out of the folder is not one of the folder's
    outside = tmp_path / "outside.json"
    shutil.move(out / "untrusted_demo.json", outside)
    (out / "untrusted_demo.json").symlink_to(outside)
    with pytest.raises(KerngenError):
        kerngen.load(out)
    assert not canary.exists()


def test_export_writes_only_inside_out(tmp_path, base):
    from kerngen.results.export import export_run

    run = load_run(base)
    first = export_run(run, tmp_path / "first")
    assert all(p.parent == tmp_path / "first" for p in first.files())
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "victim.json"
    target.write_text("untouched")
    (out / first.manifest.name).symlink_to(target)  # a link planted in --out, leading out of it
    with pytest.raises(KerngenError, match="leads outside"):
        export_run(run, out)
    assert target.read_text() == "untouched" and sorted(p.name for p in out.iterdir()) == [first.manifest.name]
    with pytest.raises(KerngenError, match="arch"):
        export_run(run, tmp_path / "o2", arch="../../sm_90")
    assert not (tmp_path / "o2").exists()


CONTROL = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[H\x9b31m"


def test_show_strips_terminal_control_sequences(tmp_path, base):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    events = read_lines(run)
    for e in events:
        if e["type"] == "ideas":
            e["ideas"][0]["text"] = f"{CONTROL}vectorize [bold red]loads[/] {CONTROL}"
        elif e["type"] == "node_created" and e["id"] == 1:
            e["notes"] = CONTROL
            e["idea"]["text"] = f"{CONTROL}vectorize [bold red]loads[/] {CONTROL}"  # the node's copy (report)
        elif e["type"] == "run_finished":
            e["reason"] = f"done {CONTROL}[/oops]"
    write_lines(run, events)
    res = invoke("show", run, "--width", "250")
    ok(res)
    assert "\x1b" not in res.output and "\x9b" not in res.output and "\x07" not in res.output
    assert "vectorize [bold red]loads[/]" in res.output and "done [/oops]" in res.output  # printed, not markup
    # through the console script too (no terminal: rich adds no escape of its own)
    proc = subprocess.run(["kerngen", "show", str(run), "--width", "250"], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert b"\x1b" not in proc.stdout and b"vectorize" in proc.stdout
    ok(invoke("report", run, "-o", tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert "\x1b" not in html and "vectorize [bold red]loads[/]" in html


def _mutations() -> dict[str, object]:
    def started(**kw):
        return lambda ev: ev[0].update(kw)

    def first(kind, fn):
        def apply(ev):
            fn(next(e for e in ev if e["type"] == kind))
        return apply

    return {
        "problem of a wrong type": started(problem=5),
        "no config": lambda ev: ev[0].pop("config"),
        "problem_info of wrong types": started(problem_info={"info": {"name": 3}, "sha256": "zz"}),
        "time as text": started(t="yesterday"),
        "unknown verdict": first("node_evaluated", lambda e: e["result"].update(verdict="bogus")),
        "self-parent": first("node_created", lambda e: e.update(parent=e["id"])),
        "infinite usage": first("run_finished", lambda e: e["usage"].update(llm_calls=float("inf"))),
        "deep nesting": "raw:" + "[" * 5000 + "]" * 5000,
        "a 5000-digit number": "raw:" + json.dumps({"type": "baseline", "seq": 1}).replace("1}", "1" * 5000 + "}"),
        "not UTF-8": b"raw-bytes:\xff\xfe{\"type\": \"ideas\"}",
    }


@pytest.mark.parametrize("name", list(_mutations()))
def test_bad_journals_end_in_one_line_never_a_traceback(tmp_path, base, name):
    mutate = _mutations()[name]
    run = tmp_path / "run"
    shutil.copytree(base, run)
    events = read_lines(run)
    if isinstance(mutate, (str, bytes)):
        raw = mutate.encode() if isinstance(mutate, str) else mutate
        tail = raw.split(b":", 1)[1]
        with open(run / "events.jsonl", "ab") as fh:
            fh.write(tail + b"\n")
    else:
        mutate(events)
        if name == "self-parent":  # the same id created again, as its own child
            dup = dict(next(e for e in events if e["type"] == "node_created"))
            events.insert(events.index(next(e for e in events if e["type"] == "node_created")) + 1, dup)
        write_lines(run, events)
    for cmd in (("show", run), ("report", run, "-o", tmp_path / "r.html"), ("export", run, "--out", tmp_path / "o"),
                ("replay", run, "--runs-dir", tmp_path / "replays", "--evaluator", "scripted"),
                ("generate", "--resume", run, "--evaluator", "scripted", "--rounds", "3")):
        res = invoke(*cmd)
        if res.exit_code != 0:
            one_line_error(res)
        assert res.exception is None or isinstance(res.exception, SystemExit), (cmd, res.exception)
