"""Model runs everywhere op runs are (issue 34), on the CPU: ``kerngen runs`` lists them, ``report`` renders one
(bars of time before and after, the table per region), ``export`` writes one as data that ``kerngen.load`` reads,
``suite`` shows their end-to-end rows, ``replay`` re-checks and re-times a plan (the emulator as the launcher), the
loaded module keeps the forward's signature; and a record handed to kerngen that is bad in any way (a spec over
the limits, an ATen op outside the allowlist or not functional, a binding to a missing tensor, a huge sparse file)
is refused by every verb and by ``kerngen.load`` with one line and a non-zero exit."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kerngen
import kerngen.cli.app
from kerngen.agent.model_run import ModelRun, RegionRow, VariantTry, amdahl_text, read_model_run, write_model_run
from kerngen.agent.playbook.model_plan import plan_model
from kerngen.errors import KerngenError
from kerngen.harness.model.bench import EndToEnd
from kerngen.harness.model.check import ModelCheck
from kerngen.problems.load import load_problem
from kerngen.results.model_run import load_model_run, model_run_json
from tests.emu.runner import available, run_plan

PLAYBOOK = Path(__file__).resolve().parents[1] / "data" / "playbook"
PROBLEM = PLAYBOOK / "regions_resblock.py"
emulated = pytest.mark.skipif(not available(), reason="no C++ compiler (g++) for the CPU emulator")


def launch(i, spec, plan, tensors):
    run_plan(spec, plan, tensors, timeout_s=600)


@pytest.fixture(scope="module")
def problem():
    return load_problem(str(PROBLEM))


@pytest.fixture(scope="module")
def record(problem) -> ModelRun:
    """A model run's record as ``kerngen generate`` writes it (the playbook's plan: both regions as kernels)."""
    planning = plan_model(problem)
    rows = [RegionRow(region=r.region.index, nodes=list(r.region.nodes), family=r.family, eager_ms=1.0 + r.region.index,
                      share=(1.0 + r.region.index) / 3, floor_ms=0.1, chosen="kernel", variant=r.variant,
                      kernel_ms=0.5, why="", config={"BM": 64}) for r in planning.regions]
    rows[1].tried = [VariantTry(variant="direct", ok=False, message="<script>alert(1)</script> \x1b[31mred")]
    return ModelRun(id="20261128-000000-resblock-model", problem=planning.plan.problem,
                    problem_path=str(PROBLEM.resolve()), problem_sha256=problem.sha256, device="NVIDIA H100 80GB HBM3",
                    started="2026-11-28T00:00:00+00:00", plan=planning.plan, regions=rows,
                    check=ModelCheck(ok=True, sets=4, message="4 input sets agree"),
                    timing=EndToEnd(eager_ms=3.0, compile_ms=2.0, kerngen_ms=1.0, kerngen_compile_ms=1.5))


@pytest.fixture
def runs(tmp_path, record) -> Path:
    write_model_run(record, tmp_path / "runs" / record.id)
    return tmp_path / "runs"


def cli(*args: str):
    return CliRunner().invoke(kerngen.cli.app.app, [*args], catch_exceptions=False)


def test_runs_lists_model_runs_and_a_corrupt_one_as_a_row(runs, record):
    (runs / "20261128-000001-bad-model").mkdir()
    (runs / "20261128-000001-bad-model" / "model.json").write_text("{")
    res = cli("runs", "--runs-dir", str(runs), "--width", "200")
    assert res.exit_code == 0, res.output
    assert record.id in res.output and "model runs under" in res.output and "2.00x" in res.output
    rows = json.loads(cli("runs", "--runs-dir", str(runs), "--json").output)
    good, bad = [r for r in rows if r.get("kind") == "model"]
    assert good["correct"] is True and good["speedup_compile"] == pytest.approx(2.0) and good["kernel_share"] > 0.99
    assert bad["status"].startswith("corrupt:") and bad["correct"] is None


def test_report_draws_the_regions_before_and_after_and_escapes_the_record(runs, record, tmp_path):
    res = cli("report", record.id, "--runs-dir", str(runs), "-o", str(tmp_path / "r.html"))
    assert res.exit_code == 0, res.output
    html = (tmp_path / "r.html").read_text()
    assert ">before<" in html and ">after<" in html and html.count("<rect") == 4  # two regions, two bars
    assert "r1 conv_epi kernel" in html and "3.0000 ms" in html and "1.0000 ms" in html  # 1+2 ms before, 0.5+0.5 after
    assert "<script>" not in html and "&lt;script&gt;" in html and "\x1b" not in html
    # both regions are kernels (shares 1/3 + 2/3): the Amdahl bound is no number (1 / (1 - 100%)), not 1e9
    assert "Amdahl bound\nunbounded" in html and "1000000000" not in html


def test_an_amdahl_bound_past_a_thousand_is_shown_as_unbounded(record):
    assert amdahl_text(1.25) == "1.25x" and amdahl_text(999.0) == "999.00x" and amdahl_text(1e9) == "unbounded"
    assert record.amdahl_text == "unbounded" and model_run_json(record)["amdahl_bound"] is None


def test_export_writes_data_only_and_load_reads_it_with_the_callers_model(runs, record, problem, tmp_path):
    out = tmp_path / "exp"
    res = cli("export", str(runs / record.id), "-o", str(out))
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "model.json"]
    assert read_model_run(out).plan == record.plan and read_model_run(out).problem_path == ""
    with pytest.raises(KerngenError, match="pass the model"):
        kerngen.load(str(out))
    assert cli("export", str(runs / record.id), "-o", str(out)).exit_code != 0  # never over an export


@emulated
def test_a_loaded_model_keeps_the_forwards_signature(runs, record, problem, tmp_path):
    out = tmp_path / "exp"
    cli("export", str(runs / record.id), "-o", str(out))
    model = problem.build_model("cpu", 3)
    module = load_model_run(out, model=model, launcher=launch)
    assert list(inspect.signature(module).parameters) == ["x"]
    (x,) = problem.make_inputs("cpu", 4)
    with torch.no_grad():
        want = model(x)
        assert torch.allclose(module(x=x), want, atol=1e-4, rtol=1e-4)  # by keyword, as the original takes it
        assert torch.allclose(module(x), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(TypeError, match=r"forward\(x\)"):
        module(y=x)


def test_suite_shows_model_rows_for_a_run_or_its_problem_file(runs, record):
    for arg in (str(runs / record.id), str(PROBLEM)):
        res = cli("suite", arg, "--runs-dir", str(runs))
        assert res.exit_code == 0, res.output
        assert record.id in res.output and "2.00x" in res.output and "yes" in res.output
    data = json.loads(cli("suite", record.id, "--runs-dir", str(runs), "--json").output)
    assert data["models"][0]["run"] == record.id


@emulated
def test_replay_rechecks_and_retimes_the_plan_end_to_end(runs, record, problem, tmp_path):
    from kerngen.agent.model_search import replay_model

    new = replay_model(record, problem, tmp_path / "again", device="cpu", launcher=launch, timer=lambda fn: (fn(), 0.7)[1],
                       compile=False, log=lambda line: None)
    assert new.check.ok and new.check.kernel_calls == 8 and new.replay_of == record.id  # 4 sets x 2 kernels
    assert new.timing.kerngen_ms == 0.7 and read_model_run(tmp_path / "again").plan == record.plan
    wrong = record.model_copy(update={"problem_sha256": "0" * 64})
    with pytest.raises(KerngenError, match="sha256"):
        replay_model(wrong, problem, tmp_path / "x", device="cpu", launcher=launch, timer=lambda fn: 1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_replay_from_the_cli_without_a_gpu_is_one_line(runs, record, monkeypatch, tmp_path):
    from kerngen.agent.problem_data import remember

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))  # a trust list of this test's own
    # the recorded file was never run by kerngen here: the record's word is not enough to run it
    res = cli("replay", record.id, "--runs-dir", str(runs))
    assert res.exit_code == 2 and "never run by kerngen on this machine" in res.output and "Traceback" not in res.output
    remember(record.problem_sha256, Path(record.problem_path))
    res = cli("replay", record.id, "--runs-dir", str(runs))
    assert res.exit_code != 0 and "CUDA GPU" in res.output and "Traceback" not in res.output


def test_replay_from_the_cli_loads_the_recorded_problem_file(runs, record, monkeypatch, tmp_path):
    """Past the GPU check, the recorded problem file (a path) is loaded and handed to the replay (on 4x H200 the
    verb failed there: load_problem was given a Path, 2026-11-28). The GPU's parts are stood in for."""
    import kerngen.agent.model_search as model_search
    import kerngen.harness.model.bench as bench
    import kerngen.harness.model.execute as execute
    from kerngen.agent.problem_data import remember

    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path))
    remember(record.problem_sha256, Path(record.problem_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(bench, "cuda_timer", lambda dev: None)
    monkeypatch.setattr(execute, "cuda_launcher", lambda: None)
    seen = []

    def replay(run, problem, run_dir, **kw):
        seen.append(problem.sha256)
        return run

    monkeypatch.setattr(model_search, "replay_model", replay)
    res = cli("replay", record.id, "--runs-dir", str(runs))
    assert res.exit_code == 0, res.output
    assert seen == [record.problem_sha256] and "Traceback" not in res.output


def _bad(record: ModelRun, how: str) -> str:
    """The record's JSON made bad in one way."""
    d = json.loads(record.model_dump_json())
    steps = d["plan"]["steps"]
    k = next(s for s in steps if s["kind"] == "kernel")
    if how == "spec":
        k["spec"]["defines"] = {f"D{i}": "1" for i in range(300)}
    elif how == "op":
        d["plan"]["steps"].append({"kind": "aten", "node": "evil", "op": "system", "overload": "default", "args": {}})
    elif how == "overload":
        d["plan"]["steps"].append({"kind": "aten", "node": "evil", "op": "relu", "overload": "out",
                                   "args": {"self": {"ref": "x"}}})
    elif how == "binding":
        k["bindings"] = {**k["bindings"], next(iter(k["bindings"])): "no_such_tensor"}
    return json.dumps(d)


@pytest.mark.parametrize("how", ["spec", "op", "overload", "binding", "huge"])
def test_a_bad_record_is_refused_by_every_verb_and_by_load(runs, record, tmp_path, how):
    folder = runs / record.id
    path = folder / "model.json"
    if how == "huge":
        with path.open("r+b") as f:
            f.truncate(65 << 20)  # sparse: 65 MB of nothing
    else:
        path.write_text(_bad(record, how))
    for args in (("show", str(folder)), ("report", str(folder)), ("export", str(folder), "-o", str(tmp_path / "e")),
                 ("replay", str(folder)), ("suite", str(folder))):
        res = CliRunner().invoke(kerngen.cli.app.app, list(args))
        assert res.exit_code != 0, (args, res.output)
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, (args, res.output)
    with pytest.raises(KerngenError):
        kerngen.load(str(folder), model=torch.nn.Identity())
    rows = json.loads(cli("runs", "--runs-dir", str(runs), "--json").output)
    assert rows[0]["status"].startswith("corrupt:")  # listed, never a crash


def test_replay_never_runs_a_problem_file_the_run_folder_holds(runs, record):
    folder = runs / record.id
    (folder / "model.py").write_text("raise SystemExit('never imported')\n")
    write_model_run(record.model_copy(update={"problem_path": str(folder / "model.py")}), folder)
    res = cli("replay", str(folder))
    assert res.exit_code != 0 and "inside the run folder" in res.output
