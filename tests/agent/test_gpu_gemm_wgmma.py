"""GPU tier of the Hopper GEMM core (issue 35; sm_90 only, skipped elsewhere): the ``wgmma`` variant passes the
harness's full check (fresh inputs, 3 seeds; fp32 at atol/rtol 1e-4 and relative error 1e-5, bf16/fp16 at 1e-2) at
M, N, K that are no multiples of its tiles, batched and transposed, in bf16, fp16 and 3xTF32, with epilogues
(bias, GELU, a residual input, a triangle), at several configurations each (one and two consumers, two m64 blocks a
consumer, deeper k tiles, FLUSH 0, split-K), and on KernelBench files at their own size (bf16 copies made by
``kerngen problems --to-dtype``); its error against an fp64 product is at most twice torch's fp32 (printed with
-s, FLUSH 0 beside); plain TF32 (TERMS 1) is rejected by the fp32 check."""

from __future__ import annotations


import pytest
import torch

from kerngen.agent.playbook import explain, family_of
from kerngen.harness.evaluator import Candidate, EvalOptions
from kerngen.harness.results import Verdict
from kerngen.problems.dtype_copy import dtype_copy, dtype_copy_name
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.gpu_runs import fp64_errors, run_spec
from tests.agent.test_gemm_wgmma import gemm_problem
from tests.resources import kernelbench


def build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)

pytestmark = pytest.mark.gpu

KB = kernelbench()
CHECK = EvalOptions(seeds=3, bench=False, timeout_s=60)  # a kernel that hangs costs 60 s, not the run
# configurations beside each spec's default: every knob moved once (the ones a shape or mode refuses are skipped)
TF32_CONFIGS = [{}, {"WGM": 2, "STAGES": 2}, {"CWG": 1, "BK": 64, "STAGES": 2, "BN": 64}]
HALF_CONFIGS = [{}, {"WGM": 2, "BN": 128}, {"CWG": 1, "BK": 128, "STAGES": 2, "BN": 192}]


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        pytest.skip(f"wgmma needs sm_90 (this GPU is sm_{major}{minor})")


def _candidates(m, configs: list[dict], defaults: dict | None = None, variant: str = "wgmma") -> list[Candidate]:
    from kerngen.harness.spec import plan

    spec = build(m, variant, dict(defaults or {}))
    out = []
    for cfg in configs:
        try:
            plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)
        except Exception:  # noqa: BLE001 - a configuration this shape or mode does not admit
            continue
        out.append(Candidate(spec=spec, config=cfg))
    assert out, m.message
    return out


def _all_pass(pool, ref: ProblemRef, cands: list[Candidate]) -> None:
    results = pool.evaluate(ref, cands, CHECK)
    bad = [f"{c.spec.name} {r.config}: {r.verdict.value} {r.message}" for c, r in zip(cands, results) if not r.ok]
    assert not bad, "\n".join(bad)
    print(f"\n{ref.label()}: {len(results)} configurations pass; rel err <= {max(r.check.rel_err for r in results):.2g}")


SHAPES = [  # (source, shape, dtype): no dim a multiple of the tiles
    ("matmul", (1000, 333, 517), "float32"),  # 3xTF32: both operands through the pre-pass (B transposed)
    ("matmul", (1000, 264, 136), "bfloat16"),  # read in place (16-byte rows), B N-major
    ("matmul", (999, 333, 517), "float16"),  # padded by the pre-pass; odd N: element stores
    ("linear_gelu", (300, 200, 136), "bfloat16"),  # bias + GELU epilogue, the weight K-major
    ("linear_gelu", (513, 384, 1000), "float32"),  # the gemm family's 3xTF32 with its epilogue
]


@pytest.mark.parametrize("source, shape, dtype", SHAPES, ids=lambda v: str(v))
def test_odd_shapes_pass_at_several_configurations(pool, source, shape, dtype):
    ref = ProblemRef(source=source, shape=shape, dtype=dtype)
    m = explain(load_problem(ref))
    _all_pass(pool, ref, _candidates(m, TF32_CONFIGS if dtype == "float32" else HALF_CONFIGS))


