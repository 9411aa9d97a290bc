"""GPU tier: the exported op's path against its kernel (attention with TMA descriptors, softmax,
layernorm), side by side in one worker; the launch path's caches on a real GPU (descriptors built
once per pointer, no synchronisation per call); CUDA graph capture and replay; torch.compile
(fullgraph=True) of a model calling the op, at the exported shape and at another one."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

ATTENTION = (2, 4, 1024, 128)  # small enough for a quick test, the wgmma kernel's TMA path all the same
GAP_PCT = 5.0  # the op's median within this of its kernel's (the benchmark's target is 3%: docs/exported-op.md)


def _hopper() -> bool:
    import torch

    return torch.cuda.get_device_capability() == (9, 0)


def playbook_spec(tmp_path, problem: str, *args: str):
    """The playbook's kernel spec of a variant at its default configuration (`kerngen playbook -o`)."""
    from typer.testing import CliRunner

    import kerngen.cli.app
    from kerngen.harness.spec.spec import KernelSpec

    out = tmp_path / f"{problem}.json"
    res = CliRunner().invoke(kerngen.cli.app.app, ["playbook", problem, *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return KernelSpec.load(out)


def exported(tmp_path, spec, ref, name: str):
    import kerngen
    from kerngen.results.export import export_spec

    res = export_spec(spec, None, ref, tmp_path / name, name=name)
    return kerngen.load(res.dir)


def _qkv(shape=ATTENTION, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]


@pytest.mark.parametrize("problem,args", [
    ("softmax", ()),
    ("layernorm", ()),
    ("attention", ("--variant", "wgmma")),
])
def test_op_path_is_timed_beside_its_kernel(tmp_path, problem, args):
    if problem == "attention" and not _hopper():
        pytest.skip("the wgmma kernel is sm_90a")
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.problems.ref import ProblemRef

    spec = playbook_spec(tmp_path, problem, *args)
    with WorkerPool(timeout_s=300) as pool:
        t = pool.time_op(ProblemRef(source=problem), spec, budget_ms=300)
    assert t.matches, "the op's output differs from its kernel's"
    print(f"{problem}: kernel {t.kernel.median_ms:.4f} ms, op {t.op.median_ms:.4f} ms ({t.gap_pct:+.2f}%), "
          f"host {t.host_us:.0f} us a call")
    assert t.gap_pct < GAP_PCT, t.warning()


def test_descriptors_once_per_pointer_and_no_sync_per_call(tmp_path):
    if not _hopper():
        pytest.skip("the wgmma kernel is sm_90a")
    import torch
    import torch.nn.functional as F

    from kerngen.problems.ref import ProblemRef

    ref = ProblemRef(source="attention", shape=ATTENTION)
    op = exported(tmp_path, playbook_spec(tmp_path, "attention", "--shape", "x".join(map(str, ATTENTION)),
                                          "--variant", "wgmma"), ref, "attn_cache_test")
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(op(q, k, v), want, atol=1e-2, rtol=1e-2)
    cache = op.kerngen._descriptors
    assert cache.builds == 3  # q, k and v
    torch.cuda.set_sync_debug_mode("error")  # a synchronising torch call in the op would raise now
    try:
        for _ in range(20):
            op(q, k, v)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert cache.builds == 3 and op.kerngen.runtime.entries == 1
    q2 = q.clone()  # a new pointer: its descriptor is made once
    torch.testing.assert_close(op(q2, k, v), want, atol=1e-2, rtol=1e-2)
    op(q2, k, v)
    assert cache.builds == 4


def test_cuda_graph_capture_and_replay_give_the_eager_output(tmp_path):
    import torch

    from kerngen.problems.ref import ProblemRef

    if _hopper():
        shape, ref = ATTENTION, ProblemRef(source="attention", shape=ATTENTION)
        spec = playbook_spec(tmp_path, "attention", "--shape", "x".join(map(str, ATTENTION)), "--variant", "wgmma")
        make = _qkv
    else:
        shape, ref = (256, 4096), ProblemRef(source="softmax", shape=(256, 4096))
        spec = playbook_spec(tmp_path, "softmax", "--shape", "256x4096")

        def make(shape=shape, seed=0):
            g = torch.Generator(device="cuda").manual_seed(seed)
            return [torch.randn(shape, device="cuda", generator=g)]
    op = exported(tmp_path, spec, ref, "graph_test")
    static = make(shape, 1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's CUDA graph docs ask
        for _ in range(3):
            op(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*static)
    for seed in (2, 3):
        fresh = make(shape, seed)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, op(*fresh)), f"replay on set {seed} differs from an eager call"


def test_torch_compile_fullgraph_of_a_model_calling_the_op(tmp_path):
    import torch

    from kerngen.problems.ref import ProblemRef

    op = exported(tmp_path, playbook_spec(tmp_path, "softmax", "--shape", "512x4096"),
                  ProblemRef(source="softmax", shape=(512, 4096)), "compiled_test")

    class Net(torch.nn.Module):
        def forward(self, x):
            return op(torch.relu(x) * 2.0) + 1.0

    compiled = torch.compile(Net(), fullgraph=True)  # a graph break would raise
    for rows in (512, 256):  # the exported shape, then another one its constraints admit
        x = torch.randn(rows, 4096, device="cuda")
        torch.testing.assert_close(compiled(x), torch.softmax(torch.relu(x) * 2.0, dim=1) + 1.0, atol=1e-5, rtol=1e-5)
    assert op.kerngen.stats.decisions["float32[256, 4096]"].startswith("kernel of bucket 0")
    assert op.kerngen.stats.fallback_calls == 0


def test_a_loop_takes_the_prepared_path_and_gives_the_same_output(tmp_path):
    """A model loop's calls find their launches made (torch's allocator hands the same addresses out
    again), give bit-identical outputs, synchronise nothing, and work with inputs that require grad."""
    import torch

    from kerngen.problems.ref import ProblemRef

    op = exported(tmp_path, playbook_spec(tmp_path, "softmax", "--shape", "256x4096"),
                  ProblemRef(source="softmax", shape=(256, 4096)), "loop_test")
    x = torch.randn(256, 4096, device="cuda")
    first = op(x)
    torch.testing.assert_close(first, torch.softmax(x, dim=1), atol=1e-5, rtol=1e-5)
    kernel = op.kerngen._kernels[0]
    y = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            y = op(x)  # the previous output is freed once y is rebound: its address comes back
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(y, first) and kernel.binds == 1
    assert kernel.prepares <= 4, f"{kernel.prepares} launch sets made for 51 calls on the same input"
    before = kernel.prepares
    x2 = x.clone().requires_grad_()  # another address, and an input that requires grad (no autograd formula)
    assert torch.equal(op(x2), first) and kernel.prepares == before + 1
    assert op.kerngen.runtime.entries == 1


def test_a_matmul_op_on_a_users_randn_inputs_runs_its_kernel(tmp_path):
    """The first call's comparison with PyTorch judges rounding by the output's relative error: a 4096-deep fp32
    matmul of plain randn inputs (outputs ~64, ~1e-3 apart from cuBLAS in absolute terms) runs the kernel. On an
    H200 (2026-11-28) the loaded matmul fell back to PyTorch there, at 2.3x its kernel's time."""
    import torch

    from kerngen.problems.ref import ProblemRef

    op = exported(tmp_path, playbook_spec(tmp_path, "matmul"), ProblemRef(source="matmul"), "matmul_randn")
    a, b = (torch.randn(4096, 4096, device="cuda") for _ in range(2))
    want = (a.double() @ b.double()).float()
    got = op(a, b)
    rel = float((got.double() - want.double()).norm() / want.double().norm())
    print(f"matmul on randn: max abs {float((got - want).abs().max()):.3g}, relative {rel:.3g}")
    assert op.kerngen.stats.fallback_calls == 0, op.kerngen.stats.decisions
    assert rel <= 1e-5
