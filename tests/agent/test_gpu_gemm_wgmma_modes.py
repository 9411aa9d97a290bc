"""GPU tier of the Hopper GEMM core's ping-pong consumers (PINGPONG), thread-block clusters with TMA multicast
(CLUSTER) and the shared-memory staged epilogue (EPI_SMEM) (sm_90 only, skipped elsewhere): the harness's full check (fresh inputs, 3 seeds) at M, N, K that are no
multiples of the tiles, batched and transposed, in bf16, fp16 and 3xTF32, with epilogues (bias, GELU, a residual, a
triangle) and split-K, each mode alone and both together, at a few configurations each; and the launcher refusing a
plan whose cluster is not the kernel's own ``__cluster_dims__``. The CPU tier: test_gemm_wgmma_modes.py."""

from __future__ import annotations

import pytest
import torch

from kerngen.agent.playbook import explain
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.gpu.launcher import LaunchRefused, LoadedModule, check_cluster
from kerngen.harness.spec import plan
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.test_gemm_wgmma import gemm_problem
from tests.agent.test_gpu_gemm_wgmma import _all_pass, _candidates, build

pytestmark = pytest.mark.gpu

MODES = [{"PINGPONG": 1}, {"CLUSTER": 2}, {"PINGPONG": 1, "CLUSTER": 2}]
# beside each mode's default: the other value of the knobs (the cooperative / single-block kernel of the same source)
# and a reshaped tile; the ones a shape or mode refuses are skipped
CONFIGS = [{}, {"PINGPONG": 0}, {"CLUSTER": 1}, {"WGM": 2, "BN": 128}]


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        pytest.skip(f"wgmma needs sm_90 (this GPU is sm_{major}{minor})")


def _mode_candidates(m, modes=MODES, configs=CONFIGS, extra: dict | None = None):
    out = []
    for mode in modes:
        out += _candidates(m, [c for c in configs if set(c) <= {"WGM", "BN", "STAGES"} or set(c) & set(mode)],
                           {**mode, **(extra or {})})
    return out


SHAPES = [
    ("matmul", (1000, 333, 517), "float32"),  # 3xTF32: both operands through the pre-pass
    ("matmul", (1000, 264, 136), "bfloat16"),  # read in place, B N-major (multicast boxes split between blocks)
    ("matmul", (999, 333, 517), "float16"),  # padded by the pre-pass; odd M: a cluster's second tile partly outside
    ("linear_gelu", (300, 200, 136), "bfloat16"),  # bias + GELU epilogue
    ("linear_gelu", (513, 384, 1000), "float32"),
]


@pytest.mark.parametrize("source, shape, dtype", SHAPES, ids=lambda v: str(v))
def test_odd_shapes_pass_in_every_mode(pool, source, shape, dtype):
    ref = ProblemRef(source=source, shape=shape, dtype=dtype)
    _all_pass(pool, ref, _mode_candidates(explain(load_problem(ref))))


LAYOUTS = [
    ("torch.bmm(A, B)", {"A": (3, 200, 136), "B": (3, 136, 72)}, "bfloat16", "pass"),
    ("torch.bmm(A, B)", {"A": (3, 200, 136), "B": (3, 136, 72)}, "float32", "pass"),
    ("A.T @ B", {"A": (136, 200), "B": (136, 96)}, "float16", "pass"),
    ("A @ B.T", {"A": (200, 520), "B": (96, 520)}, "float32", "pass"),
    ("torch.triu(A @ B)", {"A": (300, 300), "B": (300, 300)}, "bfloat16", "pass"),
    ("torch.relu(self.fc(x)) * y + y", {"x": (2, 50, 136), "y": (2, 50, 200)}, "bfloat16",
     "self.fc = nn.Linear(136, 200)"),
]


@pytest.mark.parametrize("forward, inputs, dtype, init", LAYOUTS, ids=lambda v: str(v)[:40])
def test_batched_transposed_masked_and_fused(pool, tmp_path, forward, inputs, dtype, init):
    p = gemm_problem(tmp_path, forward, inputs, dtype, init)
    _all_pass(pool, ProblemRef(source=str(p.path)), _mode_candidates(explain(p), configs=[{}]))


# EPI_SMEM: the stores staged through shared memory; N a multiple of a 16-byte piece (its constraint), M and K odd, the
# row tail of the last tile partly outside, BN 192 (three 64-column pieces), cooperative and ping-pong consumers
STAGED = [
    ("matmul", (1000, 264, 136), "bfloat16"),
    ("matmul", (999, 328, 517), "float16"),  # odd M: 16-row warp slices partly below M
    ("linear_gelu", (300, 200, 136), "bfloat16"),  # bias + GELU; N 200: the last 64-column piece partly past N
    ("linear_gelu", (513, 388, 1000), "float32"),  # 3xTF32, fp32 pieces of 4 outputs
]


@pytest.mark.parametrize("source, shape, dtype", STAGED, ids=lambda v: str(v))
def test_the_staged_epilogue_passes(pool, source, shape, dtype):
    ref = ProblemRef(source=source, shape=shape, dtype=dtype)
    configs = [{}, {"STAGES": 2}, {"WGM": 2, "BN": 128, "STAGES": 2}, {"BN": 192, "STAGES": 2}]
    _all_pass(pool, ref, _mode_candidates(explain(load_problem(ref)), [{"EPI_SMEM": 1}, {"EPI_SMEM": 1, "PINGPONG": 1}],
                                          configs))


def test_the_staged_epilogue_with_a_residual_and_batches(pool, tmp_path):
    p = gemm_problem(tmp_path, "torch.relu(self.fc(x)) * y + y", {"x": (2, 50, 136), "y": (2, 50, 200)}, "bfloat16",
                     "self.fc = nn.Linear(136, 200)")
    _all_pass(pool, ProblemRef(source=str(p.path)), _mode_candidates(explain(p), [{"EPI_SMEM": 1}], [{}, {"BN": 64}]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_split_k_on_a_long_k(pool, dtype):
    ref = ProblemRef(source="matmul", shape=(256, 200, 65000), dtype=dtype)
    m = explain(load_problem(ref))
    _all_pass(pool, ref, _mode_candidates(m, configs=[{}], extra={"SPLIT_K": 8}))


def test_the_launcher_refuses_a_cluster_the_kernel_does_not_declare():
    m = explain(load_problem(ProblemRef(source="matmul", shape=(1000, 264, 136), dtype="bfloat16")))
    for defaults, plan_cluster, ok in (({"CLUSTER": 2}, None, True), ({}, 2, False)):
        spec = build(m, "wgmma", defaults)
        resolved = plan.resolve(spec, sizes={}, tensors=m.tensor_facts())
        compiled = compile_job(job_for(spec, resolved, "sm_90"), cache=None)
        step = resolved.launches[-1]
        if plan_cluster is not None:
            step = step.model_copy(update={"cluster": plan_cluster})
        fn = LoadedModule(compiled.cubin, [step.kernel]).function(step.kernel, step.shared_mem)
        if ok:
            check_cluster(fn, step)
        else:
            with pytest.raises(LaunchRefused, match="the plan says cluster 2, the kernel declares __cluster_dims__ "
                                                    "width 1"):
                check_cluster(fn, step)
