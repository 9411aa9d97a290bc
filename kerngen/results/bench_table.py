"""Rows and the rich table of ``kerngen bench``: one line each for eager, torch.compile, the
kernel and the roofline floor, with ratios computed from medians measured in the same run."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from kerngen.harness.results import Baseline, EvalResult, GpuFacts, Timing
from kerngen.harness.gpu.timing import MAX_LATE_FRACTION


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is not a positive finite number."""
    if num is None or den is None or not den > 0 or not math.isfinite(den):
        return None
    return num / den


def _row(name: str, verdict: str, t: Timing | None, base: Baseline) -> dict:
    ms = t.median_ms if t else None
    return {
        "name": name,
        "verdict": verdict,
        "median_ms": ms,
        "iqr_ms": t.iqr_ms if t else None,
        "speedup_vs_eager": ratio(base.eager.median_ms, ms),
        "speedup_vs_compile": ratio(base.compiled.median_ms if base.compiled else None, ms),
        "pct_of_roofline": (100.0 * base.floor_ms / ms) if (ms and base.floor_ms) else None,
        "clocks_sagged": bool(t and t.clocks and t.clocks.sagged),
        "host_bound": bool(t and t.late_reps > t.reps * MAX_LATE_FRACTION),
    }


def bench_rows(base: Baseline, result: EvalResult | None) -> list[dict]:
    rows = [_row("PyTorch eager", "ok", base.eager, base)]
    if base.compiled is not None:
        rows.append(_row("torch.compile", "ok", base.compiled, base))
    else:
        rows.append({**_row("torch.compile", "failed", None, base), "note": base.compile_error})
    if result is not None:
        rows.append({**_row("kernel", result.verdict.value, result.timing if result.ok else None, base),
                     "note": result.message})
    return rows


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def print_bench(label: str, facts: GpuFacts, base: Baseline, result: EvalResult | None) -> None:
    console = Console()
    table = Table(title=f"{label} on {facts.name}")
    for col in ("", "verdict", "median ms", "IQR ms", "vs eager", "vs compile", "% roofline"):
        table.add_column(col, justify="left" if col in ("", "verdict") else "right")
    rows = bench_rows(base, result)
    for row in rows:
        flag = (" (clocks sagged)" if row["clocks_sagged"] else "") + (" (host-bound)" if row["host_bound"] else "")
        table.add_row(
            row["name"] + flag, row["verdict"], _fmt(row["median_ms"], ".4f"), _fmt(row["iqr_ms"], ".4f"),
            _fmt(row["speedup_vs_eager"], ".2f", "x"), _fmt(row["speedup_vs_compile"], ".2f", "x"),
            _fmt(row["pct_of_roofline"], ".1f", "%"),
        )
    if base.floor_ms is not None:
        table.add_row(f"roofline floor ({base.floor_bound})", "", f"{base.floor_ms:.4f}", "", "", "", "100.0%")
    if base.floor_measured_ms is not None:
        table.add_row("  from the measured ceilings", "", f"{base.floor_measured_ms:.4f}", "", "", "", "")
    console.print(table)
    if base.floor_basis:
        console.print(f"roofline floor: {base.floor_basis}", markup=False)
    if result is not None:
        console.print(f"kernel: {result.message}")
    if base.compiled is None and base.compile_error:
        console.print(f"[yellow]torch.compile failed:[/] {base.compile_error}")
    if base.degenerate:
        console.print(f"[yellow]warning:[/] degenerate problem: {base.degenerate_reason}")
    if any(row["host_bound"] for row in rows):
        console.print("[yellow]warning:[/] host-bound: the GPU waited for the host inside some timed reps even "
                      "with a lead; those times include launch overhead")
    if base.launch_bound:
        console.print("[yellow]warning:[/] launch-bound problem: times are dominated by launch overhead")
