"""The README's install line for a machine without a GPU: CI runs exactly it (``.ci/run``), and it
installs into a fresh venv small, with torch's CPU build (issue 37: the CUDA build made a 6.1 GB
venv on a machine with no GPU).

The fresh-venv test installs for real (about a minute here: the wheels come from pip's cache and the
machine's local wheels). It runs in CI; ``KERNGEN_SKIP_INSTALL_TEST=1`` skips it on a developer's
machine. Its bound: 2048 MiB (measured: 1697 MiB on 2026-11-27 with torch 2.13.0+cpu, 754 MiB of it
torch, 243 MiB NVRTC and the CUDA headers, 240 MiB Ray for the cluster tests)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MIB = 2048


def readme_cpu_line() -> str:
    block = (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    (line,) = [line.strip() for line in block.splitlines() if line.strip().startswith("pip install") and "cpu" in line]
    return line


def test_ci_runs_exactly_the_readme_line():
    line = readme_cpu_line()
    assert "'.[cpu,test]'" in line and "whl/cpu" in line
    assert line in [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()]


def _mib(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) >> 20


@pytest.mark.install
@pytest.mark.timeout(1200)
@pytest.mark.skipif(os.environ.get("KERNGEN_SKIP_INSTALL_TEST") == "1", reason="KERNGEN_SKIP_INSTALL_TEST=1")
def test_the_readme_cpu_line_installs_a_small_venv(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    args = shlex.split(readme_cpu_line())
    assert args[:2] == ["pip", "install"]
    # a machine that reaches PyPI only (CI's) fails PyTorch's index at once rather than after retries
    env = {**os.environ, "PIP_RETRIES": os.environ.get("PIP_RETRIES", "0"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    res = subprocess.run([str(py), "-m", "pip", *args[1:], "-q"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    probe = subprocess.run([str(py), "-c", "import torch, kerngen; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-2000:]
    version, cuda = probe.stdout.split()
    assert cuda == "None" and version.endswith("+cpu"), probe.stdout  # the CPU build, not PyPI's CUDA one
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("nvidia/cublas")) and not list(site.glob("triton"))  # none of the CUDA build's parts
    size = _mib(env_dir)
    assert size < MAX_MIB, f"{size} MiB"
    out = subprocess.run([str(env_dir / "bin" / "kerngen"), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("kerngen "), out.stderr
    print(f"README CPU install: {size} MiB, torch {version}", file=sys.stderr)


def test_every_package_folder_is_listed_for_a_non_editable_install():
    """pyproject lists packages and their folders by hand: a sub-package missing there is found by an editable
    install (through its parent's folder) and lost by ``pip install .`` and by scripts/mutation.py --jobs (the
    lstm family's folder, 2026-11-28). Every folder with an ``__init__.py`` under a mapped one is listed, with
    its templates where it has any."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, data = set(setup["packages"]), setup.get("package-data", {})
    for name, folder in setup["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(root / folder).parts
            dotted = ".".join([name, *rel])
            assert dotted in listed, f"{dotted} ({init.parent.relative_to(root)}) is not in pyproject's packages"
            if (init.parent / "templates").is_dir():
                assert {"templates/*.j2", "templates/*"} & set(data.get(dotted, [])), f"{dotted}'s templates are not data"
