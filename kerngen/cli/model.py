"""``kerngen generate MODEL.py`` for a whole model (issue 34): the offline playbook's model search
(:mod:`kerngen.agent.model_search`) on this process's GPU, its progress per region, the table at the end.
Taken when ``--as-model`` is given, or when the playbook has no one spec for the problem but a model plan with a
kernel region."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from kerngen.errors import KerngenError

__all__ = ["generate_model", "is_model_resume", "resume_model", "wants_model"]


def wants_model(ref: Any) -> bool:
    """True when the playbook offers no one spec for the problem but a model plan with a kernel region."""
    from kerngen.agent.playbook import NotCovered
    from kerngen.agent.playbook.model_plan import plan_model
    from kerngen.agent.playbook.proposer import PlaybookProposer
    from kerngen.problems.load import load_problem

    problem = load_problem(ref)
    prop = PlaybookProposer(problem)
    if prop.match is not None and prop.offer is not None and prop.offer.offered:
        return False
    try:
        return bool(plan_model(problem).kernels)
    except NotCovered:
        return False


def generate_model(ref: Any, runs_dir: Path, minutes: float | None, compile: bool = True,
                   resume_dir: Path | None = None, llm: Callable[[], Any] | None = None) -> None:
    """A new model run, or (``resume_dir``) the interrupted one there continued (``minutes``: this session's).
    ``llm``: makes the LLM proposer (after the GPU is found: no request is spent where none runs) whose kernels each
    region gets beside the playbook's (:mod:`kerngen.agent.model_llm`)."""
    import torch
    import typer
    from rich.console import Console

    from kerngen.agent.model_llm import RegionLLM
    from kerngen.agent.model_search import search_model
    from kerngen.agent.problem_data import remember
    from kerngen.harness.model.bench import cuda_timer
    from kerngen.harness.model.execute import cuda_launcher
    from kerngen.problems.load import load_problem
    from kerngen.results.model_run import plain, render_model_run, render_region_trees

    if not torch.cuda.is_available():
        raise KerngenError("a model run needs a CUDA GPU here (kerngen playbook MODEL.py lists its plan without one)")
    problem = load_problem(ref)
    if problem.path:  # a file this user ran: a later replay or load may read it again on the run's word
        remember(problem.sha256, Path(problem.path).resolve())
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = resume_dir or Path(runs_dir) / f"{stamp}-{problem.name}-model"
    out = Console(highlight=False, soft_wrap=True)
    out.print(f"[bold]model run[/] {plain(run_dir)}" + (" (resumed)" if resume_dir else ""))
    dev = torch.device("cuda", torch.cuda.current_device())
    propose = RegionLLM(llm(), run_dir, problem) if llm is not None else None
    try:
        run = search_model(problem, run_dir, device=dev, launcher=cuda_launcher(), timer=cuda_timer(dev),
                           minutes=5.0 if minutes is None else minutes, compile=compile, resume=resume_dir is not None,
                           log=lambda line: out.print(f"  {line}", markup=False), propose=propose)
    except KeyboardInterrupt:
        src = f" {problem.path}" if problem.path else ""
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"interrupted: model run {run_dir.name} is saved in {run_dir} (every region searched is in its journal); "
            f"continue it with: kerngen generate{src} --as-model --resume {run_dir}", markup=False)
        raise typer.Exit(130) from None
    if propose is not None and propose.stopped:
        out.print(f"the LLM stopped: {propose.stopped}", markup=False)
    out.print(render_model_run(run))
    out.print(render_region_trees(run))
    out.print(f"record: {run_dir / 'model.json'}; kerngen.load('{run_dir}') gives the model as an nn.Module",
              markup=False)


def is_model_resume(resume: str, runs_dir: Path) -> bool:
    """Whether ``--resume RUN`` names a model run (its folder or id)."""
    from kerngen.results.model_run import model_run_path

    return model_run_path(resume, runs_dir) is not None


def resume_model(resume: str, problem_file: str | None, runs_dir: Path, minutes: float | None) -> None:
    """``kerngen generate [MODEL.py] --as-model --resume RUN``: the journal read (a bad one: one line) before any
    GPU work; the problem file: MODEL.py, else the journal's own while kerngen ran it here, unchanged."""
    from types import SimpleNamespace

    from kerngen.agent.model_journal import read_model_journal
    from kerngen.agent.model_run import MODEL_EVENTS, MODEL_FILE
    from kerngen.agent.safe_paths import refuse_symlinks
    from kerngen.problems.ref import parse_problem_ref
    from kerngen.results.model_run import latest_model_run, model_run_path, recorded_problem_file

    folder = latest_model_run(runs_dir) if resume == "latest" else model_run_path(resume, runs_dir)
    if folder is None:
        raise KerngenError(f"{resume}: not a model run (no {MODEL_EVENTS} there, nor under {runs_dir})")
    if Path(folder).is_symlink():
        raise KerngenError(f"{folder}: a symbolic link; a resume writes into the run folder, never through a link")
    refuse_symlinks(folder, (MODEL_EVENTS, MODEL_FILE))
    if (Path(folder) / MODEL_FILE).exists():
        raise KerngenError(f"model run {Path(folder).name} is finished (its model.json is written): nothing to "
                           "resume; kerngen replay RUN --tune searches it again")
    started = read_model_journal(folder)[0][0]
    rec = SimpleNamespace(id=started.run_id, problem_path=started.problem_path, problem_sha256=started.problem_sha256)
    src = problem_file or str(recorded_problem_file(rec, Path(folder), "pass it: kerngen generate MODEL.py --as-model "
                                                                        f"--resume {resume}"))
    generate_model(parse_problem_ref(src, None, None, None), runs_dir, minutes, resume_dir=Path(folder))


