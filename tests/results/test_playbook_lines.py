"""scripts/playbook_lines.py: issue #32's size gate at equal features, over a small git history made here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests import resources

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@pytest.fixture(scope="module")
def lines():
    return resources.script("playbook_lines.py", "playbook_lines")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                           *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _write(repo: Path, path: str, n: int) -> None:
    f = repo / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("".join(f"line {i}\n" for i in range(n)))


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "--short", "HEAD")


@pytest.fixture()
def history(tmp_path):
    """base: 13 counted lines (a.py 10, k.cu.j2 3; NOTES.md and other/ not counted); a feature adds b.py (+6);
    a branch cuts a.py by 4 and is merged (the merge counts, against its first parent); a docs-only commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, "agent/playbook/a.py", 10)
    _write(repo, "agent/playbook/templates/k.cu.j2", 3)
    _write(repo, "agent/playbook/NOTES.md", 100)
    _write(repo, "other/x.py", 5)
    base = _commit(repo, "base")
    _write(repo, "agent/playbook/gemm/b.py", 6)
    feature = _commit(repo, "feature: b")
    _git(repo, "checkout", "-q", "-b", "cut")
    _write(repo, "agent/playbook/a.py", 6)
    _commit(repo, "cut a")
    _git(repo, "checkout", "-q", "main")
    _write(repo, "other/x.py", 50)
    _commit(repo, "docs only")
    _git(repo, "merge", "-q", "--no-ff", "-m", "Merge branch 'cut'", "cut")
    merge = _git(repo, "rev-parse", "--short", "HEAD")
    return repo, base, feature, merge


def test_the_count_takes_python_and_templates_under_the_playbook_only(lines, history):
    repo, base, feature, merge = history
    assert lines.lines_at(repo, base) == 13
    assert lines.lines_at(repo, feature) == 19
    assert lines.lines_at(repo, merge) == 15


def test_features_are_set_apart_and_every_other_commit_is_the_refactors(lines, history):
    repo, base, feature, merge = history
    acc = lines.account(repo, base, {feature: "#35 b"})
    assert (acc["base"], acc["now"], acc["features"], acc["refactor"]) == (13, 15, 6, -4)
    # the docs-only commit changes no count and has no row; the merge counts its whole branch
    assert [(r["commit"], r["delta"], r["feature"]) for r in acc["rows"]] == [(feature, 6, "#35 b"), (merge, -4, None)]


def test_a_feature_missing_from_the_table_counts_against_the_refactor(lines, history):
    repo, base, _feature, _merge = history
    acc = lines.account(repo, base, {})
    assert (acc["features"], acc["refactor"]) == (0, 2)


def test_the_command_prints_the_gate_at_equal_features(lines, history, capsys):
    repo, base, _feature, _merge = history
    assert lines.main(["--repo", str(repo), "--base", base]) == 0
    out = capsys.readouterr().out
    assert f"at {base}: 13 lines" in out
    assert "now: 15; at equal features (base + features): 13; now - equal features: +2" in out


def test_bad_arguments_and_a_bad_base_are_one_line_errors(lines, history, capsys):
    repo, _base, _feature, _merge = history
    assert lines.main(["--base"]) == 1
    assert lines.main(["--repo", str(repo), "--base", "no-such-rev"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage:") and err[1].startswith("playbook_lines: git failed")
