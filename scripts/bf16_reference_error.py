"""How far PyTorch's own bf16 reference lies from the truth, and whether the exact answer passes the harness's check
against it (docs/harness-tests.md, "noticed"): conv (no bias) + eval batch norm + residual + ReLU at ResNet18's
layer3 shape in bf16, on the CPU. For each seed: the exact answer (the model in fp64, rounded to bf16) compared with
the bf16 reference by the harness's comparison at the problem's atol/rtol, and the reference's largest distance from
fp64.

    python scripts/bf16_reference_error.py [SEEDS]      # default 6; a few minutes on 2 cores
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ holds the problem-file helper the GPU test uses

from kerngen.harness.gpu.compare import compare  # noqa: E402
from kerngen.problems.load import load_problem  # noqa: E402
from kerngen.problems.ref import ProblemRef  # noqa: E402
from tests.agent.test_conv_wgmma_splitk import region_problem  # noqa: E402


def main(seeds: int = 6) -> int:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        p = region_problem(Path(tmp), 256, 256, 3, 1, 14, dtype="bfloat16")
        prob = load_problem(ProblemRef(source=str(p.path)))
        model = prob.build_model(torch.device("cpu"))
        atol, rtol = prob.info.atol, prob.info.rtol
        print(f"atol {atol}, rtol {rtol}")
        for seed in range(seeds):
            inputs = prob.make_inputs(torch.device("cpu"), 1000 + seed)
            with torch.no_grad():
                ref = prob.run_reference(model, inputs)[0]
                truth = copy.deepcopy(model).double()(*[x.double() for x in inputs])
            c = compare(truth.to(torch.bfloat16), ref, atol=atol, rtol=rtol)
            print(f"seed {1000 + seed}: exact answer {'passes' if c.ok else 'FAILS: ' + c.message[:120]}; "
                  f"max |reference - fp64| {float((ref.double() - truth).abs().max()):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 6))
