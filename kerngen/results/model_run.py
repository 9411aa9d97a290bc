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

from kerngen.agent.model_run import ModelRun, is_model_run, read_model_run
from kerngen.agent.tree import resolve_run

__all__ = ["load_model_run", "model_run_json", "model_run_path", "render_model_run"]


def model_run_path(run: str | Path, runs_dir: str | Path = "runs") -> Path | None:
    """The folder of a model run RUN names, None when RUN is no model run."""
    p = Path(run)
    for cand in (p, Path(runs_dir) / str(run)):
        if cand.is_dir() and is_model_run(cand):
            return cand
    return None


def _ms(v: float | None) -> str:
    return f"{v:.4f}" if v is not None else "-"


def render_model_run(run: ModelRun) -> Table:
    """The regions (share of eager time, kernel vs PyTorch, why), then the end-to-end line in the caption."""
    t = Table(title=f"model run {run.id}: {run.problem} on {run.device}", title_justify="left")
    for col in ("region", "nodes", "family", "share", "eager ms", "kernel ms", "runs", "Amdahl", "why"):
        t.add_column(col, overflow="fold")
    for r in run.regions:
        t.add_row(f"r{r.region}", ", ".join(r.nodes)[:40], r.family or "-", f"{100 * r.share:.1f}%", _ms(r.eager_ms),
                  _ms(r.kernel_ms), f"kernel {r.variant}" if r.chosen == "kernel" else "PyTorch", f"{r.amdahl:.2f}x",
                  r.why[:120])
    c, e = run.check, run.timing
    lines = [f"end to end: {'correct' if c and c.ok else 'NOT correct'}" + (f" ({c.message})" if c else ""),
             f"kerngen kernels: {100 * run.kernel_share:.1f}% of the eager step time; Amdahl bound "
             f"{run.amdahl_bound:.2f}x"]
    if e is not None:
        ratio = f"; {e.compile_ms / e.best_ms:.2f}x torch.compile" if e.compile_ms else ""
        lines.append(f"eager {_ms(e.eager_ms)} ms, torch.compile {_ms(e.compile_ms)} ms, kerngen {_ms(e.kerngen_ms)} "
                     f"ms, kerngen + compile {_ms(e.kerngen_compile_ms)} ms{ratio}" + "".join(f"; {n}" for n in e.notes))
    t.caption = "\n".join(lines)
    t.caption_justify = "left"
    return t


def model_run_json(run: ModelRun) -> dict[str, Any]:
    d = run.model_dump(mode="json", exclude={"plan"})
    d.update(kernel_share=run.kernel_share, amdahl_bound=run.amdahl_bound,
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
    import hashlib

    from kerngen.problems.load import load_problem

    src = Path(run.problem_path)
    if not src.is_file() or folder.resolve() in src.resolve().parents:
        raise KerngenError(f"model run {run.id}: pass the model, kerngen.load(RUN, model=model) (its problem file "
                           f"{src} is not there, or lies inside the run folder)")
    if hashlib.sha256(src.read_bytes()).hexdigest() != run.problem_sha256:
        raise KerngenError(f"model run {run.id}: {src} changed since the run; pass the model: "
                           "kerngen.load(RUN, model=model)")
    return load_problem(str(src)).build_model("cuda", 0)
