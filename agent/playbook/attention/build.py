"""Variant builders of the ``attention`` family (each ``(match, defaults) -> KernelSpec``):

- ``fa2``: FlashAttention-2 style forward on the tensor cores (bf16/fp16, head dim 64 or 128):
  ``templates/attention_fa2.cu.j2``, whose header gives the tiling, the pipeline and the mma/ldmatrix
  fragment layouts;
- ``wgmma``: FlashAttention-3 style forward for Hopper (sm_90a): TMA copies by a producer warpgroup, wgmma
  products by 1-3 consumer warpgroups, the softmax overlapped with P V: ``templates/attention_wgmma.cu.j2``;
- ``simt``: the same online softmax in fp32 FFMA for fp32 inputs of any head dim (a multiple of 4;
  KernelBench's 97 has D = 1024): ``templates/attention_simt.cu.j2``. fp32 stays fp32: no TF32.

The match's facts (made by :mod:`.attention.family`): ``q``, ``k``, ``v`` (input names), ``dtype``,
``causal``, ``scale`` (None: PyTorch's default 1/sqrt(D), else the constant), ``nd`` (the rank of q),
``what`` (a human description). Shapes enter as expressions over the bound tensors, so a spec follows
the tensors it is resolved against; constraints reject what the kernels cannot do.
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import i32, paren, make_spec, pick, render

__all__ = ["FA2_DEFAULTS", "MAX_SMEM_SM80", "MAX_SMEM_SM90", "SIMT_DEFAULTS", "SPEC_NAMES", "TENSOR_CORE_DTYPES",
           "TENSOR_CORE_HEAD_DIMS", "WGMMA_DEFAULTS", "attention_fa2", "attention_simt", "attention_wgmma",
           "fa2_smem_bytes"]

FAMILY = "attention"  # the spec names are f"playbook-attention-{variant}" (Family.spec_name)
TENSOR_CORE_DTYPES = ("bfloat16", "float16")
TENSOR_CORE_HEAD_DIMS = (64, 128)
# every offered configuration fits both an A100 (sm_80: 163 KB a block, opted in) and an H100 (227 KB)
MAX_SMEM_SM80 = 166912
LOG2E = math.log2(math.e)
MAX_SMEM_SM90 = 232448  # 227 KB a block, opted in: the wgmma kernel runs on sm_90a alone
SPEC_NAMES = {v: f"playbook-{FAMILY}-{v}" for v in ("fa2", "wgmma", "simt")}

# defaults per head dim. D = 128: FlashAttention-2's H100 tile, 4 warps of 32 query rows on a 128 x 64 tile
# with Q re-read from shared memory, K/V double-buffered, XOR swizzle (the best of the exhaustive tune on an
# H100, 2026-11-23); D = 64: 4 warps of 32 rows with Q in registers (each K/V fragment feeds two mmas)
FA2_DEFAULTS = {
    128: dict(BLOCK_M=128, BLOCK_N=64, WARPS=4, STAGES=2, SWIZZLE=1, QSMEM=1, PINGPONG=0),
    64: dict(BLOCK_M=128, BLOCK_N=64, WARPS=4, STAGES=2, SWIZZLE=1, QSMEM=0, PINGPONG=0),
}
FA2_TUNABLES = dict(BLOCK_M=[64, 128, 256], BLOCK_N=[32, 64, 128], WARPS=[4, 8], STAGES=[2, 3, 4], SWIZZLE=[0, 1],
                    QSMEM=[0, 1], PINGPONG=[0, 1])
FA2_THREADS = "32 * WARPS"
FA2_MI = "(BLOCK_M // (16 * WARPS))"  # m16 tiles of one warp
FA2_ROW = "(HEAD_DIM if SWIZZLE else HEAD_DIM + 8)"  # elements between rows in shared memory
FA2_SMEM = f"2 * {FA2_ROW} * (BLOCK_M + 2 * STAGES * BLOCK_N)"  # the Q tile, then STAGES x (K, V)
# registers a thread needs, roughly: O (MI x D/8 n8 tiles x 4), S (MI x BLOCK_N/8 x 4), Q's fragments
# (MI x D/16 x 4 held, or MI x 4 of one k step with QSMEM), P's packed A fragments of one k step and two
# B fragments, ~36 for addresses, the softmax state and counters. Calibrated on NVRTC 13 for sm_90 over
# every configuration with 2-3 stages: the admitted ones compile without spills (up to 255 registers: D =
# 128, 4 warps of 32 rows, BLOCK_N 64, Q re-read from shared memory, is FlashAttention-2's tile and takes
# exactly 255) except three with padded rows, where ptxas is not monotone near the limit: D = 128 BLOCK_M
# 256 8 warps BLOCK_N 64 QSMEM (8 bytes), and D = 64 BLOCK_M 128 4 warps BLOCK_N 32 with Q in registers
# (4-16 bytes at 168 registers). Those stay admitted (the tuner measures them like any other). Excluded:
# 2 m16 tiles a warp at D = 128 with Q held in registers (~300 registers). Q re-read from shared memory only
# pays with 2 m16 tiles a warp (one tile holds Q in 32 registers at most).
# PINGPONG keeps the packed P of the tile before across the tensor phase: MI x BLOCK_N/4 more
FA2_REGS = f"({FA2_MI} * (HEAD_DIM // 2 + BLOCK_N // 2 + (4 if QSMEM else HEAD_DIM // 4) + 4 + PINGPONG * BLOCK_N // 4) + 44)"

# wgmma: CWG consumer warpgroups of 64 query rows each plus one producer warpgroup. Defaults: the best of the
# exhaustive tune on an H100 (2026-11-24): at head dim 128 two consumers taking turns (ping-pong) on 128 x 128
# tiles with 3 K/V stages; at 64 three consumers (192 query rows, FlashAttention-3's tile) on 128 keys
WGMMA_DEFAULTS = {
    128: dict(CWG=2, BLOCK_N=128, STAGES=3, PINGPONG=1),
    64: dict(CWG=3, BLOCK_N=128, STAGES=3, PINGPONG=0),
}
WGMMA_BLOCK_NS = [64, 96, 112, 128, 144, 160, 176, 192]
WGMMA_TUNABLES = dict(CWG=[1, 2, 3], BLOCK_N=WGMMA_BLOCK_NS, STAGES=[2, 3, 4], PINGPONG=[0, 1])
WGMMA_THREADS = "128 * (CWG + 1)"
WGMMA_ROWS = "64 * CWG"
# Q, STAGES x (K, V), the 1 KB the kernel may skip to align its base to 1024 bytes, the mbarriers
WGMMA_SMEM = "2 * HEAD_DIM * (64 * CWG + 2 * STAGES * BLOCK_N) + 1024 + 8 * (1 + 4 * STAGES)"
# a consumer thread's registers after setmaxnreg (the kernel's FW_REG_CONSUMER; CWG 1 keeps launch bounds' 255)
WGMMA_REG_BUDGET = "(255 if CWG == 1 else 240 if CWG == 2 else 160)"
# its need, roughly: O (D / 2 fp32), S (BLOCK_N / 2) and the packed P of the tile before (BLOCK_N / 4) live at
# once while S's softmax overlaps P V, plus ~32 for the softmax state, addresses and descriptors, ~8 more for
# PINGPONG's turns (NVRTC 13, sm_90a: D = 128, BLOCK_N = 192 spills 8 bytes with turns and none without)
WGMMA_REGS = "(HEAD_DIM // 2 + 3 * BLOCK_N // 4 + 32 + 8 * PINGPONG)"

SIMT_DEFAULTS = dict(BLOCK_N=64, WARPS=8)
SIMT_TUNABLES = dict(BLOCK_N=[32, 64], WARPS=[4, 8])
SIMT_THREADS = "32 * WARPS"
SIMT_QT = "min(32 * WARPS, HEAD_DIM // 4)"  # threads along the float4 columns of O
SIMT_SMEM = "4 * (16 * (HEAD_DIM + 4) + WARPS * 16 * BLOCK_N + 16 * (BLOCK_N + 4) + 32)"
SIMT_O_FLOATS = "16 * HEAD_DIM // (32 * WARPS)"  # O accumulators of one thread
MAX_SIMT_O_FLOATS = 128


def _at(constraints: list[str], d: str) -> list[str]:
    """Constraints written over HEAD_DIM, made over the problem's expression for it (a spec's defines are
    known to its launch steps, not to its constraints)."""
    return [c.replace("HEAD_DIM", paren(d)) for c in constraints]


def _facts(m: FamilyMatch) -> Any:
    if m.facts.kind != "attention":
        raise ValueError(f"this variant computes attention; the problem is a {m.facts.kind}")
    return m.facts


def _shapes(f: Any) -> dict[str, str]:
    """Expressions of the problem's sizes over the bound tensors: BH (the leading dims), Sq, Sk, D."""
    q, k, nd = f.q, f.k, f.nd
    return dict(BH=" * ".join(f"{q}.shape[{i}]" for i in range(nd - 2)), Sq=f"{q}.shape[{nd - 2}]",
                Sk=f"{k}.shape[{nd - 2}]", D=f"{q}.shape[{nd - 1}]")


