"""The Hopper GEMM core (sm_90a: TMA + mbarrier ring, a producer warpgroup, 1-2 consumer warpgroups on wgmma,
persistent grouped tile order, the fused epilogue before the stores): ``templates/gemm_wgmma.cu.j2``, whose header
gives the pipeline, the shared-memory layouts, the descriptors and the fragment layouts.

:func:`gemm_wgmma_spec` turns a typed :class:`GemmProblem` (M, N, K, batch as expressions over the bound tensors,
the two operands' layouts, the dtype, the epilogue) into a :class:`KernelSpec`; the families' hooks
(:func:`matmul_wgmma`, :func:`gemm_wgmma`, and the 16-bit family in :mod:`.gemm.gemm16`) only translate their match
facts into one. Modes (:class:`Mode`): bf16 / f16 (fp32 accumulation) for 16-bit problems; fp32 problems run
3xTF32 (fp32 accuracy: the pre-pass kernel splits both operands into big + small tf32 planes in scratch, and the
core multiplies small*big + big*small + big*big), or plain TF32 (``TERMS`` 1 asked for in ``defaults``: only to
show that the fp32 check rejects it). At ``--precision tf32`` (``GemmProblem.tf32``) one source serves both: TERMS
is tunable over 1 and 3 (the planes, the shared memory and the scratch follow it), 1 by default (:mod:`..terms`).

The plan: [pre-pass of A] [pre-pass of B] main [split-K sum]. An operand goes through the pre-pass (written K-major,
its rows padded to 16 bytes) in the tf32 modes always, and in the 16-bit modes when its rows are not a multiple of
16 bytes at the problem's shape (TMA maps only such rows; a constraint keeps the direct path to shapes that have
them). Split-K (``SPLIT_K`` > 1 in ``defaults``, for outputs of too few tiles to fill the GPU): the main kernel
writes fp32 partial tiles to scratch and a second kernel adds them in slice order and applies the epilogue.
``PINGPONG`` (ping-pong consumers) and ``CLUSTER`` (pairs of blocks sharing B by TMA multicast) are in a spec only
when ``defaults`` name them (docs/gemm-wgmma.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.epilogue import Epilogue
from kerngen.agent.playbook.gemm.build_tf32 import (MAX_SPLIT_FLOATS, SPLIT_MAX_OUTPUTS as MAX_SPLIT_OUTPUTS,
                                                    SPLIT_VALUES, split_k_of)
from kerngen.agent.playbook.render import i32, paren, MAX_SMEM, make_spec, pick, render
from kerngen.agent.playbook.terms import PLAIN_TF32, TERMS_PLAIN, TERMS_SPLIT, offer_terms

__all__ = ["BNS", "DEFAULTS", "MAX_SPLIT_OUTPUTS", "Mode", "Operand", "GemmProblem", "PLANES_BY_TERMS", "REGS", "SMEM",
           "SPLIT_VALUES", "TERMS_PLAIN", "TERMS_SPLIT", "TF32_MODES", "TF32_TERMS_TEXT", "TUNABLES", "VARIANT",
           "gemm_wgmma_spec", "mode_of", "planes_of", "smem_bytes"]

VARIANT = "wgmma"
TEMPLATE = "gemm_wgmma.cu.j2"
KERNEL, PREP_KERNEL, SUM_KERNEL = "gemm_wgmma", "gemm_wgmma_prep", "gemm_wgmma_sum"


class Mode(str, Enum):
    """What the tensor cores multiply: 16-bit operands, or fp32 ones as tf32 terms."""

    bf16 = "bf16"
    f16 = "f16"
    tf32x3 = "tf32x3"  # fp32 accuracy: small*big + big*small + big*big
    tf32 = "tf32"  # big*big alone: plain TF32 (fails an fp32 check; only when asked for)
    tf32_terms = "tf32_terms"  # TERMS picks at compile time: 3 as tf32x3, 1 as tf32 (--precision tf32)


_MODES = {"bfloat16": Mode.bf16, "float16": Mode.f16}
ELEMENT_BYTES = {Mode.bf16: 2, Mode.f16: 2, Mode.tf32x3: 4, Mode.tf32: 4, Mode.tf32_terms: 4}
TF32_MODES = (Mode.tf32x3, Mode.tf32, Mode.tf32_terms)
PLANES_BY_TERMS = "((TERMS + 1) // 2)"  # tf32_terms: 2 planes (big, small) at TERMS 3, 1 at TERMS 1


def mode_of(dtype: str, terms: int = TERMS_SPLIT, tf32: bool = False) -> Mode:
    """The mode of a problem in ``dtype`` (``tf32``: checked at --precision tf32, TERMS tunable); ValueError for a
    dtype the core does not take."""
    if dtype == "float32":
        return Mode.tf32_terms if tf32 else Mode.tf32x3 if terms == TERMS_SPLIT else Mode.tf32
    if dtype not in _MODES:
        raise ValueError(f"the wgmma GEMM takes bf16, fp16 or fp32 (as 3xTF32) operands, not {dtype}")
    return _MODES[dtype]


@dataclass(frozen=True)
class Operand:
    """One operand as stored: ``name`` (an input or a parameter, contiguous), ``mn_major`` (stored [outer][K][R], the
    product's rows (A: M, B: N) contiguous, instead of [outer][R][K]) and ``batched`` (one matrix per batch entry,
    else one for all)."""

    name: str
    mn_major: bool
    batched: bool


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM: out[b] (M x N, contiguous) = epilogue(A[b] @ B[b]) for b < batch. M, N, K, batch are expressions
    over the bound tensors (so the spec follows the tensors it is resolved against); ``shape`` is (batch, M, N, K)
    now (it picks the plan: which operands go through the pre-pass, whether split-K is offered). The epilogue:
    ``bias`` (a per-column tensor), ``ep`` (the traced elementwise chain), ``mask`` ("upper" | "lower": triu/tril
    with ``diag``). ``checks``: constraints the caller's layout needs (expressions). ``tf32``: checked at
    ``--precision tf32`` (fp32 only: TERMS 1 and 3 offered, 1 by default)."""

    a: Operand
    b: Operand
    M: str
    N: str
    K: str
    batch: str
    dtype: str
    shape: tuple[int, int, int, int]
    bias: str | None = None
    ep: Epilogue | None = None
    mask: str = ""
    diag: int = 0
    what: str = ""
    checks: tuple[str, ...] = ()
    tf32: bool = False


