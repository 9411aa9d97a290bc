"""GPU tier of the ``conv_nd`` family: its offered kernels pass the harness's full checks on
KernelBench files at their own size (a 3-D conv, a grouped dilated strided transposed 2-D conv, a
transposed 2-D conv with an epilogue) and on an odd shape; times beside PyTorch eager (printed with -s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerngen.harness.evaluator import EvalOptions
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import offered, resized_copy

pytestmark = pytest.mark.gpu

KB = Path("/work/shared/kernelbench")
FILES = [KB / "level1" / "54_conv_standard_3D__square_input__square_kernel.py",
         KB / "level1" / "75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__.py",
         KB / "level2" / "2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py"]
ODD = (FILES[1], dict(batch_size=3, height=37, width=29))


def _run(pool, path: Path) -> None:
    ref = ProblemRef(source=str(path))
    cands = offered(ref, "conv_nd")
    base = pool.baseline(ref, budget_ms=100, with_compile=False)
    results = pool.evaluate(ref, cands, EvalOptions(seeds=3, budget_ms=100, timeout_s=600))
    bad = [f"{r.config}: {r.verdict.value} {r.message}" for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    best = min(r.timing.median_ms for r in results)
    print(f"\n{path.name}: conv_nd {best:.4f} ms; eager {base.eager.median_ms:.4f} ms "
          f"({base.eager.median_ms / best:.2f}x)")


@pytest.mark.skipif(not KB.is_dir(), reason="no KernelBench copy at /work/shared/kernelbench")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:24])
def test_kernels_pass_at_the_files_own_size(pool, path):
    _run(pool, path)


@pytest.mark.skipif(not KB.is_dir(), reason="no KernelBench copy at /work/shared/kernelbench")
def test_kernels_pass_at_an_odd_shape(pool, tmp_path):
    src, sizes = ODD
    _run(pool, resized_copy(src, tmp_path, **sizes))
