"""The built-in ``conv2d`` and ``matmul`` families' kernels are conv_epi's and the gemm family's (issue 40's fold). At
the built-ins' shapes and defaults they compile to what main's former templates (conv2d_direct.cu.j2,
conv2d_igemm.cu.j2, sgemm.cu.j2; their specs as main 3bec180 offered them are in data/playbook/fold_before.json.gz)
compiled to: the conv kernels to the same machine code (conv2d_wide's, and level 1's 55 at the family's own default
tile), the tiled GEMM to no more registers than keep 4 blocks of 128 threads on an SM (sgemm's 126; the first fold's
145 kept 3). On the CPU emulator the tiled GEMM's float4 and scalar stores and its loaders are right at aligned,
unaligned and edge shapes, and wrong when broken."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kerngen.agent.playbook import PlaybookProposer, explain, family_of
from kerngen.harness.compile.compiler import compile_job, job_for
from kerngen.harness.compile.cubin import read_cubin
from kerngen.harness.results import GpuFacts
from kerngen.harness.spec.plan import resolve
from kerngen.harness.spec.spec import KernelSpec
from kerngen.problems.load import load_problem
from kerngen.problems.ref import ProblemRef
from tests.emu import cases
from tests.agent.family_checks import resized_copy
from tests.emu.runner import emulate
from tests.resources import kernelbench

BEFORE = {k: KernelSpec.model_validate(v) for k, v in json.loads(gzip.decompress(
    (Path(__file__).parent.parent / "data" / "playbook" / "fold_before.json.gz").read_bytes())).items()}


def _compiled(spec: KernelSpec, problem) -> tuple[dict[str, bytes], dict]:
    """Each kernel's machine code (its ``.text`` section) and ptxas figures, at the spec's defaults, for sm_90."""
    plan = resolve(spec, sizes=dict(problem.info.sizes), tensors=problem.info.tensor_facts(), config=dict(spec.defaults))
    got = compile_job(job_for(spec, plan, "sm_90"), cache=None)
    text = {s.name.removeprefix(".text."): got.cubin[s.offset:s.offset + s.size]
            for s in read_cubin(got.cubin).sections if s.name.startswith(".text.")}
    return text, got.info.kernels


def _now(name: str, variant: str):
    problem = load_problem(str(kernelbench(name)) if name.endswith(".py") else ProblemRef(source=name))
    return problem, PlaybookProposer(problem).offer.get(variant).spec


L1_55 = "level1/55_conv_standard_2D__asymmetric_input__square_kernel.py"  # 128 channels: the family's BN 64, not 128
CONV2D = [("conv2d_wide", "direct", "conv2d_direct", "conv_epi_direct"),
          ("conv2d_wide", "igemm", "conv2d_igemm", "conv_epi_igemm"),
          pytest.param(L1_55, "igemm", "conv2d_igemm", "conv_epi_igemm", marks=pytest.mark.needs_kernelbench)]


@pytest.mark.parametrize("name, variant, old_kernel, new_kernel", CONV2D,
                         ids=["conv2d_wide-direct", "conv2d_wide-igemm", "level1_55-igemm"])
def test_conv2d_kernels_compile_to_the_former_machine_code(name, variant, old_kernel, new_kernel):
    # conv2d_wide's chosen kernel is igemm (conv2d's shape and defaults are the same); the pack step of igemm is
    # conv_epi's own (groups), a kernel of a few dozen instructions per weight
    problem, new = _now(name, variant)
    old_text, _ = _compiled(BEFORE[f"{name}|{variant}"], problem)
    new_text, _ = _compiled(new, problem)
    assert len(new_text[new_kernel]) > 4096 and new_text[new_kernel] == old_text[old_kernel], \
        "the kernel compiles to other code than main's conv2d template: time it against main's (i40q.sh) first"


def _blocks_per_sm(registers: int, threads: int) -> int:
    return 65536 // (-(-registers // 8) * 8 * threads)  # registers are allocated 8 per thread at a time


def test_the_tiled_matmul_keeps_the_former_occupancy():
    problem, new = _now("matmul", "tiled")
    _, old_res = _compiled(BEFORE["matmul|tiled"], problem)
    _, new_res = _compiled(new, problem)
    old, now = old_res["sgemm_tiled"], new_res["gemm_tiled"]
    assert now.spill_stores == now.spill_loads == 0
    assert _blocks_per_sm(now.registers, 128) >= _blocks_per_sm(old.registers, 128) == 4, (old, now)


# ----- the tiled GEMM's stores and loaders on the emulator ---------------------------------------------------------
TILED = [  # (M, N, K), config: which store and load paths each exercises
    ((128, 256, 32), None),  # every tile whole (EVEN), N % 4 == 0: float4 stores, B by cp.async, no predication
    ((100, 72, 36), None),  # edges predicated, float4 stores of whole quads
    ((70, 128, 33), {"BM": 32, "BN": 32, "TM": 4, "TN": 4}),  # M and K edges, rows of A unaligned (register loads)
    ((65, 130, 20), None),  # N % 4 != 0: one float at a time, element loads, no cp.async
]


def _emulate_tiled(shape, config, edit=None) -> dict[str, str]:
    problem = cases.load("matmul", shape)
    m = explain(problem)
    spec = family_of(m).build(m, "tiled")
    if edit is not None:
        assert spec.source.count(edit[0]) == 1, edit[0]
        spec = spec.model_copy(update={"source": spec.source.replace(*edit)})
    case = cases.make_case(problem)
    emulate(spec, case.tensors, config=config, sizes=case.sizes)
    return cases.mismatches(case)


@pytest.mark.needs_cxx
@pytest.mark.parametrize("shape, config", TILED, ids=["whole-tiles", "edges", "small-tile", "unaligned-N"])
def test_the_tiled_matmul_matches_pytorch(shape, config):
    assert _emulate_tiled(shape, config) == {}


BROKEN = [  # (shape, config, the edit): each must be a mismatch
    ((128, 256, 32), None, ("make_float4(o[0], o[1], o[2], o[3])", "make_float4(o[0], o[1], o[3], o[2])")),
    ((100, 72, 36), None, ("for (int j0 = 0; j0 < TN; j0 += C_W)", "for (int j0 = 0; j0 < TN - C_W; j0 += C_W)")),
    ((65, 130, 20), None, ("crow[n0 + COL_OF(j0)] = o[0];", "crow[n0 + COL_OF(j0)] = o[0] * (r != 64);")),
    ((128, 256, 32), None, ("const float *p = p0 + u * QSTEP(COLS) * ld;", "const float *p = p0 + u * QSTEP(COLS);")),
    # B by cp.async in the double buffer: its copies committed as soon as issued, waited for after the FFMAs
    ((128, 256, 32), None, ("#define CP_LANDED() cp_wait<0>()", "#define CP_LANDED()")),
]


@pytest.mark.needs_cxx
@pytest.mark.parametrize("shape, config, edit", BROKEN, ids=["float4-order", "last-quad", "scalar-row", "loader-rows", "cp.async-wait"])
def test_a_broken_store_or_loader_is_a_mismatch(shape, config, edit):
    assert list(_emulate_tiled(shape, config, edit)) == ["out"]


# ----- where no tile divides the shape, the tiled kernel is the fallback (the former "simple" GEMM) -----------------
H200 = GpuFacts(name="NVIDIA H200", arch="sm_90", sm_count=132, max_shared_per_block_optin=232448, shared_per_sm=233472,
                mem_bytes=150 * 2**30)  # what a worker reports of an H200


@pytest.mark.parametrize("gpu", [None, H200], ids=["sm_90-limits", "H200"])
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (1001, 998, 999)], ids=["1000^3", "1001x998x999"])
def test_the_tiled_matmul_is_offered_where_no_tile_divides(shape, gpu):
    # tests/agent/test_gpu_fold_parity.py takes this offer; main offered "simple" here and "tiled" not at all (a GPU
    # run that imported main's kerngen.agent failed on exactly that)
    prop = PlaybookProposer(load_problem(ProblemRef(source="matmul", shape=shape)), gpu=gpu)
    tiled = prop.offer.get("tiled")
    assert tiled is not None, prop.offer.why_not("tiled")
    assert "simple" not in [v.variant for v in prop.offer.variants]
    plan = resolve(tiled.spec, sizes={}, tensors=load_problem(ProblemRef(source="matmul", shape=shape)).info.tensor_facts(),
                   config=dict(tiled.spec.defaults))
    assert plan.defines["EVEN"] == 0


@pytest.mark.needs_kernelbench
def test_the_tiled_matmul_is_offered_for_level1_8():
    prop = PlaybookProposer(load_problem(str(kernelbench("level1", "8_Matmul_with_irregular_shapes_.py"))), gpu=H200)
    assert prop.offer.get("tiled") is not None, prop.offer.why_not("tiled")


# ----- the gemm_rows family's streamed kernel (level 2's 14 on the GPU: float4 stores, transposing loaders) -----------
ROWS_SMALL = dict(BM=32, BN=32, TM=4, TN=4, BK=8, BLOCK=64)  # 4 x 4 GEMM blocks of 2 warps, 4 k tiles: EVEN, VEC_C
L2_14 = dict(batch_size=128, input_size=32, hidden_size=128)


def _emulate_streamed(tmp_path, config: dict, seed: int, edit=None) -> dict[str, str]:
    problem = load_problem(str(resized_copy(kernelbench("level2", "14_Gemm_Divide_Sum_Scaling.py"), tmp_path, **L2_14)))
    spec = PlaybookProposer(problem).offer.get("streamed").spec
    if edit is not None:
        assert spec.source.count(edit[0]) == 1, edit[0]
        spec = spec.model_copy(update={"source": spec.source.replace(*edit)})
    case = cases.make_case(problem, seed)
    emulate(spec, case.tensors, config={**ROWS_SMALL, **config}, sizes=case.sizes)
    return cases.mismatches(case)


@pytest.mark.needs_cxx
@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("config", [{}, {"SMEM_T": 0}, {"CP_ASYNC": 1, "SMEM_T": 0}, {"CP_ASYNC": 1, "SMEM_T": 0, "STAGES": 3}],
                         ids=["transposed", "as-is", "ring-2", "ring-3"])
def test_the_streamed_gemm_rows_kernel_matches_pytorch(tmp_path, config):
    # the offered defaults (SMEM_T 1: both nn.Linear tiles transposed through registers, float4 stores of gemm_out),
    # the tiles as they are (scalar stores), and the cp.async ring, each on three input sets (warps start in another
    # order each run)
    for seed in (0, 1, 2):
        assert _emulate_streamed(tmp_path, config, seed) == {}, (config, seed)


STREAMED_BROKEN = [  # a barrier or a wait the double buffer needs, taken out: each must be a mismatch
    ({}, ("    CP_LANDED();\n    __syncthreads();\n    for (int kt", "    CP_LANDED();\n    for (int kt")),
    ({}, ("        CP_LANDED();\n      }\n      __syncthreads();", "        CP_LANDED();\n      }")),
    ({"CP_ASYNC": 1, "SMEM_T": 0}, ("      cp_wait<STAGES - 2>();\n", "")),
]


@pytest.mark.needs_cxx
@pytest.mark.needs_kernelbench
@pytest.mark.parametrize("config, edit", STREAMED_BROKEN, ids=["first-barrier", "loop-barrier", "ring-wait"])
def test_a_streamed_kernel_without_its_sync_is_a_mismatch(tmp_path, config, edit):
    assert list(_emulate_streamed(tmp_path, config, 0, edit)) == ["out"]
