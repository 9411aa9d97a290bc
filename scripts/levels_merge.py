"""KernelBench's levels from `kerngen suite --json` reports of their shards (scripts/device/levels.sh): per level,
the problems, how many have a correct kernel, how many had no run (a shard cut by its time limit), fast_1 and the
geometric-mean speedup against torch.compile and eager (true fp32), and against torch.compile at PyTorch's
defaults; kerngen's own metrics (:func:`kerngen.results.suite.suite_metrics`) over the shards' entries together.

    python scripts/levels_merge.py levels-*.json [--json | --files | --families]
    python scripts/levels_merge.py docs/measurements/2026-11-28-4xh200-c.md docs/measurements/levels-2026-11-29/*.json.gz

A report is a `kerngen suite --json` file (gzipped: ``.json.gz``), or a markdown file holding tables per file as
``--files`` prints them (the rows docs keep when the reports themselves were not): its rows become entries with
their two speedups only, so the level rows from it have no TF32-defaults column.

``--files`` prints the table per file instead (the figures each headline row is derived from); ``--families`` the
geomeans per level and playbook family (the family of each file from the checked-in `kerngen playbook` tables,
tests/data/playbook/kernelbench_level{1,2}.json).

A report that cannot be read is named on stderr and left out (exit 1 if none can)."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from pydantic import ValidationError

from kerngen.problems.ref import ProblemRef
from kerngen.results.suite import NoKernel, SuiteEntry, SuiteReport, Why, suite_metrics

FILES_HEADER = "| level | file | correct | why not | kernel ms | eager ms | torch.compile ms | vs eager | vs compile |"


def level_of(entry: SuiteEntry) -> str:
    """``level1`` / ``level2`` from the problem's path ("other" for a built-in or another folder)."""
    m = re.search(r"(level[0-9])/[^/]+\.py$", entry.problem)
    return m.group(1) if m else "other"


def problem_key(entry: SuiteEntry) -> tuple[str, str]:
    """A problem as its level and file name: a table's row (``level1/9_X.py``) and a report's entry
    (``.../kernelbench/level1/9_X.py``) are the same problem, and the playbook tables name files so."""
    return level_of(entry), entry.problem.rsplit("/", 1)[-1]


def _speedup(cell: str) -> float | None:
    return None if cell == "-" else float(cell.removesuffix("x"))


def read_table(text: str, name: str) -> SuiteReport:
    """The per-file rows of every ``--files`` table in a markdown text, as a report (ValueError if none)."""
    entries, inside = [], False
    for line in text.splitlines():
        if line.strip() == FILES_HEADER:
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        if not inside or line.startswith("|---"):
            continue
        level, file, correct, why, _, _, _, eager_x, compile_x = (c.strip() for c in line.strip().strip("|").split("|"))
        kind = Why(why) if why in Why._value2member_map_ else None
        entries.append(SuiteEntry(
            problem=f"{level}/{file}", ref=ProblemRef(source=f"{level}/{file}"),
            verdict="ok" if correct == "yes" else (why or "no_kernel"),
            why=NoKernel(kind=kind, text=why) if kind else None,
            speedup_eager=_speedup(eager_x), speedup_compile=_speedup(compile_x)))
    if not entries:
        raise ValueError("no table per file in it")
    return SuiteReport(gpu=f"the tables of {name}", entries=entries, metrics=suite_metrics(entries))