def _scale_log2(f: dict[str, Any], d: str) -> str:
    """scale * log2(e): the kernel's exp2 argument factor (an fp32 argument)."""
    if f.scale is None:
        return f"{paren(d)} ** -0.5 * {LOG2E!r}"
    return repr(float(f.scale) * LOG2E)


def _common_constraints(f: dict[str, Any], s: dict[str, str]) -> list[str]:
    q, k, v, nd = f.q, f.k, f.v, f.nd
    same = [f"{k}.shape[{i}] == {q}.shape[{i}] and {v}.shape[{i}] == {q}.shape[{i}]" for i in range(nd - 2)]
    out = [*same, f"{v}.shape[{nd - 2}] == {s['Sk']}", f"{k}.shape[{nd - 1}] == {s['D']}",
           f"{v}.shape[{nd - 1}] == {s['D']}", f"{s['Sq']} >= 1 and {s['Sk']} >= 1",
           f"({s['BH']}) * {s['Sq']} * {s['D']} < 2**62", f"({s['BH']}) <= 65535",
           f"{s['Sq']} < 2**31 and {s['Sk']} < 2**31"]
    if f.causal:  # PyTorch's causal mask is top-left aligned; the kernels take the square case
        out.append(f"{s['Sq']} == {s['Sk']}")
    return out


