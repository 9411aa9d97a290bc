"""``kerngen export`` and ``kerngen.load`` on the CPU: files, manifest, the generated module, its
fake implementation (FakeTensorMode, meta tensors) and its ValueErrors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kerngen
import kerngen.cli.app
from kerngen.results.export import arg_names, export_run, export_spec, identifier
from kerngen.results.exported_op import load_op
from kerngen.results.manifest import ExportManifest, read_manifest
from kerngen.problems.ref import ProblemRef
from tests.cli_output import stderr_of
from tests.kernels.specs import CASES

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "runs" / "20261122-023101-softmax-f340"
SHAPE = (4096, 65536)

runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_run(SHIPPED, tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A real softmax kernel at a small shape (only its checks run here: no GPU)."""
    case = CASES["softmax_ok"]
    return export_spec(case.spec, {"BLOCK": 128}, ProblemRef(source="softmax", shape=(8, 100)),
                       tmp_path_factory.mktemp("small"), name="softmax_small_test")


def test_export_writes_source_plan_cubin_and_module(exported):
    files = sorted(p.name for p in exported.dir.iterdir())
    assert files == sorted(p.name for p in exported.files()) and len(files) == 4
    m = read_manifest(exported.manifest)
    assert isinstance(m, ExportManifest) and m.op == f"kerngen::{m.name}" == exported.op
    assert m.problem == ProblemRef(source="softmax", shape=SHAPE, dtype="float32")
    assert [(t.name, t.shape, t.dtype) for t in m.inputs] == [("x", SHAPE, "float32")]
    assert [(t.name, t.shape) for t in m.outputs] == [("out", SHAPE)] and m.params == []
    assert m.config == {"BLOCK": 256} and m.spec.defaults == {"BLOCK": 256}  # the tuned config
    assert m.origin.endswith("node #37") and m.arch == "sm_90" and m.timing.median_ms == pytest.approx(0.558474)
    assert m.plan.steps[0].grid == (SHAPE[0] * SHAPE[1] // 256, 1, 1)
    assert (exported.dir / m.source_file).read_text() == m.spec.source
    assert (exported.dir / m.cubin_file).read_bytes()[:4] == b"\x7fELF"
    assert "-DBLOCK=256" in m.nvrtc_options
    assert json.loads(exported.manifest.read_text())["format"] == "kerngen-export/1"
    text = exported.module.read_text()  # a convenience that only calls kerngen.load (never imported by kerngen)
    assert f'kerngen.load(Path(__file__).resolve().with_name("{m.name}.json"))' in text
    assert "never imports" in text and "custom_op" not in text


def test_generated_module_imports_and_fakes_shapes(exported):
    op = kerngen.load(exported.dir)
    assert op is load_op(exported.manifest)  # imported once per process
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = op(torch.empty(SHAPE))
        assert tuple(y.shape) == SHAPE and y.dtype == torch.float32
    y = getattr(torch.ops.kerngen, exported.name)(torch.empty(SHAPE, device="meta"))
    assert y.device.type == "meta" and tuple(y.shape) == SHAPE


def test_strict_mode_refuses_a_dtype_no_kernel_has(exported):
    op = kerngen.load(exported.dir, strict=True)
    try:
        with pytest.raises(ValueError, match=r"no kernel for float16\[4096, 65536\]: no kernel for these dtypes "
                                             r"\(the export's: float32\) \(strict mode\)"):
            op(torch.empty(SHAPE, dtype=torch.float16, device="meta"))
        with pytest.raises(ValueError, match="takes 1 tensors"):  # the implementation itself (the schema says so first)
            op.kerngen(torch.empty(SHAPE, device="meta"), torch.empty(SHAPE, device="meta"))
    finally:
        kerngen.load(exported.dir)  # the op is one per process: back to the default rules


def test_other_shapes_and_dtypes_fall_back_to_the_built_in_problem(exported):
    op = kerngen.load(exported.dir)
    # fp16: no kernel of that dtype; the built-in softmax (kerngen's own file) tells the shapes
    y = op(torch.empty(SHAPE, dtype=torch.float16, device="meta"))
    assert tuple(y.shape) == SHAPE and y.dtype == torch.float16
    # another shape the kernel's constraints admit: its output shapes come from the same forward
    assert tuple(op(torch.empty(4096, 100, device="meta")).shape) == (4096, 100)


def test_cpu_tensors_run_the_problem_forward_not_the_kernel(small):
    from kerngen.results.exported_kernel import FallbackWarning

    op = kerngen.load(small.dir)
    x = torch.randn(8, 100)
    with pytest.warns(FallbackWarning, match="CUDA tensors only; running built-in problem softmax"):
        y = op(x)
    assert torch.allclose(y, torch.softmax(x, dim=1)) and op.kerngen.stats.fallback_calls == 1
    op(x)  # warned once per signature, counted every call
    assert op.kerngen.stats.fallback_calls == 2
    assert "fallback" in op.kerngen.stats.decisions["float32[8, 100]"]
    strict = kerngen.load(small.dir, strict=True)
    try:
        with pytest.raises(ValueError, match="CUDA tensors only"):
            strict(x)
    finally:
        kerngen.load(small.dir)
    assert tuple(op(torch.empty(8, 100, device="meta")).shape) == (8, 100)


def test_load_a_run_exports_into_the_cache(tmp_path, monkeypatch, exported):
    monkeypatch.setenv("KERNGEN_EXPORT_DIR", str(tmp_path))
    op = kerngen.load(SHIPPED)
    (folder,) = tmp_path.iterdir()
    assert folder.name.endswith("node37") and (folder / f"{exported.name}.json").is_file()
    assert tuple(op(torch.empty(SHAPE, device="meta")).shape) == SHAPE


def test_identifiers():
    assert identifier("conv.weight") == "conv_weight" and identifier("1x") == "_1x" and identifier("lambda") == "lambda_"
    assert arg_names(["x", "conv.weight", "conv_weight"]) == ["x", "conv_weight", "conv_weight_"]



def test_export_cli(tmp_path):
    res = runner.invoke(kerngen.cli.app.app, ["export", str(SHIPPED), "--out", str(tmp_path / "out"), "--name", "sm_cli"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "sm_cli.py").is_file() and "kerngen::sm_cli" in res.stdout


def test_export_cli_errors_are_one_line_exit_2(tmp_path):
    res = runner.invoke(kerngen.cli.app.app, ["export", "no-such-run", "--out", str(tmp_path / "o"),
                                          "--runs-dir", str(tmp_path)])
    assert res.exit_code == 2 and "no-such-run" in stderr_of(res)
    empty = tmp_path / "empty"
    empty.mkdir()
    lines = (SHIPPED / "events.jsonl").read_text().splitlines(keepends=True)
    (empty / "events.jsonl").write_text("".join(lines[:2]))  # started, baseline: no kernel at all
    res = runner.invoke(kerngen.cli.app.app, ["export", str(empty), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    err = stderr_of(res).strip()
    assert "no correct kernel" in err and len(err.splitlines()) == 1


def test_export_into_an_existing_file_is_one_line_exit_2(tmp_path):
    afile = tmp_path / "taken.txt"
    afile.write_text("not a folder")
    res = runner.invoke(kerngen.cli.app.app, ["export", str(SHIPPED), "--out", str(afile)])
    assert res.exit_code == 2
    err = stderr_of(res).strip()
    assert "is a file" in err and len(err.splitlines()) == 1 and "Traceback" not in res.output
    assert afile.read_text() == "not a folder"


def test_a_demo_run_exports_as_a_demo(exported, tmp_path):
    """The scripted run is a toy: its op name and its manifest's origin say so, and so does the CLI."""
    m = read_manifest(exported.manifest)
    assert exported.name.startswith("demo_softmax_") and m.op == f"kerngen::{exported.name}"
    assert m.origin.startswith("DEMO (scripted, not measured on a GPU)")
    res = runner.invoke(kerngen.cli.app.app, ["export", str(SHIPPED), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "DEMO (scripted, not measured on a GPU)" in res.stdout and "kerngen::demo_softmax_" in res.stdout
