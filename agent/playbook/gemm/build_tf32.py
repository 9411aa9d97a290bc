"""fp32 GEMMs on the tensor cores at fp32 accuracy: split-precision TF32 ("3xTF32"), one template
(``templates/tf32x3_sgemm.cu.j2``, whose header explains the split, the accumulation and the layouts) for the
``gemm`` family's ``tf32x3`` variant (nn.Linear + elementwise chain, batched and transposed-B products:
:func:`gemm_tf32x3`) and the built-in ``matmul`` family's (a plain A @ B is a GEMM of the gemm family's layout:
:func:`sgemm_tf32x3`, and :func:`sgemm_tf32x3_padded` for shapes its tiles do not divide). It serves the layouts
whose tiles divide the shape: A row-major and contiguous, B either [K][N] or [N][K] (nn.Linear's weight), no
triangle mask; the others stay with the FFMA ``tiled`` variant.

Tunables: BM x BN block tile, BK k tile, WM x WN warp tile (WM % 16, WN % 32), STAGES cp.async
ring depth, GROUP_M block grouping, FLUSH (1: a fresh mma accumulator per k tile, summed in fp32
with round-to-nearest; 0: accumulate in the mma accumulator, half the registers) and TERMS
(3 = 3xTF32; 1 = plain TF32: at ``--precision tf32`` tunable over both and 1 by default, else offered only
when asked for, as it must fail the fp32 check; :mod:`..terms`).

Split-K: asked for with ``SPLIT_K`` > 1 in ``defaults``, the spec is the two-launch plan of
:func:`split_k_plan` (the k tiles divided among SPLIT_K blocks per output tile, their partial tiles
summed in slice order by a second kernel that applies the epilogue; grid z spans batch and slice),
SPLIT_K tunable over :data:`SPLIT_VALUES`, admissible only for outputs of fewer than two waves of 128 x 128
tiles. Without it (absent or 1) the spec is the single fused launch, no SPLIT_K tunable, its source unchanged.
"""

from __future__ import annotations

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.gemm.build import GemmFacts, as_gemm, epilogue_vars, gemm_facts
from kerngen.agent.playbook.entry import A, M, P, PAR, Entry
from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import i32, paren, MAX_SMEM, make_spec, pick, render
from kerngen.agent.playbook.terms import TERMS_PLAIN, TERMS_SPLIT, TERMS_VALUES, offer_terms

__all__ = ["DEFAULTS", "GEMM_IDEAS", "NO_FLUSH", "PADDED_SPEC_NAME", "PADDED_VARIANT", "SPEC_NAME", "SPLIT_VALUES",
           "TERMS_PLAIN", "TERMS_SPLIT", "TF32_IDEAS", "VARIANT", "gemm_tf32x3", "sgemm_tf32x3", "sgemm_tf32x3_padded",
           "mma_limits", "smem_bytes", "split_k_of", "split_k_plan"]

VARIANT = "tf32x3"
SPEC_NAME = "playbook-matmul-tf32x3"
TEMPLATE = "tf32x3_sgemm.cu.j2"
KERNEL = "sgemm_tf32x3"

# shared memory of one block: STAGES slots of A's tile (BM rows of BK + 8 floats) and B's tile
# (BK rows of BN + 4 floats); the pads make the fragment loads conflict-free (see the template)
SMEM = "4 * STAGES * (BM * (BK + 8) + BK * (BN + 4))"
THREADS = "32 * (BM // WM) * (BN // WN)"
# accumulator floats per thread: 4 per mma tile, twice with FLUSH (the per-tile partial sums);
# 128 leaves room for the split fragments under the 255-register limit
ACC_FLOATS = "4 * (WM // 16) * (WN // 8) * (1 + FLUSH)"
MAX_ACC_FLOATS = 128
# registers per thread, estimated: the accumulators, the raw fragments of a whole k tile (ptxas
# hoists every shared-memory load of the unrolled k tile: 4 floats per m16 tile and 2 per n8 tile
# per k8 step) and ~24 for addresses and counters. Calibrated on NVRTC 13 for sm_90 (e.g. 64x32
# warps, FLUSH 1, BK 32: estimate 248, ptxas 225; 64x64, FLUSH 0, BK 32: estimate 280, ptxas 255
# with spills). __launch_bounds__ gives a thread 65536 / THREADS registers at most.
REGS_EST = f"{ACC_FLOATS} + (BK // 8) * (4 * (WM // 16) + 2 * (WN // 8)) + 24"
MAX_REGS = 255
REGS_PER_SM = 65536

