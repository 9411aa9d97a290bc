"""The gate of a playbook refactor: what the playbook offers for every problem of the built-in suite and
of every KernelBench file found (``--kernelbench DIR``: its level1 and level2 folders), and what NVRTC
compiles for each offered variant at a sample of configurations (up to 40 each):

    problem|variant          -> the spec's name and content hash (source, tunables, defaults, plan, ...)
    problem|variant|config   -> sha256(source, options) of the compile job

Two trees that print the same map offer the same specs and compile byte-identical kernels. A
developer's tool, run from the repository root (no GPU needed):

    python3 scripts/playbook_job_hashes.py --kernelbench ../shared/kernelbench > new.json
    git worktree add /tmp/old e584391
    python3 scripts/playbook_job_hashes.py --tree /tmp/old --kernelbench ../shared/kernelbench > old.json
    python3 scripts/playbook_job_hashes.py --compare old.json new.json

``--tree`` lays that checkout out as the package it installs as (pyproject's folder mapping) in a
temporary folder and runs this script there. ``--compare`` prints how many entries are identical,
and every one changed, added or removed. Only offered variants count: this reads the proposer's
offer (``PlaybookProposer(problem).offer``), which every tree since issue 14 has."""

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

BUILT_IN = ("softmax", "layernorm", "rmsnorm", "gelu", "conv2d", "conv2d_wide", "conv_relu_maxpool", "matmul", "matmul_wide",
            "attention", "linear_gelu")


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


def _problems(kernelbench: Path | None) -> list:
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import ProblemRef

    refs = [ProblemRef(source=s) for s in BUILT_IN]
    refs += [ProblemRef(source="softmax", shape=(1024, 1024)),
             ProblemRef(source="layernorm", shape=(8, 32, 64, 64), dtype="bfloat16")]
    out = [(ref.label(), lambda ref=ref: load_problem(ref)) for ref in refs]
    for level in ("level1", "level2"):
        folder = kernelbench / level if kernelbench else None
        if folder is None or not folder.is_dir():
            continue
        for f in sorted(folder.glob("*.py"), key=lambda p: int(p.name.split("_")[0])):
            out.append((f"{level}/{f.name}", lambda f=f: load_problem(str(f))))
    return out


def hashes(kernelbench: Path | None) -> dict[str, str]:
    from kerngen.harness.compile.compiler import job_for
    from kerngen.harness.spec.plan import resolve
    from kerngen.harness.tune.prune import enumerate_configs

    from kerngen.agent.playbook import PlaybookProposer

    out: dict[str, str] = {}
    for label, load in _problems(kernelbench):
        try:
            problem = load()
        except Exception as exc:  # noqa: BLE001 - a file that does not load offers nothing
            out[f"{label}|-"] = f"does not load: {type(exc).__name__}"
            continue
        prop = PlaybookProposer(problem)
        if prop.offer is None or not prop.offer.offered:
            out[f"{label}|-"] = "nothing offered"
            continue
        info = problem.info
        for vo in prop.offer.offered:
            spec = vo.spec
            out[f"{label}|{vo.variant}"] = f"{spec.name} {spec.content_hash()}"
            for cfg in enumerate_configs(spec, seed=0, limit=40):
                try:
                    plan = resolve(spec, sizes=dict(info.sizes), tensors=info.tensor_facts(), config=cfg)
                except Exception:  # noqa: BLE001 - a config that does not resolve compiles nothing
                    continue
                job = job_for(spec, plan, "sm_90")
                key = json.dumps([job.source, job.options], sort_keys=True).encode()
                out[f"{label}|{vo.variant}|{json.dumps(cfg, sort_keys=True)}"] = hashlib.sha256(key).hexdigest()[:16]
    return out


def compare(old: dict[str, str], new: dict[str, str]) -> int:
    same = [k for k in old if new.get(k) == old[k]]
    changed = sorted(k for k in old if k in new and new[k] != old[k])
    removed = sorted(k for k in old if k not in new)
    added = sorted(k for k in new if k not in old)
    specs = lambda keys: sorted({"|".join(k.split("|")[:2]) for k in keys})  # noqa: E731
    print(f"identical: {len(same)} entries ({len(specs(same))} problem|variant); changed {len(changed)}, "
          f"removed {len(removed)}, added {len(added)}")
    for what, keys in (("changed", changed), ("removed", removed), ("added", added)):
        for k in specs(keys):
            n = sum(1 for x in keys if x.startswith(k + "|") or x == k)
            print(f"  {what}: {k} ({n} entries)")
    return 0 if not changed and not removed else 1


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--compare"] and len(args) == 3:
        sys.exit(compare(json.loads(Path(args[1]).read_text()), json.loads(Path(args[2]).read_text())))
    kb = None
    if "--kernelbench" in args:
        i = args.index("--kernelbench")
        kb = Path(args[i + 1]).resolve()
        del args[i:i + 2]
    if len(args) == 2 and args[0] == "--tree":
        with tempfile.TemporaryDirectory() as tmp:
            layout(Path(args[1]), Path(tmp))
            env = dict(os.environ, PYTHONPATH=tmp)
            extra = ["--kernelbench", str(kb)] if kb else []
            sys.exit(subprocess.run([sys.executable, __file__, *extra], env=env, cwd=tmp).returncode)
    json.dump(hashes(kb), sys.stdout, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
