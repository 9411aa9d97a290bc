"""``kerngen report``: one self-contained, escaped HTML file of the shipped run; renders in headless
Chromium without console errors (skipped where chromium is not installed)."""

from __future__ import annotations

import json

from markupsafe import escape
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.results.report import progress_series, spec_diff, write_report
from kerngen.agent.tree import load_run

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "runs" / "20261122-023101-softmax-f340"
EVIL = "<script>alert('x')</script> Use exp2f with"

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
    res = runner.invoke(kerngen.cli.app.app, ["report", str(SHIPPED), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.is_file() and "report written" in res.stdout
    res = runner.invoke(kerngen.cli.app.app, ["report", "no-such-run", "--runs-dir", str(tmp_path)])
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


# ----- every shipped run: its tuning, the same wall minutes as show, formatted numbers ---------
from kerngen.agent.journal import NodeTuned  # noqa: E402
from kerngen.results.report import context, tuning_series  # noqa: E402
from kerngen.results.report_charts import ridge_point  # noqa: E402
from kerngen.results.show import spent_wall_s  # noqa: E402
from kerngen.harness.tune.outcome import TuneOutcome  # noqa: E402

RUNS = sorted(p for p in (ROOT / "runs").iterdir() if (p / "events.jsonl").is_file())


@pytest.mark.parametrize("run_dir", RUNS, ids=[p.name for p in RUNS])
def test_every_shipped_run_reports_its_tuning(run_dir, tmp_path):
    run = load_run(run_dir)
    tuned = {i: ev for i, ev in run.tuned.items() if ev.outcome() is not None}
    assert tuned, f"{run_dir.name} ships tuned nodes"
    text = write_report(run, tmp_path / "r.html").read_text()
    assert "No survivor was tuned" not in text
    assert text.count("<svg") == 3  # progress, roofline, autotuning
    for i, ev in tuned.items():
        assert f"node #{i}: {len(ev.curve)} configurations, kept " in text
        assert all(p.evals == k + 1 and p.best_ms is not None for k, p in enumerate(ev.curve))
    series = tuning_series(run)
    assert len(series) == len(tuned) and all(any(p.ok for p in s.points) for s in series)
    ctx = context(run)
    assert [t["id"] for t in ctx["tuning"]] == sorted(tuned)
    assert ctx["elapsed_min"] == pytest.approx(spent_wall_s(run) / 60)  # the same minutes as `kerngen show`
    # numbers are formatted: no float with over 4 significant digits outside the charts and the sources
    body = re.sub(r"<svg.*?</svg>|<pre.*?</pre>|<code>.*?</code>", "", text, flags=re.S)
    raw = [m for m in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", body) if len(m.replace(".", "").lstrip("0")) > 4]
    assert not raw, raw[:10]


def test_both_older_curve_shapes_read_as_one():
    real = {"evals": 1, "seconds": 1.2, "best_ms": 2.5}
    scripted = {"config": {"BLOCK": 128}, "ms": 0.99, "verdict": "ok", "wall_s": 0.25}
    failed = {"config": {"BLOCK": 512}, "ms": None, "verdict": "incorrect", "wall_s": 0.25}
    ev = NodeTuned(id=1, curve=[real, {"evals": 2, "seconds": 1.5, "best_ms": 2.0}])
    assert [p.best_ms for p in ev.curve] == [2.5, 2.0] and ev.curve[0].config is None
    ev = NodeTuned(id=1, curve=[scripted, failed])
    assert [(p.evals, p.best_ms, p.ok) for p in ev.curve] == [(1, 0.99, True), (2, 0.99, False)]
    again = NodeTuned.model_validate_json(ev.model_dump_json())
    assert again.curve == ev.curve
    # inf is no JSON: a best-so-far of inf (nothing correct yet) is written as None and read back
    out = TuneOutcome.model_validate({"config": {}, "result": {"verdict": "ok", "spec_hash": "x", "config": {}},
                                      "evaluated": 1, "curve": [{"evals": 1, "best_ms": float("inf")}]})
    assert json.loads(out.model_dump_json())["curve"][0]["best_ms"] is None


def test_roofline_ridge_point_is_peak_over_bandwidth():
    assert ridge_point(4242.8, 51.28) == pytest.approx(12.09, abs=0.01)  # an H200 in fp32: ~12 FLOP/B
    assert ridge_point(None, 51.0) is None and ridge_point(4000.0, None) is None


def test_a_demo_run_says_so(tmp_path):
    text = write_report(load_run(SHIPPED), tmp_path / "demo.html").read_text()
    assert "DEMO (scripted, not measured on a GPU)" in text and "<title>[DEMO]" in text
    real = write_report(load_run(RUNS[-1]), tmp_path / "real.html").read_text()
    assert "DEMO" not in real


def test_report_into_a_folder(tmp_path):
    res = runner.invoke(kerngen.cli.app.app, ["report", str(SHIPPED), "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / f"{SHIPPED.name}.html").is_file()
    res = runner.invoke(kerngen.cli.app.app, ["report", str(SHIPPED), "-o", str(tmp_path / "no" / "such" / "r.html")])
    assert res.exit_code == 2 and "Traceback" not in res.output
