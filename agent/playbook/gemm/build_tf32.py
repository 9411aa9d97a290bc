"""The ``gemm`` family's 3xTF32 variant: the fused-epilogue GEMM (nn.Linear + elementwise chain,
batched and transposed-B products) on the tensor cores at fp32 accuracy, from the same template
as the matmul family's (``templates/tf32x3_sgemm.cu.j2``, whose header explains the split and the
layouts). It serves the layouts whose tiles divide the shape: A row-major and contiguous, B
either [K][N] or [N][K] (nn.Linear's weight), no triangle mask; the others stay with the FFMA
``tiled`` variant. Tunables (TERMS 1 and 3 at ``--precision tf32``: :mod:`..terms`), register and shared-memory
limits are the matmul variant's, and so is
split-K (``SPLIT_K`` > 1 in ``defaults``: :func:`.gemm.build_matmul_tf32.split_k_plan`; grid z spans batch and slice,
the epilogue moves to the second kernel)."""

from __future__ import annotations

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.gemm.build import epilogue_vars, gemm_facts
from kerngen.agent.playbook.gemm.build_matmul_tf32 import (ACC_FLOATS, DEFAULTS, KERNEL, MAX_ACC_FLOATS, MAX_REGS, NO_FLUSH,
                                               REGS_EST, REGS_PER_SM, SPLIT_DESCRIPTION, SPLIT_TEXT, SPLIT_VALUES,
                                               TEMPLATE, THREADS, TUNABLES, split_k_of, split_k_plan)
from kerngen.agent.playbook.entry import A, M, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import paren, MAX_SMEM, make_spec, pick, render
from kerngen.agent.playbook.terms import TERMS_VALUES, offer_terms

__all__ = ["IDEAS", "VARIANT", "gemm_tf32x3"]

VARIANT = "tf32x3"
_AFTER = frozenset({VARIANT})


