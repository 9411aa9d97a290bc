"""``kerngen generate``, ``kerngen show`` and ``kerngen replay``.

Every user-facing failure is a :class:`~kerngen.errors.KerngenError`: one line on
stderr and exit code 2 (also under typer's CliRunner). Nothing journaled is lost: a failed or
interrupted ``generate`` can be continued with ``--resume``.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console

from kerngen.agent.budget import SearchConfig, Usage, make_budget
from kerngen.agent.journal import ensure_unlocked, has_journal, new_run_id
from kerngen.agent.problem_data import rerun_ref
from kerngen.agent.safe_paths import refuse_symlinks
from kerngen.agent.search_records import budget_for_resume, resume_note
from kerngen.agent.search_settings import SearchSettings
from kerngen.agent.tree import load_run
from kerngen.cli import batch as batch_mod
from kerngen.cli import cluster
from kerngen.cli import model as model_path
from kerngen.cli.guard import warn_torn
from kerngen.errors import KerngenError
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import parse_problem_ref, parse_shapes
from kerngen.results.live import LiveView
from kerngen.results.suite import expand_problems
from kerngen.results.dry_run import dry_run_summary, render_dry_run
from kerngen.results.show import list_runs, no_kernel_why, render, render_header, render_runs, run_json
from kerngen.results.speedups import speedup_line
from kerngen.text import one_line

# The search engine (kerngen.agent.search, .replay) and the composition root (kerngen.cli.compose:
# NumPy, the playbook, the tuner) are imported in the commands that run them, not here: `kerngen
# --help`, `runs` and `show` start in a fraction of a second without them (tests/cli/test_startup.py).

# ----- generate -----------------------------------------------------------------------------
def generate(
    problems: Optional[List[str]] = typer.Argument(
        None, metavar="PROBLEM",
        help="built-in problem name or a KernelBench .py file; several, or a folder: one search each"),
    shape: Optional[str] = typer.Option(None, "--shape", help="sizes of a built-in problem, e.g. 8192x1024; "
                                        "several (1x4096,8x4096,64x4096): one search each, one export"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp32 | fp16 | bf16 (built-in problems)"),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32 (true fp32, the default) | tf32 "
                                            "(PyTorch's TF32 reference, a tolerance measured against fp64)"),
    export_dir: Optional[Path] = typer.Option(None, "--export", help="export the best kernel (of every --shape: "
                                              "one op, one shape bucket each) into this folder"),
    kernel: Optional[Path] = typer.Option(None, "--kernel", help="seed kernel spec (JSON/YAML) to start from"),
    proposer: str = typer.Option("auto", "--proposer", help="auto | llm | playbook | scripted"),
    model: Optional[str] = typer.Option(None, "--model", help="LLM model name (implies --proposer llm under auto)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint"),
    llm_concurrency: Optional[int] = typer.Option(None, "--llm-concurrency", min=1,
                                                  help="LLM requests in flight at most [4]"),
    price_in: Optional[float] = typer.Option(None, "--price-in", min=0.0,
                                             help="USD per million prompt tokens (to report cost)"),
    price_out: Optional[float] = typer.Option(None, "--price-out", min=0.0,
                                              help="USD per million completion tokens"),
    price_cached_in: Optional[float] = typer.Option(None, "--price-cached-in", min=0.0,
                                                    help="USD per million cached prompt tokens [--price-in]"),
    max_cost: Optional[float] = typer.Option(None, "--max-cost", min=0.0,
                                             help="USD the LLM may cost at most (needs --price-in/--price-out)"),
    reasoning_effort: Optional[str] = typer.Option(None, "--reasoning-effort",
                                                   help="reasoning models: minimal | low | medium | high"),
    max_output_tokens: Optional[int] = typer.Option(None, "--max-output-tokens", min=1,
                                                    help="output tokens per answer (reasoning included)"),
    llm_timeout: Optional[float] = typer.Option(None, "--llm-timeout", min=1.0,
                                                help="seconds per LLM request [120]"),
    llm_extra: Optional[str] = typer.Option(None, "--llm-extra", metavar="JSON",
                                            help="extra request fields, e.g. '{\"top_p\": 0.9}'"),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="no GPU: real LLM calls and NVRTC compiles, nothing run; ends with a summary"),
    gpu: str = typer.Option("h100", "--gpu", help="with --dry-run: the GPU to compile for (h100 h200 a100 l40s rtx4090)"),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=0, help="rounds of the search [5]"),
    beam: Optional[int] = typer.Option(None, "--beam", min=1, help="best nodes expanded per round (B) [2]"),
    ideas: Optional[int] = typer.Option(None, "--ideas", min=1, help="ideas per beam node (K) [3]"),
    branches: Optional[int] = typer.Option(None, "--branches", min=1, help="implementations per idea (M) [2]"),
    repairs: Optional[int] = typer.Option(None, "--repairs", min=0, help="repair attempts per failed node (R) [2]"),
    minutes: Optional[float] = typer.Option(None, "--minutes", help="wall-clock budget in minutes [30] "
                                            "(with --resume: for this session)"),
    gpu_minutes: Optional[float] = typer.Option(None, "--gpu-minutes", help="GPU-time budget in minutes [20] "
                                                "(with --resume: for this session)"),
    max_llm_calls: Optional[int] = typer.Option(None, "--max-llm-calls", min=0, help="LLM request budget [200]"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=0, help="LLM token budget [2M]"),
    patience: Optional[int] = typer.Option(None, "--patience", min=1, help="stop after P rounds without a gain [2]"),
    no_tune: bool = typer.Option(False, "--no-tune", help="do not autotune the survivors"),
    no_playbook_seed: bool = typer.Option(False, "--no-playbook-seed",
                                          help="with an LLM: start from nothing, not from the playbook's kernel"),
    force: bool = typer.Option(False, "--force", help="search a degenerate problem anyway"),
    as_model: bool = typer.Option(False, "--as-model", help="a whole model: a kernel per region, the rest PyTorch, "
                                  "checked and timed end to end (the default where no one spec covers it)"),
    resume: Optional[str] = typer.Option(None, "--resume", help="continue a run (its folder, id or 'latest')"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where run folders live"),
    fresh: bool = typer.Option(False, "--fresh", help="several problems: start a new batch instead of continuing"),
    as_json: bool = typer.Option(False, "--json", help="several problems: print the summary as JSON"),
    ray: Optional[str] = cluster.RAY,
    ray_gpu_model: Optional[str] = cluster.RAY_GPU_MODEL,
    evaluator_kind: str = typer.Option("pool", "--evaluator", hidden=True,
                                       help="pool (the GPUs) | scripted (deterministic, no GPU, made-up times)"),
) -> None:
    """Search for a fast CUDA-C kernel of PROBLEM; journal the search under runs/<id>/. Several
    problems (or a folder of KernelBench files): one search each, --minutes each, resumable by
    running the same command again; on several GPUs (or --ray), one problem per GPU at a time."""
    out = Console(highlight=False)
    given = {k: v for k, v in dict(rounds=rounds, max_llm_calls=max_llm_calls, max_tokens=max_tokens,
                                   max_cost_usd=max_cost, wall_minutes=minutes, gpu_minutes=gpu_minutes,
                                   patience=patience).items()
             if v is not None}
    if max_cost is not None and (price_in is None or price_out is None):
        raise KerngenError("--max-cost needs --price-in and --price-out (USD per million tokens)")
    make_budget(None, given)  # --minutes 0, --gpu-minutes -1 ...: one line and exit 2, before anything else
    usage = Usage()
    knobs = {"max_concurrency": llm_concurrency, "price_in_per_mtok": price_in, "price_out_per_mtok": price_out,
             "price_cached_in_per_mtok": price_cached_in,
             "reasoning_effort": reasoning_effort, "max_output_tokens": max_output_tokens, "timeout_s": llm_timeout,
             "extra_body": _extra_fields(llm_extra)}
    if dry_run:  # its run folder is listed with the others (runs, latest), marked as a dry run
        evaluator_kind = "dry-run"
    problems = list(problems or [])
    if len(problems) > 1 and resume:
        raise KerngenError("--resume continues one run; for several problems run the same command again")
    problem = problems[0] if problems else None
    defaults = SearchConfig()
    asked = _Asked(proposer=proposer, model=model, base_url=base_url, knobs=knobs, given=given, force=force,
                   no_playbook_seed=no_playbook_seed, runs_dir=runs_dir, gpu=gpu, ray=ray, ray_gpu_model=ray_gpu_model,
                   config=SearchConfig(beam=beam or defaults.beam, ideas=ideas or defaults.ideas,
                                       branches=branches or defaults.branches,
                                       repairs=repairs if repairs is not None else defaults.repairs,
                                       tune=not no_tune))
    shapes = parse_shapes(shape) if shape else []
    many = len(problems) > 1 or (problem is not None and Path(problem).is_dir())
    if len(shapes) > 1:
        if resume or many or problem is None:
            raise KerngenError("several --shape values take one built-in PROBLEM (each shape's run resumes alone: "
                               "kerngen generate --resume RUN)")
        return _generate_shapes(problem, shapes, dtype, precision, asked, evaluator_kind, export_dir)
    if not resume and many:
        if precision or export_dir:
            raise KerngenError("--precision and --export take one problem (several: one search each, then "
                               "kerngen export RUN)")
        return _generate_many(problems, asked, fresh=fresh, as_json=as_json, evaluator_kind=evaluator_kind)
    if resume and evaluator_kind == "pool" and (as_model or model_path.is_model_resume(resume, runs_dir)):
        return model_path.resume_model(resume, problem, runs_dir, minutes)
    if resume:
        rec = load_run(resume, runs_dir)  # JournalError for a missing or corrupt run, before anything else
        ensure_unlocked(rec.path)  # another process appending to it: refused now, before GPUs or an LLM
        refuse_symlinks(rec.path)  # a resume writes into the folder: never through a link out of it
        # the run's problem file runs again only when built in, named here, or unchanged since the run started
        ref, which = rerun_ref(rec.started, problem, hint=f"kerngen generate FILE --resume {resume}")
        out.print(which, markup=False, soft_wrap=True)
        if rec.started.dry_run:  # a dry run goes on as one, compiling for the GPU it started with
            evaluator_kind, asked = "dry-run", replace(asked, gpu=rec.started.dry_run)
        elif dry_run:
            raise KerngenError(f"run {rec.id} ran on a GPU: --dry-run does not continue it (leave --dry-run out)")
    else:
        if not problem:
            raise KerngenError("generate needs a PROBLEM (or --resume RUN)")
        ref = parse_problem_ref(problem, shape, dtype, precision)
        # --as-model with an LLM named (--model/--base-url, or --proposer llm): the LLM per region beside the playbook
        llm = as_model and (proposer == "llm" or (proposer == "auto" and (model is not None or base_url is not None)))
        if evaluator_kind == "pool" and (llm or proposer in ("auto", "playbook") and model is None and base_url is None
                                         and (as_model or model_path.wants_model(ref))):
            return model_path.generate_model(ref, runs_dir, minutes, llm=(lambda: model_path.model_llm(ref, asked)) if llm else None)
        _check_problem(ref, evaluator_kind)
        seed = KernelSpec.load(kernel) if kernel else None
    from kerngen.agent.search import Search
    from kerngen.cli import compose

    # the GPU before the LLM: where no GPU can run the search, no request to the endpoint is spent
    evaluator = compose.make_evaluator(evaluator_kind, **asked.where())
    try:
        prop, settings = _resume_settings(rec, ref, asked, usage) if resume else _new_settings(ref, asked, usage, seed)
        if resume:
            out.print(resume_note(rec, settings.budget), markup=False, soft_wrap=True)
        run_dir = settings.run_dir
        try:
            tuner = compose.make_search_tuner(evaluator_kind, evaluator, ref, no_tune or not settings.config.tune)
            view = LiveView(total_rounds=settings.budget.rounds)
            search = Search(settings, prop, evaluator, tuner=tuner, usage=usage, listeners=[view],
                            context_factory=compose.make_context_factory(evaluator_kind))
            out.print(f"[bold]run[/] {run_dir}" + (" (resumed)" if resume else ""))
            with view:
                result = search.run()
        except KeyboardInterrupt:
            _say_interrupted(run_dir, runs_dir)
            raise typer.Exit(130) from None
    finally:
        evaluator.close()
    for warning in getattr(prop, "warnings", []):  # e.g. the endpoint's context is smaller than the prompts
        Console(stderr=True, highlight=False, soft_wrap=True).print(one_line(f"warning: {warning}"), markup=False)
    run = load_run(result.run_dir)
    out.print(render_header(run))
    out.print(one_line(f"stopped: {result.reason}"), markup=False)  # a reason may quote a model's text
    if run.started.dry_run:
        out.print(render_dry_run(dry_run_summary(run)))
    elif run.best is not None:
        out.print(f"best kernel: {result.run_dir / 'best' / 'spec.json'}")
        if export_dir is not None:
            _export([run], export_dir, out)
    else:
        out.print(one_line(no_kernel_why(run)), markup=False)


def _generate_shapes(problem: str, shapes: list[tuple[int, ...]], dtype: str | None, precision: str | None,
                     asked: "_Asked", evaluator_kind: str, export_dir: Path | None) -> None:
    """``--shape A,B,C``: one search per shape, one after the other on one evaluator (--minutes each),
    then a line per shape and one export holding the best kernel of each (a shape bucket each)."""
    out = Console(highlight=False)
    refs = [parse_problem_ref(problem, "x".join(map(str, s)), dtype, precision) for s in shapes]
    for ref in refs:
        _check_problem(ref, evaluator_kind)  # every shape fails fast, before any GPU work
    from kerngen.agent.search import Search
    from kerngen.cli import compose

    done = []
    evaluator = compose.make_evaluator(evaluator_kind, **asked.where())
    try:
        for ref in refs:
            usage = Usage()
            prop, settings = _new_settings(ref, asked, usage, None)
            tuner = compose.make_search_tuner(evaluator_kind, evaluator, ref, not settings.config.tune)
            view = LiveView(total_rounds=settings.budget.rounds)
            search = Search(settings, prop, evaluator, tuner=tuner, usage=usage, listeners=[view],
                            context_factory=compose.make_context_factory(evaluator_kind))
            out.print(f"[bold]run[/] {settings.run_dir} ({ref.label()})")
            with view:
                result = search.run()
            done.append(load_run(result.run_dir))
    except KeyboardInterrupt:
        Console(stderr=True, highlight=False, soft_wrap=True).print(one_line(
            f"interrupted after {len(done)} of {len(refs)} shapes; each finished run is kept"), markup=False)
        raise typer.Exit(130) from None
    finally:
        evaluator.close()
    for run in done:
        best = run.tree.best()
        what = (f"{best.ms:.4f} ms; {speedup_line(run.tree.figures(best))}" if best is not None
                else one_line(no_kernel_why(run)))
        out.print(one_line(f"{run.tree.problem.label() if run.tree.problem else '?'}: {what} (run {run.id})"),
                  markup=False)
    ready = [r for r in done if r.best is not None]
    if export_dir is not None and ready:
        _export(ready, export_dir, out)
    elif ready:
        out.print(one_line("one op for every shape: kerngen export " + " ".join(shlex.quote(r.id) for r in ready)
                           + " --out DIR"), markup=False)


def _export(runs: list[Any], out_dir: Path, out: Console) -> None:
    from kerngen.results.export import export_runs

    res = export_runs(runs, out_dir)
    out.print(one_line(f"exported {res.op} to {res.dir} ({res.buckets + 1} shape bucket(s)); "
                       f"use it: op = kerngen.load({str(res.dir)!r})"), markup=False)


@dataclass(frozen=True)
class _Asked:
    """What ``generate`` was asked beside the problem: the same for every problem of a batch."""

    proposer: str
    model: str | None
    base_url: str | None
    knobs: dict
    given: dict  # the budgets given on the command line
    config: SearchConfig
    force: bool
    no_playbook_seed: bool
    runs_dir: Path
    gpu: str = "h100"  # the preset a dry run compiles for
    ray: str | None = None  # the Ray cluster's address (--ray), else this host's GPUs
    ray_gpu_model: str | None = None

    def where(self) -> dict[str, Any]:
        """What make_evaluator needs to know of where the evaluations run."""
        return dict(gpu=self.gpu, ray=self.ray, ray_gpu_model=self.ray_gpu_model)


def _resume_settings(rec: Any, ref: Any, asked: _Asked, usage: Usage) -> tuple[Any, SearchSettings]:
    """The proposer and settings that continue ``rec``: its config and seed, the latest recorded
    budget with the command line's in its place, its proposer and model unless others are asked."""
    from kerngen.cli.compose import make_proposer

    st = rec.started
    kind = st.proposer if asked.proposer == "auto" and st.proposer in ("llm", "playbook", "scripted") else asked.proposer
    prop, model_name = make_proposer(kind, ref, usage=usage, model=asked.model or st.model, base_url=asked.base_url,
                                     llm_knobs=asked.knobs)
    return prop, SearchSettings.resume(rec, ref, budget=budget_for_resume(rec, asked.given), force=asked.force,
                                       model=model_name)