BNS = (64, 128, 192, 256)  # the wgmma n of a consumer (a multiple of 64: MN-major B is loaded in 64-column slabs)
TUNABLES = dict(BN=list(BNS), WGM=[1, 2], CWG=[1, 2], BK=[32, 64, 128], STAGES=[2, 3, 4, 5, 6], GROUP_M=[1, 4, 8, 16],
                CTAS=[66, 114, 132], FLUSH=[0, 1], TERMS=[TERMS_SPLIT])
# defaults: 16-bit, CUTLASS's cooperative 128 x 256 tile (two consumers of 64 x 256) in 4 stages of 48 KB; 3xTF32,
# 128 x 128 (two of 64 x 128) with per-k-tile partial sums (FLUSH), 3 stages of 64 KB (both planes of A and B).
# CTAS: the persistent grid, one block per SM of an H100 SXM / H200 (132); a GPU with fewer SMs runs the rest as
# a second wave (correct, slower: the tuner's 114 serves the H100 PCIe). Not yet tuned on a GPU.
DEFAULTS = {
    "16": dict(BN=256, WGM=1, CWG=2, BK=64, STAGES=4, GROUP_M=8, CTAS=132, FLUSH=0, TERMS=TERMS_SPLIT),
    "32": dict(BN=128, WGM=1, CWG=2, BK=32, STAGES=3, GROUP_M=8, CTAS=132, FLUSH=1, TERMS=TERMS_SPLIT),
}
BM = "(64 * WGM * CWG)"
BM_PINGPONG = "(64 * WGM * (CWG - PINGPONG))"  # PINGPONG 1 (CWG 2): each consumer's own tile of 64 WGM rows
# PINGPONG and CLUSTER exist in a spec only when ``defaults`` name them (any value): the specs built without them are
# those of before (byte for byte); a spec with them offers both values to the tuner
PINGPONG_VALUES, CLUSTER_VALUES = (0, 1), (1, 2)
# EPI_SMEM 1: the epilogue's values staged through shared memory and stored as 16-byte row pieces (the template says
# how); in a spec only when ``defaults`` name it, as PINGPONG. Each consumer warp's staging tile: 16 rows of 64
# outputs and 8 more (the padding that keeps the pair writes off each other's banks)
EPI_SMEM_VALUES = (0, 1)
EPI_SMEM_BYTES = "(EPI_SMEM * 64 * CWG * 72 * {osize})"
STAGE_BYTES = "({planes} * ({bm} + BN) * BK * {esize})"
# the ring, the 1 KB the kernel may skip to align its base to 1024 bytes, the mbarriers
SMEM = "(1024 + STAGES * {stage} + 16 * STAGES)"
# a consumer thread's registers: its accumulators (WGM m64 blocks of BN / 2 floats, twice with FLUSH) and ~40 for
# descriptors, addresses and the work loop; the budget after setmaxnreg (the kernel's GW_REG_CONSUMER; CWG 1 keeps
# launch bounds' 255). Not calibrated beyond the sampled compiles of tests/agent/test_gemm_wgmma.py.
REGS = "(WGM * BN // 2 * (1 + FLUSH) + 40)"
REG_BUDGET = "(232 if CWG == 2 else 255)"
MAX_PREP_ELEMENTS = 2**31  # the pre-pass's scratch, both operands together (8 GiB of fp32)
PAD = {2: 8, 4: 4}  # elements of 16 bytes: the pre-pass pads a row to a multiple of this


