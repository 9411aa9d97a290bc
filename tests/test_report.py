"""``kerngen report``: one self-contained, escaped HTML file of the shipped run; renders in headless
Chromium without console errors (skipped where chromium is not installed)."""

from __future__ import annotations

from markupsafe import escape
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli
from kerngen.agent.report import progress_series, spec_diff, write_report
from kerngen.agent.tree import load_run

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "runs" / "20261122-023101-softmax-f340"
EVIL = "<script>alert('x')</script> Use exp2f with"

kerngen.cli._register()
runner = CliRunner()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str]:
    path = write_report(load_run(SHIPPED), tmp_path_factory.mktemp("report") / "report.html")
    return path, path.read_text()


def test_report_is_written_and_self_contained(report):
    _, text = report
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?://", text), "nothing may point outside the file"
    assert "<script" not in text.lower() and "<link" not in text.lower() and "<img" not in text.lower()
    assert text.count("<svg") == 3  # progress, roofline, autotuning


def test_report_has_every_node_idea_and_verdict(report):
    _, text = report
    run = load_run(SHIPPED)
    for n in run.nodes.values():
        assert f"<b>#{n.id}</b>" in text
        if n.idea is not None:
            assert str(escape(n.idea.text)) in text
        assert f'class="badge v-{n.verdict}">{n.verdict}</span>' in text
    for word in ("diff against #", "source and launch plan", "best kernel #37", "versions", "sm_90"):
        assert word in text


def test_report_escapes_text_from_the_run(tmp_path):
    run_dir = tmp_path / "evil"
    shutil.copytree(SHIPPED, run_dir)
    events = run_dir / "events.jsonl"
    events.write_text(events.read_text().replace("Use exp2f with", EVIL.replace("'", "\\u0027")))
    text = write_report(load_run(run_dir), tmp_path / "r.html").read_text()
    assert "<script>" not in text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text


def test_progress_and_diff_data():
    run = load_run(SHIPPED)
    by_round, by_gpu = progress_series(run)
    assert [p.x for p in by_round.points] == [0, 1, 2]
    assert by_round.points[-1].y == pytest.approx(1.0 / 0.558474, rel=1e-4)  # best speedup vs eager
    xs = [p.x for p in by_gpu.points]
    assert xs == sorted(xs) and xs[-1] > 0
    n = run.nodes[12]
    diff = spec_diff(run.nodes[n.parent].spec, n.spec, n.parent, n.id)
    assert diff[0].startswith("--- #11 kernel.cu") and any(l.startswith("+// kerngen-scripted") for l in diff)


def test_report_cli(tmp_path):
    out = tmp_path / "r.html"
    res = runner.invoke(kerngen.cli.app, ["report", str(SHIPPED), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.is_file() and "report written" in res.stdout
    res = runner.invoke(kerngen.cli.app, ["report", "no-such-run", "--runs-dir", str(tmp_path)])
    assert res.exit_code == 2


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(report, tmp_path):
    path, _ = report
    shot = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
             "--window-size=1400,2000", path.as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000
    bad = [l for l in proc.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert not bad, "\n".join(bad)