def _new_settings(ref: Any, asked: _Asked, usage: Usage, seed: KernelSpec | None) -> tuple[Any, SearchSettings]:
    from kerngen.cli.compose import make_proposer, playbook_seed

    budget = make_budget(None, asked.given)  # a bad value: one line, not a traceback
    prop, model_name = make_proposer(asked.proposer, ref, usage=usage, model=asked.model, base_url=asked.base_url,
                                     llm_knobs=asked.knobs)
    if seed is None and model_name is not None and not asked.no_playbook_seed:
        seed = playbook_seed(ref)  # the LLM starts from the playbook's kernel where it has one
    return prop, SearchSettings.new(ref, asked.runs_dir / new_run_id(ref), config=asked.config, budget=budget,
                                    seed_spec=seed, force=asked.force, model=model_name)


def _generate_many(problems: list[str], asked: _Asked, *, fresh: bool, as_json: bool, evaluator_kind: str) -> None:
    """One search per problem, one problem per GPU worker at a time (:mod:`kerngen.cli.batch`)."""
    from kerngen.agent.search import Search
    from kerngen.cli import compose

    runs_dir = asked.runs_dir
    names = expand_problems(problems)  # a missing file or an empty folder: one line, before any GPU work
    batch, path = batch_mod.open_batch(names, runs_dir, asked.given.get("wall_minutes"), fresh,
                                       kind="dry-run" if evaluator_kind == "dry-run" else "")
    t0 = time.monotonic()
    # a batch with nothing left to search needs no GPU: its summary only
    evaluator = compose.make_evaluator(evaluator_kind, **asked.where()) if batch_mod.todo(batch) else None

    def search_one(source: str, resume_dir: Path | None, started, shard: Any) -> Path:
        usage = Usage()
        if resume_dir is not None:
            rec = load_run(resume_dir)
            ensure_unlocked(rec.path)
            # the user named this file on this command line (the batch holds only those): it may run
            # again even where the run folder came from another machine, once it matches the record
            ref, _ = rerun_ref(rec.started, source)
            prop, settings = _resume_settings(rec, ref, asked, usage)
        else:
            ref = parse_problem_ref(source, None, None)
            _check_problem(ref, evaluator_kind)
            prop, settings = _new_settings(ref, asked, usage, None)
        tuner = compose.make_search_tuner(evaluator_kind, shard, ref, not settings.config.tune)
        search = Search(settings, prop, shard, tuner=tuner, usage=usage,
                        context_factory=compose.make_context_factory(evaluator_kind))
        started(settings.run_dir)
        search.run()
        return settings.run_dir

    try:
        if evaluator is not None:
            batch_mod.run_batch(batch, path, runs_dir, search_one, slots=compose.shards(evaluator), quiet=as_json)
    except KeyboardInterrupt:
        Console(stderr=True, highlight=False, soft_wrap=True).print(one_line(
            f"interrupted: the batch is saved in {path}; run the same command again to continue it"), markup=False)
        raise typer.Exit(130) from None
    finally:
        if evaluator is not None:
            evaluator.close()
    rows = batch_mod.summary_rows(batch, runs_dir)
    if as_json:
        typer.echo(batch_mod.summary_json(rows))
        return
    Console(highlight=False).print(batch_mod.render_summary(rows, batch.minutes, time.monotonic() - t0,
                                                            dry_run=evaluator_kind == "dry-run"))


