"""``kerngen bench``: PyTorch eager, torch.compile and (optionally) a kernel spec, side by side
in one run on one GPU, with verdict, median ms, speedups and % of the roofline floor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kerngen.errors import KerngenError, SpecError


def parse_config(text: str | None) -> dict[str, int]:
    """``BLOCK=256,VEC=4`` -> {"BLOCK": 256, "VEC": 4}."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = int(value)
        except ValueError:
            raise SpecError(f"bad --config entry {part!r}: expected NAME=INTEGER") from None
    return out


def bench(
    problem: str = typer.Argument(..., help="built-in problem name or KernelBench-format .py file"),
    kernel: Optional[str] = typer.Option(None, "--kernel", "-k", help="kernel spec (JSON or YAML)"),
    config: Optional[str] = typer.Option(None, "--config", help="tunables, e.g. BLOCK=256,VEC=4"),
    shape: Optional[str] = typer.Option(None, "--shape", help="built-ins: shape, e.g. 8192x1024"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="built-ins: fp32 | fp16 | bf16"),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32 (true fp32, the default) | tf32 "
                                            "(PyTorch's TF32 reference, a measured tolerance)"),
    op: bool = typer.Option(True, "--op/--no-op", help="with --kernel: time the exported op's path beside the "
                            "kernel (torch.ops, as kerngen.load gives it)"),
    seeds: int = typer.Option(3, "--seeds", min=1, help="random input sets for the correctness check"),
    budget_ms: float = typer.Option(300.0, "--budget-ms", min=1.0, help="time budget of each timed series"),
    no_compile: bool = typer.Option(False, "--no-compile", help="skip torch.compile"),
    timeout_s: float = typer.Option(120.0, "--timeout", help="per-candidate timeout in seconds"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    solution: Optional[Path] = typer.Option(
        None, "--solution", help="your KernelBench solution (a .py with class ModelNew), checked against PROBLEM "
        "and timed beside it. It is your own Python: kerngen imports and runs it, in a process of its own, "
        "only because you name it here; name only files you trust"),
) -> None:
    """Time PyTorch eager and torch.compile (in true fp32 and at PyTorch's defaults), a kernel spec, and
    the exported op's path beside the kernel, on this GPU; or your own KernelBench ModelNew (--solution)."""
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.spec.plan import resolve
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.harness.spec.spec import KernelSpec
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import parse_problem_ref

    ref = parse_problem_ref(problem, shape=shape, dtype=dtype, precision=precision)
    info = load_problem(ref).info  # a malformed problem fails here, before any GPU work
    spec = KernelSpec.load(kernel) if kernel else None
    cfg = parse_config(config)
    if solution is not None and not solution.is_file():
        raise KerngenError(f"--solution {solution}: no such file")
    if spec is not None:
        resolve(spec, sizes=info.sizes, tensors=info.tensor_facts(), config=cfg)  # fail fast on a bad plan
    with WorkerPool(timeout_s=timeout_s) as pool:
        facts = pool.gpu_facts()
        base = pool.baseline(ref, budget_ms=budget_ms, with_compile=not no_compile)
        result = op_timing = None
        if spec is not None:
            opts = EvalOptions(seeds=seeds, budget_ms=budget_ms, timeout_s=timeout_s)
            result = pool.evaluate(ref, [Candidate(spec=spec, config=cfg)], opts)[0]
            if op and result.ok:
                op_timing = pool.time_op(ref, spec, result.config or cfg, budget_ms=budget_ms)
    from kerngen.results.bench_table import bench_rows, print_bench

    # the user's ModelNew (--solution), in a process of its own, once the pool's worker is closed
    sol = _solution_row(ref, solution, base, seeds, budget_ms) if solution is not None else None
    if as_json:
        payload = {
            "problem": info.model_dump(mode="json"),
            "gpu": facts.model_dump(mode="json"),
            "baseline": base.model_dump(mode="json"),
            "kernel": result.model_dump(mode="json") if result else None,
            "op": op_timing.model_dump(mode="json") if op_timing else None,
            "rows": bench_rows(base, result, op_timing, info.dtype),
        }
        if sol is not None:
            payload["solution"] = sol
        typer.echo(json.dumps(payload, indent=2))
    else:
        print_bench(ref.label(), facts, base, result, op_timing, info.dtype)
        if sol is not None:
            _print_solution(sol)
    if (result is not None and not result.ok) or (sol is not None and sol["verdict"] != "ok"):
        raise typer.Exit(1)


