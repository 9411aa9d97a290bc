"""``kerngen suite``, ``kerngen report`` and ``kerngen export``: using the results of searches.

Every user-facing failure (missing run, run without a correct kernel, unknown problem) is a
:class:`~kerngen.errors.KerngenError`: one line on stderr and exit code 2. These commands
read run folders, which may come from anyone: any other error on their data is one line and exit
code 2 too, and none of them imports a problem file that a run names (they read the run's record,
:mod:`kerngen.agent.problem_data`); text from a run is printed without control sequences.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console

from kerngen.cli import cluster
from kerngen.cli import model as model_cli
from kerngen.cli.guard import warn_torn
from kerngen.errors import KerngenError
from kerngen.problems.torch_modes import DEFAULTS_LABEL



def _say(text: object) -> str:
    """Text from a run or an evaluation as rich markup that prints it as is."""
    from rich.markup import escape

    from kerngen.redact import printable

    return escape(printable(str(text)))


# ----- suite --------------------------------------------------------------------------------
def suite(
    problems: Optional[List[str]] = typer.Argument(None, help="built-in names, KernelBench .py files or a folder "
                                                              "of them [every built-in]"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs", "--runs-dir", help="where the runs are"),
    kernel: Optional[Path] = typer.Option(None, "--kernel", help="measure this spec instead of the runs' best"),
    config: Optional[str] = typer.Option(None, "--config", help="tunables of --kernel, e.g. BLOCK=256"),
    budget_ms: float = typer.Option(300.0, "--budget-ms", min=1.0, help="time budget of each timed series"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    op: bool = typer.Option(True, "--op/--no-op", help="time the exported op's path beside each kernel"),
    no_compile: bool = typer.Option(False, "--no-compile", help="skip torch.compile (eager baselines only)"),
    save: Optional[Path] = typer.Option(None, "--save", help="keep each measurement in this file as it is "
                                        "done; the same command again measures only what it lacks (same GPU model)"),
    ray: Optional[str] = cluster.RAY,
    ray_gpu_model: Optional[str] = cluster.RAY_GPU_MODEL,
    evaluator_kind: str = typer.Option("pool", "--evaluator", hidden=True),
) -> None:
    """The best kernel of each problem vs PyTorch eager and torch.compile (true fp32, and at PyTorch's
    defaults) on this GPU, fast_p vs each, the exported op's path beside each kernel, and why the
    problems without a kernel have none."""
    import json

    from kerngen.results.suite import expand_problems, run_suite
    from kerngen.results.suite_save import SaveFile
    from kerngen.cli.bench import parse_config
    from kerngen.harness.evaluator import EvalOptions
    from kerngen.harness.spec.spec import KernelSpec

    if save is not None and no_compile:
        raise KerngenError("--save keeps the full measurement: leave --no-compile out (or --save out)")
    models, rest = model_cli.split_model_args(list(problems or []), runs_dir)
    if models:  # model runs (or model files with one under --runs): their end-to-end rows, as recorded
        model_cli.print_model_suite(models, as_json)
        if not rest:
            return
    names = expand_problems(rest)  # ProblemError before any GPU work
    spec = KernelSpec.load(kernel) if kernel else None
    evaluator = _suite_evaluator(evaluator_kind, ray, ray_gpu_model)
    try:
        memo = SaveFile(save, evaluator.gpu_facts().name) if save is not None else None
        with _progress(len(names), enabled=not as_json) as on_progress:
            rep = run_suite(names, evaluator, runs_dir, kernel=spec, config=parse_config(config),
                            options=EvalOptions(budget_ms=budget_ms), on_progress=on_progress, memo=memo, op=op,
                            with_compile=not no_compile)
    except KeyboardInterrupt:
        if save is None:
            raise
        Console(stderr=True, highlight=False, soft_wrap=True).print(_say(
            f"interrupted: what was measured is kept in {save}; the same command again measures the rest"))
        raise typer.Exit(130) from None
    finally:
        evaluator.close()
    if as_json:
        typer.echo(json.dumps(rep.to_json(), indent=2, allow_nan=False))
    else:
        print_suite(rep)


def _suite_evaluator(kind: str, ray: str | None = None, ray_gpu_model: str | None = None) -> Any:
    """The suite's Evaluator: on GPUs, a pool of ONE worker (the first visible GPU, or one actor of
    the Ray cluster), so that a problem's baseline and its kernel are measured in the same worker
    process on the same GPU (the suite measures one thing at a time: a second worker would only
    ever idle)."""
    from kerngen.cli.compose import make_evaluator  # here: the composition root imports torch (seconds)

    if kind != "pool":
        return make_evaluator(kind)
    if ray or ray_gpu_model:
        return make_evaluator(kind, ray=ray, ray_gpu_model=ray_gpu_model, gpus=1)
    from kerngen.harness.pool.local import visible_devices

    return make_evaluator(kind, devices=visible_devices()[:1])


class _progress:
    """A rich progress bar on stderr (a no-op callback when disabled)."""

    def __init__(self, total: int, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = total
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), disable=not enabled, transient=False)
        self.task = self.bar.add_task("suite", total=total)

    def __enter__(self) -> Any:
        self.bar.start()

        def on_progress(i: int, label: str) -> None:
            self.bar.update(self.task, completed=i, description=f"suite: {label}" if label else "suite: done")

        return on_progress

    def __exit__(self, *exc: Any) -> None:
        self.bar.stop()


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


def _ms(t: Any) -> float | None:
    return t.median_ms if t is not None else None


def _why_cell(e: Any) -> str:
    """The verdict / why column, short: where a correct kernel comes from, or the kind of why
    (the whole why follows the table, one line per problem)."""
    if e.correct:
        return f"ok: {e.kernel_from}"
    return e.why.label if e.why is not None else e.verdict


def _why_line(e: Any) -> str:
    return f"{e.why.label}: {e.why.text}" if e.why is not None else f"{e.verdict}: {' '.join(e.message.split())}"


def _metrics_line(m: Any, total: int) -> str:
    fast = ", ".join(f"fast_{p} = {v:.2f}" for p, v in m.fast_p.items())
    over = f"{m.problems} problems" if not m.without_reference else (
        f"{m.problems} of {total} problems; {m.without_reference} without a {m.reference} time left out")
    return (f"vs {m.reference} ({over}): {m.correct} correct; {fast}; geometric-mean speedup over "
            f"{m.geomean_of} correct: {_f(m.geomean_speedup, '.3f', 'x')}")


def print_suite(rep: Any) -> None:
    from rich.table import Table

    from kerngen.results.speedups import SHORT_NOTE

    table = Table(title=f"suite on {_say(rep.gpu)}", caption=SHORT_NOTE.format(label=DEFAULTS_LABEL) +
                  "; op: the exported op through torch.ops, timed beside the kernel (gap to it)", caption_justify="left")
    cols = ("problem", "eager ms", "compile ms", "kernel ms (IQR)", "op ms (gap)", "floor ms", "fp32 eager",
            "fp32 compile", "dflt compile", "% of floor", "verdict / why")
    for col in cols:
        # a problem's name is folded over lines, never cut (--json has every field too)
        table.add_column(col, justify="left" if col in (cols[0], cols[-1]) else "right",
                         overflow="fold" if col == cols[0] else "ellipsis")
    for e in rep.entries:
        k = e.kernel
        compile_ms = _f(_ms(e.compiled), ".4f") if not e.compile_missing else "failed"
        op = f"{e.op.op.median_ms:.4f} ({e.op.gap_pct:+.1f}%)" if e.op is not None else "-"
        table.add_row(
            _say(e.ref.label()), _f(_ms(e.eager), ".4f"), compile_ms,
            f"{k.median_ms:.4f} ({k.iqr_ms:.4f})" if k else "-", op, _f(e.floor_ms, ".4f"),
            _f(e.speedup_eager, ".2f", "x"), _f(e.speedup_compile, ".2f", "x"), _f(e.speedup_compile_defaults, ".2f", "x"),
            _f(e.pct_roofline, ".1f", "%"), _say(_why_cell(e)),
        )
    out = Console(highlight=False)
    out.print(table)
    for e in rep.entries:
        if not e.correct:
            out.print(f"[yellow]{_say(e.ref.label())}[/]: {_say(_why_line(e))}")
        if e.compile_missing and e.compile_error:
            out.print(f"[yellow]{_say(e.ref.label())}[/]: torch.compile failed: {_say(e.compile_error)}")
        if e.op is not None and e.op.warning():
            out.print(f"[yellow]warning:[/] {_say(e.ref.label())}: {_say(e.op.warning())}")
        if e.op_error:
            out.print(f"[yellow]{_say(e.ref.label())}[/]: {_say(e.op_error)}")
    m = rep.metrics
    if rep.reused:
        out.print(f"{rep.reused} of {m.problems} measured in an earlier sitting on this GPU model (--save)")
    out.print(f"{m.correct}/{m.problems} problems with a correct kernel")
    out.print(_say(_metrics_line(m.eager, m.problems)))
    out.print(_say(_metrics_line(m.compile, m.problems)))
    if m.compile_defaults is not None:
        out.print(_say(_metrics_line(m.compile_defaults, m.problems)))
    missing = m.problems - m.correct
    if missing:
        out.print(_say(f"no correct kernel for {missing} of {m.problems}: {rep.without_kernel_text()}"))
    if rep.skipped_runs:
        shown = "; ".join(rep.skipped_runs[:3]) + (f"; ... ({len(rep.skipped_runs) - 3} more)"
                                                    if len(rep.skipped_runs) > 3 else "")
        out.print(_say(f"{len(rep.skipped_runs)} unreadable run folder(s) under {rep.runs_dir} skipped: {shown}"))


# ----- report -------------------------------------------------------------------------------
def report(
    run: str = typer.Argument(..., help="a run folder, or a run id under --runs-dir"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write, or a folder to write "
                                                                 "RUN_ID.html into [RUN/report.html]"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir"),
) -> None:
    """Write one self-contained HTML report of a run (tree of ideas, charts, configuration)."""
    from kerngen.results.model_run import model_run_path
    from kerngen.results.report import write_report
    from kerngen.agent.tree import load_run

    folder = model_run_path(run, runs_dir)
    if folder is not None:  # a model run: the regions as bars of time before and after, the table per region
        return model_cli.report_model(folder, out)
    loaded = load_run(run, runs_dir)
    warn_torn(loaded)
    path = write_report(loaded, out)
    Console(highlight=False).print(f"report written to {_say(path)}")


# ----- export -------------------------------------------------------------------------------
def export(
    runs: List[str] = typer.Argument(..., metavar="RUN...", help="a run folder or a run id under --runs-dir; "
                                     "several runs of one problem at other shapes: one op, a shape bucket each"),
    out: Path = typer.Option(..., "--out", "-o", help="folder to write the export into"),
    name: Optional[str] = typer.Option(None, "--name", help="op name (torch.ops.kerngen.NAME) [problem_hash]"),
    arch: Optional[str] = typer.Option(None, "--arch", help="cubin arch [the run's GPU]"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir"),
) -> None:
    """Export the best kernel of a run (or of several runs at other shapes): .cu, launch plan + config
    (JSON), cubin and a PyTorch op module."""
    from kerngen.agent.tree import load_run
    from kerngen.results.export import export_runs
    from kerngen.results.model_run import model_run_path

    folder = model_run_path(runs[0], runs_dir) if len(runs) == 1 else None
    if folder is not None:  # a model run: its plan and record as data (model.json), no Python
        return model_cli.export_model(folder, out)
    for one in runs:  # a journal's unreadable last line: said, and skipped
        warn_torn(load_run(one, runs_dir))
    res = export_runs(list(runs), out, runs_dir=runs_dir, name=name, arch=arch)
    console = Console(highlight=False)
    if res.name.startswith("demo_") and name is None:
        console.print("[bold red]DEMO (scripted, not measured on a GPU)[/]: this run's kernel is a toy and its "
                      "times are made up")
    buckets = f" ({res.buckets + 1} shape buckets)" if res.buckets else ""
    console.print(f"exported {res.op} to {_say(res.dir)}{buckets}:")
    for p in res.files():
        console.print(f"  {_say(p.name)}")
    console.print(_say(f"use it: op = kerngen.load({str(res.dir)!r}) (or import {res.module.stem} with that folder "
                       "on sys.path)"))
