"""``kerngen problems``: through typer's CliRunner, and the exit-code path through a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from tests.cli_output import stderr_of

DATA = Path(__file__).parents[1] / "data" / "kernelbench"


@pytest.fixture(scope="module")
def app():
    return kerngen.cli.app.app


def invoke(app, *args):
    return CliRunner().invoke(app, ["problems", *args], env={"COLUMNS": "200"})


def test_lists_builtins(app):
    r = invoke(app)
    assert r.exit_code == 0, r.output
    for name in ("softmax", "layernorm", "rmsnorm", "gelu", "conv2d", "conv_relu_maxpool", "matmul", "attention"):
        assert name in r.output
    assert "4096x65536" in r.output


def test_describes_builtins_and_files(app):
    r = invoke(app, "matmul", "attention", str(DATA / "19_ReLU.py"))
    assert r.exit_code == 0, r.output
    assert "137 GFLOP" in r.output and "550 GFLOP" in r.output
    assert "19_ReLU" in r.output and "16x1024" in r.output and "atol=0.0001" in r.output


def test_shape_and_dtype_options(app):
    r = invoke(app, "softmax", "--shape", "8192x1024", "--dtype", "bf16")
    assert r.exit_code == 0, r.output
    assert "8192x1024" in r.output and "bfloat16" in r.output and "atol=0.01" in r.output


def test_json_output(app):
    r = invoke(app, "conv2d", "rmsnorm", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert [d["name"] for d in data] == ["conv2d", "rmsnorm"]
    assert data[0]["outputs"][0]["shape"] == [100, 96, 55, 55]
    assert data[1]["dtype"] == "bfloat16" and data[1]["params"][0]["name"] == "weight"
    r = invoke(app, "matmul", "--shape", "256", "--dtype", "fp16", "--json")
    (mm,) = json.loads(r.output)
    assert mm["ref"] == {"source": "matmul", "shape": [256, 256, 256], "dtype": "float16"}
    assert mm["flops"] == 2 * 256**3 and mm["atol"] == 0.01
    r = invoke(app, "--json")
    assert len(json.loads(r.output)) == 11  # the suite, matmul_wide, conv2d_wide and linear_gelu included


def test_errors_are_one_line_and_exit_2(app):
    for args in (["/no/such.py"], ["softmax", "--shape", "1x2x3"], ["softmax", "--dtype", "fp8"],
                 [str(DATA / "19_ReLU.py"), "--shape", "4x4"], ["--shape", "4x4"]):  # fmt: skip
        r = invoke(app, *args)
        lines = [line for line in stderr_of(r).splitlines() if line.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (args, r.output)


def test_exit_code_2_and_one_line_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("class Model(:\n")
    for args in ([str(bad)], ["softmax", "--shape", "0x5"]):
        proc = subprocess.run(
            [sys.executable, "-m", "kerngen", "problems", *args], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