def _solution_row(ref, path: Path, base, seeds: int, budget_ms: float) -> dict:
    """``--solution``: the user's ModelNew checked and timed (:mod:`kerngen.harness.gpu.solution`),
    its speedups over the baseline the pool measured."""
    from kerngen.harness.gpu.solution import SolutionRequest, run_solution
    from kerngen.results.bench_table import ratio

    res = run_solution(SolutionRequest(problem=ref, solution=str(path), seeds=seeds, budget_ms=budget_ms))
    ms = res.timing.median_ms if res.timing else None
    return {"name": f"solution {path.name}", "verdict": res.verdict.value, "median_ms": ms, "message": res.message,
            "speedup_vs_eager": ratio(base.eager.median_ms, ms),
            "speedup_vs_compile": ratio(base.compiled.median_ms if base.compiled else None, ms),
            "eager_ms_same_process": res.eager.median_ms if res.eager else None}


def _print_solution(row: dict) -> None:
    from rich.console import Console

    ms = row["median_ms"]
    figures = "" if ms is None else (f": {ms:.4f} ms, {row['speedup_vs_eager']:.2f}x eager" + (
        f", {row['speedup_vs_compile']:.2f}x torch.compile" if row["speedup_vs_compile"] else "") +
        f" (the reference beside it in its own process: {row['eager_ms_same_process']:.4f} ms)")
    Console(highlight=False, soft_wrap=True).print(f"{row['name']}: {row['verdict']}{figures}; {row['message']}",
                                                   markup=False)


def calibrate(
    repeats: int = typer.Option(5, "--repeats", min=2, help="evaluations of the same kernel for the spread"),
    budget_ms: float = typer.Option(200.0, "--budget-ms", min=1.0),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Measure the harness on this GPU: overhead per candidate, spread of a median, agreement
    with triton.testing.do_bench, host time kept out of the samples."""
    from rich.console import Console
    from rich.table import Table

    from kerngen.harness.gpu.calibrate import run_calibration

    report = run_calibration(repeats=repeats, budget_ms=budget_ms)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    table = Table(title=f"harness overhead per candidate on {report.gpu} (naive softmax 4096x65536)")
    for col in ("", "end to end s", "compile s", "load s", "check s", "bench s", "median ms"):
        table.add_column(col, justify="left" if not col else "right")
    for row in report.overhead:
        p = row.phases_s
        table.add_row(
            row.label, f"{row.end_to_end_s:.3f}", f"{row.compile_s:.3f}", f"{p.get('load', 0):.3f}",
            f"{p.get('check', 0):.3f}", f"{p.get('bench', 0) + p.get('prepare_timed_sets', 0):.3f}",
            f"{row.median_ms:.4f}" if row.median_ms else row.verdict,
        )
    console = Console()
    console.print(table)
    console.print(f"run-to-run spread of the median over {len(report.medians_ms)} runs: {report.spread_pct:.2f}% "
                  f"({', '.join(f'{m:.4f}' for m in report.medians_ms)} ms)")
    if report.do_bench_ms is not None:
        console.print(f"torch.softmax: ours {report.ours_ms:.4f} ms, triton do_bench {report.do_bench_ms:.4f} ms, "
                      f"difference {report.agreement_pct:.2f}%")
    lag = report.host_lag
    if lag is not None:
        console.print(
            f"host lag ({lag.host_busy_ms:.1f} ms of host work before a small add): without the lead "
            f"{lag.without_lead_ms:.4f} ms ({lag.without_lead_late} of {lag.without_lead_reps} reps late), with it "
            f"{lag.with_lead_ms:.4f} ms ({lag.with_lead_late} of {lag.with_lead_reps} late, lead {lag.lead_cycles} "
            f"cycles)")