LAYOUTS = [  # forward, inputs, dtype, init
    ("torch.bmm(A, B)", {"A": (3, 200, 136), "B": (3, 136, 72)}, "float32", "pass"),
    ("torch.bmm(A, B)", {"A": (3, 200, 136), "B": (3, 136, 72)}, "bfloat16", "pass"),
    ("A.T @ B", {"A": (136, 200), "B": (136, 96)}, "bfloat16", "pass"),  # A M-major (descriptor transpose)
    ("A.T @ B.T", {"A": (520, 200), "B": (96, 520)}, "float16", "pass"),
    ("A @ B.T", {"A": (200, 520), "B": (96, 520)}, "float32", "pass"),
    ("torch.triu(A @ B)", {"A": (300, 300), "B": (300, 300)}, "bfloat16", "pass"),
    ("torch.tril(A @ B)", {"A": (300, 300), "B": (300, 300)}, "float32", "pass"),
    ("torch.relu(self.fc(x)) * y + y", {"x": (2, 50, 136), "y": (2, 50, 200)}, "float16",
     "self.fc = nn.Linear(136, 200)"),
    ("torch.einsum('bik,kj->bij', A, B)", {"A": (4, 50, 64), "B": (64, 72)}, "bfloat16", "pass"),  # B shared
]


@pytest.mark.parametrize("forward, inputs, dtype, init", LAYOUTS, ids=lambda v: str(v)[:40])
def test_batched_transposed_masked_and_fused(pool, tmp_path, forward, inputs, dtype, init):
    p = gemm_problem(tmp_path, forward, inputs, dtype, init)
    m = explain(p)
    configs = TF32_CONFIGS[:2] if dtype == "float32" else HALF_CONFIGS[:2]
    _all_pass(pool, ProblemRef(source=str(p.path)), _candidates(m, configs))


@pytest.mark.parametrize("dtype, splits", [("float32", (4, 32)), ("bfloat16", (8, 16))])
def test_split_k_on_a_long_k(pool, dtype, splits):
    ref = ProblemRef(source="matmul", shape=(256, 200, 65000), dtype=dtype)
    m = explain(load_problem(ref))
    cands = [c for s, cfg in zip(splits, ({}, {"CWG": 1, "BN": 64})) for c in _candidates(m, [cfg], {"SPLIT_K": s})]
    _all_pass(pool, ref, cands)


KB_FILES = [("level1/3_Batched_matrix_multiplication.py", "float32"), ("level1/3_Batched_matrix_multiplication.py",
                                                                        "bfloat16"),
            ("level1/8_Matmul_with_irregular_shapes_.py", "bfloat16"), ("level1/18_Matmul_with_transposed_both.py",
                                                                         "bfloat16"),
            ("level2/86_Matmul_Divide_GELU.py", "float32"), ("level2/86_Matmul_Divide_GELU.py", "bfloat16")]


@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("name, dtype", KB_FILES)
def test_kernelbench_files_at_their_own_size(pool, tmp_path, name, dtype):
    path = KB / name
    if dtype != "float32":  # the bf16 copy kerngen problems --to-dtype makes
        path = tmp_path / dtype_copy_name(path, dtype)
        path.write_text(dtype_copy(KB / name, dtype))
    ref = ProblemRef(source=str(path))
    m = explain(load_problem(ref))
    _all_pass(pool, ref, _candidates(m, [{}]))


# ----- accuracy against fp64 -----------------------------------------------------------------------------------
def _run(spec, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
    run_spec(spec, {"A": a, "B": b, "out": out})
    return out


@pytest.mark.parametrize("source", ["matmul", "matmul_wide"])
def test_error_against_fp64_is_at_most_twice_torch_fp32(source):
    p = load_problem(ProblemRef(source=source))
    m = explain(p)
    a, b = p.make_inputs("cuda", 7)
    (torch32,) = p.run_reference(p.build_model("cuda", 7), [a, b])  # TF32 off (strict_fp32)
    exact = a.double() @ b.double()
    ours = fp64_errors(_run(build(m, "wgmma"), a, b), exact)
    theirs = fp64_errors(torch32, exact)
    print(f"\n{source} vs fp64: wgmma 3xTF32 max {ours[0]:.3g} rel {ours[1]:.3g}; torch fp32 max {theirs[0]:.3g} "
          f"rel {theirs[1]:.3g}")
    assert ours[1] <= 2 * theirs[1] and ours[0] <= 2 * theirs[0]


def test_plain_tf32_is_rejected_on_matmul_wide(pool):
    ref = ProblemRef(source="matmul_wide")
    m = explain(load_problem(ref))
    (res,) = pool.evaluate(ref, [Candidate(spec=build(m, "wgmma", {"TERMS": 1}))], CHECK)
    assert res.verdict is Verdict.incorrect, f"{res.verdict.value}: {res.message}"
    print(f"\nTERMS 1 on matmul_wide: {res.message}")
