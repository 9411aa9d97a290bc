"""GPU tier of the ``tensormap`` launch argument and ``arch_specific`` (sm_90 and later).

The kernel (tests/kernels/tma.py) loads one box per block with ``cp.async.bulk.tensor.4d`` through
the map the harness built, waits on an mbarrier and un-swizzles shared memory into the output:

- through the launcher (:class:`PlanRunner`), every swizzle, on a bf16 (2, 3, 100, 128) tensor:
  each tile equals torch's slice, and the rows of the last tile past the 100 rows are zeros (never
  the next head's rows);
- through the whole evaluation (worker process, guarded buffers, poisoned outputs): ``-x`` is
  ``ok``; a box the tensor cannot have is ``invalid_spec`` with the launcher's one line;
- the launcher's refusals of a tensor (not contiguous), and a failing encode named by its CUresult.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.errors import SpecError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.plan import resolve
from tests.kernels.gpu import OPTIONS, describe
from tests.kernels.tma import CASES, negate_spec, tile_spec

pytestmark = pytest.mark.gpu

X = (2, 3, 100, 128)
PROBLEM = Path(__file__).resolve().parent.parent / "data" / "tma_problems" / "neg_bf16.py"


def _needs_sm90():
    import torch

    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        pytest.skip(f"TMA needs sm_90 or later (this GPU is sm_{major}{minor})")


def _compiled(spec, tensors):
    from kerngen.harness.compile.compiler import compile_job, job_for
    from kerngen.harness.compile.nvrtc_info import default_arch
    from kerngen.harness.spec.kparams import check_launch_args

    plan = resolve(spec, sizes={}, tensors={n: TensorFacts(tuple(t.shape)) for n, t in tensors.items()})
    compiled = compile_job(job_for(spec, plan, default_arch()), cache=None)
    assert compiled.info.arch.endswith("a"), compiled.info.arch  # arch_specific: sm_90a on an H100
    check_launch_args(compiled.cubin, plan, compiled.info.log)
    return plan, compiled


def _run(spec, tensors):
    import torch

    from kerngen.harness.gpu.launcher import LoadedModule, PlanRunner

    plan, compiled = _compiled(spec, tensors)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        module = LoadedModule(compiled.cubin, ["tma_rows"])
        runner = PlanRunner(module, plan, tensors, stream)
        runner()
    stream.synchronize()
    return runner


@pytest.mark.parametrize("case", CASES, ids=[f"{r}x{c}_sw{s}" for r, c, s in CASES])
def test_tma_boxes_match_torch_slices_with_zeros_past_the_rows(case):
    import torch

    _needs_sm90()
    box_rows = case[0]
    tiles = -(-X[2] // box_rows)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(X, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.full((6, tiles * box_rows, X[3]), float("nan"), device="cuda", dtype=torch.bfloat16)
    runner = _run(tile_spec(*case), {"x": x, "out": out})
    expected = torch.zeros_like(out)
    expected[:, : X[2]] = x.reshape(6, X[2], X[3])
    bits, want = out.view(torch.int16), expected.view(torch.int16)
    for head in range(6):
        for tile in range(tiles):
            rows = slice(tile * box_rows, (tile + 1) * box_rows)
            assert torch.equal(bits[head, rows], want[head, rows]), (
                f"head {head} tile {tile}: {int((bits[head, rows] != want[head, rows]).sum())} elements differ")
    assert runner._tensormaps and all(m.data_ptr() % 64 == 0 and m.numel() == 128 for m in runner._tensormaps)


def test_tma_negation_passes_the_evaluation():
    from kerngen.harness.evaluator import Candidate
    from kerngen.harness.pool.local import WorkerPool
    from kerngen.harness.results import Verdict
    from kerngen.problems.ref import ProblemRef

    _needs_sm90()
    problem = ProblemRef(source=str(PROBLEM))
    good, bad = negate_spec(64, 64, 128), negate_spec(64, 48, 128)  # 128 columns are no multiple of 48
    with WorkerPool(devices=None, timeout_s=30.0) as pool:
        r_good, r_bad = pool.evaluate(problem, [Candidate(spec=good), Candidate(spec=bad)], OPTIONS)
    assert r_good.verdict is Verdict.ok, describe(r_good)
    assert r_good.compile is not None and r_good.compile.arch.endswith("a"), describe(r_good)
    assert r_bad.verdict is Verdict.invalid_spec, describe(r_bad)
    assert r_bad.message == ("launch plan: step 0: kernel 'tma_rows' argument 0: tensormap of 'x': cols 128 "
                             "(shape[-1]) is not a multiple of box_cols 48"), describe(r_bad)


def test_launcher_refuses_a_tensor_without_a_map():
    import torch

    _needs_sm90()
    x = torch.zeros((2, 3, 128, 100), device="cuda", dtype=torch.bfloat16).transpose(2, 3)  # (2, 3, 100, 128)
    out = torch.zeros((6, 128, 128), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(SpecError, match=r"^step 0: kernel 'tma_rows' argument 0: tensormap of 'x': the tensor is "
                                        r"not contiguous$"):
        _run(tile_spec(64, 64, 128), {"x": x, "out": out})


def test_a_failing_encode_is_a_spec_error_with_its_cuda_result():
    import torch

    from kerngen.harness.gpu.tensormap import TensorMapLayout, encode

    _needs_sm90()
    x = torch.zeros(X, device="cuda", dtype=torch.bfloat16)
    bad = TensorMapLayout(dtype="bfloat16", element_bytes=2, dims=(64, 100, 2, 6), strides=(256, 128, 51200),
                          box=(64, 512, 2, 1), swizzle=128)  # a box of 512 rows: past the driver's 256
    with pytest.raises(SpecError, match=r"cuTensorMapEncodeTiled failed with CUDA_ERROR_INVALID_VALUE"):
        encode(bad, x.data_ptr())
