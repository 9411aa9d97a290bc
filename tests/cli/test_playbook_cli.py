"""``kerngen playbook``: the family, variants and ideas of a problem, and a variant's spec written
out for ``kerngen tune`` (no GPU)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import kerngen.cli.app
from kerngen.harness.spec.spec import KernelSpec
from tests.cli_output import stderr_of

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(kerngen.cli.app.app, list(args))


def test_lists_family_variants_and_ideas():
    res = invoke("playbook", "conv2d")
    assert res.exit_code == 0, res.output
    assert "family conv2d; variants: direct, igemm" in res.output
    assert "conv-igemm" in res.output and "Implicit GEMM" in res.output


def test_writes_a_variant_spec_that_loads_and_tunes(tmp_path):
    out = tmp_path / "igemm.json"
    res = invoke("playbook", "conv2d", "--variant", "igemm", "--out", str(out))
    assert res.exit_code == 0, res.output
    spec = KernelSpec.load(out)
    assert spec.name == "playbook-conv2d-igemm" and spec.space_size() == 1296
    assert {s.kernel for s in spec.steps} == {"conv_epi_pack", "conv_epi_igemm"}
    assert "1296 configurations" in res.output


def test_first_variant_by_default_and_shape_flags(tmp_path):
    out = tmp_path / "rows.json"
    res = invoke("playbook", "rmsnorm", "--shape", "1024x4096", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert KernelSpec.load(out).name == "playbook-rmsnorm-rows-reg"


def test_bad_variant_and_uncovered_problem_are_one_line_errors(tmp_path):
    res = invoke("playbook", "conv2d", "--variant", "winograd", "--out", str(tmp_path / "x.json"))
    assert res.exit_code == 2
    err = stderr_of(res).strip().splitlines()
    assert len(err) == 1 and "winograd" in err[0] and "direct, igemm" in err[0]
    # without --out too: an unknown variant is an error, not silently ignored
    res = invoke("playbook", "layernorm", "--variant", "cop")
    assert res.exit_code == 2 and "unknown --variant 'cop'" in stderr_of(res) and "coop" in stderr_of(res)
    res = invoke("playbook", str(Path(__file__).resolve().parents[1] / "data" / "playbook" / "regions_lstm_cell.py"))
    assert res.exit_code == 2 and "nothing for" in stderr_of(res) and "NotCovered: lstm_cell at lstm_cell" in stderr_of(res)
    # one op no family takes is a PyTorch step of a model plan, not a refusal (issue 34): exit 0, the op named
    res = invoke("playbook", str(Path(__file__).resolve().parents[1] / "data" / "playbook" / "kb_permute.py"))
    assert res.exit_code == 0 and "r0 PyTorch [permute]: NotCovered: permute at permute" in res.output
    assert "r1 kernel elementwise" in res.output
    res = invoke("playbook", "conv2d", "--out", str(tmp_path / "missing" / "x.json"))
    assert res.exit_code == 2 and "cannot write" in stderr_of(res)


def test_a_folder_lists_each_file_and_the_count_covered(tmp_path):
    import json
    import shutil
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data" / "kernelbench"
    shutil.copy(data / "19_ReLU.py", tmp_path / "19_ReLU.py")
    (tmp_path / "2_broken.py").write_text("def (:\n")
    (tmp_path / "3_attention.py").write_text((data.parent / "playbook" / "kb_attention.py").read_text())
    res = invoke("playbook", str(tmp_path))
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("2_broken.py  -: does not load:")  # numeric order: 2, 3, 19
    assert lines[1] == "3_attention.py  attention [fa2, wgmma]"
    assert lines[2] == "19_ReLU.py  elementwise [vec]"
    assert lines[-1] == "2 of 3 files have a playbook kernel (sm_90 limits); families: attention, elementwise"
    res = invoke("playbook", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["files"] == 3 and got["covered"] == 2
    assert got["rows"][2] == {"file": "19_ReLU.py", "family": "elementwise", "variants": ["vec"], "why": ""}


def test_a_folder_with_no_problems_or_with_one_problem_flags_is_a_one_line_error(tmp_path):
    res = invoke("playbook", str(tmp_path))
    assert res.exit_code != 0 and "no .py problem files" in stderr_of(res)
    (tmp_path / "a.py").write_text("x = 1\n")
    res = invoke("playbook", str(tmp_path), "--variant", "vec")
    assert res.exit_code != 0 and "are for one problem, not a folder" in stderr_of(res)


def test_a_folder_worked_out_by_several_processes_lists_what_one_process_lists(tmp_path):
    """``--jobs 2`` (each file's offer in a spawned process, rows printed in the folder's order) gives the same
    rows as one process, a file that does not load included."""
    import json
    import shutil

    data = Path(__file__).resolve().parents[1] / "data" / "kernelbench" / "level1"
    for name in ("19_ReLU.py", "21_Sigmoid.py", "25_Swish.py", "23_Softmax.py", "24_LogSoftmax.py"):
        shutil.copy(data / name, tmp_path / name)
    (tmp_path / "2_broken.py").write_text("def (:\n")
    one, two = (invoke("playbook", str(tmp_path), "--json", "--no-cache", "--jobs", j) for j in ("1", "2"))
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    assert json.loads(one.output) == json.loads(two.output)
    assert [r["file"] for r in json.loads(two.output)["rows"]] == [
        "2_broken.py", "19_ReLU.py", "21_Sigmoid.py", "23_Softmax.py", "24_LogSoftmax.py", "25_Swish.py"]
