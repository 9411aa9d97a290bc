"""KERNGEN_REQUIRE_ALL=1 (CI) turns "a C++ compiler / the KernelBench copy is missing" from a skip
into a failure (tests/conftest.py), for the marked tests and for any skip whose reason names them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKED = "tests/harness/test_emu_jail.py::test_the_environment_is_empty_of_secrets"


def pytest_run(tmp_path, *args: str, require: bool, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "KERNGEN_EMU_CXX": str(tmp_path / "no-such-compiler"), **env}
    full.pop("KERNGEN_REQUIRE_ALL", None)
    if require:
        full["KERNGEN_REQUIRE_ALL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args],
                          cwd=ROOT, env=full, capture_output=True, text=True, timeout=300)


def test_a_missing_compiler_skips_by_default_and_fails_when_required(tmp_path):
    skipped = pytest_run(tmp_path, MARKED, require=False)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert "no C++ compiler for the CPU emulator" in skipped.stdout
    failed = pytest_run(tmp_path, MARKED, require=True)
    assert failed.returncode == 1 and "1 error" in failed.stdout, failed.stdout  # failed in its setup
    assert "KERNGEN_REQUIRE_ALL=1: required here" in failed.stdout


def test_a_skip_written_by_hand_that_names_kernelbench_fails_when_required(tmp_path):
    test = ROOT / "tests" / "base" / f"test_tmp_skip_{os.getpid()}.py"
    test.write_text("import pytest\n\ndef test_x():\n    pytest.skip('no KernelBench copy here')\n\n"
                    "def test_other():\n    pytest.skip('unrelated')\n")
    try:
        res = pytest_run(tmp_path, str(test.relative_to(ROOT)), require=True)
    finally:
        test.unlink()
    assert res.returncode == 1 and "1 failed, 1 skipped" in res.stdout, res.stdout