def _say_interrupted(run_dir: Path, runs_dir: Path) -> None:
    """Ctrl-C in generate: which run stopped and the command that continues it (on stderr)."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if not has_journal(run_dir):
        err.print(one_line(f"interrupted before run {run_dir.name} started: nothing to resume"), markup=False)
        return
    if run_dir.parent == runs_dir:
        name = run_dir.name
        where = "" if runs_dir == Path("runs") else f" --runs-dir {shlex.quote(str(runs_dir))}"
    else:
        name, where = str(run_dir), ""
    err.print(one_line(f"interrupted: run {run_dir.name} is saved in {run_dir}; continue it with: "
                        f"kerngen generate --resume {shlex.quote(name)}{where}"), markup=False)


def _extra_fields(text: str | None) -> dict[str, Any] | None:
    """``--llm-extra``: a JSON object of request fields (one line and exit 2 when it is not)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise KerngenError(f"--llm-extra is not JSON: {one_line(str(exc), 120)}") from None
    if not isinstance(value, dict):
        raise KerngenError("--llm-extra must be a JSON object of request fields, e.g. '{\"top_p\": 0.9}'")
    return value


def _check_problem(ref: Any, evaluator_kind: str) -> None:
    """Fail fast (before a run folder exists) on a problem that does not load."""
    try:
        load_problem(ref)
    except KerngenError:
        if evaluator_kind == "scripted" and not ref.source.endswith(".py"):
            return  # the scripted demo runs on any name
        raise


