"""What a newcomer meets in the first hour (issue 37, part 7): each small rough edge, one test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.journal import Journal, read_events
from kerngen.errors import NoGPUError
from kerngen.harness.pool.local import NO_GPU
from kerngen.problems.ref import parse_shape
from kerngen.results.report_charts import around
from tests.cli_output import stderr_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (ROOT / "runs").iterdir() if (p / "events.jsonl").is_file())
KB = ROOT / "tests" / "data" / "kernelbench"
runner = CliRunner()


def invoke(*args: str, **kw):
    return runner.invoke(kerngen.cli.app.app, list(args), **kw)


def _one_line_error(res, code: int = 2) -> str:
    err = stderr_of(res).strip()
    assert res.exit_code == code, (res.exit_code, res.output, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ----- no GPU: said before the LLM endpoint is asked anything, with what to do instead -------
def test_no_gpu_is_said_before_the_endpoint_is_probed_and_suggests_a_dry_run(httpserver, monkeypatch):
    from kerngen.harness.pool import local

    def no_gpu() -> list[str]:
        raise NoGPUError(NO_GPU)

    monkeypatch.setattr(local, "visible_devices", no_gpu)  # so on a GPU host too
    httpserver.expect_request("/v1/models").respond_with_json({"data": [{"id": "m"}]})
    res = invoke("generate", "softmax", "--model", "m", "--base-url", httpserver.url_for("/v1"),
                 env={"OPENAI_API_KEY": "sk-test"})
    err = _one_line_error(res)
    assert "no CUDA device" in err and "--dry-run" in err and "kerngen check" in err
    assert httpserver.log == []  # not one request: the GPU check came first


# ----- --shape with a size missing ------------------------------------------------------------
@pytest.mark.parametrize("text", ["4096x", "x4096", "4096xx8", "4096,,8", "4096x*8"])
def test_a_shape_with_a_size_missing_is_refused(text):
    with pytest.raises(Exception, match="a size is missing"):
        parse_shape(text)
    err = _one_line_error(invoke("problems", "softmax", "--shape", text))
    assert "a size is missing" in err


@pytest.mark.parametrize("text,dims", [("8192x1024", (8192, 1024)), ("8192,1024", (8192, 1024)),
                                       ("(8192, 1024)", (8192, 1024)), ("(8192,)", (8192,)),
                                       ("8192 x 1024", (8192, 1024)), ("4_096", (4096,))])
def test_shapes_as_before(text, dims):
    assert parse_shape(text) == dims


# ----- check: a usage error exits 2, a failed check 1 --------------------------------------
def test_check_exits_2_on_usage_errors(tmp_path):
    spec = ROOT / "runs" / "20261122-041828-matmul-b9c7" / "best" / "spec.json"
    for args, words in ((["no-such-spec.json", "matmul"], "kernel spec not found"),
                        ([str(spec), "matmul", "--config", "BM"], "expected NAME=INTEGER"),
                        ([str(spec), "matmul", "--config", "TW=16"], "unknown tunables"),
                        ([str(spec), "matmul", "--config", "BM=3"], "BM=3 is not among its values"),
                        ([str(spec), "matmul", "--shape", "64x"], "a size is missing")):
        err = _one_line_error(invoke("check", *args))
        assert words in err, (args, err)
        res = invoke("check", *args, "--json")
        assert res.exit_code == 2 and json.loads(res.output)["ok"] is False
    # the spec's own tunables are named, so the next try can be right
    assert "BM=[" in _one_line_error(invoke("check", str(spec), "matmul", "--config", "TW=16"))


# ----- problems DIR ------------------------------------------------------------------------
def test_problems_takes_a_folder(tmp_path):
    for f in ("19_ReLU.py", "100_HingeLoss_cuda.py"):
        shutil.copy(KB / f, tmp_path / f)
    res = invoke("problems", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    names = [p["name"] for p in json.loads(res.output)]
    assert len(names) == 2 and any("ReLU" in n for n in names) and any("Hinge" in n for n in names)


# ----- budgets are named as typed -----------------------------------------------------------
@pytest.mark.parametrize("args,option", [(["--minutes", "0"], "--minutes"), (["--gpu-minutes", "-1"], "--gpu-minutes"),
                                         (["--minutes", "nan"], "--minutes")])
def test_budget_errors_name_the_option(args, option):
    err = _one_line_error(invoke("generate", "softmax", *args))
    assert f"bad {option} " in err and "wall_minutes" not in err and "gpu_minutes" not in err


# ----- a bad last journal line: skipped with a warning, cut off by a resume --------------------
def _torn(tmp_path: Path, tail: str) -> Path:
    runs = tmp_path / "runs"
    run = runs / SHIPPED[-1].name
    shutil.copytree(SHIPPED[-1], run)
    with (run / "events.jsonl").open("a") as fh:
        fh.write(tail)
    return runs


@pytest.mark.parametrize("tail", ['{"type": "node_evaluated", "id": 3, "res\n', "garbage\n\n", "{}\n"])
def test_a_bad_last_line_blocks_nothing(tmp_path, tail):
    runs = _torn(tmp_path, tail)
    events, truncated = read_events(runs / SHIPPED[-1].name)
    assert truncated == len(tail.encode()) and len(events) == len(read_events(SHIPPED[-1])[0])
    for args in (["show", "latest"], ["report", "latest", "-o", str(tmp_path / "r.html")],
                 ["export", "latest", "-o", str(tmp_path / "ex")]):
        res = invoke(*args, "--runs-dir", str(runs))
        assert res.exit_code == 0, (args, res.output)
        assert "is unreadable" in stderr_of(res) and "--resume cuts it off" in stderr_of(res)
    assert (tmp_path / "r.html").is_file() and any((tmp_path / "ex").iterdir())


def test_a_resume_cuts_the_bad_last_line_off(tmp_path):
    runs = _torn(tmp_path, "garbage\n")
    journal, events, truncated = Journal.reopen(runs / SHIPPED[-1].name)
    journal.close()
    assert truncated == len("garbage\n")
    assert (runs / SHIPPED[-1].name / "events.jsonl").read_bytes() == (SHIPPED[-1] / "events.jsonl").read_bytes()


def test_a_bad_line_before_the_last_is_still_an_error(tmp_path):
    runs = _torn(tmp_path, "garbage\n" + (SHIPPED[-1] / "events.jsonl").read_text().splitlines()[-1] + "\n")
    err = _one_line_error(invoke("show", "latest", "--runs-dir", str(runs)))
    assert "is not valid JSON" in err


# ----- the tuning curve shows its spread -----------------------------------------------------
def test_the_tuning_axis_spans_the_times_not_zero():
    lo, hi = around([2.80, 2.95, 2.83, 2.91])
    assert 2.6 < lo < 2.80 and 2.95 < hi < 3.1
    lo, hi = around([1.0, 1.0])
    assert 0.9 < lo < 1.0 < hi < 1.1  # a flat curve still has a range


# ----- the README's examples and the guide's links ------------------------------------------
def _readme_commands() -> list[str]:
    block = (ROOT / "README.md").read_text().split("## Using it", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip().startswith("kerngen ")]


def test_the_readmes_conv_examples_chain(tmp_path, monkeypatch):
    """The spec the README's playbook line writes takes the README's next lines' --config."""
    import shlex

    monkeypatch.chdir(tmp_path)
    lines = [shlex.split(c)[1:] for c in _readme_commands() if "conv.json" in c]
    writes = [a for a in lines if a[0] == "playbook"]
    checks = [a for a in lines if a[0] == "check"]
    assert writes and checks and lines.index(writes[0]) < lines.index(checks[0])  # written before it is used
    res = invoke(*writes[0])
    assert res.exit_code == 0, res.output
    for args in checks + [["check", "conv.json", "conv2d", *a[a.index("--config"):a.index("--config") + 2]]
                          for a in lines if a[0] == "bench"]:
        res = invoke(*args)
        assert res.exit_code == 0, (args, res.output, stderr_of(res))


def test_every_relative_link_of_the_docs_resolves():
    import re

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: {target}"


def test_run_names_are_folded_not_cut_at_80_columns():
    from rich.console import Console

    from kerngen.results.show import render_runs

    long = "20261127-211356-20_convtranspose3d_sum_residualadd_multiply_residualadd-332e"
    rows = [{"run": long, "path": "x", "problem": "level2/20_ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd.py",
             "gpu": "NVIDIA H100 80GB HBM3", "best_ms": 1.23, "speedup_eager": 1.2, "speedup_compile": 1.1,
             "speedup_compile_defaults": None, "state": "finished", "status": "finished: x", "dry_run": None}]
    console = Console(width=80, record=True)
    console.print(render_runs(rows))
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    lines = text.splitlines()
    width = next(line for line in lines if "problem" in line and "GPU" in line).index("GPU")
    assert long in "".join(line[:width].strip() for line in lines)