# the default: second of a 2.5-minute tune at 4096^3 on an H100 (2026-11-23, 438 admissible
# configs, `kerngen tune matmul --shape 4096x4096x4096`): 4 warps of 64 x 32 on a 128 x 64 block
# tile, BK 32 in a 2-deep ring: 2.325 ms against 2.584 for the former 128 x 128 default. The first
# (64 x 128, warps 32 x 64, 4 stages: 2.313 ms) spills 12 bytes on sm_80; this one spills on neither.
# ncu of the first: tensor pipe 57% active, occupancy 12%, stalls wait 28%, math-pipe throttle 27%
DEFAULTS = dict(BM=128, BN=64, BK=32, WM=64, WN=32, STAGES=2, GROUP_M=8, TERMS=TERMS_SPLIT, FLUSH=1)
TUNABLES = dict(BM=[64, 128, 256], BN=[64, 128, 256], BK=[16, 32], WM=[32, 64], WN=[32, 64], STAGES=[2, 3, 4],
                GROUP_M=[1, 8], TERMS=[TERMS_SPLIT], FLUSH=[0, 1])

# split-K: values of SPLIT_K in a split spec (1 is the single-launch spec); offered while the output (all
# batches) has fewer 128 x 128 tiles than two waves of an H100/H200's 132 SMs at one block each (a bound on
# the shape alone: more outputs fill the GPU without it, whatever the tile); the partials' scratch at most
# 2**26 floats (256 MiB); the second kernel's block
SPLIT_VALUES = (2, 4, 8, 16, 32)
SPLIT_MAX_OUTPUTS = 2 * 132 * 128 * 128
MAX_SPLIT_FLOATS = 2**26
SUM_THREADS = 256
PARTIALS = "partials"  # the scratch tensor [SPLIT_K][batch][M][N]
SPLIT_DESCRIPTION = ("; split-K: SPLIT_K blocks per output tile, each over its slice of the k tiles, write "
                     "partial tiles that a second kernel adds in slice order (deterministic) before the epilogue")


def split_k_of(defaults: dict[str, int]) -> int:
    """The SPLIT_K asked for in ``defaults`` (1: none); ValueError for a value not offered."""
    split = defaults.get("SPLIT_K", 1)
    if split != 1 and split not in SPLIT_VALUES:
        raise ValueError(f"SPLIT_K {split} is not one of 1, {', '.join(map(str, SPLIT_VALUES))}")
    return split


def split_k_plan(step: dict, rows: str, cols: str, inner: str, batch: str) -> dict:
    """The split-K plan made from the template's single fused launch ``step`` (arguments A, B, the
    epilogue's tensors, out, M, N, K; grid x = the output tiles): make_spec's ``steps``, ``scratch`` and
    the extra ``constraints``. The main kernel runs SPLIT_K blocks per tile (grid z = batch * SPLIT_K)
    into the partials; ``<kernel>_sum`` adds them and applies the epilogue (its tensors move there)."""
    args = step["args"]
    operands, fused, (out, m_, n_, k_) = args[:2], args[2:-4], args[-4:]
    tiles = step["grid"][0]
    main = dict(step, grid=[tiles, 1, f"{batch} * SPLIT_K"], args=[*operands, {"name": PARTIALS}, m_, n_, k_])
    total = f"{batch} * {rows} * {cols}"
    reduce = dict(kernel=f"{step['kernel']}_sum", grid=[f"cdiv({total}, {4 * SUM_THREADS})"], block=[SUM_THREADS],
                  args=[{"name": PARTIALS}, *fused, out, m_, n_, i32(batch)])
    ktiles = f"{inner} // BK"
    return dict(
        steps=[main, reduce],
        scratch=[dict(name=PARTIALS, dtype="float32", size=f"SPLIT_K * {total}")],
        constraints=[
            f"{total} < {SPLIT_MAX_OUTPUTS}",  # fewer than two waves of tiles: else no split
            f"(SPLIT_K - 1) * cdiv({ktiles}, SPLIT_K) < {ktiles}",  # every slice has a k tile (the last may be short)
            f"SPLIT_K * {total} <= {MAX_SPLIT_FLOATS}",
            f"{batch} * SPLIT_K <= 65535",
        ],
    )


