"""KernelBench's levels from `kerngen suite --json` reports of their shards (scripts/device/levels.sh): per level,
the problems, how many have a correct kernel, how many had no run (a shard cut by its time limit), fast_1 and the
geometric-mean speedup against torch.compile and eager (true fp32), and against torch.compile at PyTorch's
defaults; kerngen's own metrics (:func:`kerngen.results.suite.suite_metrics`) over the shards' entries together.

    python scripts/levels_merge.py levels-*.json [--markdown]

A report that cannot be read is named on stderr and left out (exit 1 if none can)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from pydantic import ValidationError

from kerngen.results.suite import SuiteEntry, SuiteReport, Why, suite_metrics


def level_of(entry: SuiteEntry) -> str:
    """``level1`` / ``level2`` from the problem's path ("other" for a built-in or another folder)."""
    m = re.search(r"(level[0-9])/[^/]+\.py$", entry.problem)
    return m.group(1) if m else "other"


def read_reports(paths: list[Path]) -> tuple[list[SuiteReport], list[str]]:
    reports, bad = [], []
    for p in paths:
        try:
            reports.append(SuiteReport.model_validate(json.loads(p.read_text())))
        except (OSError, ValueError, ValidationError) as exc:
            bad.append(f"{p}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
    return reports, bad


def rows(reports: list[SuiteReport]) -> list[dict]:
    by_level: dict[str, dict[str, SuiteEntry]] = defaultdict(dict)
    for r in reports:
        for e in r.entries:
            by_level[level_of(e)][e.problem] = e  # a problem in two shards: the later report's entry
    out = []
    for level in sorted(by_level):
        entries = list(by_level[level].values())
        m = suite_metrics(entries)
        why = [e.why.kind for e in entries if e.why is not None]
        out.append({"level": level, "problems": m.problems, "correct": m.correct, "no_run": why.count(Why.no_run),
                    "degenerate": why.count(Why.degenerate),
                    "fast_1_compile": m.compile.fast_p.get("1"), "geomean_compile": m.compile.geomean_speedup,
                    "fast_1_eager": m.eager.fast_p.get("1"), "geomean_eager": m.eager.geomean_speedup,
                    "geomean_compile_defaults": m.compile_defaults.geomean_speedup if m.compile_defaults else None,
                    "gpus": sorted({r.gpu for r in reports})})
    return out


def _x(v: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    reports, bad = read_reports(args.reports)
    for b in bad:
        print(f"left out: {b}", file=sys.stderr)
    if not reports:
        print("no report could be read", file=sys.stderr)
        return 1
    table = rows(reports)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print(f"GPU: {', '.join(table[0]['gpus']) if table else '-'}; {len(reports)} reports")
    print("| level | problems | correct | no run | degenerate | fast_1 vs compile | geomean vs compile | fast_1 vs eager | "
          "geomean vs eager | geomean vs compile, TF32 defaults |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['level']} | {r['problems']} | {r['correct']} | {r['no_run']} | {r['degenerate']} | {_x(r['fast_1_compile'], '.2f', '')} "
              f"| {_x(r['geomean_compile'])} | {_x(r['fast_1_eager'], '.2f', '')} | {_x(r['geomean_eager'])} "
              f"| {_x(r['geomean_compile_defaults'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