def gemm_tf32x3(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = gemm_facts(m)
    if f.trans_a or f.mask:
        raise ValueError("the 3xTF32 GEMM reads a row-major A and writes every output (no triangle)")
    M_, N_, K_, batch = paren(f.M), paren(f.N), paren(f.K), paren(f.BATCH)
    trans_b = bool(f.trans_b)
    ep_vars, ep_args, formula = epilogue_vars(f)
    split = split_k_of(defaults)
    src = render(TEMPLATE, kernel=KERNEL, has_bias=bool(f.bias), split_k=split > 1, **ep_vars)
    b_tile = "BN * (BK + 8)" if trans_b else "BK * (BN + 4)"
    smem = f"4 * STAGES * (BM * (BK + 8) + {b_tile})"
    # contiguous operands: the template's row strides are K (A, and B stored [N][K]) and N (B stored [K][N])
    ldb = K_ if trans_b else N_
    constraints = [
        f"{paren(f.LDA)} == {K_}", f"{paren(f.LDB)} == {ldb}",
        f"{M_} % BM == 0", f"{N_} % BN == 0", f"{K_} % BK == 0",
        f"{paren(f.SA)} % 4 == 0", f"{paren(f.SB)} % 4 == 0",  # every batch's operand 16-byte aligned
        "BM % WM == 0", "BN % WN == 0", "WM % 16 == 0", "WN % 32 == 0", "BK % 8 == 0",
        f"{THREADS} <= 1024",
        f"(BM * BK // 4) % ({THREADS}) == 0", f"(BK * BN // 4) % ({THREADS}) == 0",
        "STAGES >= 2", f"{smem} <= {MAX_SMEM}",
        f"{ACC_FLOATS} <= {MAX_ACC_FLOATS}",
        f"{REGS_EST} <= {MAX_REGS}", f"({THREADS}) * ({REGS_EST}) <= {REGS_PER_SM}",
        # plain TF32 fails the fp32 check: offered at --precision tf32 only
        " or ".join(f"TERMS == {v}" for v in TERMS_VALUES) if m.tf32 else "TERMS == 3", "FLUSH == 0 or FLUSH == 1",
        f"{M_} < 2**31 and {N_} < 2**31 and {K_} < 2**31",
        f"({M_} // BM) * ({N_} // BN) < 2**31", f"{batch} <= 65535",
    ]
    tunables = {k: list(v) for k, v in TUNABLES.items()}
    d = pick(defaults, DEFAULTS)
    terms = offer_terms(tunables, d, defaults, m.tf32)
    args = ([{"name": f.a}, {"name": f.b}] + ([{"name": f.bias}] if f.bias else []) + ep_args
            + [{"name": "out"}, {"kind": "int32", "value": M_}, {"kind": "int32", "value": N_},
               {"kind": "int32", "value": K_}])
    step = dict(kernel=KERNEL, grid=[f"({M_} // BM) * ({N_} // BN)", 1, batch], block=[THREADS], shared_mem=smem,
                args=args)
    plan = dict(steps=[step], constraints=[])
    if split > 1:
        plan = split_k_plan(step, M_, N_, K_, batch)
        tunables["SPLIT_K"], d["SPLIT_K"] = list(SPLIT_VALUES), split
    epi = f", then {formula} in registers" if formula else ""
    return make_spec(
        f"playbook-gemm-{VARIANT}",
        f"fp32 GEMM {f.what}{epi} on the tensor cores at fp32 accuracy (3xTF32): operands split into tf32 "
        "hi + lo, lo*hi + hi*lo + hi*hi per k8 step with mma.sync m16n8k8, per-k-tile fp32 partial sums, "
        "cp.async STAGES-deep ring, conflict-free fragment loads, the epilogue applied before each store"
        + (SPLIT_DESCRIPTION if split > 1 else "") + terms,
        src, tunables, d,
        defines=dict(TRANS_B=int(trans_b), SA=paren(f.SA), SB=paren(f.SB)),
        constraints=constraints + plan["constraints"], scratch=plan.get("scratch", []),
        steps=plan["steps"],
    )


IDEAS: tuple[Entry, ...] = (
    Entry("gemm-tf32x3", "Run the GEMM on the tensor cores with split-precision TF32 (3xTF32) and keep the fused "
          "epilogue: each operand split into tf32 hi + lo, lo*hi + hi*lo + hi*hi accumulated with mma.sync "
          "m16n8k8 in fp32 (per-k-tile partial sums added with round-to-nearest), bias and the elementwise "
          "chain applied to each value in registers before its store.", P,
          "the matmul variant measured 1.15x cuBLAS fp32 at 4096^3 on an H100; the epilogue costs no extra pass",
          # split-K second: only admissible where the output's tiles (all batches) leave SMs idle
          VARIANT, ({}, {"SPLIT_K": 16}, {"BM": 64, "BN": 128, "WM": 32, "WN": 64, "STAGES": 4}), round0=True),
    Entry("gemm-tf32x3-tile", "Change the 3xTF32 GEMM's block tile: 64 x 128 for fewer rows (more blocks for a "
          "small batch), or 64 x 64 warp tiles accumulating straight in the mma accumulator.", PAR, "0-15%",
          VARIANT, ({"BM": 64, "WM": 32}, {**NO_FLUSH, "BM": 128}), after=_AFTER),
    Entry("gemm-tf32x3-pipeline", "Retune the cp.async ring of the 3xTF32 GEMM (more stages, or BK 16) so more "
          "tiles are in flight while the tensor cores work.", A, "0-10%", VARIANT,
          ({"STAGES": 4}, {"STAGES": 4, "BK": 16}), after=_AFTER),
    Entry("gemm-tf32x3-splitk", SPLIT_TEXT, PAR, "up to SPLIT_K x where the output's tiles (all batches) leave most "
          "SMs idle; not offered where they fill two waves", VARIANT,
          ({"SPLIT_K": 8}, {"SPLIT_K": 16, "BM": 64, "WM": 32}), after=_AFTER),
    Entry("gemm-tf32x3-l2", "Tune the 3xTF32 GEMM's grouped block order (GROUP_M) for L2 reuse of the operands.",
          M, "0-5%", VARIANT, ({"GROUP_M": 1},), after=_AFTER),
)
