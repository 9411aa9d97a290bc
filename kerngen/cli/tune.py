"""``kerngen tune``: autotune the launch parameters of one kernel spec on one problem.

Prints the best configurations with median ms, speedup vs PyTorch eager and % of the roofline
floor, how many configs were evaluated per minute, pruned counts with reasons, cache hits.
``--compare-exhaustive`` runs the exhaustive search AND the model-guided one with 20% of its
budget on the same space (the figures of the README), plus a replay of the model-guided strategy
over several seeds against the exhaustive measurements.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import typer

from kerngen.cli import cluster
from kerngen.text import strict_json
from kerngen.errors import KerngenError

COMPARE_FRACTION = 0.2
REPLAY_SEEDS = 5


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:{spec}}{suffix}"


def _cfg(config: dict[str, int] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (config or {}).items()) or "(no tunables)"


def _rows(result, eager_ms: float | None, floor: float | None, top: int) -> list[dict[str, Any]]:
    from kerngen.harness.gpu.roofline import pct_of_roofline

    rows = []
    for rank, t in enumerate(result.ranked()[:top], 1):
        ms = t.ms
        rows.append({
            "rank": rank,
            "config": t.config,
            "median_ms": ms,
            "iqr_ms": t.result.timing.iqr_ms if t.result and t.result.timing else None,
            "speedup_vs_eager": (eager_ms / ms) if eager_ms and ms > 0 else None,
            "pct_of_roofline": pct_of_roofline(ms, floor) if floor else None,
            "cached": t.cached,
        })
    return rows


def _summary(result) -> dict[str, Any]:
    return {
        "strategy": result.strategy,
        "space_size": result.space_size,
        "feasible": result.feasible,
        "evaluated": len(result.evaluated),
        "measured_this_run": result.measured,
        "cache_hits": result.cache_hits,
        "remeasured": result.remeasured,
        "evals_per_minute": result.evals_per_minute,
        "seconds": result.seconds,
        "failed": result.failures(),
        "pruned": result.pruned_counts(),
        "pruned_examples": result.pruned_examples(),
        "best_config": result.best_config,
        "best_ms": result.best.ms if result.best else None,
        "phase_medians_s": result.phase_medians(),
        "notes": result.notes,
    }


def _print_result(console, title: str, result, eager_ms, floor, floor_bound: str, top: int) -> None:
    from rich.table import Table

    console.print(f"[bold]{title}[/]")
    console.print(
        f"strategy {result.strategy}: {result.space_size} configs, {result.feasible} after static pruning; "
        f"{len(result.evaluated)} evaluated ({result.measured} measured on this run, "
        f"{result.cache_hits} cache hits, {result.remeasured} re-measured) in {result.seconds:.1f} s "
        f"= {result.evals_per_minute:.1f} evals/min"
    )
    fails = result.failures()
    if fails:
        console.print("failed (scored inf): " + ", ".join(f"{v} {k}" for k, v in fails.items()))
    counts, ex = result.pruned_counts(), result.pruned_examples()
    if counts:
        console.print(f"pruned {len(result.pruned)}:")
        for kind, n in counts.items():
            console.print(f"  {n:6d} {kind}: e.g. {ex.get(kind, '')}", markup=False)
    rows = _rows(result, eager_ms, floor, top)
    if not rows:
        console.print("[bold red]no correct configuration[/]")
        return
    table = Table(show_header=True, header_style="bold")
    for col in ("#", "config", "median ms", "IQR ms", "vs eager", f"% roofline ({floor_bound or 'n/a'})"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        table.add_row(
            str(r["rank"]) + ("*" if r["cached"] else ""), _cfg(r["config"]), _fmt(r["median_ms"], ".4f"),
            _fmt(r["iqr_ms"], ".4f"), _fmt(r["speedup_vs_eager"], ".2f", "x"), _fmt(r["pct_of_roofline"], ".1f", "%"),
        )
    console.print(table)
    if any(r["cached"] for r in rows):
        console.print("* from the cache (not re-measured on this run)")
    if eager_ms:
        console.print(f"PyTorch eager: {eager_ms:.4f} ms" + (f"; roofline floor {floor:.4f} ms" if floor else ""))
    for note in result.notes:
        console.print(f"note: {note}", markup=False)


def tune_cmd(
    problem: str = typer.Argument(..., help="built-in problem name or KernelBench-format .py file"),
    kernel: str = typer.Option(..., "--kernel", "-k", help="kernel spec (JSON or YAML) with tunables"),
    shape: Optional[str] = typer.Option(None, "--shape", help="built-ins: shape, e.g. 8192x1024"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="built-ins: fp32 | fp16 | bf16"),
    strategy: str = typer.Option("auto", "--strategy", help="exhaustive | random | model | auto"),
    max_evals: int = typer.Option(200, "--max-evals", min=1, help="most configurations to evaluate"),
    minutes: Optional[float] = typer.Option(None, "--minutes", min=0.0, help="wall-clock budget"),
    top: int = typer.Option(5, "--top", min=1, help="how many of the best configs to show"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, help="configs per batch (default 8 per GPU)"),
    seed: int = typer.Option(0, "--seed", help="seed of the random and model-guided strategies"),
    no_cache: bool = typer.Option(False, "--no-cache", help="neither read nor write the tuning cache"),
    timeout_s: float = typer.Option(60.0, "--timeout", help="per-config timeout in seconds"),
    budget_ms: float = typer.Option(
        25.0, "--budget-ms", min=1.0, help="timed repetitions per config (ms); the best few are re-measured"
    ),
    compare_exhaustive: bool = typer.Option(
        False, "--compare-exhaustive", help="run exhaustive and model-guided (20% budget) and compare"
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    ray: Optional[str] = cluster.RAY,
    ray_gpu_model: Optional[str] = cluster.RAY_GPU_MODEL,
) -> None:
    """Autotune a kernel spec's tunables on this machine's GPUs, or a Ray cluster's (every config
    fully checked)."""
    from kerngen.cli.compose import make_evaluator  # here: the composition root imports torch (seconds)
    from kerngen.problems.load import load_problem
    from kerngen.problems.ref import parse_problem_ref

    from kerngen.harness.gpu.roofline import floor_ms
    from kerngen.harness.spec.spec import KernelSpec
    from kerngen.harness.tune.strategies import STRATEGIES
    from kerngen.harness.tune.cache import TuneCache
    from kerngen.harness.tune.tuner import tune

    if strategy not in STRATEGIES:
        raise KerngenError(f"unknown --strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    spec = KernelSpec.load(kernel)
    if not spec.tunables:
        raise KerngenError(f"kernel spec {kernel} has no tunables: nothing to tune (use kerngen bench)")
    ref = parse_problem_ref(problem, shape=shape, dtype=dtype)
    info = load_problem(ref).info
    sizes, tensors = info.sizes, info.tensor_facts()
    cache = None if no_cache else TuneCache()

    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    progress = None if as_json else _progress(console)
    # this host's GPUs, or a Ray cluster's (--ray); NoGPUError where there is none
    with make_evaluator("pool", timeout_s=timeout_s, ray=ray, ray_gpu_model=ray_gpu_model) as pool:
        gpu = pool.gpu_facts()
        try:
            base = pool.baseline(ref, with_compile=False)  # tune reports eager and roofline only
            eager_ms = base.eager.median_ms
            floor, bound = (base.floor_ms, base.floor_bound) if base.floor_ms else floor_ms(
                info.flops, info.min_bytes, info.dtype, gpu)
        except KerngenError as exc:
            base, eager_ms = None, None
            floor, bound = floor_ms(info.flops, info.min_bytes, info.dtype, gpu)
            if not as_json:
                console.print(f"note: no PyTorch baseline: {exc}", markup=False)
        from kerngen.harness.evaluator import EvalOptions

        options = EvalOptions(budget_ms=budget_ms, timeout_s=timeout_s)
        common = dict(sizes=sizes, tensors=tensors, gpu=gpu, minutes=minutes, batch=batch, seed=seed,
                      on_result=progress, options=options)
        if not compare_exhaustive:
            result = tune(pool, ref, spec, strategy=strategy, max_evals=max_evals, cache=cache, **common)
            payload = {
                "problem": ref.label(), "kernel": spec.name, "gpu": gpu.name,
                "eager_ms": eager_ms, "floor_ms": floor, "floor_bound": bound,
                "summary": _summary(result), "top": _rows(result, eager_ms, floor, top),
                "curve": [c.model_dump() for c in result.curve],
            }
            if as_json:
                typer.echo(json.dumps(strict_json(payload), indent=2))
            else:
                _print_result(console, f"tune {spec.name} on {ref.label()} ({gpu.name})", result, eager_ms,
                              floor, bound, top)
            if result.best is None:
                raise typer.Exit(1)
            return
        exh = tune(pool, ref, spec, strategy="exhaustive", max_evals=spec.space_size(), cache=cache, **common)
        budget = max(1, math.ceil(COMPARE_FRACTION * max(exh.feasible, 1)))
        model = tune(pool, ref, spec, strategy="model", max_evals=budget, cache=None, **common)
    payload = compare_payload(exh, model, spec, seed)
    payload.update({"problem": ref.label(), "kernel": spec.name, "gpu": gpu.name, "eager_ms": eager_ms,
                    "floor_ms": floor})
    if as_json:
        payload["exhaustive_curve"] = [c.model_dump() for c in exh.curve]
        payload["model_curve"] = [c.model_dump() for c in model.curve]
        typer.echo(json.dumps(strict_json(payload), indent=2))
    else:
        _print_result(console, f"exhaustive: {spec.name} on {ref.label()} ({gpu.name})", exh, eager_ms, floor,
                      bound, top)
        _print_result(console, f"model-guided, {budget} evals (20%)", model, eager_ms, floor, bound, top)
        _print_compare(console, payload)


def compare_payload(exh, model, spec, seed: int) -> dict[str, Any]:
    """Both optima, the gap in % (as measured, and of the model's config in the exhaustive
    table), evaluations each used, and a replay of the model strategy over several seeds."""
    from kerngen.harness.tune.tuner import replay_strategy

    ex_ms = exh.best.ms if exh.best else math.inf
    mg_ms = model.best.ms if model.best else math.inf
    table = {json.dumps(t.config, sort_keys=True): t.ms for t in exh.evaluated}
    mg_in_table = table.get(json.dumps(model.best_config, sort_keys=True), math.inf) if model.best_config else math.inf
    budget = model.measured or len(model.evaluated)
    replays = [replay_strategy(exh, spec, "model", budget=budget, seed=seed + s) for s in range(REPLAY_SEEDS)]
    gaps = [100.0 * (r / ex_ms - 1.0) if math.isfinite(ex_ms) else math.inf for r in replays]
    return {
        "exhaustive": {"best_config": exh.best_config, "best_ms": ex_ms, "evals": len(exh.evaluated),
                       "measured": exh.measured, "seconds": exh.seconds},
        "model": {"best_config": model.best_config, "best_ms": mg_ms, "evals": len(model.evaluated),
                  "seconds": model.seconds},
        "gap_pct": 100.0 * (mg_ms / ex_ms - 1.0) if math.isfinite(ex_ms) and math.isfinite(mg_ms) else None,
        "gap_pct_same_measurements": 100.0 * (mg_in_table / ex_ms - 1.0)
        if math.isfinite(ex_ms) and math.isfinite(mg_in_table) else None,
        "evals_fraction": len(model.evaluated) / max(1, len(exh.evaluated)),
        "replay_gaps_pct": gaps,
    }


def _print_compare(console, p: dict[str, Any]) -> None:
    e, m = p["exhaustive"], p["model"]
    console.print("[bold]exhaustive vs model-guided[/]")
    console.print(f"  exhaustive:   {_fmt(e['best_ms'], '.4f')} ms  {_cfg(e['best_config'])}  ({e['evals']} evals, "
                  f"{e['seconds']:.1f} s)", markup=False)
    console.print(f"  model-guided: {_fmt(m['best_ms'], '.4f')} ms  {_cfg(m['best_config'])}  ({m['evals']} evals = "
                  f"{100 * p['evals_fraction']:.0f}%, {m['seconds']:.1f} s)", markup=False)
    console.print(f"  gap: {_fmt(p['gap_pct'], '+.2f', '%')} as measured, "
                  f"{_fmt(p['gap_pct_same_measurements'], '+.2f', '%')} on the exhaustive measurements", markup=False)
    gaps = [g for g in p["replay_gaps_pct"] if math.isfinite(g)]
    if gaps:
        console.print(f"  replay of the model strategy on the exhaustive table, {len(gaps)} seeds: "
                      f"mean gap {sum(gaps) / len(gaps):+.2f}%, worst {max(gaps):+.2f}%", markup=False)


def _progress(console):
    state = {"n": 0, "best": math.inf}

    def cb(t) -> None:
        state["n"] += 1
        state["best"] = min(state["best"], t.ms)
        if state["n"] % 10 == 0:
            console.print(f"  .. {state['n']} measured, best {_fmt(state['best'], '.4f')} ms", markup=False)

    return cb
