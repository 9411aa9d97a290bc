"""The files a run folder holds beside its journal, derived from it and rewritten atomically:
``tree.json`` and ``best/`` (the best kernel's spec with its config, its figures as JSON and
Markdown). They can always be rebuilt from ``events.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kerngen.agent.journal import BEST, TREE, write_atomic
from kerngen.agent.tree import Tree


# what a run's times are (the exported op's own path: `kerngen bench --op`, `kerngen suite`)
TIMED = "the kernel, as the harness launches its plan (not the exported op's path)"


def write_derived(run_dir: Path, tree: Tree) -> None:
    """tree.json and best/ (spec with its config, figures as JSON and Markdown), atomically."""
    write_atomic(run_dir / TREE, json.dumps(tree.to_json(), indent=1) + "\n")
    best = tree.best()
    if best is None or best.spec is None:
        return
    spec = best.best_spec()
    assert spec is not None
    f = tree.figures(best)
    b = tree.baseline
    fig = {
        "run_id": tree.started.run_id if tree.started else None,
        "problem": tree.problem.label() if tree.problem else None,
        "gpu": tree.gpu.name if tree.gpu else None,
        "node": best.id, "idea": best.idea.text if best.idea else None,
        "config": best.config, **f,
        "eager_ms": b.eager.median_ms if b else None,
        "compile_ms": b.compiled.median_ms if b and b.compiled else None,
        "eager_defaults_ms": b.eager_defaults.median_ms if b and b.eager_defaults else None,
        "compile_defaults_ms": b.compiled_defaults.median_ms if b and b.compiled_defaults else None,
        "precision": (tree.problem.precision if tree.problem else None) or "fp32",
        "timed": TIMED,
        "floor_ms": b.floor_ms if b else None,
        "registers": (best.best_result.compile.worst().registers
                      if best.best_result and best.best_result.compile else None),
        "lineage": [n.id for n in tree.lineage(best)],
    }
    write_atomic(run_dir / BEST / "spec.json", spec.model_dump_json(indent=2) + "\n")
    write_atomic(run_dir / BEST / "figures.json", json.dumps(fig, indent=2) + "\n")
    write_atomic(run_dir / BEST / "figures.md", figures_markdown(fig))


def figures_markdown(fig: dict[str, Any]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    rows = [
        ("problem", fig["problem"]), ("GPU", fig["gpu"]), ("best node", f"#{fig['node']}"),
        ("idea", fig["idea"] or "(seed / first kernel)"), ("config", json.dumps(fig["config"])),
        ("kernel ms", num(fig["ms"], ".4f")), ("eager ms", num(fig["eager_ms"], ".4f")),
        ("torch.compile ms", num(fig["compile_ms"], ".4f")), ("floor ms", num(fig["floor_ms"], ".4f")),
        ("speedup vs eager (true fp32)", num(fig["speedup_eager"], ".2f") + "x"),
        ("speedup vs torch.compile (true fp32)", num(fig["speedup_compile"], ".2f") + "x"),
        (f"speedup vs torch.compile at {fig.get('defaults_label') or 'PyTorch defaults'}",
         num(fig.get("speedup_compile_defaults"), ".2f") + "x"),
        ("checked at", "true fp32" if fig.get("precision", "fp32") == "fp32" else "TF32 (--precision tf32)"),
        ("timed", fig.get("timed", TIMED)),
        ("% of roofline", num(fig["pct_roofline"], ".1f")), ("registers", str(fig["registers"])),
        ("lineage", " -> ".join(f"#{i}" for i in fig["lineage"])),
    ]
    lines = [f"# Best kernel of {fig['run_id']}", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    return "\n".join(lines) + "\n"
