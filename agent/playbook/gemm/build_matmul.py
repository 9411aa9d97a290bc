"""Variant builders of the fp32 matmul family: the tiled SGEMM and the any-shape one."""

from __future__ import annotations


from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render


# ---------------------------------------------------------------------------------------------
# matmul
def sgemm_tiled(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    a, b = m.inputs[0].name, m.inputs[1].name
    kernel = "sgemm_tiled"
    src = render("sgemm.cu.j2", kernel=kernel)
    d = pick(defaults, dict(BM=64, BN=128, BK=16, GROUP_M=8, CP_ASYNC=1))
    return make_spec(
        "playbook-matmul-sgemm",
        "fp32 SGEMM (FFMA, no TF32): BM x BN block tile, 8x8 register tile per thread split 4+4 for "
        "conflict-free float4 shared loads, A transposed in shared memory, double-buffered (register "
        "prefetch or cp.async), grouped block order for L2 reuse",
        src,
        dict(BM=[64, 128], BN=[64, 128], BK=[8, 16], GROUP_M=[1, 4, 8, 16], CP_ASYNC=[0, 1]),
        d,
        constraints=[f"{a}.shape[1] == {b}.shape[0]", f"{a}.shape[0] % BM == 0", f"{b}.shape[1] % BN == 0",
                     f"{a}.shape[1] % BK == 0", "(BM * BK // 4) % ((BM // 8) * (BN // 8)) == 0",
                     "(BN * BK // 4) % ((BM // 8) * (BN // 8)) == 0",
                     f"{a}.shape[0] * {a}.shape[1] < 2**31 and {a}.shape[1] * {b}.shape[1] < 2**31",
                     f"({a}.shape[0] // BM) * ({b}.shape[1] // BN) < 2**31"],
        steps=[dict(kernel=kernel, grid=[f"({a}.shape[0] // BM) * ({b}.shape[1] // BN)"], block=["(BM // 8) * (BN // 8)"],
                    args=[{"name": a}, {"name": b}, {"name": "out"}, {"kind": "int32", "value": f"{a}.shape[0]"},
                          {"kind": "int32", "value": f"{b}.shape[1]"}, {"kind": "int32", "value": f"{a}.shape[1]"}])],
    )


def sgemm_simple(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    a, b = m.inputs[0].name, m.inputs[1].name
    kernel = "sgemm_simple"
    src = render("sgemm_simple.cu.j2", kernel=kernel)
    d = pick(defaults, dict(TILE=32, RM=4))
    return make_spec(
        "playbook-matmul-simple",
        "fp32 GEMM for any shape: shared-memory tiles, RM outputs per thread, every access bounds-checked",
        src,
        dict(TILE=[16, 32], RM=[1, 2, 4, 8]),
        d,
        constraints=[f"{a}.shape[1] == {b}.shape[0]", "TILE % RM == 0",
                     f"{a}.shape[0] * {a}.shape[1] < 2**31 and {a}.shape[1] * {b}.shape[1] < 2**31"],
        steps=[dict(kernel=kernel, grid=[f"cdiv({b}.shape[1], TILE)", f"cdiv({a}.shape[0], TILE)"], block=["TILE", "TILE // RM"],
                    args=[{"name": a}, {"name": b}, {"name": "out"}, {"kind": "int32", "value": f"{a}.shape[0]"},
                          {"kind": "int32", "value": f"{b}.shape[1]"}, {"kind": "int32", "value": f"{a}.shape[1]"}])],
    )
