"""Recognition on every KernelBench level-1 and level-2 file, against checked-in tables
(``tests/data/playbook/kernelbench_level{1,2}.json``, the output of
``kerngen playbook ../shared/kernelbench/levelN --json``): each file's family and the variants
offered at its own size for sm_90's limits, or why nothing is. A change of coverage, either way,
shows up here as a diff against the table; regenerate the table when the change is meant. The
files live beside the project (``../shared/kernelbench``); the comparison skips where they are absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerngen.agent.playbook.coverage import default_limits
from kerngen.agent.playbook.coverage_table import coverage_row, problem_files
from tests.resources import kernelbench

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "tests" / "data" / "playbook"
KB = kernelbench()
LEVELS = ("level1", "level2")


def _table(level: str) -> dict:
    return json.loads((TABLES / f"kernelbench_{level}.json").read_text())


@pytest.mark.parametrize("level", LEVELS)
def test_the_table_lists_every_file_once_with_a_reason_when_nothing_is_offered(level):
    t = _table(level)
    names = [r["file"] for r in t["rows"]]
    assert len(names) == len(set(names)) == t["files"] == 100
    assert t["covered"] == sum(1 for r in t["rows"] if r["variants"])
    for r in t["rows"]:
        assert bool(r["variants"]) != bool(r["why"]), r["file"]
        assert r["family"] != "-" or not r["variants"], r["file"]


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("level", LEVELS)
def test_every_file_is_recognised_as_the_table_says(level):
    want = {r["file"]: r for r in _table(level)["rows"]}
    folder = KB / level
    diffs = []
    for f in problem_files(folder):
        r = coverage_row(f, folder, default_limits())
        w = want.get(r.file)
        if w is None or (r.family, list(r.variants)) != (w["family"], w["variants"]):
            was = f"{w['family']} {w['variants']}" if w else "absent"
            diffs.append(f"{r.file}: table {was}, now {r.family} {list(r.variants)} {r.why[:120]}")
    assert not diffs, "\n".join(diffs)