# the tf32_terms mode's "what" (the conv core's too)
TF32_TERMS_TEXT = (f"fp32 as TF32 products, TERMS of them per k8 step (pre-passes write TERMS 3's big + small tf32 "
                   f"planes, TERMS 1's big plane alone): 1 = {PLAIN_TF32}, big*big alone, the default here; 3 = "
                   "3xTF32, small*big + big*small + big*big, fp32 accuracy")


def planes_of(mode: Mode) -> int | str:
    """The planes of each operand: 2 for 3xTF32 (big, small), else 1; an expression of TERMS in the tf32_terms mode."""
    return 2 if mode is Mode.tf32x3 else PLANES_BY_TERMS if mode is Mode.tf32_terms else 1


def smem_bytes(cfg: dict[str, int], mode: Mode) -> int:
    """Dynamic shared memory of the main kernel at ``cfg`` (the spec's expression, in Python)."""
    planes = 2 if mode is Mode.tf32x3 or (mode is Mode.tf32_terms and cfg["TERMS"] == TERMS_SPLIT) else 1
    stage = planes * (64 * cfg["WGM"] * cfg["CWG"] + cfg["BN"]) * cfg["BK"] * ELEMENT_BYTES[mode]
    staging = cfg.get("EPI_SMEM", 0) * 64 * cfg["CWG"] * 72 * ELEMENT_BYTES[mode]  # the output's element too
    return 1024 + cfg["STAGES"] * stage + 16 * cfg["STAGES"] + staging


def _inner(op: Operand, rows: str, k: str) -> str:
    """The stored operand's contiguous dim: K, or its rows when MN-major."""
    return rows if op.mn_major else k


def _needs_prep(op: Operand, rows: int, k: int, mode: Mode) -> bool:
    if mode in TF32_MODES:
        return True
    return (rows if op.mn_major else k) % PAD[2] != 0