def mma_limits(wn: int, bk: int, smem: str, loads: tuple[str, ...] = ()) -> list[str]:
    """The constraints of a block of mma.sync 3xTF32 warps (this GEMM's and the convolution's, :mod:`.conv.build_tf32`):
    the warp tiling (WN % ``wn``, BK % ``bk``), ``loads`` (the caller's copies per thread), the ring's ``smem``, the
    registers, TERMS and FLUSH."""
    return ["BM % WM == 0", "BN % WN == 0", "WM % 16 == 0", f"WN % {wn} == 0", f"BK % {bk} == 0", f"{THREADS} <= 1024",
            *loads, "STAGES >= 2", f"{smem} <= {MAX_SMEM}", f"{ACC_FLOATS} <= {MAX_ACC_FLOATS}",
            f"{REGS_EST} <= {MAX_REGS}", f"({THREADS}) * ({REGS_EST}) <= {REGS_PER_SM}",
            # plain TF32 (TERMS 1) fails the fp32 check: the tunables offer it at --precision tf32 only (offer_terms);
            # asked for, it resolves (to show the check rejecting it)
            " or ".join(f"TERMS == {v}" for v in TERMS_VALUES), "FLUSH == 0 or FLUSH == 1"]


def smem_bytes(cfg: dict[str, int]) -> int:
    """Shared memory of one block at ``cfg`` (the spec's SMEM expression, in Python)."""
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    return 4 * cfg["STAGES"] * (bm * (bk + 8) + bk * (bn + 4))


def gemm_tf32x3(m: FamilyMatch, defaults: dict[str, int], name: str = f"playbook-gemm-{VARIANT}") -> KernelSpec:
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
        *mma_limits(32, 8, smem, (f"(BM * BK // 4) % ({THREADS}) == 0", f"(BK * BN // 4) % ({THREADS}) == 0")),
        f"{M_} < 2**31 and {N_} < 2**31 and {K_} < 2**31",
        f"({M_} // BM) * ({N_} // BN) < 2**31", f"{batch} <= 65535", *f.checks,
    ]
    tunables = {k: list(v) for k, v in TUNABLES.items()}
    d = pick(defaults, DEFAULTS)
    terms = offer_terms(tunables, d, defaults, m.tf32)
    args = ([{"name": f.a}, {"name": f.b}] + ([{"name": f.bias}] if f.bias else []) + ep_args
            + [{"name": "out"}, i32(M_), i32(N_), i32(K_)])
    step = dict(kernel=KERNEL, grid=[f"({M_} // BM) * ({N_} // BN)", 1, batch], block=[THREADS], shared_mem=smem,
                args=args)
    plan = dict(steps=[step], constraints=[])
    if split > 1:
        plan = split_k_plan(step, M_, N_, K_, batch)
        tunables["SPLIT_K"], d["SPLIT_K"] = list(SPLIT_VALUES), split
    epi = f", then {formula} in registers" if formula else ""
    return make_spec(
        name,
        f"fp32 GEMM {f.what}{epi} on the tensor cores at fp32 accuracy (3xTF32): operands split into tf32 "
        "hi + lo, lo*hi + hi*lo + hi*hi per k8 step with mma.sync m16n8k8, per-k-tile fp32 partial sums, "
        "cp.async STAGES-deep ring, conflict-free fragment loads, the epilogue applied before each store"
        + (SPLIT_DESCRIPTION if split > 1 else "") + terms,
        src, tunables, d,
        defines=dict(TRANS_B=int(trans_b), SA=paren(f.SA), SB=paren(f.SB)),
        constraints=constraints + plan["constraints"], scratch=plan.get("scratch", []),
        steps=plan["steps"],
    )




