"""``kerngen generate MODEL.py`` for a whole model (issue 34): the offline playbook's model search
(:mod:`kerngen.agent.model_search`) on this process's GPU, its progress per region, the table at the end.
Taken when ``--as-model`` is given, or when the playbook has no one spec for the problem but a model plan with a
kernel region."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kerngen.errors import KerngenError

__all__ = ["generate_model", "wants_model"]


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


def generate_model(ref: Any, runs_dir: Path, minutes: float | None, compile: bool = True) -> None:
    import torch
    from rich.console import Console

    from kerngen.agent.model_search import search_model
    from kerngen.harness.model.bench import cuda_timer
    from kerngen.harness.model.execute import cuda_launcher
    from kerngen.problems.load import load_problem
    from kerngen.results.model_run import render_model_run

    if not torch.cuda.is_available():
        raise KerngenError("a model run needs a CUDA GPU here (kerngen playbook MODEL.py lists its plan without one)")
    problem = load_problem(ref)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(runs_dir) / f"{stamp}-{problem.name}-model"
    out = Console(highlight=False, soft_wrap=True)
    out.print(f"[bold]model run[/] {run_dir}")
    dev = torch.device("cuda", torch.cuda.current_device())
    run = search_model(problem, run_dir, device=dev, launcher=cuda_launcher(), timer=cuda_timer(dev),
                       minutes=5.0 if minutes is None else minutes, compile=compile,
                       log=lambda line: out.print(f"  {line}", markup=False))
    out.print(render_model_run(run))
    out.print(f"record: {run_dir / 'model.json'}; kerngen.load('{run_dir}') gives the model as an nn.Module")