def read_reports(paths: list[Path]) -> tuple[list[SuiteReport], list[str]]:
    reports, bad = [], []
    for p in paths:
        try:
            if p.suffix == ".md":
                reports.append(read_table(p.read_text(), p.name))
                continue
            raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
            reports.append(SuiteReport.model_validate(json.loads(raw)))
        except (OSError, EOFError, ValueError, ValidationError) as exc:
            bad.append(f"{p}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
    return reports, bad


def latest(reports: list[SuiteReport]) -> list[SuiteEntry]:
    """Each problem's entry once (:func:`problem_key`): of a problem in two shards, the later report's, except that
    a shard whose run was cut (no run) never hides another's measurement of the problem, in whichever order the
    reports come (a glob sorts ``levels-s10-*`` before ``levels-s9-*``)."""
    by_problem: dict[tuple[str, str], SuiteEntry] = {}
    for r in reports:
        for e in r.entries:
            held = by_problem.get(problem_key(e))
            if held is None or not _no_run(e) or _no_run(held):
                by_problem[problem_key(e)] = e
    return list(by_problem.values())


def _no_run(entry: SuiteEntry) -> bool:
    return entry.why is not None and entry.why.kind == Why.no_run


def rows(reports: list[SuiteReport]) -> list[dict]:
    by_level: dict[str, list[SuiteEntry]] = defaultdict(list)
    for e in latest(reports):
        by_level[level_of(e)].append(e)
    out = []
    for level in sorted(by_level):
        entries = by_level[level]
        m = suite_metrics(entries)
        why = [e.why.kind for e in entries if e.why is not None]
        out.append({"level": level, "problems": m.problems, "correct": m.correct, "no_run": why.count(Why.no_run),
                    "degenerate": why.count(Why.degenerate),
                    "fast_1_compile": m.compile.fast_p.get("1"), "geomean_compile": m.compile.geomean_speedup,
                    "fast_1_eager": m.eager.fast_p.get("1"), "geomean_eager": m.eager.geomean_speedup,
                    "geomean_compile_defaults": m.compile_defaults.geomean_speedup if m.compile_defaults else None,
                    "gpus": sorted({r.gpu for r in reports})})
    return out


def _file_order(e: SuiteEntry) -> tuple:
    number = re.search(r"/(\d+)_[^/]*$", e.problem)
    return level_of(e), int(number.group(1)) if number else 0, e.problem


def file_rows(reports: list[SuiteReport]) -> list[dict]:
    """One row per problem (a problem in two shards: the later report's entry), by level then file number."""
    out = []
    for e in sorted(latest(reports), key=_file_order):
        out.append({"level": level_of(e), "file": e.problem.rsplit("/", 1)[-1], "correct": e.verdict == "ok",
                    "why": e.why.kind.value if e.why is not None else ("" if e.verdict == "ok" else e.verdict),
                    "kernel_ms": e.kernel.median_ms if e.kernel else None,
                    "eager_ms": e.eager.median_ms if e.eager else None,
                    "compile_ms": e.compiled.median_ms if e.compiled else None,
                    "vs_eager": e.speedup_eager, "vs_compile": e.speedup_compile})
    return out


TABLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "playbook"


def families(tables: Path = TABLES) -> dict[tuple[str, str], str]:
    """(level, file name) -> the playbook family the checked-in `kerngen playbook --json` table gives it."""
    out = {}
    for table in sorted(tables.glob("kernelbench_level*.json")):
        level = table.stem.removeprefix("kernelbench_")
        out |= {(level, r["file"]): r["family"] or "-" for r in json.loads(table.read_text())["rows"]}
    return out


def family_rows(reports: list[SuiteReport], family_of: dict[tuple[str, str], str]) -> list[dict]:
    """Per (level, family): files, correct ones, fast_1 and geomean against torch.compile (kerngen's own metrics, as
    the rows per level)."""
    groups: dict[tuple[str, str], list[SuiteEntry]] = defaultdict(list)
    for e in latest(reports):
        groups[(level_of(e), family_of.get(problem_key(e), "?"))].append(e)
    out = []
    for (level, family), entries in sorted(groups.items()):
        m = suite_metrics(entries)
        out.append({"level": level, "family": family, "files": m.problems, "correct": m.correct,
                    "fast_1_compile": m.compile.fast_p.get("1"), "geomean_compile": m.compile.geomean_speedup})
    return out


def _x(v: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    shown = ap.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the rows as JSON")
    shown.add_argument("--files", action="store_true", help="a markdown row per file instead of per level")
    shown.add_argument("--families", action="store_true", help="a markdown row per level and playbook family")
    args = ap.parse_args(argv)
    reports, bad = read_reports(args.reports)
    for b in bad:
        print(f"left out: {b}", file=sys.stderr)
    if not reports:
        print("no report could be read", file=sys.stderr)
        return 1
    if args.files:
        print(FILES_HEADER)
        print("|---|---|---|---|---|---|---|---|---|")
        for f in file_rows(reports):
            print(f"| {f['level']} | {f['file']} | {'yes' if f['correct'] else 'no'} | {f['why']} "
                  f"| {_x(f['kernel_ms'], '.4f', '')} | {_x(f['eager_ms'], '.4f', '')} | {_x(f['compile_ms'], '.4f', '')} "
                  f"| {_x(f['vs_eager'])} | {_x(f['vs_compile'])} |")
        return 0
    if args.families:
        print("| level | family | files | correct | fast_1 vs compile | geomean vs compile |")
        print("|---|---|---|---|---|---|")
        for f in family_rows(reports, families()):
            print(f"| {f['level']} | {f['family']} | {f['files']} | {f['correct']} | {_x(f['fast_1_compile'], '.2f', '')} "
                  f"| {_x(f['geomean_compile'])} |")
        return 0
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
