"""``kerngen check --emulate``: a spec the user names, after the static checks, through the harness's
correctness check on the CPU emulator against PyTorch at a small shape (issue 37, item 9)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from tests.cli_output import stderr_of
from tests.kernels.specs import CASES

pytestmark = pytest.mark.needs_cxx
runner = CliRunner()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))


def spec_file(tmp_path, name: str):
    path = tmp_path / f"{name}.json"
    path.write_text(CASES[name].spec.model_dump_json())
    return str(path)


def check(*args: str):
    return runner.invoke(kerngen.cli.app.app, ["check", *args])


def test_a_correct_spec_passes_the_emulated_check(tmp_path):
    res = check(spec_file(tmp_path, "softmax_ok"), "softmax", "--shape", "4x300", "--config", "BLOCK=128", "--emulate")
    assert res.exit_code == 0, res.output
    assert "emulated on the CPU against PyTorch: ok" in res.output
    assert "correct on 3 random input sets" in res.output
    assert res.output.strip().splitlines()[-1].endswith("resources, emulate")


def test_a_broken_spec_fails_with_the_evidence(tmp_path):
    res = check(spec_file(tmp_path, "gelu_first_half"), "gelu", "--shape", "37x41", "--emulate")
    assert res.exit_code == 1, res.output
    err = stderr_of(res)
    assert err.startswith("error: emulate: incorrect: seed ") and err.count("\n") <= 1, err
    assert "out: 759 of 1517 elements differ (unwritten_output)" in err


def test_json_names_the_stage_verdict_and_failed_check(tmp_path):
    res = check(spec_file(tmp_path, "gelu_zeroes_input"), "gelu", "--shape", "37x41", "--emulate", "--json")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert report["ok"] is False and report["stage"] == "emulate"
    assert report["emulated"]["verdict"] == "incorrect" and report["emulated"]["failed"] == "input_mutated"
    assert len(report["emulated"]["seeds"]) == 3
    assert "input 'x' was modified" in report["error"]


def test_a_crash_is_a_runtime_error(tmp_path):
    res = check(spec_file(tmp_path, "gelu_trap"), "gelu", "--shape", "37x41", "--emulate", "--json")
    report = json.loads(res.stdout)
    assert res.exit_code == 1 and report["emulated"]["verdict"] == "runtime_error"
    assert "__trap" in report["error"]


def test_the_static_checks_come_first(tmp_path):
    res = check(spec_file(tmp_path, "gelu_call_counter"), "gelu", "--shape", "37x41", "--emulate", "--json")
    report = json.loads(res.stdout)
    assert res.exit_code == 1 and report["stage"] == "forbidden" and report["emulated"] is None


def test_too_large_a_shape_is_a_usage_error(tmp_path):
    res = check(spec_file(tmp_path, "gelu_ok"), "gelu", "--emulate")
    assert res.exit_code == 2
    err = stderr_of(res)
    assert "--emulate: gelu moves 512 MiB" in err and "--shape" in err and err.count("\n") <= 1


def test_without_emulate_nothing_is_emulated(tmp_path):
    res = check(spec_file(tmp_path, "gelu_first_half"), "gelu", "--shape", "37x41", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["emulated"] is None
