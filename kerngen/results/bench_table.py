"""Rows and the rich table of ``kerngen bench``: one line each for eager and torch.compile (in true
fp32, and at PyTorch's defaults where those compute something else), the kernel, the exported op's
path and the roofline floor, with ratios computed from medians measured in the same run: "fp32" vs
PyTorch in true fp32, "dflt" vs PyTorch at its defaults (cuDNN convolutions in TF32). A bf16 or fp16
problem's PyTorch rows ran in that dtype and say so ("bf16" for "fp32")."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from kerngen.harness.results import Baseline, EvalResult, GpuFacts, OpTiming, Timing
from kerngen.results.speedups import pytorch_precision, short_note
from kerngen.harness.gpu.timing import MAX_LATE_FRACTION


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is not a positive finite number."""
    if num is None or den is None or not den > 0 or not math.isfinite(den):
        return None
    return num / den


def _ms(t: Timing | None) -> float | None:
    return t.median_ms if t is not None else None


def _row(name: str, verdict: str, t: Timing | None, base: Baseline) -> dict:
    ms = t.median_ms if t else None
    return {
        "name": name,
        "verdict": verdict,
        "median_ms": ms,
        "iqr_ms": t.iqr_ms if t else None,
        "speedup_vs_eager": ratio(base.eager.median_ms, ms),
        "speedup_vs_compile": ratio(base.compiled.median_ms if base.compiled else None, ms),
        "speedup_vs_eager_defaults": ratio(_ms(base.eager_defaults), ms),
        "speedup_vs_compile_defaults": ratio(_ms(base.compiled_defaults), ms),
        "pct_of_roofline": (100.0 * base.floor_ms / ms) if (ms and base.floor_ms) else None,
        "clocks_sagged": bool(t and t.clocks and t.clocks.sagged),
        "host_bound": bool(t and t.late_reps > t.reps * MAX_LATE_FRACTION),
    }


def bench_rows(base: Baseline, result: EvalResult | None, op: OpTiming | None = None,
               dtype: str = "float32") -> list[dict]:
    """The rows of a problem whose main dtype is ``dtype`` (it names the precision PyTorch's rows ran in)."""
    ran = pytorch_precision(dtype)[1]
    rows = [_row(f"PyTorch eager ({ran})", "ok", base.eager, base)]
    if base.compiled is not None:
        rows.append(_row(f"torch.compile ({ran})", "ok", base.compiled, base))
    else:
        rows.append({**_row(f"torch.compile ({ran})", "failed", None, base), "note": base.compile_error})
    if base.eager_defaults is not None and not base.defaults_same:
        label = base.defaults_label or "defaults"
        rows.append(_row(f"PyTorch eager ({label})", "ok", base.eager_defaults, base))
        if base.compiled_defaults is not None:
            rows.append(_row(f"torch.compile ({label})", "ok", base.compiled_defaults, base))
    if result is not None:
        rows.append({**_row("kernel", result.verdict.value, result.timing if result.ok else None, base),
                     "note": result.message})
    if op is not None:
        rows.append({**_row("exported op (torch.ops)", "ok" if op.matches else "differs", op.op, base),
                     "note": op.warning(), "gap_pct": op.gap_pct, "host_us": op.host_us,
                     "kernel_ms_beside": op.kernel.median_ms})
    return rows


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def print_bench(label: str, facts: GpuFacts, base: Baseline, result: EvalResult | None,
                op: OpTiming | None = None, dtype: str = "float32") -> None:
    console = Console()
    table = Table(title=f"{label} on {facts.name}", caption=short_note(base.defaults_label or "defaults", dtype),
                  caption_justify="left")
    tag = pytorch_precision(dtype)[0]
    cols = ("", "verdict", "median ms", "IQR ms", f"{tag} eager", f"{tag} compile", "dflt eager", "dflt compile",
            "% roofline")
    for col in cols:
        table.add_column(col, justify="left" if col in ("", "verdict") else "right")
    rows = bench_rows(base, result, op, dtype)
    for row in rows:
        flag = (" (clocks sagged)" if row["clocks_sagged"] else "") + (" (host-bound)" if row["host_bound"] else "")
        table.add_row(
            row["name"] + flag, row["verdict"], _fmt(row["median_ms"], ".4f"), _fmt(row["iqr_ms"], ".4f"),
            _fmt(row["speedup_vs_eager"], ".2f", "x"), _fmt(row["speedup_vs_compile"], ".2f", "x"),
            _fmt(row["speedup_vs_eager_defaults"], ".2f", "x"), _fmt(row["speedup_vs_compile_defaults"], ".2f", "x"),
            _fmt(row["pct_of_roofline"], ".1f", "%"),
        )
    if base.floor_ms is not None:
        table.add_row(f"roofline floor ({base.floor_bound})", "", f"{base.floor_ms:.4f}", "", "", "", "", "", "100.0%")
    if base.floor_measured_ms is not None:
        table.add_row("  from the measured ceilings", "", f"{base.floor_measured_ms:.4f}", "", "", "", "", "", "")
    console.print(table)
    if base.floor_basis:
        console.print(f"roofline floor: {base.floor_basis}", markup=False)
    if base.defaults_same:
        console.print(f"{base.defaults_label}: the same outputs bit for bit as true fp32 (no op of the problem uses "
                      "TF32): the true fp32 times stand for both")
    if result is not None:
        console.print(f"kernel: {result.message}")
    if op is not None:
        console.print(f"exported op: {op.op.median_ms:.4f} ms beside its kernel's {op.kernel.median_ms:.4f} ms "
                      f"({op.gap_pct:+.1f}%), host {op.host_us:.0f} us a call; timed: the op through torch.ops and "
                      "the kernel through the harness's launcher, interleaved rep by rep, same inputs")
        if op.warning():
            console.print(f"[yellow]warning:[/] {op.warning()}")
    if base.compiled is None and base.compile_error:
        console.print(f"[yellow]torch.compile failed:[/] {base.compile_error}")
    if base.degenerate:
        console.print(f"[yellow]warning:[/] degenerate problem: {base.degenerate_reason}")
    if any(row["host_bound"] for row in rows):
        console.print("[yellow]warning:[/] host-bound: the GPU waited for the host inside some timed reps even "
                      "with a lead; those times include launch overhead")
    if base.launch_bound:
        console.print("[yellow]warning:[/] launch-bound problem: times are dominated by launch overhead")
