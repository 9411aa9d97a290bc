"""``kerngen suite --save FILE``: a suite over more problems than one sitting measures, resumed
without measuring anything twice; a file of another GPU model or of nothing readable is refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.agent.scripted import scripted_spec
from kerngen.harness.evaluator import EvalOptions
from kerngen.problems.ref import ProblemRef
from kerngen.results.suite import run_suite
from kerngen.results.suite_save import SaveFile, SuiteSaveError
from tests.cli_output import stderr_of
from tests.results.test_suite import FakeEvaluator

runner = CliRunner()


class _CutOff(FakeEvaluator):
    """The sitting ends (the lent GPU's time limit) when the baseline of ``stop_at`` starts."""

    def __init__(self, stop_at: str, **kw) -> None:
        super().__init__(**kw)
        self.stop_at = stop_at

    def baseline(self, problem: ProblemRef, **kw):
        if problem.source == self.stop_at:
            raise KeyboardInterrupt
        return super().baseline(problem, **kw)


def test_a_second_sitting_measures_only_what_the_first_did_not(tmp_path):
    save, spec = tmp_path / "suite.json", scripted_spec(1.0)
    first = _CutOff("gelu", kernel_ms=0.25)
    with pytest.raises(KeyboardInterrupt):
        run_suite(["softmax", "gelu"], first, tmp_path, kernel=spec, memo=SaveFile(save, "fake GPU"))
    assert [c[1].source for c in first.calls] == ["softmax", "softmax"]  # baseline, evaluate
    kept = json.loads(save.read_text())
    assert kept["gpu"] == "fake GPU" and [m["entry"]["problem"] for m in kept["measured"]] == ["softmax"]

    second = FakeEvaluator(kernel_ms=0.5)
    rep = run_suite(["softmax", "gelu"], second, tmp_path, kernel=spec, memo=SaveFile(save, "fake GPU"))
    assert [c[1].source for c in second.calls] == ["gelu", "gelu"]  # softmax is not measured again
    assert rep.reused == 1 and rep.metrics.problems == 2 and rep.metrics.correct == 2
    soft, gelu = rep.entries
    assert soft.speedup_eager == pytest.approx(4.0) and gelu.speedup_eager == pytest.approx(2.0)  # each its sitting's
    assert len(json.loads(save.read_text())["measured"]) == 2


def test_another_kernel_configuration_or_budget_is_measured_again(tmp_path):
    save, spec = tmp_path / "suite.json", scripted_spec(1.0)
    run_suite(["softmax"], FakeEvaluator(), tmp_path, kernel=spec, config={"BLOCK": 256}, memo=SaveFile(save, "g"))
    for config, budget in (({"BLOCK": 128}, None), ({"BLOCK": 256}, 50.0)):
        ev = FakeEvaluator()
        options = EvalOptions(budget_ms=budget) if budget else None
        rep = run_suite(["softmax"], ev, tmp_path, kernel=spec, config=config, options=options,
                        memo=SaveFile(save, "g"))
        assert rep.reused == 0 and [c[0] for c in ev.calls] == ["baseline", "evaluate"]
    ev = FakeEvaluator()  # the newest measurement of a problem is the one kept
    rep = run_suite(["softmax"], ev, tmp_path, kernel=spec, config={"BLOCK": 256}, options=EvalOptions(budget_ms=50.0),
                    memo=SaveFile(save, "g"))
    assert rep.reused == 1 and ev.calls == []


def test_an_edited_problem_file_is_measured_again(tmp_path):
    problem = tmp_path / "p.py"
    problem.write_text("# one\n")
    save, spec = tmp_path / "suite.json", scripted_spec(1.0)
    run_suite([str(problem)], FakeEvaluator(), tmp_path, kernel=spec, memo=SaveFile(save, "g"))
    memo = SaveFile(save, "g")
    run_suite([str(problem)], FakeEvaluator(), tmp_path, kernel=spec, memo=memo)
    assert memo.reused == 1
    problem.write_text("# two\n")
    memo = SaveFile(save, "g")
    run_suite([str(problem)], FakeEvaluator(), tmp_path, kernel=spec, memo=memo)
    assert memo.reused == 0


@pytest.mark.parametrize("content, says", [
    ("{not json", "not a kerngen suite file"),
    ('{"format": "kerngen-suite/1", "gpu": "g", "measured": [{"key": 1}]}', "not a kerngen suite file"),
    ('{"format": "other/9", "gpu": "g"}', "format 'other/9'"),
    ('{"format": "kerngen-suite/1", "gpu": "NVIDIA H200", "measured": []}', "measured on NVIDIA H200; this GPU is g"),
])
def test_an_unusable_file_is_refused_in_one_line(tmp_path, content, says):
    save = tmp_path / "suite.json"
    save.write_text(content)
    with pytest.raises(SuiteSaveError) as err:
        SaveFile(save, "g")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_link_is_refused(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text('{"format": "kerngen-suite/1", "gpu": "g"}')
    (tmp_path / "suite.json").symlink_to(target)
    with pytest.raises(SuiteSaveError, match="not a regular file"):
        SaveFile(tmp_path / "suite.json", "g")


def test_the_command_resumes_and_refuses_a_bad_file_without_a_traceback(tmp_path):
    spec, save = tmp_path / "spec.json", tmp_path / "suite.json"
    spec.write_text(scripted_spec(1.0).model_dump_json())
    args = ["suite", "softmax", "--kernel", str(spec), "--evaluator", "scripted", "--save", str(save)]
    res = runner.invoke(kerngen.cli.app.app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert "earlier sitting" not in res.stdout and save.is_file()
    res = runner.invoke(kerngen.cli.app.app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "1 of 1 measured in an earlier sitting on this GPU model" in res.stdout
    save.write_text("garbage")
    res = runner.invoke(kerngen.cli.app.app, args)
    err = stderr_of(res).strip()
    assert res.exit_code != 0 and err.startswith("error:") and "not a kerngen suite file" in err
    assert "Traceback" not in res.output and len(err.splitlines()) == 1


def test_an_interrupted_command_says_where_the_measurements_are(tmp_path, monkeypatch):
    from kerngen.cli import compose

    monkeypatch.setattr(compose, "make_evaluator", lambda kind, **kw: _CutOff("gelu"))
    spec, save = tmp_path / "spec.json", tmp_path / "suite.json"
    spec.write_text(scripted_spec(1.0).model_dump_json())
    res = runner.invoke(kerngen.cli.app.app, ["suite", "softmax", "gelu", "--kernel", str(spec), "--evaluator",
                                              "scripted", "--save", str(save)], env={"COLUMNS": "300"})
    assert res.exit_code == 130 and "Traceback" not in res.output
    assert f"what was measured is kept in {save}" in " ".join(res.output.split())
    assert [m["entry"]["problem"] for m in json.loads(save.read_text())["measured"]] == ["softmax"]