@dataclass(frozen=True)
class _Side:
    """How the main kernel reads one operand: the tensormap argument, the pre-pass launch (None: read directly)
    and its scratch, whether the kernel sees it MN-major, the constraints of the direct path."""

    tmap: dict[str, Any]
    prep: dict[str, Any] | None
    scratch: dict[str, Any] | None
    mn_major: bool
    constraints: list[str]


def _side(op: Operand, which: str, rows: str, k: str, batch: str, mode: Mode, prep: bool, dtype: str,
          bm: str = BM) -> _Side:
    esize = ELEMENT_BYTES[mode]
    swe = 128 // esize  # elements of a 128-byte swizzled row: box_cols of a K-major k tile
    outer = paren(batch) if op.batched else "1"
    box_rows = bm if which == "a" else "BN"
    if not prep:
        view = [outer, k, rows] if op.mn_major else [outer, rows, k]
        box = {"box_rows": "BK", "box_cols": 64} if op.mn_major else {"box_rows": box_rows, "box_cols": swe}
        tmap = {"kind": "tensormap", "name": op.name, **box, "swizzle": 128, "full_width": False, "view": view}
        inner = _inner(op, rows, k)
        return _Side(tmap, None, None, op.mn_major, [f"{inner} % {PAD[esize]} == 0"])
    planes = planes_of(mode)
    kp = f"round_up({k}, {PAD[esize]})"
    name = f"{which}_prep"
    scratch = dict(name=name, dtype="float32" if esize == 4 else dtype, size=f"{planes} * {outer} * {rows} * {kp}")
    launch = dict(kernel=PREP_KERNEL, grid=[f"cdiv({kp}, 32)", f"cdiv({rows}, 32)", outer], block=[32, 8],
                  args=[{"name": op.name}, {"name": name}, *(i32(v) for v in (rows, k, kp, outer)),
                        i32(int(op.mn_major))])
    tmap = {"kind": "tensormap", "name": name, "box_rows": box_rows, "box_cols": swe, "swizzle": 128,
            "full_width": False, "view": [f"{planes} * {outer}", rows, kp]}
    checks = [f"cdiv({rows}, 32) <= 65535", f"{outer} <= 65535"]
    return _Side(tmap, launch, scratch, False, checks)


def _epilogue(p: GemmProblem) -> tuple[dict[str, Any], list[dict[str, str]], str]:
    """Template vars of the fused epilogue, the launch args of its tensors (bias first), its formula."""
    ep = p.ep if p.ep is not None and not p.ep.empty else None
    vars_ = dict(has_bias=bool(p.bias), statements=ep.statements if ep else (), expr=ep.expr if ep else "v",
                 n_ep=len(ep.params) if ep else 0, mask=p.mask)
    args = ([{"name": p.bias}] if p.bias else []) + [{"name": q.name} for q in (ep.params if ep else ())]
    return vars_, args, ep.formula if ep else ""