def sgemm_tf32x3(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """The built-in matmul family's plain A @ B (inputs A (M, K) and B (K, N), row-major fp32)."""
    return gemm_tf32x3(as_gemm(m), defaults, SPEC_NAME)


# the padded variant: A, B padded with zeros to whole tiles of every offered size (BM, BN <= 256, BK <= 32)
PADDED_VARIANT = "tf32x3_padded"
PADDED_SPEC_NAME = "playbook-matmul-tf32x3-padded"
PAD_KERNEL = f"{KERNEL}_pad"
PAD_MN, PAD_K = 256, 32
PAD_THREADS, PAD_PER_THREAD = 256, 8  # pad_copy.cu.j2's block and elements a thread
MAX_PADDED_FLOATS = 2**31  # the three scratch matrices together (8 GiB)


def sgemm_tf32x3_padded(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    """The 3xTF32 GEMM for shapes its tiles do not divide (KernelBench 8: 8205 x 2949 x 5921): A and B
    copied into zero-padded scratch up to whole tiles, the tile-aligned kernel on those, the leading
    M x N of the padded product copied out. Zero rows and columns add nothing to the dot products, so the
    result is the unpadded one; offered only where the plain kernel's tiles do not divide the shape."""
    a, b = m.inputs[0].name, m.inputs[1].name
    rows, inner, cols = f"{a}.shape[0]", f"{a}.shape[1]", f"{b}.shape[1]"
    mp, kp, np_ = (f"(cdiv({rows}, {PAD_MN}) * {PAD_MN})", f"(cdiv({inner}, {PAD_K}) * {PAD_K})",
                   f"(cdiv({cols}, {PAD_MN}) * {PAD_MN})")
    padded = GemmFacts(kind="gemm", a="a_pad", b="b_pad", M=mp, N=np_, K=kp, LDA=kp, LDB=np_, what=f"{a} @ {b}")
    core = gemm_tf32x3(FamilyMatch("gemm", m.inputs, m.params, m.outputs, padded, precision=m.precision),
                       {k: v for k, v in defaults.items() if k != "SPLIT_K"}, PADDED_SPEC_NAME)

    def copy(src_: str, dst: str, sr: str, sc: str, dr: str, dc: str) -> dict:
        return dict(kernel=PAD_KERNEL, grid=[f"cdiv({dr} * {dc}, {PAD_THREADS * PAD_PER_THREAD})"], block=[PAD_THREADS],
                    args=[{"name": src_}, {"name": dst}, i32(sr), i32(sc), i32(dr), i32(dc)])

    (main,) = core.steps
    main = main.model_dump()
    main["args"] = [{"name": "c_pad"} if a.get("name") == "out" else a for a in main["args"]]
    return KernelSpec.model_validate(dict(
        core.model_dump(),
        description=core.description + "; A and B zero-padded to whole tiles in scratch, the product copied out",
        source=core.source + "\n" + render("pad_copy.cu.j2", kernel=PAD_KERNEL, threads=PAD_THREADS,
                                            per_thread=PAD_PER_THREAD),
        steps=[copy(a, "a_pad", rows, inner, mp, kp), copy(b, "b_pad", inner, cols, kp, np_), main,
               copy("c_pad", "out", mp, np_, rows, cols)],
        scratch=[dict(name="a_pad", dtype="float32", size=f"{mp} * {kp}"),
                 dict(name="b_pad", dtype="float32", size=f"{kp} * {np_}"),
                 dict(name="c_pad", dtype="float32", size=f"{mp} * {np_}")],
        constraints=[
            f"{inner} == {b}.shape[0]",
            f"{rows} % {PAD_MN} != 0 or {cols} % {PAD_MN} != 0 or {inner} % {PAD_K} != 0",  # else the plain kernel
            f"{mp} * {kp} + {kp} * {np_} + {mp} * {np_} <= {MAX_PADDED_FLOATS}",
            *core.constraints,
        ]))


SPLIT_TEXT = ("Split K across CTAs when the output has too few tiles to fill the GPU: SPLIT_K blocks per output "
              "tile each multiply a slice of the k tiles into fp32 partial tiles, summed in a fixed order (slice 0 "
              "first: the same result every run, no atomics) by a second small kernel that applies the epilogue.")


# ideas of the built-in "matmul" family's tf32x3 variants
NO_FLUSH = {"FLUSH": 0, "WN": 64, "BK": 16, "STAGES": 4}  # 64x64 warp tiles fit only with FLUSH 0 and BK 16
TF32_IDEAS: tuple[Entry, ...] = (
    Entry("mm-tf32x3", "Run the fp32 GEMM on the tensor cores with split-precision TF32 (3xTF32): split each "
          "operand into tf32 hi + lo and accumulate lo*hi + hi*lo + hi*hi with mma.sync m16n8k8 in fp32, "
          "per-k-tile partial sums added with round-to-nearest; fp32 accuracy at tensor-core speed.", P,
          "1.15x cuBLAS fp32 at 4096^3 on an H100, tuned", VARIANT,
          # split-K second: admissible only where the output's tiles leave SMs idle (KernelBench 6: 256 x 256,
          # K = 524288, 20.6 ms unsplit, 1.30 ms split), and there it must not wait for a refinement round
          ({}, {"SPLIT_K": 16}, {"BK": 16, "STAGES": 4}), round0=True),
    Entry("mm-tf32x3-padded", "Run the fp32 GEMM on the tensor cores (3xTF32) even where no tile divides the "
          "shape: copy A and B into zero-padded buffers of whole tiles, multiply those with the tile-aligned "
          "kernel and copy the leading M x N back; the zero rows and columns add nothing, and the copies are "
          "memory-bound passes worth a few percent of the product.", P,
          "expected near the tile-aligned kernel's speed less the copies (not yet measured on a GPU)", PADDED_VARIANT,
          ({}, {"BK": 16, "STAGES": 4}), round0=True),
    Entry("mm-tf32x3-accumulate", "Accumulate straight in the mma accumulator (no per-tile partial sums) with "
          "64x64 warp tiles and BK 16: half the accumulator registers and twice the mma work per fragment "
          "load; kept only if the fp32 check still passes (the tensor core's accumulation rounding decides).", P,
          "0-20%, or rejected by the check", VARIANT, (NO_FLUSH, {**NO_FLUSH, "BN": 256}),
          after=frozenset({VARIANT})),
    Entry("mm-tf32x3-tile", "Change the block tile of the 3xTF32 GEMM (64x128, or 256x128 with 64x64 warp tiles): "
          "a larger tile reuses each shared-memory byte more, a smaller one leaves room for two blocks per SM.",
          PAR, "0-15%", VARIANT, ({"BM": 64, "WM": 32}, {**NO_FLUSH, "BM": 256, "STAGES": 3}),
          after=frozenset({VARIANT})),
    Entry("mm-tf32x3-pipeline", "Retune the cp.async ring of the 3xTF32 GEMM: more stages or a shorter k tile, "
          "so more tiles are in flight while the tensor cores work.", A, "0-10%", VARIANT,
          ({"STAGES": 4, "BK": 16}, {"STAGES": 2}), after=frozenset({VARIANT})),
    Entry("mm-tf32x3-splitk", SPLIT_TEXT, PAR, "up to SPLIT_K x where the output's tiles leave most SMs idle "
          "(a long K, a small M x N); not offered where they fill two waves", VARIANT,
          ({"SPLIT_K": 8}, {"SPLIT_K": 16, "BM": 64, "WM": 32}), after=frozenset({VARIANT})),
    Entry("mm-tf32x3-l2", "Tune the grouped block order (GROUP_M) of the 3xTF32 GEMM for L2 reuse of A and B.",
          M, "0-5%", VARIANT, ({"GROUP_M": 1},), after=frozenset({VARIANT})),
)


_AFTER = frozenset({VARIANT})
GEMM_IDEAS: tuple[Entry, ...] = (
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
