"""A model run end to end on the CPU (issue 34): the offline model search with the emulator as the launcher and
a stand-in timer, its record (the per-region table, the end-to-end check), ``kerngen show`` of it, and
``kerngen.load`` of it as an nn.Module (eager and torch.compile) against the original model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kerngen
import kerngen.cli.app
from kerngen.agent.model_run import read_model_run
from kerngen.agent.model_search import search_model
from kerngen.problems.load import load_problem
from tests.emu.runner import available, run_plan

PLAYBOOK = Path(__file__).resolve().parents[1] / "data" / "playbook"
pytestmark = pytest.mark.skipif(not available(), reason="no C++ compiler (g++) for the CPU emulator")


class Counted:
    """The emulator as the launcher, counting launches; the timer says 0.5 ms for a call that launched a kernel
    and 1 ms for one that did not (emulated times say nothing: this makes the kernels win, to test that path)."""

    def __init__(self, wrong_region: int | None = None) -> None:
        self.launches = 0
        self.wrong = wrong_region

    def launch(self, i, spec, plan, tensors):
        self.launches += 1
        run_plan(spec, plan, tensors, timeout_s=600)

    def timer(self, fn):
        before = self.launches
        fn()
        return 0.5 if self.launches > before else 1.0


@pytest.fixture(scope="module")
def resblock_run(tmp_path_factory):
    problem = load_problem(str(PLAYBOOK / "regions_resblock.py"))
    c = Counted()
    run_dir = tmp_path_factory.mktemp("runs") / "resblock-model"
    run = search_model(problem, run_dir, device="cpu", launcher=c.launch, timer=c.timer, compile=False,
                       log=lambda line: None, tune=1)
    return run, run_dir, problem, c


def test_a_model_run_keeps_correct_faster_kernels_and_checks_the_assembled_model(resblock_run):
    run, run_dir, _, _ = resblock_run
    assert run.check is not None and run.check.ok, run.check
    assert [r.chosen for r in run.regions] == ["kernel", "kernel"]
    assert all(r.tried and r.tried[0].ok for r in run.regions)
    assert abs(sum(r.share for r in run.regions) - 1.0) < 1e-6 and run.kernel_share > 0.99
    assert run.timing is not None and run.timing.kerngen_ms == 0.5 and run.timing.eager_ms == 1.0
    again = read_model_run(run_dir)
    assert again.plan == run.plan and [r.variant for r in again.regions] == [r.variant for r in run.regions]


def test_show_prints_the_regions_and_the_end_to_end_line(resblock_run):
    _, run_dir, _, _ = resblock_run
    res = CliRunner().invoke(kerngen.cli.app.app, ["show", str(run_dir), "--width", "200"])
    assert res.exit_code == 0, res.output
    assert "r0" in res.output and "kernel" in res.output and "end to end: correct" in res.output
    res = CliRunner().invoke(kerngen.cli.app.app, ["show", str(run_dir), "--json"])
    data = json.loads(res.output)
    assert data["kind"] == "model" and data["kernel_share"] > 0.99 and "plan" not in data


def test_load_gives_the_model_as_a_module_in_eager_and_under_compile(resblock_run):
    from kerngen.results.model_run import load_model_run

    run, run_dir, problem, c = resblock_run
    model = problem.build_model("cpu", 7)
    x = problem.make_inputs("cpu", 9)
    module = load_model_run(run_dir, model=model, launcher=c.launch)
    before = c.launches
    with torch.no_grad():
        want = model(*x)
        assert torch.allclose(module(*x), want, atol=1e-4, rtol=1e-4)
        assert c.launches == before + 2  # both regions ran as kernels
        compiled = torch.compile(module, backend="eager", fullgraph=True)
        assert torch.allclose(compiled(*x), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(kerngen.errors.KerngenError, match="pass the model"):
        bad = run.model_copy(update={"problem_path": str(run_dir / "model.py")})
        (run_dir / "model.py").write_text("raise SystemExit('never imported')\n")
        from kerngen.agent.model_run import write_model_run

        write_model_run(bad, run_dir)
        kerngen.load(run_dir)


def test_a_model_run_whose_region_kernel_is_wrong_is_never_reported_correct(tmp_path, monkeypatch):
    import kerngen.agent.model_region as ms

    real = ms.kernel_step

    def wrong(region, variant, sizes, defaults=None):  # the second region reads the input instead of r0's output
        step = real(region, variant, sizes, defaults)
        if region.index == 1:
            step = step.model_copy(update={"bindings": {**step.bindings, "relu": "x"}})
        return step

    monkeypatch.setattr(ms, "kernel_step", wrong)
    problem = load_problem(str(PLAYBOOK / "regions_resblock.py"))
    c = Counted()
    run = search_model(problem, tmp_path / "r", device="cpu", launcher=c.launch, timer=c.timer, compile=False,
                       log=lambda line: None, tune=0)
    assert run.regions[1].chosen == "pytorch" and "no variant was correct" in run.regions[1].why
    assert run.check.ok and run.regions[0].chosen == "kernel"  # the region checked alone caught it


def test_load_reads_the_recorded_problem_file_only_when_kerngen_ran_it_here(resblock_run, monkeypatch, tmp_path):
    """A model record names its problem file by path and sha256; a folder handed over could name any file on this
    machine whose hash is known (a public module). Without ``model=``, ``kerngen.load`` builds the model from that
    file only when kerngen itself ran that content here before (the trust list that replays use)."""
    import kerngen.problems.load as problems_load
    from kerngen.agent.problem_data import remember, trusted
    from kerngen.results.model_run import load_model_run

    from kerngen.agent.model_run import write_model_run

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))  # a trust list of this test's own
    run, run_dir, problem, c = resblock_run
    write_model_run(run, run_dir)  # the record as the search wrote it (another test rewrites it)
    assert not trusted(run.problem_sha256)
    with pytest.raises(kerngen.errors.KerngenError, match="never run by kerngen on this machine"):
        load_model_run(run_dir, launcher=c.launch)
    remember(run.problem_sha256, Path(run.problem_path))
    built = []
    real = problems_load.load_problem

    def on_cpu(src):  # the file itself, built on the CPU (the recorded model is built on CUDA)
        p = real(src)
        built.append(src)
        return type("P", (), {"build_model": lambda self, dev, seed: p.build_model("cpu", seed)})()

    monkeypatch.setattr(problems_load, "load_problem", on_cpu)
    module = load_model_run(run_dir, launcher=c.launch)
    assert built == [run.problem_path] and module is not None


def test_a_region_tries_its_tensor_core_variants_first_on_a_gpu_that_has_them(monkeypatch):
    """A short budget reaches a region's first variants only: on Hopper the wgmma core, then 3xTF32, go first (the
    offer lists igemm and direct first); on sm_80 3xTF32; off a GPU (the emulator) the offer's order."""
    from kerngen.agent.model_region import tensor_cores_first

    offered = ["igemm", "direct", "tf32x3", "wgmma", "rows_tf32x3_staged"]
    cap = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    cuda = torch.device("cuda", 0)
    assert tensor_cores_first(offered, cuda) == ["wgmma", "tf32x3", "rows_tf32x3_staged", "igemm", "direct"]
    cap["value"] = (8, 0)
    assert tensor_cores_first(offered, cuda) == ["tf32x3", "rows_tf32x3_staged", "igemm", "direct", "wgmma"]
    cap["value"] = (7, 5)
    assert tensor_cores_first(offered, cuda) == offered
    assert tensor_cores_first(offered, torch.device("cpu")) == offered