def gemm_wgmma_spec(p: GemmProblem, defaults: dict[str, int], name: str) -> KernelSpec:
    """The spec of ``p`` (see the module's text), named ``name``."""
    terms = defaults.get("TERMS", TERMS_SPLIT)
    if terms not in (TERMS_SPLIT, TERMS_PLAIN) or (terms == TERMS_PLAIN and p.dtype != "float32"):
        raise ValueError(f"TERMS {terms}: 3 (3xTF32) or, for fp32 problems, 1 (plain TF32)")
    mode = mode_of(p.dtype, terms, p.tf32)
    split = split_k_of(defaults)  # split-K (as the 3xTF32 GEMM's): only below two waves of 128 x 128 output tiles
    if p.mask and split > 1:
        raise ValueError("split-K and a triangle mask: not offered together")
    pingpong, cluster, epi_smem = "PINGPONG" in defaults, "CLUSTER" in defaults, "EPI_SMEM" in defaults
    if defaults.get("EPI_SMEM", 0) not in EPI_SMEM_VALUES:
        raise ValueError(f"EPI_SMEM {defaults.get('EPI_SMEM')}: 0 or 1")
    if epi_smem and split > 1:
        raise ValueError("EPI_SMEM and split-K: not offered together (split-K's partials are fp32 scratch)")
    if defaults.get("PINGPONG", 0) not in PINGPONG_VALUES or defaults.get("CLUSTER", 1) not in CLUSTER_VALUES:
        raise ValueError(f"PINGPONG {defaults.get('PINGPONG')} / CLUSTER {defaults.get('CLUSTER')}: PINGPONG is 0 or 1, "
                         "CLUSTER 1 or 2")
    bm = BM_PINGPONG if pingpong else BM
    half = mode in (Mode.bf16, Mode.f16)
    M, N, K, batch = paren(p.M), paren(p.N), paren(p.K), paren(p.batch)
    _, m_now, n_now, k_now = p.shape
    a = _side(p.a, "a", M, K, batch, mode, _needs_prep(p.a, m_now, k_now, mode), p.dtype, bm)
    b = _side(p.b, "b", N, K, batch, mode, _needs_prep(p.b, n_now, k_now, mode), p.dtype)
    ep_vars, ep_args, formula = _epilogue(p)
    src = render(TEMPLATE, kernel=KERNEL, prep_kernel=PREP_KERNEL, sum_kernel=SUM_KERNEL, mode=mode.value,
                 out_dtype=p.dtype, a_mn=a.mn_major, b_mn=b.mn_major, prep=bool(a.prep or b.prep), split_k=split > 1,
                 bns=BNS, pingpong=pingpong, cluster=cluster, epi_smem=epi_smem, **ep_vars)
    esize = ELEMENT_BYTES[mode]
    smem = SMEM.format(stage=STAGE_BYTES.format(planes=planes_of(mode), bm=bm, esize=esize))
    if epi_smem:  # the output's element is the operands' (esize)
        smem = f"({smem} + {EPI_SMEM_BYTES.format(osize=esize)})"
    sk = "SPLIT_K" if split > 1 else "1"
    units = f"{batch} * cdiv({M}, {f'({bm} * CLUSTER)' if cluster else bm}) * cdiv({N}, BN) * {sk}"
    tunables = {k: list(v) for k, v in TUNABLES.items()}
    tunables["BK"] = [64, 128] if half else [32, 64]
    # fp32 at 1e-4 needs FLUSH: without it the tensor core's own accumulation of 3xTF32 products failed the check
    # on an H200 (A @ B.T, K 520: 3 of 19,200 elements off by 1.5e-4, 2026-11-27), so it is not offered for fp32
    tunables["FLUSH"] = [0] if half else [1]
    tunables["TERMS"] = [terms]
    d = pick(defaults, DEFAULTS["16" if half else "32"])
    offer_terms(tunables, d, defaults, mode is Mode.tf32_terms)
    for knob, values, on in (("PINGPONG", PINGPONG_VALUES, pingpong), ("CLUSTER", CLUSTER_VALUES, cluster),
                             ("EPI_SMEM", EPI_SMEM_VALUES, epi_smem)):
        if on:
            tunables[knob], d[knob] = list(values), defaults[knob]
    out = "out"
    main_args = [a.tmap, b.tmap, *ep_args, {"name": out}, i32(M), i32(N), i32(K), i32(batch)]
    kt = f"cdiv({K}, BK)"
    constraints = [
        f"{M} >= 1 and {N} >= 1 and {K} >= 1", f"{M} < 2**31 and {N} < 2**31 and {K} < 2**31",
        f"{batch} * {M} * {N} < 2**62", f"{units} < 2**31",
        f"{smem} <= {MAX_SMEM}", f"{REGS} <= {REG_BUDGET}",
        f"({sk} - 1) * cdiv({kt}, {sk}) < {kt}",  # every k slice has a k tile
        *a.constraints, *b.constraints, *p.checks,
    ]
    main = dict(kernel=KERNEL, grid=[f"CLUSTER * min({units}, CTAS // CLUSTER)" if cluster else f"min({units}, CTAS)"],
                block=["128 * (CWG + 1)"], shared_mem=smem, args=main_args, **({"cluster": "CLUSTER"} if cluster else {}))
    if pingpong:
        constraints.append("PINGPONG == 0 or CWG == 2")
    if epi_smem:  # whole 16-byte pieces: a row's vectors stay inside it, and past N they are wholly past it
        constraints.append(f"EPI_SMEM == 0 or {N} % {16 // esize} == 0")
    steps = [s for s in (a.prep, b.prep) if s is not None]
    scratch = [s for s in (a.scratch, b.scratch) if s is not None]
    if scratch:
        constraints.append(f"{' + '.join(s['size'] for s in scratch)} <= {MAX_PREP_ELEMENTS}")
    if split > 1:
        total = f"{batch} * {M} * {N}"
        tunables["SPLIT_K"], d["SPLIT_K"] = list(SPLIT_VALUES), split
        main["args"] = [a.tmap, b.tmap, {"name": "partials"}, *main_args[-4:]]
        steps += [main, dict(kernel=SUM_KERNEL, grid=[f"cdiv({total}, 256)"], block=[256],
                             args=[{"name": "partials"}, *ep_args, {"name": out}, i32(M), i32(N), i32(batch)])]
        scratch.append(dict(name="partials", dtype="float32", size=f"SPLIT_K * {total}"))
        constraints += [f"{total} < {MAX_SPLIT_OUTPUTS}", f"SPLIT_K * {total} <= {MAX_SPLIT_FLOATS}"]
    else:
        steps.append(main)
    what = {Mode.bf16: "bf16", Mode.f16: "fp16", Mode.tf32x3: "fp32 at fp32 accuracy (3xTF32: both operands split "
            "into big + small tf32 planes by a pre-pass, small*big + big*small + big*big per k8 step)",
            Mode.tf32: "fp32 as plain TF32 (one term: NOT fp32 accurate)", Mode.tf32_terms: TF32_TERMS_TEXT}[mode]
    epi = f", then {formula}" if formula else ""
    masked = f", {p.mask} triangle kept" if p.mask else ""
    return make_spec(
        name,
        f"GEMM {p.what}{epi}{masked} on Hopper (sm_90a), {what}: a persistent grid of one block per SM over "
        "GROUP_M-grouped tiles; a producer warpgroup issues TMA copies of BK-deep k tiles of A and B into a "
        "STAGES-deep ring of 128-byte-swizzled shared memory (mbarriers: full with the bytes, empty from the "
        "consumers); CWG consumer warpgroups (setmaxnreg) share the (64 * WGM * CWG) x BN tile, each issuing wgmma "
        "m64nBN straight from shared memory (descriptors), one commit group per k tile, a slot freed when its group "
        "has completed; the epilogue in fp32 registers before paired stores"
        + ("; with FLUSH each k tile's products in fresh registers added into the sum (round to nearest)"
           if not half else "")
        + ("; split-K: SPLIT_K k slices per tile write fp32 partials that a second kernel adds in order before the "
           "epilogue" if split > 1 else "")
        + ("; PINGPONG 1: the two consumers each own a whole (64 * WGM) x BN tile, taking the block's units in turns "
           "(named barriers order their main loops, so one's epilogue overlaps the other's wgmma)" if pingpong else "")
        + ("; CLUSTER 2: pairs of blocks (a thread-block cluster) take vertically adjacent tiles of one unit and share "
           "B's k tiles (each block loads half of B's boxes and multicasts them to both; a slot is released in both)"
           if cluster else "")
        + ("; EPI_SMEM 1: each consumer warp stages its outputs 64 columns at a time in shared memory and stores them "
           "as 16-byte row pieces (whole 128-byte lines)" if epi_smem else ""),
        src, tunables, d, arch_specific=True, scratch=scratch, constraints=constraints, steps=steps,
        defines=dict(A_BATCHED=int(p.a.batched), B_BATCHED=int(p.b.batched), EVEN_N=f"{N} % 2 == 0",
                     DIAG=int(p.diag)),
    )