def _args(f: dict[str, Any], s: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": f.q}, {"name": f.k}, {"name": f.v}, {"name": "out"},
            i32(s["Sq"]), i32(s["Sk"]),
            {"kind": "float32", "value": _scale_log2(f, s["D"])}]


def _spec(variant: str, kernel: str, f: dict[str, Any], s: dict[str, str], text: str, src: str,
          tunables: dict[str, list[int]], defaults: dict[str, int], constraints: list[str], rows: str, threads: str,
          smem: str, args: list[dict[str, Any]] | None = None, **spec_fields: Any) -> KernelSpec:
    """Every variant's one launch: a block per (``rows`` query rows, batch * head) of ``threads``, ``smem`` bytes
    of dynamic shared memory, the arguments ``args`` (those of :func:`_args` unless given); ``text`` follows
    "attention ... (mask, "; ``spec_fields`` are more fields of the spec (``arch_specific``)."""
    mask = "causal" if f.causal else "no mask"
    return make_spec(
        SPEC_NAMES[variant], f"attention {f.what} ({mask}, {text}", src, {k: list(v) for k, v in tunables.items()},
        defaults, defines=dict(HEAD_DIM=s["D"]), constraints=constraints, **spec_fields,
        steps=[dict(kernel=kernel, grid=[f"cdiv({s['Sq']}, {rows})", s["BH"]], block=[threads], shared_mem=smem,
                    args=_args(f, s) if args is None else args)],
    )