# ----- show ---------------------------------------------------------------------------------
def show(
    run: str = typer.Argument(..., help="a run folder, a run id under --runs-dir, or 'latest'"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir"),
    width: Optional[int] = typer.Option(None, "--width", help="console width (default: the terminal's)"),
    as_json: bool = typer.Option(False, "--json", help="print the run as one JSON object"),
) -> None:
    """Print the search tree of a run: ideas, categories, verdicts, times, speedups, registers."""
    from kerngen.results.model_run import model_run_json, model_run_path, read_model_run, render_model_run, render_region_trees

    folder = model_run_path(run, runs_dir)
    if folder is not None:  # a model run: its regions and the end-to-end figures
        record = read_model_run(folder)
        if as_json:
            typer.echo(json.dumps(model_run_json(record), indent=2))
        else:
            Console(highlight=False, width=width).print(render_model_run(record), render_region_trees(record))
        return
    loaded = load_run(run, runs_dir)
    warn_torn(loaded)
    if as_json:
        typer.echo(json.dumps(run_json(loaded), indent=2, allow_nan=False))
        return
    Console(highlight=False, width=width).print(render(loaded))


# ----- runs ---------------------------------------------------------------------------------
def runs(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where run folders live"),
    width: Optional[int] = typer.Option(None, "--width", help="console width (default: the terminal's)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list instead of a table"),
) -> None:
    """List the runs under --runs-dir: problem, GPU, best ms, speedup vs eager and torch.compile,
    status. Reads their journals only (no problem file is imported); a corrupt run is a row."""
    from kerngen.results.model_run import model_run_rows

    rows = list_runs(runs_dir)
    if as_json:
        typer.echo(json.dumps(rows + model_run_rows(runs_dir), indent=2))
        return
    out = Console(highlight=False, width=width)
    if rows:
        out.print(render_runs(rows, runs_dir))
    if not model_path.print_model_runs(runs_dir, width) and not rows:  # model runs: a table of their own
        out.print(f"no runs under {runs_dir}/ (kerngen generate PROBLEM starts one)", markup=False)


# ----- replay -------------------------------------------------------------------------------
def replay(
    run: str = typer.Argument(..., help="a run folder, a run id under --runs-dir, or 'latest'"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where the replay's run folder goes too"),
    problem: Optional[str] = typer.Option(None, "--problem",
                                          help="the problem file to run (a run's own file runs only when built in "
                                               "or unchanged since the run started)"),
    tune: bool = typer.Option(False, "--tune", help="a model run: tune each kernel region again on this GPU, from "
                              "its recorded variant and configuration, then check and time end to end"),
    minutes: Optional[float] = typer.Option(None, "--minutes", min=0.01, help="with --tune: the budget (default 2)"),
    evaluator_kind: str = typer.Option("pool", "--evaluator", hidden=True),
) -> None:
    """Re-run a recorded search with no LLM call, re-evaluating every node on this GPU."""
    from kerngen.agent.replay import replay_run
    from kerngen.cli import compose
    from kerngen.results.model_run import model_run_path
    from kerngen.results.replay_table import replay_table

    folder = model_run_path(run, runs_dir)
    if folder is not None:  # a model run: its plan re-checked and re-timed end to end on this GPU
        return model_path.replay_model_run(folder, runs_dir, problem, tune=tune, minutes=minutes)
    orig = load_run(run, runs_dir)  # a missing or corrupt run says so first
    if tune or minutes is not None:
        raise KerngenError("--tune re-tunes a model run; an op run's kernel: kerngen tune PROBLEM --kernel "
                           "runs/RUN/best/spec.json")
    _, which = rerun_ref(orig.started, problem)  # before any GPU work: which file runs, or why none
    Console(highlight=False).print(which, markup=False, soft_wrap=True)
    evaluator = compose.make_evaluator(evaluator_kind)
    try:
        view = LiveView(total_rounds=len(orig.tree.beams))
        with view:
            rep = replay_run(orig, evaluator, runs_dir=runs_dir, listeners=[view], problem=problem,
                             context_factory=compose.make_context_factory(evaluator_kind))
    finally:
        evaluator.close()
    out = Console(highlight=False)
    out.print(replay_table(rep))
    ob, nb = orig.best, rep.outcome.best
    if ob is not None:
        out.print(f"recorded best: #{ob.id} {ob.ms:.4f} ms")
    if nb is not None:
        out.print(f"replayed best: #{nb.id} {nb.ms:.4f} ms")
    out.print(f"replay written to {rep.run_dir} ({rep.proposer_calls} proposer calls)", markup=False)
