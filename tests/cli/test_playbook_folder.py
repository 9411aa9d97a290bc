"""``kerngen playbook DIR``: every file's row cached by its content and kerngen's source (issue 37):
the same command again answers from the cache, a changed file or a changed kerngen works its row
out again, ``--no-cache`` works everything out."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
import kerngen.version

ROOT = Path(__file__).resolve().parents[2]
KB = ROOT / "tests" / "data" / "kernelbench"
runner = CliRunner()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "kb"
    d.mkdir()
    for name in ("19_ReLU.py", "1_Square_matrix_multiplication_.py", "1_Conv2D_ReLU_BiasAdd.py"):
        shutil.copy(KB / name, d / name)
    return d


def _run(*args: str) -> tuple[str, float]:
    t0 = time.process_time()
    res = runner.invoke(kerngen.cli.app.app, ["playbook", *args], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    return res.output, time.process_time() - t0


def _rows(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.endswith("]") or ": " in line.split("  ", 1)[-1]][:3]


def test_the_same_folder_again_comes_from_the_cache(folder):
    cold, cold_s = _run(str(folder))
    assert "from the cache" not in cold
    warm, warm_s = _run(str(folder))
    assert "3 of 3 from the cache" in warm
    assert _rows(warm) == _rows(cold) and len(_rows(cold)) == 3
    assert warm_s * 3 < cold_s, (warm_s, cold_s)  # the "at least 3x faster"
    again, _ = _run(str(folder), "--no-cache")
    assert "from the cache" not in again and _rows(again) == _rows(cold)


def test_a_changed_file_or_a_changed_kerngen_is_worked_out_again(folder, monkeypatch):
    _run(str(folder))
    relu = folder / "19_ReLU.py"
    relu.write_text(relu.read_text() + "\n# edited\n")
    out, _ = _run(str(folder))
    assert "2 of 3 from the cache" in out
    kerngen.version.source_hash.cache_clear()
    monkeypatch.setattr(kerngen.version, "source_hash", lambda: "another-kerngen")
    out, _ = _run(str(folder))
    assert "from the cache" not in out


def test_an_unreadable_cache_entry_is_worked_out_again(folder, tmp_path):
    first, _ = _run(str(folder))
    for entry in (tmp_path / "cache" / "playbook").iterdir():
        entry.write_text("{not json")
    out, _ = _run(str(folder))
    assert "from the cache" not in out and _rows(out) == _rows(first)
    out, _ = _run(str(folder), "--json")
    assert '"covered"' in out
