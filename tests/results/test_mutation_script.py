"""scripts/mutation.py: what a worker's copy of the tree holds (the GPU host's copy lists carried folders as
untracked files: copied, they broke every worker of a device call)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import resources


@pytest.fixture(scope="module")
def mutation():
    return resources.script("mutation.py", "mutation_script")


def test_a_worker_tree_leaves_out_shared_and_untracked_dot_folders(mutation):
    tracked = ["README.md", ".ci/run", ".gitignore", "harness/gpu/check.py", "tests/harness/test_x.py"]
    listed = tracked + ["shared/kernelbench/level1/1_a.py", ".whl/openai.whl", ".mut/cosmic_ray.whl", ".i41k/README.md",
                        ".ray/ray.whl", "tests/harness/new_untracked_test.py", ""]
    kept = mutation.copied(listed, tracked)
    assert kept == ["README.md", ".ci/run", ".gitignore", "harness/gpu/check.py", "tests/harness/test_x.py",
                    "tests/harness/new_untracked_test.py"]



def _session(path: Path, module: Path, items: dict[str, tuple[str, int, object]]):
    """A cosmic-ray session at ``path`` of mutants of ``module``: job id -> (operator, line, result or None)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, WorkItem

    with use_db(str(path), WorkDB.Mode.create) as work:
        for job, (op, line, result) in items.items():
            work.add_work_item(WorkItem(job_id=job, mutations=[MutationSpec(
                module_path=str(module), operator_name=op, occurrence=0, start_pos=(line, 0), end_pos=(line, 1))]))
            if result is not None:
                work.set_result(job, result)


def test_resume_restores_the_workers_module_skips_new_equivalents_and_reports(mutation, tmp_path, monkeypatch, capsys):
    """``--resume``: each worker's copy of the module is put back as its tree has it (a mutant killed by the budget
    leaves it mutated), pending mutants now in EQUIVALENT are skipped, the sessions as left are reported."""
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    out, m = tmp_path / "run", "integrity"
    w = out / "worker3"  # the others' folders gone: a worker is its folder, not its number
    (w / "tree" / "harness" / "gpu").mkdir(parents=True)
    (w / "site" / "kerngen" / "harness" / "gpu").mkdir(parents=True)
    (w / "tree" / "harness" / "gpu" / f"{m}.py").write_text("X = 1\n")
    installed = w / "site" / "kerngen" / "harness" / "gpu" / f"{m}.py"
    installed.write_text("X = 2  # a mutant left in place\n")
    (out / f"{m}.sqlite").write_bytes(b"")
    (w / f"{m}.toml").write_text(mutation._config(m, 10.0).replace(f'"harness/gpu/{m}.py"', f'"{installed}"'))
    equivalent = next(k for k in mutation.EQUIVALENT if k[0] == m)
    _session(w / f"{m}.sqlite", installed, {
        "k": ("core/AddNot", 1, WorkResult(worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.KILLED)),
        "s": ("core/AddNot", 2, WorkResult(worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.SURVIVED,
                                           diff="the diff")),
        "e": (equivalent[1], equivalent[2], None)})  # pending, and listed as equivalent since
    monkeypatch.setattr("sys.argv", ["mutation.py", "--resume", "--module", m, "--out", str(out)])
    assert mutation.main() == 1  # a survivor
    text = capsys.readouterr().out
    assert installed.read_text() == "X = 1\n"
    assert "resuming 1 workers" in text and f"SURVIVED {m}.py:2 core/AddNot" in text and "the diff" in text
    assert "killed 1, survived 1, incompetent 0; score 50.0%" in text and "not judged" not in text
    monkeypatch.setattr("sys.argv", ["mutation.py", "--resume", "--module", m, "--out", str(tmp_path / "none")])
    assert mutation.main() == 2 and "nothing to resume" in capsys.readouterr().out
