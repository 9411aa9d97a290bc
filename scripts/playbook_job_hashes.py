"""What NVRTC compiles for every playbook variant at a sample of configurations (up to 40 each) on
the built-in suite: ``problem|variant|config -> sha256(source, options)``. Two trees that print the
same map compile byte-identical kernels. A developer's tool, run from the repository root:

    python3 scripts/playbook_job_hashes.py > new.json
    git worktree add /tmp/old b031268 && python3 scripts/playbook_job_hashes.py --tree /tmp/old > old.json

``--tree`` lays that checkout out as the package it installs as (pyproject's folder mapping) in a
temporary folder and runs this script there. No GPU needed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path


def layout(root: Path, dst: Path) -> None:
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg.get("package-dir", {})
    for pkg in cfg["packages"]:
        src, out = root / dirs.get(pkg, pkg.replace(".", "/")), dst.joinpath(*pkg.split("."))
        out.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file():
                shutil.copy(f, out / f.name)
            elif f.name == "templates":
                shutil.copytree(f, out / f.name, dirs_exist_ok=True)


def hashes() -> dict[str, str]:
    # module paths of today's tree, and of the trees before issue 13 moved them
    try:
        from kerngen.harness.compile.compiler import job_for
        from kerngen.harness.spec.plan import resolve
        from kerngen.harness.tune.tuner import enumerate_configs
    except ImportError:
        from kerngen.harness.compile import job_for
        from kerngen.harness.plan import resolve
        from kerngen.harness.tuner import enumerate_configs
    try:
        from kerngen.problems.load import load_problem
    except ImportError:
        from kerngen.problems.problem import load_problem
    from kerngen.agent.playbook import builders
    from kerngen.agent.playbook.families import explain
    from kerngen.problems.ref import ProblemRef

    refs = [ProblemRef(source=s) for s in ("softmax", "layernorm", "rmsnorm", "gelu", "conv2d", "conv_relu_maxpool",
                                           "matmul")]
    refs += [ProblemRef(source="softmax", shape=(1024, 1024)),
             ProblemRef(source="layernorm", shape=(8, 32, 64, 64), dtype="bfloat16")]
    out: dict[str, str] = {}
    for ref in refs:
        problem = load_problem(ref)
        match, info = explain(problem), problem.info
        for variant in builders.VARIANTS[match.family]:
            spec = builders.build(match, variant)
            for cfg in enumerate_configs(spec, seed=0, limit=40):
                try:
                    plan = resolve(spec, sizes=dict(info.sizes), tensors=info.tensor_facts(), config=cfg)
                except Exception:  # noqa: BLE001 - a config that does not resolve compiles nothing
                    continue
                job = job_for(spec, plan, "sm_90")
                key = json.dumps([job.source, job.options], sort_keys=True).encode()
                out[f"{ref.label()}|{variant}|{json.dumps(cfg, sort_keys=True)}"] = hashlib.sha256(key).hexdigest()[:16]
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--tree":
        with tempfile.TemporaryDirectory() as tmp:
            layout(Path(sys.argv[2]), Path(tmp))
            env = dict(os.environ, PYTHONPATH=tmp)
            sys.exit(subprocess.run([sys.executable, __file__], env=env, cwd=tmp).returncode)
    json.dump(hashes(), sys.stdout, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