def fa2_smem_bytes(cfg: dict[str, int], head_dim: int) -> int:
    """Dynamic shared memory of the fa2 kernel at ``cfg`` (the spec's expression, in Python)."""
    row = head_dim if cfg["SWIZZLE"] else head_dim + 8
    return 2 * row * (cfg["BLOCK_M"] + 2 * cfg["STAGES"] * cfg["BLOCK_N"])


# ---------------------------------------------------------------------------------------------
def _tensor_core_facts(m: FamilyMatch, which: str) -> Any:
    """The match's facts, or why ``which`` (a tensor-core kernel) cannot serve it."""
    f = _facts(m)
    if f.dtype not in TENSOR_CORE_DTYPES:
        raise ValueError(f"the {which} kernel takes bf16 or fp16 inputs, not {f.dtype}")
    if f.head_dim not in TENSOR_CORE_HEAD_DIMS:
        raise ValueError(f"the {which} kernel takes head dims 64 and 128, not {f.head_dim}")
    return f


def attention_fa2(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = _tensor_core_facts(m, "tensor-core")
    s = _shapes(f)
    kernel = "attention_fa2"
    src = render("attention_fa2.cu.j2", kernel=kernel, dtype=f.dtype, causal=f.causal)
    d = pick(defaults, FA2_DEFAULTS[f.head_dim])
    nt = FA2_THREADS
    constraints = _common_constraints(f, s) + _at([
        "HEAD_DIM == 64 or HEAD_DIM == 128",
        "BLOCK_M % (16 * WARPS) == 0", f"{FA2_MI} <= 2",
        f"(BLOCK_M * HEAD_DIM // 8) % ({nt}) == 0", f"(BLOCK_N * HEAD_DIM // 8) % ({nt}) == 0",
        "STAGES >= 2", "SWIZZLE == 0 or SWIZZLE == 1", f"QSMEM == 0 or (QSMEM == 1 and {FA2_MI} == 2)",
        "PINGPONG == 0 or (PINGPONG == 1 and WARPS == 8 and STAGES == 3)",  # two groups of 4; a 3-slot ring
        f"{FA2_SMEM} <= {MAX_SMEM_SM80}",
        f"{FA2_REGS} <= 255", f"{FA2_REGS} * {nt} <= 65536",
    ], s["D"])
    text = (f"{f.dtype}): FlashAttention-2 style forward on the tensor cores. One block per (BLOCK_M query rows, "
            "batch*head), the longest causal tiles launched first; Q copied once (cp.async) and held in registers "
            "(ldmatrix) or, with QSMEM and 32 rows a warp, re-read from shared memory every k step; K/V tiles of "
            "BLOCK_N keys through a STAGES-deep cp.async ring in shared memory (XOR-swizzled or padded rows); S = Q "
            "K^T and O += P V with mma.sync m16n8k16 (fp32 accumulate); online softmax in fp32 registers with "
            "ex2.approx and the scale folded into one FFMA; P converted to 16 bits in registers and fed straight "
            "into the P V mma; with PINGPONG two groups of 4 warps take turns on the tensor cores (named barriers); "
            "causal tiles above the diagonal skipped, only the diagonal and ragged tiles masked; output staged "
            "through shared memory for 16-byte stores")
    return _spec("fa2", kernel, f, s, text, src, FA2_TUNABLES, d, constraints, "BLOCK_M", nt, FA2_SMEM)


def attention_wgmma(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = _tensor_core_facts(m, "wgmma")
    s = _shapes(f)
    kernel = "attention_wgmma"
    src = render("attention_wgmma.cu.j2", kernel=kernel, dtype=f.dtype, causal=f.causal,
                 block_ns=WGMMA_BLOCK_NS)
    d = pick(defaults, WGMMA_DEFAULTS[f.head_dim])
    constraints = _common_constraints(f, s) + _at([
        "HEAD_DIM == 64 or HEAD_DIM == 128",
        "CWG >= 1 and CWG <= 3", "BLOCK_N % 16 == 0 and BLOCK_N <= 256", "STAGES >= 2",
        "PINGPONG == 0 or (PINGPONG == 1 and CWG == 2)",  # two consumers take turns
        f"{WGMMA_SMEM} <= {MAX_SMEM_SM90}",
        f"{WGMMA_REGS} <= {WGMMA_REG_BUDGET}",
    ], s["D"])
    # q, k, v reach the kernel as TMA descriptors: boxes of (rows x 64 columns) x all the head dim's slabs,
    # 128-byte swizzled, rows past the sequence read as zeros
    maps = [{"kind": "tensormap", "name": getattr(f, x), "box_rows": rows, "box_cols": 64, "swizzle": 128}
            for x, rows in (("q", WGMMA_ROWS), ("k", "BLOCK_N"), ("v", "BLOCK_N"))]
    args = [*maps, {"name": "out"}, *_args(f, s)[4:]]
    text = (f"{f.dtype}): FlashAttention-3 style forward for Hopper (sm_90a). "
            "One block per (64 * CWG query rows, batch*head), the longest causal tiles first, of one producer "
            "warpgroup and CWG consumer warpgroups (setmaxnreg moves the producer's registers to the consumers). "
            "The producer issues TMA copies of the Q tile and of BLOCK_N-key K and V tiles into a STAGES-deep ring "
            "of 128-byte-swizzled shared memory, each completing on an mbarrier; each consumer owns 64 query rows "
            "and, per key tile, issues S = Q K^T (wgmma m64nBLOCK_Nk16, both operands from shared memory) and O += "
            "P V of the tile before (wgmma with P from registers, V transposed through its descriptor), runs the "
            "online softmax of S in fp32 (exp2, scale folded into one FFMA, O rescaled only when a row max grew by "
            "more than 2^8) while that P V still runs, and frees the K/V slots through mbarriers; with PINGPONG the "
            "two consumers take turns issuing their products (named barriers). Causal tiles above the diagonal "
            "are skipped; the output is staged through shared memory for 16-byte stores")
    return _spec("wgmma", kernel, f, s, text, src, WGMMA_TUNABLES, d, constraints, WGMMA_ROWS, WGMMA_THREADS,
                 WGMMA_SMEM, args=args, arch_specific=True)


def attention_simt(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = _facts(m)
    if f.dtype != "float32":
        raise ValueError(f"the FFMA kernel takes fp32 inputs (fp32 stays fp32), not {f.dtype}; bf16 and fp16 "
                         "go to the tensor-core kernel")
    s = _shapes(f)
    kernel = "attention_simt"
    src = render("attention_simt.cu.j2", kernel=kernel, causal=f.causal)
    d = pick(defaults, SIMT_DEFAULTS)
    nt = SIMT_THREADS
    constraints = _common_constraints(f, s) + _at([
        "HEAD_DIM % (4 * WARPS) == 0",  # each warp's head-dim slice is whole float4s
        f"(HEAD_DIM // 4) % {SIMT_QT} == 0", f"(16 * {SIMT_QT}) % ({nt}) == 0",
        f"BLOCK_N % (({nt}) // 16) == 0", f"({nt}) // 16 <= 32",  # a row's softmax threads are in one warp
        f"{SIMT_O_FLOATS} <= {MAX_SIMT_O_FLOATS}",
        f"{SIMT_SMEM} <= {MAX_SMEM_SM80}",
    ], s["D"])
    text = ("fp32): online-softmax attention in fp32 FFMA (no TF32). One block per (16 query rows, batch*head), Q "
            "kept in shared memory; per tile of BLOCK_N keys the head dim is split over the warps for S = Q K^T "
            "(register-tiled, partial tiles summed in shared memory), the online softmax runs with a row's threads "
            "in one warp (exp2, scale folded in), and O += P V with O in registers, V read once per block through "
            "L2, P broadcast from shared memory")
    return _spec("simt", kernel, f, s, text, src, SIMT_TUNABLES, d, constraints, "16", nt, SIMT_SMEM)

