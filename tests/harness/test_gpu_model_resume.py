"""A model run's resume and re-tune on the GPU (issue 34, GPU tier), at a small size: a run stopped by Ctrl-C
at a kernel launch in its second region, resumed (its finished region not evaluated again, the one interrupted
going on from its recorded tries), checked end to end; then ``kerngen replay --tune`` of it (each kernel region
tuned again from its recorded variant and configuration), checked end to end, and from the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.model_journal import ModelRunResumed, RegionFinished, RegionTried, read_model_journal
from kerngen.problems.load import load_problem

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "tests" / "data" / "playbook" / "regions_resblock.py"


class Stop:
    """The CUDA launcher, Ctrl-C at launch ``stop_at`` (None: never), counting launches."""

    def __init__(self, stop_at: int | None = None) -> None:
        from kerngen.harness.model.execute import cuda_launcher

        self.real, self.launches, self.stop_at = cuda_launcher(), 0, stop_at

    def __call__(self, i, spec, plan, tensors):
        if self.stop_at is not None and self.launches + 1 == self.stop_at:
            raise KeyboardInterrupt
        self.launches += 1
        self.real(i, spec, plan, tensors)


@pytest.fixture(scope="module")
def gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch.device("cuda", torch.cuda.current_device())


def test_a_model_run_interrupted_and_resumed_and_replayed_with_a_tune(gpu, tmp_path):
    from kerngen.agent.model_search import retune_model, search_model
    from kerngen.harness.model.bench import cuda_timer

    problem = load_problem(str(PROBLEM))
    run_dir = tmp_path / "resblock-model"
    began: list[int] = []
    stop = Stop(stop_at=10 ** 9)  # set once the second region begins
    timer = cuda_timer(gpu, 10.0)

    def log(line: str) -> None:
        print(line)
        if line.startswith("[2/"):
            began.append(stop.launches)
        elif began and (": correct" in line or ": not kept" in line):
            stop.stop_at = stop.launches + 1  # the second region's first try is journaled: Ctrl-C at the next launch

    with pytest.raises(KeyboardInterrupt):
        search_model(problem, run_dir, device=gpu, launcher=stop, timer=timer, minutes=1.0, compile=False, log=log,
                     tune=2)
    events, _ = read_model_journal(run_dir)
    first = [e.region for e in events if isinstance(e, RegionFinished)]
    assert len(first) == 1 and began

    again = Stop()
    run = search_model(problem, run_dir, device=gpu, launcher=again, timer=timer, minutes=1.0, compile=False,
                       log=print, resume=True)
    events, _ = read_model_journal(run_dir)
    k = next(i for i, e in enumerate(events) if isinstance(e, ModelRunResumed))
    assert not [e for e in events[k:] if isinstance(e, RegionTried) and e.region == first[0]]  # not searched again
    assert run.check is not None and run.check.ok, run.check
    assert run.sessions == 2 and {r.region for r in run.regions if r.tried} == {0, 1}
    cut = next(r for r in run.regions if r.region != first[0])
    assert cut.tried[0] == next(e.tried for e in events[:k] if isinstance(e, RegionTried) and e.region == cut.region)

    new = retune_model(run, problem, tmp_path / "retuned", device=gpu, launcher=Stop(), timer=timer, minutes=0.5,
                       compile=False, log=print, tune=2)
    assert new.retuned and new.replay_of == run.id and new.check.ok, new.check
    for r in new.regions:
        old = next(o for o in run.regions if o.region == r.region)
        if old.chosen == "kernel":
            assert r.tried[0].variant == old.variant and r.tried[0].config == old.config
    print("changed:", new.changed)


def test_replay_tune_from_the_cli_path(gpu, tmp_path, capsys):
    """``kerngen replay RUN --tune --problem MODEL.py``'s code path (torch.compile left out: seconds, not minutes)."""
    from kerngen.agent.model_run import read_model_run
    from kerngen.agent.model_search import search_model
    from kerngen.cli.model import replay_model_run
    from kerngen.harness.model.bench import cuda_timer
    from kerngen.harness.model.execute import cuda_launcher

    runs = tmp_path / "runs"
    problem = load_problem(str(PROBLEM))
    search_model(problem, runs / "20260101-000000-resblock-model", device=gpu, launcher=cuda_launcher(),
                 timer=cuda_timer(gpu, 10.0), minutes=0.3, compile=False, log=print, tune=2)
    replay_model_run(runs / "20260101-000000-resblock-model", runs, str(PROBLEM), compile=False, tune=True,
                     minutes=0.3)
    assert "regions whose kernel changed" in capsys.readouterr().out
    (replay,) = [p for p in runs.iterdir() if p.name.endswith("-model-replay")]
    new = read_model_run(replay)
    assert new.retuned and new.check.ok and new.replay_of == "20260101-000000-resblock-model"
