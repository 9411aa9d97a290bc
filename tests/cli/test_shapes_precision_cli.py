"""``kerngen generate --shape A,B,C [--export DIR]`` (one search per shape, one export with a shape
bucket each), ``--precision``, and what show says of which PyTorch and which precision (CPU tier:
the scripted evaluator)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.tree import run_folders
from kerngen.results.manifest import read_manifest
from tests.cli_output import stderr_of

DATA = Path(__file__).parents[1] / "data" / "kernelbench"
runner = CliRunner()
SCRIPTED = ("--proposer", "scripted", "--evaluator", "scripted", "--rounds", "1", "--no-tune")


def invoke(*args: object):
    return runner.invoke(kerngen.cli.app.app, [str(a) for a in args], env={"COLUMNS": "250"})


def one_line_exit_2(res, words: str) -> None:
    err = stderr_of(res).strip()
    assert res.exit_code == 2 and len(err.splitlines()) == 1 and words in err, (res.exit_code, err)


def test_several_shapes_one_export_with_a_bucket_each(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "op"
    res = invoke("generate", "softmax", "--shape", "8x128,32x128", "--runs-dir", runs, "--export", out, *SCRIPTED)
    assert res.exit_code == 0, res.output
    folders = run_folders(runs)
    assert len(folders) == 2
    assert "softmax 8x128: " in res.stdout and "softmax 32x128: " in res.stdout
    assert "vs PyTorch (true fp32)" in res.stdout and "vs PyTorch defaults (TF32 conv)" in res.stdout
    assert "(2 shape bucket(s))" in res.stdout
    (manifest,) = out.glob("*.json")
    m = read_manifest(manifest)
    shapes = [tuple(v.inputs[0].shape) for v in m.variants()]
    assert shapes == [(8, 128), (32, 128)] and m.precision == "fp32"
    assert all(v.timed.value == "kernel" for v in m.variants())  # which path the recorded times are of
    assert (out / m.buckets[0].source_file).is_file() and (out / m.buckets[0].cubin_file).is_file()
    # the same runs exported again by hand: one op, the fastest kernel per shape
    again = invoke("export", *[f.name for f in folders], "--runs-dir", runs, "--out", tmp_path / "again")
    assert again.exit_code == 0, again.output
    assert "(2 shape buckets)" in again.stdout


def test_show_says_which_precision_and_which_pytorch(tmp_path):
    runs = tmp_path / "runs"
    res = invoke("generate", "softmax", "--shape", "8x128", "--precision", "tf32", "--runs-dir", runs, *SCRIPTED)
    assert res.exit_code == 0, res.output
    show = invoke("show", "latest", "--runs-dir", runs, "--width", "250")
    assert show.exit_code == 0, show.output
    text = show.stdout
    assert "softmax 8x128 [tf32]" in text and "checked at  TF32 (PyTorch's TF32 reference" in text
    assert "true fp32: eager 1.0000 ms" in text and "PyTorch defaults (TF32 conv): eager 0.9000 ms" in text
    assert "vs PyTorch (true fp32); " in text and "(not the exported op's path); kerngen bench" in text
    data = json.loads(invoke("show", "latest", "--runs-dir", runs, "--json").stdout)
    assert data["best_figures"]["defaults_label"] == "PyTorch defaults (TF32 conv)"
    rows = json.loads(invoke("runs", "--runs-dir", runs, "--json").stdout)
    assert rows[0]["speedup_compile_defaults"] is not None


def test_bad_shape_lists_and_precisions_are_one_line(tmp_path):
    runs = tmp_path / "runs"
    one_line_exit_2(invoke("generate", "softmax", "--precision", "fp16", "--runs-dir", runs, *SCRIPTED),
                    "unknown precision 'fp16'")
    one_line_exit_2(invoke("generate", DATA / "19_ReLU.py", "--shape", "8x8,16x8", "--runs-dir", runs, *SCRIPTED),
                    "apply to built-in problems only")
    one_line_exit_2(invoke("generate", "softmax", "gelu", "--shape", "8x8,16x8", "--runs-dir", runs, *SCRIPTED),
                    "several --shape values take one built-in PROBLEM")
    one_line_exit_2(invoke("generate", "softmax", "--shape", "8x8,8x8", "--runs-dir", runs, *SCRIPTED),
                    "names a shape twice")
    assert not runs.exists() or not list(run_folders(runs))  # refused before any run started


def test_one_export_holds_one_problem(tmp_path):
    runs = tmp_path / "runs"
    for name in ("softmax", "gelu"):
        assert invoke("generate", name, "--shape", "8x128", "--runs-dir", runs, *SCRIPTED).exit_code == 0
    ids = [f.name for f in run_folders(runs)]
    one_line_exit_2(invoke("export", *ids, "--runs-dir", runs, "--out", tmp_path / "o"), "one export holds")
