"""scripts/device/tier_table.py: the GPU tier's counts from scripts/device/i39.sh's JUnit files, one row per pytest run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import resources

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device" / "tier_table.py"


def _script():
    return resources.script("device/tier_table.py", "tier_table")


JUNIT = """<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">
<testcase classname="tests.harness.test_timing" name="test_a" time="1.5"/>
<testcase classname="tests.harness.test_timing.TestClocks" name="test_b" time="2.0"><failure message="x"/></testcase>
<testcase classname="tests.cli.test_first" name="test_c" time="0.25"><skipped/></testcase>
<testcase classname="tests.cli.test_first" name="test_d" time="6.0"/>
</testsuite></testsuites>"""


def test_rows_failures_and_seconds_per_file(tmp_path, capsys):
    (tmp_path / "phases.txt").write_text("sharedA 124 403\nserialA 0 86\nlost 137 600\n")
    (tmp_path / "gpu-tier-sharedA.xml").write_text(JUNIT)
    (tmp_path / "gpu-tier-serialA.xml").write_text(
        '<testsuites><testsuite tests="1" failures="0" errors="0" skipped="0">'
        '<testcase classname="tests.harness.test_timing" name="test_e" time="0.5"/></testsuite></testsuites>')
    assert _script().main(tmp_path) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| sharedA | 4 | 2 | 1 | 0 | 1 | 403 | 124 |" in lines  # a failure: not called merely stopped
    assert "| serialA | 1 | 1 | 0 | 0 | 0 | 86 | 0 |" in lines
    assert "| lost | no JUnit XML: see gpu-tier-lost.log | | | | | 600 | 137 |" in lines
    assert "FAILED tests.harness.test_timing.TestClocks::test_b" in lines
    # a class's tests count to their module; the slowest file first
    assert lines[-1] == "seconds per file: test_first 6, test_timing 4"


def test_a_run_stopped_by_its_limit_with_no_failure_says_so(tmp_path, capsys):
    (tmp_path / "phases.txt").write_text("par3 124 246\n")
    (tmp_path / "gpu-tier-par3.xml").write_text(
        '<testsuites><testsuite tests="1" failures="0" errors="0" skipped="0">'
        '<testcase classname="tests.agent.test_x" name="t" time="3"/></testsuite></testsuites>')
    _script().main(tmp_path)
    assert "| par3 | 1 | 1 | 0 | 0 | 0 | 246 | 124 (stopped at its time limit) |" in capsys.readouterr().out


def test_the_failed_tests_pytest_ids_to_run_again(tmp_path):
    t = _script()
    xml = tmp_path / "gpu-tier-sharedA.xml"
    xml.write_text(JUNIT.replace('name="test_d" time="6.0"/>', 'name="test_d[4_Matrix_vector-v1]" time="6.0">'
                                 '<error message="oom"/></testcase>'))
    assert t.failed_ids(xml) == ["tests/harness/test_timing.py::TestClocks::test_b",
                                 "tests/cli/test_first.py::test_d[4_Matrix_vector-v1]"]
    assert t.failed_ids(tmp_path / "missing.xml") == []
    assert t.node_id("tests.agent.test_gpu_fam_scan", "t[89_cumsum.py]") == "tests/agent/test_gpu_fam_scan.py::t[89_cumsum.py]"


def test_no_failure_prints_no_line(tmp_path):
    """i39.sh reads the ids with mapfile: an empty line would reach pytest as "", which collects all of tests/."""
    import subprocess
    import sys

    (tmp_path / "ok.xml").write_text('<testsuites><testsuite tests="1" failures="0" errors="0" skipped="0">'
                                     '<testcase classname="tests.a.test_x" name="t" time="1"/></testsuite></testsuites>')
    run = subprocess.run([sys.executable, str(SCRIPT), "--failed", str(tmp_path / "ok.xml")], capture_output=True,
                         text=True, check=True)
    assert run.stdout == ""


@pytest.mark.parametrize("args", [[], ["--failed"], ["/no/such/folder"], ["a", "b"]])
def test_wrong_arguments_get_a_one_line_usage(args):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.startswith("usage: tier_table.py") and run.stderr.count("\n") == 1, run
