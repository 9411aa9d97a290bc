"""GPU tier of the ``conv_nd`` family: its offered kernels (the direct one everywhere, the 3xTF32 implicit
GEMM on 3-D convs and stride-1 transposed ones) pass the harness's full checks on KernelBench files at
their own size (a 3-D conv, a grouped dilated strided transposed 2-D conv, a transposed 2-D conv with an
epilogue, stride-1 transposed 2-D and 3-D convs) and on odd shapes; each variant's time beside PyTorch
eager (printed with -s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.harness.evaluator import EvalOptions
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import offered, resized_copy
from tests.resources import kernelbench

pytestmark = pytest.mark.gpu

KB = kernelbench()
FILES = [KB / "level1" / "54_conv_standard_3D__square_input__square_kernel.py",
         KB / "level1" / "75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__.py",
         KB / "level2" / "2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py",
         KB / "level1" / "65_conv_transposed_2D__square_input__asymmetric_kernel.py",
         KB / "level1" / "61_conv_transposed_3D__square_input__square_kernel.py"]
ODDS = [(FILES[1], dict(batch_size=3, height=37, width=29)),
        (FILES[4], dict(batch_size=3, in_channels=5, out_channels=7, depth=9, height=13, width=11))]


def _run(pool, path: Path) -> None:
    ref = ProblemRef(source=str(path))
    cands = offered(ref, "conv_nd")
    base = pool.baseline(ref, budget_ms=100, with_compile=False)
    results = pool.evaluate(ref, cands, EvalOptions(seeds=3, budget_ms=100, timeout_s=600))
    bad = [f"{r.config}: {r.verdict.value} {r.message}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    times = "; ".join(f"{variant_of_spec(c.spec)} {r.timing.median_ms:.4f} ms ({base.eager.median_ms / r.timing.median_ms:.2f}x)"
                      for c, r in zip(cands, results))
    print(f"\n{path.name}: eager {base.eager.median_ms:.4f} ms; {times}")


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:24])
def test_kernels_pass_at_the_files_own_size(pool, path):
    _run(pool, path)


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("odd", ODDS, ids=lambda o: o[0].name[:24])
def test_kernels_pass_at_an_odd_shape(pool, tmp_path, odd):
    src, sizes = odd
    _run(pool, resized_copy(src, tmp_path, **sizes))
