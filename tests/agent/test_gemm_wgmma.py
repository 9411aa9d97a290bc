"""The Hopper GEMM core (issue 35), CPU tier: which problems get the ``wgmma`` variant (matmul and gemm at fp32 as
3xTF32, the ``gemm16`` family at bf16/fp16; on sm_90 only, its idea first in round 0), the plans (the split pre-pass,
TMA descriptors of k-tile boxes over views, operands read in place or padded, batches, transposes, split-K, plain
TF32 only when asked for), the constraints on shared memory and registers, NVRTC for sm_90a of sampled
configurations with no spills and no wgmma warning from ptxas, the split arithmetic on the host, and the pre-pass
kernel on the CPU emulator. The GPU tier: test_gpu_gemm_wgmma.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, explain, family_of
from kerngen.agent.playbook.gemm.build_wgmma import PREP_KERNEL, Mode, mode_of, smem_bytes
from kerngen.agent.playbook.coverage import offer
from kerngen.agent.playbook.proposer import variant_of_spec
from kerngen.agent.playbook.render import MAX_SMEM, render
from kerngen.harness.gpu.op_runtime import _bind_launch
from kerngen.agent.proposer import SearchContext
from kerngen.errors import CompileError, SpecError
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec import plan
from kerngen.harness.spec.spec import KernelSpec
from kerngen.harness.tune.admissible import admissible, limits_for
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.agent.family_checks import forward_problem


def build(m, variant, defaults=None):
    return family_of(m).build(m, variant, defaults)

try:
    from tests.emu.runner import available as emulator_available
    from tests.emu.runner import emulate
except ImportError:  # pragma: no cover - a tree without the emulator
    emulator_available, emulate = (lambda: False), None


def gemm_problem(folder: Path, forward: str, inputs: dict[str, tuple[int, ...]], dtype: str = "float32",
                 init: str = "pass"):
    """A KernelBench-format problem of ``forward`` over inputs of those shapes, every tensor in ``dtype``."""
    return forward_problem(folder, forward, inputs, init=init, dtype=dtype, make="randn")


def _resolve(spec: KernelSpec, m, cfg: dict | None = None) -> plan.ResolvedPlan:
    return plan.resolve(spec, sizes={}, tensors=m.tensor_facts(), config=cfg)


def _admits(spec: KernelSpec, m, cfg: dict) -> bool:
    try:
        _resolve(spec, m, cfg)
    except SpecError:
        return False
    return True


def _maps(launch) -> list[tuple]:
    return [(a.name, a.box, a.full_width, a.view) for a in launch.args if a.kind == "tensormap"]


H100 = GpuFacts(name="H100", arch="sm_90")
A100 = GpuFacts(name="A100", arch="sm_80")


def _ctx(m, gpu: GpuFacts) -> SearchContext:
    return SearchContext(problem_name="p", problem_source="", problem_summary="", gpu=gpu,
                         tensors={k: list(v) for k, v in m.tensors().items()})


# ----- who gets it --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ref, family, name", [
    (ProblemRef(source="matmul"), "matmul", "playbook-matmul-wgmma"),
    (ProblemRef(source="linear_gelu", dtype="float32"), "gemm", "playbook-gemm-wgmma"),
    (ProblemRef(source="linear_gelu"), "gemm16", "playbook-gemm16-wgmma"),  # bf16 by default
    (ProblemRef(source="matmul", dtype="float16"), "gemm16", "playbook-gemm16-wgmma"),
])
def test_on_hopper_its_idea_comes_first_and_elsewhere_it_is_not_offered(ref, family, name):
    prop = PlaybookProposer(load_problem(ref))
    assert prop.match is not None and prop.match.family == family
    (first,) = prop.ideas(_ctx(prop.match, H100), None, 1)
    (branch, *_) = prop.implement(_ctx(prop.match, H100), None, first, 1)
    assert branch.spec.name == name and branch.spec.arch_specific and variant_of_spec(branch.spec) == "wgmma"
    fresh = PlaybookProposer(load_problem(ref))
    ideas = fresh.ideas(_ctx(fresh.match, A100), None, 20)
    assert all(fresh._by_text[i.text].variant != "wgmma" for i in ideas)
    off = offer(prop.match, sizes={}, tensors=prop.match.tensor_facts(), gpu=limits_for("sm_80"))
    assert "a Hopper kernel (sm_90a: wgmma, TMA), not offered for sm_80" in off.why_not("wgmma")
    if family == "gemm16":  # no other kernel for 16-bit GEMMs: nothing to offer off Hopper, and why
        assert not off.offered and "not offered for sm_80" in off.reason


def test_16bit_gemms_of_every_layout_are_the_gemm16_familys(tmp_path):
    cases = {  # forward, inputs -> (operands MN-major, batched)
        ("A @ B", (("A", (64, 40)), ("B", (40, 48)))): ((False, True), (False, False)),
        ("A.T @ B.T", (("A", (40, 64)), ("B", (48, 40)))): ((True, False), (False, False)),
        ("torch.bmm(A, B)", (("A", (3, 64, 40)), ("B", (3, 40, 48)))): ((False, True), (True, True)),
        ("torch.triu(A @ B)", (("A", (64, 64)), ("B", (64, 64)))): ((False, True), (False, False)),
    }
    for (forward, inputs), (mn, batched) in cases.items():
        m = explain(gemm_problem(tmp_path, forward, dict(inputs), "bfloat16"))
        assert m.family == "gemm16" and m.facts.dtype == "bfloat16", forward
        spec = build(m, "wgmma")
        assert spec.defines["A_BATCHED"] == batched[0] and spec.defines["B_BATCHED"] == batched[1]
        assert "m64n256k16.f32.bf16.bf16" in spec.source and f", 1, 1, {int(mn[0])}, {int(mn[1])};" in spec.source
    triu = explain(gemm_problem(tmp_path, "torch.triu(A @ B)", {"A": (64, 64), "B": (64, 64)}, "float16"))
    assert "if (c - r < DIAG) v = 0.f;" in build(triu, "wgmma").source


# ----- plans ----------------------------------------------------------------------------------------------------
def test_the_3xtf32_plan_splits_both_operands_into_k_major_planes():
    m = explain(load_problem("matmul"))  # fp32 4096^3
    spec = build(m, "wgmma")
    assert spec.default_config() == {"BN": 128, "WGM": 1, "CWG": 2, "BK": 32, "STAGES": 3, "GROUP_M": 8, "CTAS": 132,
                                     "FLUSH": 1, "TERMS": 3}
    r = _resolve(spec, m)
    prep_a, prep_b, main = r.launches
    assert [s.size for s in r.scratch] == [2 * 4096 * 4096] * 2 and {s.dtype for s in r.scratch} == {"float32"}
    assert prep_a.grid == (128, 128, 1) and prep_a.block == (32, 8, 1) and prep_a.args[-1].value == 0  # A: K-major
    assert prep_b.args[-1].value == 1  # B (K, N) is transposed into [N][K]
    assert main.grid == (132, 1, 1) and main.block == (384, 1, 1)
    assert main.shared_mem == 1024 + 3 * 2 * (128 + 128) * 32 * 4 + 48 == smem_bytes(spec.default_config(), Mode.tf32x3)
    assert _maps(main) == [("a_prep", (128, 32), False, (2, 4096, 4096)), ("b_prep", (128, 32), False, (2, 4096, 4096))]
    for instr in ("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "cp.async.bulk.tensor.3d",
                  "setmaxnreg.inc.sync.aligned", "cvt.rna.tf32.f32", "mbarrier.try_wait.parity"):
        assert instr in spec.source
    # small terms first, then big * big, every k8 step
    assert spec.source.index("gw_desc_a(sa + GW_A_TILE, blk, kk), gw_desc_b(sb, kk)") < \
        spec.source.index("gw_desc_a(sa, blk, kk), gw_desc_b(sb + GW_B_TILE, kk)") < \
        spec.source.index("gw_desc_a(sa, blk, kk), gw_desc_b(sb, kk), 1)")


def test_the_exported_op_binds_the_planes_view_and_the_k_tile_box():
    """The op a user loads builds its descriptors from what the plan says: the scratch planes seen as
    (2, M, K) with one k tile per box, as the harness's launcher does (the export of a 3xTF32 matmul once
    failed: its 1-D scratch given to TMA as it is)."""
    m = explain(load_problem("matmul"))
    main = _resolve(build(m, "wgmma"), m).launches[-1]
    names = {a.name: i for i, a in enumerate(main.args) if a.kind in ("tensor", "tensormap")}
    maps = _bind_launch("fn", main, names, 0)[6]
    assert [(box.rows, box.cols, box.full_width, box.view) for _, _, box in maps] == \
        [(128, 32, False, (2, 4096, 4096))] * 2


def test_plain_tf32_only_when_asked_for():
    m = explain(load_problem(ProblemRef(source="matmul", shape=(256, 128, 100))))
    spec = build(m, "wgmma", {"TERMS": 1})
    assert spec.tunables["TERMS"] == [1] and "GW_PLANES 1" in spec.source and "gw_tf32(v - big)" not in spec.source
    assert [s.size for s in _resolve(spec, m).scratch] == [256 * 100, 128 * 100]  # one plane, K 100 already padded
    bf = explain(load_problem(ProblemRef(source="matmul", shape=(256, 128, 100), dtype="bfloat16")))
    with pytest.raises(ValueError, match="TERMS 1"):
        build(bf, "wgmma", {"TERMS": 1})


def test_16bit_operands_are_read_in_place_when_their_rows_are_whole_16_bytes():
    m = explain(load_problem(ProblemRef(source="matmul", dtype="bfloat16")))
    spec = build(m, "wgmma")
    r = _resolve(spec, m)
    (main,) = r.launches
    assert not r.scratch and main.block == (384, 1, 1) and main.shared_mem == 1024 + 4 * (128 + 256) * 64 * 2 + 64
    # A (M, K) K-major: boxes of 128 rows x 64 k; B (K, N) N-major: boxes of 64 k x 64 columns
    assert _maps(main) == [("A", (128, 64), False, (1, 4096, 4096)), ("B", (64, 64), False, (1, 4096, 4096))]
    assert ", 1, 1, 0, 1;" in spec.source  # B transposed in its descriptor
    # rows of 517 or 333 bf16 are not whole 16 bytes: those operands go through the pre-pass (padded, K-major)
    odd = explain(load_problem(ProblemRef(source="matmul", shape=(1000, 333, 517), dtype="bfloat16")))
    spec = build(odd, "wgmma")
    r = _resolve(spec, odd)
    assert [launch.kernel for launch in r.launches] == [PREP_KERNEL, PREP_KERNEL, "gemm_wgmma"]
    assert [(s.size, s.dtype) for s in r.scratch] == [(1000 * 520, "bfloat16"), (333 * 520, "bfloat16")]
    assert _maps(r.launches[2]) == [("a_prep", (128, 64), False, (1, 1000, 520)),
                                    ("b_prep", (256, 64), False, (1, 333, 520))]
    assert ", 1, 1, 0, 0;" in spec.source
    # a spec made for aligned rows refuses shapes without them
    with pytest.raises(SpecError, match="% 8 == 0"):
        plan.resolve(build(m, "wgmma"), sizes={}, tensors=odd.tensor_facts())


def test_linear_epilogue_and_batches_in_fp16(tmp_path):
    p = gemm_problem(tmp_path, "torch.relu(self.fc(x)) * y + y", {"x": (2, 50, 136), "y": (2, 50, 200)}, "float16",
                     init="self.fc = nn.Linear(136, 200)")
    m = explain(p)
    spec = build(m, "wgmma")
    (main,) = _resolve(spec, m).launches
    # x's leading dims flatten into 100 rows; the weight (N, K) is K-major; bias and the residual y follow
    assert _maps(main) == [("x", (128, 64), False, (1, 100, 136)), ("fc.weight", (256, 64), False, (1, 200, 136))]
    assert [a.name for a in main.args[2:5]] == ["fc.bias", "y", "out"]
    assert "v += bias[c];" in spec.source and "ep0[idx]" in spec.source and "cvt.rn.f16.f32" in spec.source
    b = explain(gemm_problem(tmp_path, "torch.bmm(A, B)", {"A": (3, 100, 64), "B": (3, 64, 72)}, "float16"))
    (main,) = _resolve(build(b, "wgmma"), b).launches
    assert _maps(main) == [("A", (128, 64), False, (3, 100, 64)), ("B", (64, 64), False, (3, 64, 72))]


def test_split_k_where_the_output_has_few_tiles():
    m = explain(load_problem(ProblemRef(source="matmul", shape=(256, 256, 65536))))
    spec = build(m, "wgmma", {"SPLIT_K": 8})
    r = _resolve(spec, m)
    assert [launch.kernel for launch in r.launches] == [PREP_KERNEL, PREP_KERNEL, "gemm_wgmma", "gemm_wgmma_sum"]
    assert r.launches[2].grid == (2 * 2 * 8, 1, 1)  # 2 x 2 tiles of 128 x 128, 8 slices each
    assert r.scratch[-1].name == "partials" and r.scratch[-1].size == 8 * 256 * 256
    big = explain(load_problem("matmul"))
    assert not _admits(build(big, "wgmma", {"SPLIT_K": 8}), big, {})  # 1024 tiles fill the GPU


# ----- constraints ------------------------------------------------------------------------------------------------
def test_constraints_bound_shared_memory_and_registers():
    fp32 = explain(load_problem("matmul"))
    spec = build(fp32, "wgmma")
    assert spec.tunables["FLUSH"] == [1]  # fp32 at 1e-4: never without FLUSH (it failed the check on an H200)
    assert not _admits(spec, fp32, {"FLUSH": 0, "BN": 256, "STAGES": 2})
    assert _admits(spec, fp32, {"BN": 128, "STAGES": 2})  # 2 x 64 KB... within 227 KB; 2 x 64 + 40 registers
    assert not _admits(spec, fp32, {"STAGES": 4})  # 4 x 64 KB > 227 KB
    assert not _admits(spec, fp32, {"BN": 256})  # FLUSH: 2 x 128 accumulators
    assert not _admits(spec, fp32, {"WGM": 2, "BN": 256, "FLUSH": 0})  # 256 accumulators
    assert _admits(spec, fp32, {"CWG": 1, "BN": 192})  # one consumer keeps 255 registers: 2 x 96 + 40
    bf16 = explain(load_problem(ProblemRef(source="matmul", dtype="bfloat16")))
    spec16 = build(bf16, "wgmma")
    assert _admits(spec16, bf16, {"WGM": 2, "BN": 128}) and not _admits(spec16, bf16, {"STAGES": 5})
    assert spec16.tunables["FLUSH"] == [0] and spec16.tunables["BK"] == [64, 128]
    for m, s, mode in ((fp32, spec, Mode.tf32x3), (bf16, spec16, Mode.bf16)):
        counted = admissible(s, sizes={}, tensors=m.tensor_facts(), gpu=limits_for("sm_90"))
        assert counted.count > 100
        for cfg in counted.configs:
            full = s.full_config(cfg)
            assert smem_bytes(full, mode) <= MAX_SMEM
            regs = full["WGM"] * full["BN"] // 2 * (1 + full["FLUSH"]) + 40
            assert regs <= (232 if full["CWG"] == 2 else 255)


# ----- NVRTC for sm_90a -------------------------------------------------------------------------------------------
COMPILED = {  # problem -> sampled configurations: defaults, each knob moved, the register-tightest ones
    ("matmul", None, "float32"): [{}, {"BN": 128, "STAGES": 2}, {"WGM": 2, "BN": 64, "STAGES": 2},
                                  {"CWG": 1, "BN": 192}, {"BK": 64, "STAGES": 2, "BN": 64}, {"TERMS": 1}],
    ("matmul", None, "bfloat16"): [{}, {"WGM": 2, "BN": 128}, {"CWG": 1, "WGM": 2, "BN": 192, "STAGES": 3},
                                   {"BN": 192, "BK": 128, "STAGES": 2}, {"BN": 64, "STAGES": 6}],
    ("linear_gelu", (300, 200, 136), "float16"): [{}, {"BN": 128, "WGM": 2}],
    ("matmul", (256, 256, 8192), "bfloat16"): [{"SPLIT_K": 4}],
    ("matmul", (1000, 333, 517), "float32"): [{"SPLIT_K": 2}],
}


@pytest.mark.parametrize("key", list(COMPILED), ids=lambda k: f"{k[0]}-{k[2]}-{k[1]}")
def test_it_compiles_for_sm90a_without_spills_or_wgmma_warnings(key):
    source, shape, dtype = key
    m = explain(load_problem(ProblemRef(source=source, shape=shape, dtype=dtype)))
    for cfg in COMPILED[key]:
        defaults = {k: v for k, v in cfg.items() if k in ("SPLIT_K", "TERMS")}
        spec = build(m, "wgmma", defaults)
        job = job_for(spec, _resolve(spec, m, {k: v for k, v in cfg.items() if k not in defaults}), "sm_90")
        assert job.arch == "sm_90a"
        got = compile_job(job, cache=None)
        for name, res in got.info.kernels.items():
            assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_bytes == 0, (cfg, name, res)
        log = got.info.log
        for warning in ("C7510", "C7512", "C7515", "C7517", "serialized", "warpgroup.wait is injected"):
            assert warning not in log, (cfg, log[-800:])


def test_it_does_not_compile_for_a_gpu_without_wgmma():
    m = explain(load_problem(ProblemRef(source="matmul", shape=(256, 256, 256), dtype="bfloat16")))
    spec = build(m, "wgmma")
    with pytest.raises(CompileError):
        compile_job(job_for(spec, _resolve(spec, m), "sm_80"), cache=None)


# ----- the split arithmetic ---------------------------------------------------------------------------------------
def tf32_rna(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 of finite fp32 values: round to 10 mantissa bits, ties away from zero."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    big = tf32_rna(x)
    return big, tf32_rna((x - big).astype(np.float32))


def test_the_split_keeps_fp32_and_one_term_does_not():
    rng = np.random.default_rng(35)
    x = np.concatenate([rng.standard_normal(100_000), 10.0 ** rng.uniform(-30, 30, 10_000),
                        [1.0, -1.0, 2 ** -126, 3.4e38, 1 + 2 ** -11, 1 + 3 * 2 ** -12]]).astype(np.float32)
    big, small = split(x)
    assert not (big.view(np.uint32) & 0x1FFF).any() and not (small.view(np.uint32) & 0x1FFF).any()
    rest = np.abs(x.astype(np.float64) - big - small)
    assert (rest <= 2.0 ** -21 * np.abs(x.astype(np.float64))).all()  # the residue: ~2^-22 |x|
    assert np.abs(x.astype(np.float64) - big).max() / np.abs(x).max() > 2.0 ** -13  # one term alone: ~2^-12 |x|
    # the three products of a K = 4096 dot product against fp64 (exact products, no accumulation rounding)
    a, b = rng.standard_normal((2, 64, 4096)).astype(np.float32)
    (ab, as_), (bb, bs) = split(a), split(b)
    exact = (a.astype(np.float64) * b).sum(1)
    scale = np.abs(a.astype(np.float64) * b).sum(1)
    three = (as_.astype(np.float64) * bb + ab.astype(np.float64) * bs + ab.astype(np.float64) * bb).sum(1)
    one = (ab.astype(np.float64) * bb).sum(1)
    assert (np.abs(three - exact) / scale).max() < 2e-7 < 1e-5 < (np.abs(one - exact) / scale).max()


@pytest.mark.skipif(not emulator_available(), reason="no C++ compiler (g++) for the CPU emulator")
@pytest.mark.parametrize("mode, trans", [("tf32x3", 0), ("tf32x3", 1), ("tf32", 1), ("bf16", 1)])
def test_the_pre_pass_on_the_cpu_emulator(mode, trans):
    """The pre-pass kernel (the template's own text) writes big + small planes K-major, rows padded with zeros."""
    outer, rows, k = 2, 37, 70
    kp = -(-k // (8 if mode == "bf16" else 4)) * (8 if mode == "bf16" else 4)
    planes = 2 if mode == "tf32x3" else 1
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    src = torch.randn((outer, k, rows) if trans else (outer, rows, k)).to(dtype)
    dst = torch.full((planes * outer * rows * kp,), float("nan"), dtype=dtype)
    i32 = [{"kind": "int32", "value": v} for v in (rows, k, kp, outer, trans)]
    spec = KernelSpec(source=render("_gemm_wgmma_prep.cuh.j2", mode=mode, prep_kernel=PREP_KERNEL),
                      steps=[dict(kernel=PREP_KERNEL, grid=[-(-kp // 32), -(-rows // 32), outer], block=[32, 8],
                                  args=[{"name": "src"}, {"name": "dst"}, *i32])])
    emulate(spec, {"src": src, "dst": dst})
    want = (src.transpose(1, 2) if trans else src).float().contiguous()
    want = torch.nn.functional.pad(want, (0, kp - k)).numpy()
    got = dst.float().view(planes, outer, rows, kp).numpy()
    if mode == "bf16":
        assert np.array_equal(got[0], want)
        return
    big, small = split(want)
    assert np.array_equal(got[0], big) and (planes == 1 or np.array_equal(got[1], small))
    assert not got[0][..., k:].any()
    assert mode_of("float32", 1 if mode == "tf32" else 3).value == mode