# ----- the other verbs on model runs: runs, report, export, replay, suite -----------------------
def print_model_runs(runs_dir: Path, width: int | None) -> bool:
    """The model runs' table under ``runs_dir`` (False: there are none)."""
    from rich.console import Console

    from kerngen.results.model_run import model_run_rows, render_model_runs

    rows = model_run_rows(runs_dir)
    if rows:
        Console(highlight=False, width=width).print(render_model_runs(rows, runs_dir))
    return bool(rows)


def report_model(folder: Path, out: Path | None) -> None:
    from rich.console import Console

    from kerngen.agent.model_run import read_model_run
    from kerngen.results.model_report import write_model_report
    from kerngen.results.model_run import plain

    path = write_model_report(read_model_run(folder), folder, out)
    Console(highlight=False).print(f"report written to {plain(path)}")


def export_model(folder: Path, out: Path) -> None:
    from rich.console import Console

    from kerngen.results.model_run import plain, export_model_run

    dest = export_model_run(folder, out)
    Console(highlight=False).print(plain(f"exported model run {folder.name} to {dest} (model.json: data, no Python); "
                                        f"use it: module = kerngen.load({str(dest)!r}, model=my_model)"))


def replay_model_run(folder: Path, runs_dir: Path, problem_file: str | None, compile: bool = True,
                     tune: bool = False, minutes: float | None = None) -> None:
    """``kerngen replay`` of a model run: its plan re-checked and re-timed end to end on this GPU, a new record;
    ``tune``: each kernel region tuned again here first (:func:`kerngen.agent.model_search.retune_model`).
    The problem file: ``--problem``, else the run's own while it is where the run read it, unchanged."""
    import torch
    from rich.console import Console

    from kerngen.agent.model_run import read_model_run
    from kerngen.agent.model_search import replay_model, retune_model
    from kerngen.harness.model.bench import cuda_timer
    from kerngen.harness.model.execute import cuda_launcher
    from kerngen.problems.load import load_problem
    from kerngen.results.model_run import recorded_problem_file, render_model_run, render_region_trees

    if minutes is not None and not minutes > 0:
        raise KerngenError("--minutes must be more than 0")
    run = read_model_run(folder)  # before any GPU work: a record that cannot run is refused here
    src = problem_file or recorded_problem_file(run, Path(folder), "pass it: --problem MODEL.py")
    if not Path(src).is_file():
        raise KerngenError(f"problem file {src} not found")
    if not torch.cuda.is_available():
        raise KerngenError("replaying a model run needs a CUDA GPU here")
    problem = load_problem(src)
    if problem.sha256 != run.problem_sha256:
        raise KerngenError(f"{src}: not the problem run {run.id} planned (its sha256 differs)")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(runs_dir) / f"{stamp}-{problem.name}-model-replay"
    out = Console(highlight=False, soft_wrap=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    how = dict(device=dev, launcher=cuda_launcher(), timer=cuda_timer(dev), compile=compile,
               log=lambda line: out.print(f"  {line}", markup=False))
    if tune:
        new = retune_model(run, problem, run_dir, minutes=2.0 if minutes is None else minutes, **how)
        out.print(render_region_trees(new))
        out.print("regions whose kernel changed: " + (", ".join(f"r{r}" for r in new.changed) or "none"))
    else:
        new = replay_model(run, problem, run_dir, **how)
    out.print(render_model_run(new))
    out.print(f"replay written to {run_dir / 'model.json'}", markup=False)


def split_model_args(args: list[str], runs_dir: Path) -> tuple[list[Path], list[str]]:
    """``kerngen suite``'s arguments split into model runs (a model run folder or id, or a problem file whose
    newest model run lies under ``runs_dir``) and the rest (op problems)."""
    from kerngen.results.model_run import model_run_path, model_run_rows

    models: list[Path] = []
    rest: list[str] = []
    # oldest first: a later run of the same file wins
    by_file = {r["problem_path"]: Path(r["path"]) for r in model_run_rows(runs_dir) if r["problem_path"]}
    for a in args:
        folder = model_run_path(a, runs_dir)
        found = folder or (by_file.get(str(Path(a).resolve())) if a.endswith(".py") else None)
        (models.append(found) if found is not None else rest.append(a))
    return models, rest


def print_model_suite(folders: list[Path], as_json: bool) -> None:
    """The model runs' end-to-end rows (as recorded: ``kerngen replay RUN`` re-times one on this GPU)."""
    import json

    import typer
    from rich.console import Console

    from kerngen.results.model_run import model_run_row, render_model_runs

    rows = [model_run_row(f) for f in folders]
    bad = next((r for r in rows if r["status"].startswith("corrupt")), None)
    if bad is not None:  # a run the suite was asked for by name: its figures are not there
        raise KerngenError(f"{bad['path']}: {bad['status']}")
    if as_json:
        typer.echo(json.dumps({"models": rows}, indent=2))
        return
    t = render_model_runs(rows, "the suite's arguments")
    t.caption = "as recorded by each run; kerngen replay RUN re-checks and re-times one on this GPU"
    Console(highlight=False, soft_wrap=True).print(t)


def model_llm(ref: Any, asked: Any) -> Any:
    """The LLM of a model run (made once its GPU is known to be there): the op search's, its request and cost
    budgets (--max-llm-calls, --max-cost) over the whole run."""
    from kerngen.agent.budget import Usage
    from kerngen.cli.compose import make_proposer

    prop, _ = make_proposer("llm", ref, usage=Usage(), model=asked.model, base_url=asked.base_url,
                            llm_knobs=asked.knobs)
    prop.limit_requests(asked.given.get("max_llm_calls"))
    prop.limit_cost(asked.given.get("max_cost_usd"))
    return prop
