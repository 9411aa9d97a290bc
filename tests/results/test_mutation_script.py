"""scripts/mutation.py: what a worker's copy of the tree holds (the GPU host's copy lists carried folders as
untracked files: copied, they broke every worker of a device call)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutation.py"


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_worker_tree_leaves_out_shared_and_untracked_dot_folders(mutation):
    tracked = ["README.md", ".ci/run", ".gitignore", "harness/gpu/check.py", "tests/harness/test_x.py"]
    listed = tracked + ["shared/kernelbench/level1/1_a.py", ".whl/openai.whl", ".mut/cosmic_ray.whl", ".i41k/README.md",
                        ".ray/ray.whl", "tests/harness/new_untracked_test.py", ""]
    kept = mutation.copied(listed, tracked)
    assert kept == ["README.md", ".ci/run", ".gitignore", "harness/gpu/check.py", "tests/harness/test_x.py",
                    "tests/harness/new_untracked_test.py"]

