"""Model runs shown and loaded (issue 34): the per-region table of a run's ``model.json``
(:mod:`kerngen.agent.model_run`) and ``kerngen.load(RUN)`` on a model run: an ``nn.Module`` with the original
forward's positional inputs, the chosen kernels as ``torch.library`` custom ops, the weights the caller's model
(or the model of the run's own problem file, re-read from where the run found it and only while its sha256 is
unchanged, never from the run folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from kerngen.errors import KerngenError

from kerngen.agent.model_run import AMDAHL_UNBOUNDED, MODEL_FILE, ModelRun, is_model_run, read_model_run, write_model_run
from kerngen.agent.tree import resolve_run

__all__ = ["EXPORT_README", "export_model_run", "latest_model_run", "load_model_run", "model_run_json", "model_run_path", "model_run_row",
           "model_run_rows", "plain", "recorded_problem_file", "render_model_run", "render_model_runs",
           "render_region_trees"]

EXPORT_README = "README.txt"


def model_run_path(run: str | Path, runs_dir: str | Path = "runs") -> Path | None:
    """The folder of a model run (or a model export) RUN names, None when RUN is no model run."""
    p = Path(run)
    for cand in (p, Path(runs_dir) / str(run)):
        if cand.is_dir() and is_model_run(cand):
            return cand
    return None


def latest_model_run(runs_dir: str | Path = "runs") -> Path | None:
    """The newest model run folder under ``runs_dir`` (by name: its start stamp)."""
    rows = model_run_rows(runs_dir)
    return Path(rows[-1]["path"]) if rows else None


def model_run_rows(runs_dir: str | Path = "runs") -> list[dict[str, Any]]:
    """One row per model run folder under ``runs_dir`` (by name: its start stamp), for ``kerngen runs``."""
    try:
        return [model_run_row(d) for d in sorted(d for d in Path(runs_dir).iterdir() if d.is_dir() and is_model_run(d))]
    except OSError:
        return []


def model_run_row(folder: Path) -> dict[str, Any]:
    """What ``kerngen runs`` and ``kerngen suite`` say of a model run (a folder whose record does not read: a row
    saying why)."""
    row: dict[str, Any] = {"kind": "model", "run": folder.name, "path": str(folder), "problem": None,
                           "problem_path": None, "gpu": None, "correct": None, "kernel_share": None, "eager_ms": None,
                           "compile_ms": None, "kerngen_ms": None, "speedup_compile": None, "status": ""}
    try:
        r = read_model_run(folder)
    except KerngenError as exc:
        if not (folder / MODEL_FILE).exists():  # a run stopped before its end: its journal holds what it searched
            return row | {"status": f"interrupted: kerngen generate MODEL.py --as-model --resume {folder}"}
        return row | {"status": f"corrupt: {str(exc)[:200]}"}
    t = r.timing
    row.update(problem=r.problem, problem_path=r.problem_path, gpu=r.device, correct=bool(r.check and r.check.ok),
               kernel_share=r.kernel_share, status=r.stopped or "finished")
    if t is not None:
        row.update(eager_ms=t.eager_ms, compile_ms=t.compile_ms, kerngen_ms=t.best_ms,
                   speedup_compile=t.compile_ms / t.best_ms if t.compile_ms else None)
    return row


def render_model_runs(rows: list[dict[str, Any]], runs_dir: str | Path = "runs") -> Table:
    """The model runs' table of ``kerngen runs`` (recorded figures: end to end, the best of kerngen and kerngen +
    torch.compile)."""
    from rich import box

    t = Table(title=f"model runs under {plain(runs_dir)}", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, padding=(0, 1))
    t.add_column("run\nproblem", min_width=30, overflow="fold")
    t.add_column("GPU", max_width=12)
    for col in ("correct", "kernels\nshare", "eager\nms", "comp.\nms", "kerngen\nms", "vs\ncomp."):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("status", overflow="fold")
    for r in rows:
        ok = "-" if r["correct"] is None else "yes" if r["correct"] else "NO"
        share = "-" if r["kernel_share"] is None else f"{100 * r['kernel_share']:.0f}%"
        ratio = "-" if r["speedup_compile"] is None else f"{r['speedup_compile']:.2f}x"
        t.add_row(plain(f"{r['run']}\n{r['problem'] or '?'}"), plain(r["gpu"] or "?"), ok, share,
                  _ms(r["eager_ms"]), _ms(r["compile_ms"]), _ms(r["kerngen_ms"]), ratio, plain(r["status"]))
    return t


def export_model_run(path: str | Path, out: str | Path, runs_dir: str | Path = "runs") -> Path:
    """A model run as data in ``out``: its record (the plan: specs and allowlisted ATen steps; the table; the
    check; the times) with the problem's path left out (the weights are the caller's: ``kerngen.load(OUT,
    model=m)``), and a README. No Python is written."""
    from kerngen.harness.atomic import write_atomic

    folder = model_run_path(path, runs_dir)
    if folder is None:
        raise KerngenError(f"{path}: not a model run")
    run = read_model_run(folder)
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise KerngenError(f"{dest}: exists and is not an empty folder")
    write_model_run(run.model_copy(update={"problem_path": ""}), dest)
    write_atomic(dest / EXPORT_README, (
        f"kerngen model export of run {run.id} ({run.problem}, {run.device}).\n"
        f"model.json: the plan (kernel specs, allowlisted ATen steps; no Python) and the run's record.\n"
        f"Load it: module = kerngen.load({str(dest)!r}, model=my_model)  # my_model: the original nn.Module\n"))
    return dest


def _ms(v: float | None) -> str:
    return f"{v:.4f}" if v is not None else "-"


def plain(text: object) -> str:
    """Text from a record as rich markup that prints it as is (no markup, no control sequences)."""
    from rich.markup import escape

    from kerngen.redact import printable

    return escape(printable(str(text)))


def render_model_run(run: ModelRun) -> Table:
    """The regions (share of eager time, roofline floor, kernel vs PyTorch, why), then the end-to-end line in the
    caption. Everything from the record is printed as text (never as markup)."""
    t = Table(title=plain(f"model run {run.id}: {run.problem} on {run.device}"), title_justify="left")
    for col in ("region", "nodes", "family", "share", "eager ms", "floor ms", "kernel ms", "runs", "Amdahl", "why"):
        t.add_column(col, overflow="fold")
    for r in run.regions:
        t.add_row(f"r{r.region}", plain(", ".join(r.nodes)[:40]), plain(r.family or "-"), f"{100 * r.share:.1f}%",
                  _ms(r.eager_ms), _ms(r.floor_ms), _ms(r.kernel_ms),
                  plain(f"kernel {r.variant}") if r.chosen == "kernel" else "PyTorch", r.amdahl_text,
                  plain(r.why[:120]))
    c, e = run.check, run.timing
    lines = [f"end to end: {'correct' if c and c.ok else 'NOT correct'}" + (f" ({c.message})" if c else ""),
             f"kerngen kernels: {100 * run.kernel_share:.1f}% of the eager step time; Amdahl bound "
             f"{run.amdahl_text}"]
    if e is not None:
        ratio = f"; {e.compile_ms / e.best_ms:.2f}x torch.compile" if e.compile_ms else ""
        lines.append(f"eager {_ms(e.eager_ms)} ms, torch.compile {_ms(e.compile_ms)} ms, kerngen {_ms(e.kerngen_ms)} "
                     f"ms, kerngen + compile {_ms(e.kerngen_compile_ms)} ms{ratio}" + "".join(f"; {n}" for n in e.notes))
    t.caption = plain("\n".join(lines))
    t.caption_justify = "left"
    return t


def render_region_trees(run: ModelRun) -> Any:
    """Each searched region's tries as a tree: its variants, and under the kernel a tune started from, the
    configurations tried (what each changes from it); the chosen one marked."""
    from rich.console import Group
    from rich.tree import Tree

    trees = []
    for r in run.regions:
        if not r.tried:
            continue
        head = f"r{r.region} {r.family or '-'}: " + (f"kernel {r.variant} {_ms(r.kernel_ms)} ms" if r.chosen == "kernel"
                                                      else f"PyTorch ({r.why[:80]})")
        tree = Tree(plain(head))
        nodes: dict[int, Any] = {}
        for i, t in enumerate(r.tried):
            parent = r.tried[t.parent] if t.parent is not None and 0 <= t.parent < i else None
            label = t.variant if t.config is None else _changes(t, parent, r.tried)
            mark = " *" if r.chosen == "kernel" and i == r.chosen_try else ""
            text = f"{label}: " + (f"{_ms(t.kernel_ms)} ms" if t.ok else t.message[:100]) + mark
            nodes[i] = (nodes.get(t.parent, tree) if parent is not None else tree).add(plain(text))
        trees.append(tree)
    return Group(*trees)


def _changes(t: Any, parent: Any, tried: list[Any]) -> str:
    """What a tune's configuration changes from the kernel it tunes: from its configuration when recorded, else
    (a variant at its default) the values its sibling configurations differ in."""
    if parent is not None and parent.config is not None:
        base = parent.config
        return " ".join(f"{k}={v}" for k, v in t.config.items() if base.get(k) != v) or "the same configuration"
    sibs = [s.config for s in tried if s.parent == t.parent and s.config is not None]
    keys = {k for c in sibs for k in c if len({str(x.get(k)) for x in sibs}) > 1} or set(t.config)
    return " ".join(f"{k}={v}" for k, v in t.config.items() if k in keys)


def model_run_json(run: ModelRun) -> dict[str, Any]:
    d = run.model_dump(mode="json", exclude={"plan"})
    d.update(kernel_share=run.kernel_share,
             amdahl_bound=run.amdahl_bound if run.amdahl_bound < AMDAHL_UNBOUNDED else None,
             steps=[{"kind": s.kind, "region": s.region} for s in run.plan.steps])
    return d


def load_model_run(path: str | Path, runs_dir: str | Path = "runs", *, model: Any = None, launcher: Any = None
                   ) -> Any:
    """The run's plan as an ``nn.Module`` (:class:`kerngen.harness.model.module.PlanModule`). ``model``: the
    original model whose weights it uses; default: the run's problem file built on CUDA (seed 0), when that file
    is still where the run read it, outside the run folder, with the same sha256. ``launcher``: the tests'
    emulator (default: CUDA)."""
    from kerngen.harness.model.module import PlanModule

    folder = model_run_path(path, runs_dir) or resolve_run(path, runs_dir)
    run = read_model_run(folder)
    if model is None:
        model = _recorded_model(run, folder)
    if launcher is None:
        from kerngen.harness.model.execute import cuda_launcher

        launcher = cuda_launcher()
    return PlanModule(run.plan, model, launcher)


def _recorded_model(run: ModelRun, folder: Path) -> Any:
    from kerngen.problems.load import load_problem

    src = recorded_problem_file(run, folder, "pass the model: kerngen.load(RUN, model=model)")
    return load_problem(str(src)).build_model("cuda", 0)


def recorded_problem_file(run: ModelRun, folder: Path, ask: str) -> Path:
    """The problem file ``run`` names, when kerngen may build it on the record's word: there, outside the run
    folder, with the recorded sha256, and run by kerngen on this machine before (a handed record could name any
    file here whose hash is public). Else a one-line :class:`KerngenError` ending in ``ask``."""
    from kerngen.agent.problem_data import file_sha256, trusted

    src = Path(run.problem_path)
    if not run.problem_path or not src.is_file():
        raise KerngenError(f"model run {run.id}: its problem file {src} is not here; {ask}")
    if folder.resolve() in src.resolve().parents:  # a folder from anyone never names the Python that runs
        raise KerngenError(f"model run {run.id}: its problem file {src} lies inside the run folder; {ask}")
    if file_sha256(src) != run.problem_sha256:
        raise KerngenError(f"model run {run.id}: {src} changed since the run; {ask}")
    if not trusted(run.problem_sha256):
        raise KerngenError(f"model run {run.id}: {src} was never run by kerngen on this machine; read it, then {ask}")
    return src