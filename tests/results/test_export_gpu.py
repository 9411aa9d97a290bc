"""GPU tier: a correct softmax kernel, journaled as a tiny run, exported and loaded as a PyTorch op.

It must match the reference inside an nn.Module, eagerly and under torch.compile(fullgraph=True),
pass torch.library.opcheck's schema and fake-tensor checks, refuse wrong devices and shapes, and
run as fast as the harness measured it (within 10% + IQR of the recorded median, same GPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SHAPE = (4096, 32768)  # 512 MiB in: ~1 ms, so Python launch overhead is not what gets timed

def softmax_spec():
    from kerngen.harness.gpu.calibrate import naive_softmax_spec  # block per row, three passes (GPU-checked)

    return naive_softmax_spec("x")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(run folder, GPU name, the harness's result): the kernel evaluated by the WorkerPool and
    journaled as a one-node run."""
    from kerngen.agent.budget import SearchBudget, SearchConfig
    from kerngen.agent.journal import Journal, NodeCreated, NodeEvaluated, RunFinished, RunStarted
    from kerngen.harness.evaluator import Candidate, EvalOptions
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    ref = ProblemRef(source="softmax", shape=SHAPE, dtype="float32")
    spec = softmax_spec()
    with WorkerPool() as pool:
        facts = pool.gpu_facts()
        result = pool.evaluate(ref, [Candidate(spec=spec)], EvalOptions(budget_ms=300))[0]
    assert result.ok, result.message
    run_dir = tmp_path_factory.mktemp("runs") / "export-gpu-test"
    with Journal(run_dir) as j:
        j.append(RunStarted(run_id=run_dir.name, problem=ref, config=SearchConfig(), budget=SearchBudget(),
                            proposer="test", gpu=facts))
        j.append(NodeCreated(id=0, parent=None, round=0, kind="seed", spec=spec))
        j.append(NodeEvaluated(id=0, result=result))
        j.append(RunFinished(reason="test", best=0, best_ms=result.ms))
    return run_dir, facts.name, result


@pytest.fixture(scope="module")
def op(recorded, tmp_path_factory):
    import kerngen
    from kerngen.results.export import export_run

    res = export_run(recorded[0], tmp_path_factory.mktemp("export"))
    return kerngen.load(res.dir)


def _x(seed: int = 0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(SHAPE, device="cuda", generator=g) * 3


def test_matches_reference_in_a_module_eager_and_compiled(op):
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0, device="cuda"), requires_grad=False)

        def forward(self, x):
            return op(x * self.scale) + 1.0

    net = Net()
    x = _x(1)
    want = torch.softmax(x * 2.0, dim=1) + 1.0
    torch.testing.assert_close(net(x), want, atol=1e-4, rtol=1e-4)
    compiled = torch.compile(net, fullgraph=True)
    torch.testing.assert_close(compiled(_x(1)), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled(_x(2)), torch.softmax(_x(2) * 2.0, dim=1) + 1.0, atol=1e-4, rtol=1e-4)


def test_opcheck_schema_and_fake(op):
    import torch

    torch.library.opcheck(op, (_x(3),), test_utils=("test_schema", "test_faketensor"))


def test_other_devices_and_shapes(op, recorded):
    """CPU tensors never reach the kernel (the built-in softmax runs instead, or strict mode raises);
    another shape the kernel's constraints admit runs the kernel, checked against PyTorch first."""
    import torch

    import kerngen
    from kerngen.results.exported_kernel import FallbackWarning

    x = torch.randn(8, 64)
    with pytest.warns(FallbackWarning, match="CUDA tensors only"):
        torch.testing.assert_close(op(x), torch.softmax(x, dim=1))
    small = torch.randn(16, 16, device="cuda")
    torch.testing.assert_close(op(small), torch.softmax(small, dim=1), atol=1e-4, rtol=1e-4)
    assert op.kerngen.stats.decisions["float32[16, 16]"] == "kernel of bucket 0 (an unchecked shape)"
    strict = kerngen.load(op.kerngen.dir, strict=True)
    try:
        with pytest.raises(ValueError, match="CUDA tensors only"):
            strict(x)
    finally:
        kerngen.load(op.kerngen.dir)


def test_time_within_the_recorded_spread(op, recorded):
    import torch
    import triton.testing

    _, gpu, result = recorded
    if torch.cuda.get_device_name() != gpu:
        pytest.skip(f"recorded on {gpu}, running on {torch.cuda.get_device_name()}")
    x = _x(4)
    ms = triton.testing.do_bench(lambda: op(x), warmup=25, rep=300, return_mode="median")
    t = result.timing
    assert abs(ms - t.median_ms) <= 0.10 * t.median_ms + t.iqr_ms, (
        f"exported op {ms:.4f} ms vs harness {t.median_ms:.4f} ms (IQR {t.iqr_ms:.4f})")


def test_export_dir_is_self_describing(recorded, tmp_path):
    from kerngen.results.export import export_run
    from kerngen.results.manifest import read_manifest

    res = export_run(recorded[0], tmp_path / "again")
    m = read_manifest(res.manifest)
    assert m.timing is not None and m.timing.median_ms == pytest.approx(recorded[2].timing.median_ms)
    assert Path(res.dir / m.cubin_file).is_file()
