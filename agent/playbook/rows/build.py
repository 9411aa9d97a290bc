"""Variant builders of the row families: softmax, layernorm, rmsnorm (the row in registers, split, cooperative)."""

from __future__ import annotations

import math

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import COOP_NB, MAX_SMEM, make_spec, pick, render, shape_prod, vec_width


# ---------------------------------------------------------------------------------------------
# row reductions (softmax / layernorm / rmsnorm) with the row in registers
def _row_facts(m: FamilyMatch) -> tuple[str, str, str]:
    """(row-length expression, row-count expression, dtype)."""
    x = m.x
    nd = len(x.shape)
    k = m.facts.ndims
    ncols = shape_prod(x.name, range(nd - k, nd))
    nrows = f"({x.name}.numel // ({ncols}))"
    return ncols, nrows, x.dtype


def _param_args(m: FamilyMatch) -> list[dict[str, str]]:
    """The launch args of the row op's weight and bias, those it has."""
    return [{"name": t} for t in (m.facts.weight, m.facts.bias) if t]


def _row_defaults(ncols: int, ve: int) -> tuple[int, int]:
    """(TPR, BLOCK) so that each thread holds at most ~16-32 values."""
    nv = max(1, ncols // ve)
    tpr = 32
    while tpr < 1024 and math.ceil(nv / tpr) * ve > 16:
        tpr *= 2
    if tpr < 32:
        tpr = 32
    block = max(tpr, 128 if tpr <= 128 else tpr)
    return tpr, block


def rows_reg(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    mode = m.family
    x = m.x
    ve = vec_width(x.dtype)
    ncols, nrows, dtype = _row_facts(m)
    k = m.facts.ndims
    ncols_val = math.prod(x.shape[len(x.shape) - k:])
    tpr, block = _row_defaults(ncols_val, ve)
    # full occupancy (32 registers a thread) pays when a thread holds few values: rmsnorm bf16 8192,
    # 16 values a thread, went from 75% to 100% theoretical occupancy and 0.0716 to 0.0705 ms (H200)
    d = pick(defaults, dict(TPR=tpr, BLOCK=block, CACHE_HINT=0, RITER=1, BULK=0, MIN_BLOCKS=1))
    if "MIN_BLOCKS" not in defaults and math.ceil(ncols_val / ve / d["TPR"]) * ve <= 16:
        d["MIN_BLOCKS"] = 2048 // d["BLOCK"]
    has_w = bool(m.facts.weight)
    has_b = bool(m.facts.bias)
    kernel = f"{mode}_rows"
    log = bool(m.facts.log)  # softmax family: log_softmax
    src = render("rows_reg.cu.j2", dtype=dtype, mode=mode, eps=repr(float(m.facts.eps)),
                 has_weight=has_w, has_bias=has_b, wdtype=(m.facts.wdtype or dtype), kernel=kernel, log_softmax=log)
    args = [{"name": x.name}, *_param_args(m), {"name": "out"}, {"kind": "int64", "value": nrows}]
    per_thread = f"cdiv(({ncols}) // {ve}, TPR) * {ve}"
    bulk_smem = f"BULK * min(RITER, 2) * (BLOCK // TPR) * ({ncols}) * {16 // ve}"  # 16-byte vectors of ve
    return make_spec(
        f"playbook-{mode}-rows-reg",
        f"{'log_softmax' if log else mode}: TPR threads per row, BLOCK/TPR rows per block, the row held in registers "
        f"(16-byte loads, fp32 math): one read and one write of the row; RITER row groups per block "
        f"with the next row loaded while this one is reduced",
        src,
        dict(TPR=[32, 64, 128, 256, 512, 1024], BLOCK=[128, 256, 512, 1024], CACHE_HINT=[0, 1, 2], RITER=[1, 2, 4, 8, 16],
             BULK=[0, 1], MIN_BLOCKS=[1, 2, 4, 8, 16]),
        d,
        defines={"NCOLS": ncols},
        constraints=[f"({ncols}) % {ve} == 0", "BLOCK % TPR == 0", f"{per_thread} <= 64",
                     f"{per_thread} * BLOCK <= 32768", f"cdiv({nrows}, BLOCK // TPR) < 2**31",
                     f"{bulk_smem} <= {MAX_SMEM}", "BULK == 0 or CACHE_HINT == 0", "BLOCK * MIN_BLOCKS <= 2048"],
        steps=[dict(kernel=kernel, grid=[f"cdiv({nrows}, (BLOCK // TPR) * RITER)"], block=["BLOCK"], args=args,
                    shared_mem=bulk_smem)],
    )


def rmsnorm_two_pass(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    x = m.x
    ve = vec_width(x.dtype)
    ncols, nrows, dtype = _row_facts(m)
    # H200, rmsnorm bf16 8192x8192, prototype sweep: BLOCK 256, U 4, MIN_BLOCKS 5 (48 registers) 0.0672 ms against
    # 0.0685-0.0716 for the other (BLOCK, U, MIN_BLOCKS) tried; in the harness 0.0684 against the register-held
    # row's 0.0703
    d = pick(defaults, dict(BLOCK=256, U=4, MIN_BLOCKS=5, EL=1))
    has_w = bool(m.facts.weight)
    kernel = "rmsnorm_two_pass"
    src = render("rmsnorm_two_pass.cu.j2", dtype=dtype, eps=repr(float(m.facts.eps)), has_weight=has_w,
                 wdtype=(m.facts.wdtype or dtype), kernel=kernel)
    args = [{"name": x.name}, *_param_args(m), {"name": "out"}, {"kind": "int64", "value": nrows}]
    return make_spec(
        "playbook-rmsnorm-two-pass",
        "rmsnorm: a block per row, two loops over the row (sum of squares, then scale and store) with U "
        "16-byte vectors in flight a thread; the second loop re-reads the row from L1/L2 (evict-last on the "
        "first read), so no row is held in registers and occupancy stays full",
        src,
        dict(BLOCK=[128, 256, 512, 1024], U=[1, 2, 4, 8], MIN_BLOCKS=[1, 2, 3, 4, 5, 6, 8, 16], EL=[0, 1]),
        d,
        defines={"NCOLS": ncols},
        constraints=[f"({ncols}) % {ve} == 0", f"({ncols}) // {ve} < 2**31", f"{nrows} < 2**31",
                     "BLOCK * MIN_BLOCKS <= 2048"],
        steps=[dict(kernel=kernel, grid=[nrows], block=["BLOCK"], args=args)],
    )


def softmax_long(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    x = m.x
    ve = vec_width(x.dtype)
    ncols, nrows, dtype = _row_facts(m)
    d = pick(defaults, dict(BLOCK=1024, UNROLL=8, CACHE_KB=0))
    kernel = "softmax_long"
    log = bool(m.facts.log)
    src = render("softmax_long.cu.j2", dtype=dtype, kernel=kernel, log_softmax=log)
    return make_spec(
        "playbook-softmax-long",
        f"{'log_softmax' if log else 'softmax'} over long rows: a block per row, online max/sum in one DRAM pass, the row cached in "
        "shared memory (CACHE_KB) and the rest re-read from L2; streaming stores",
        src,
        dict(BLOCK=[256, 512, 1024], UNROLL=[2, 4, 8], CACHE_KB=[0, 32, 64, 96, 128, 160, 200]),
        d,
        defines={"NCOLS": ncols, "CACHE_V": f"min(({ncols}) // {ve}, CACHE_KB * 64)"},
        constraints=[f"({ncols}) % {ve} == 0", f"{nrows} < 2**31", f"({ncols}) < 2**31"],
        steps=[dict(kernel=kernel, grid=[nrows], block=["BLOCK"], shared_mem="CACHE_V * 16",
                    args=[{"name": x.name}, {"name": "out"}, {"kind": "int64", "value": nrows}])],
    )


def layernorm_split(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    x = m.x
    ve = vec_width(x.dtype)
    ncols, nrows, dtype = _row_facts(m)
    d = pick(defaults, dict(BLOCK=256, ITEMS=4, MIN_BLOCKS=4))  # exhaustive tune of 52 configs, H200: 0.2372 ms
    has_w, has_b = bool(m.facts.weight), bool(m.facts.bias)
    ks, ka = "layernorm_stats", "layernorm_apply"
    src = render("layernorm_split.cu.j2", dtype=dtype, eps=repr(float(m.facts.eps)), has_weight=has_w, has_bias=has_b,
                 wdtype=(m.facts.wdtype or dtype), kernel_stats=ks, kernel_apply=ka)
    nch = f"cdiv(({ncols}) // {ve}, BLOCK * ITEMS)"
    args = [{"name": x.name}, {"name": "part"}, *_param_args(m), {"name": "out"}]
    return make_spec(
        "playbook-layernorm-split",
        "layernorm over long rows: each row split over many blocks; kernel 1 writes per-chunk (mean, M2) "
        "(Welford/Chan), kernel 2 merges them and normalises its chunk (chunks walked backwards to hit L2)",
        src,
        dict(BLOCK=[128, 256, 512, 1024], ITEMS=[2, 4, 8, 16], MIN_BLOCKS=[1, 2, 4, 8]),
        d,
        defines={"NCOLS": ncols, "NCH": nch},
        scratch=[dict(name="part", dtype="float32", size=f"2 * {nrows} * {nch}")],
        constraints=[f"({ncols}) % {ve} == 0", f"{nch} <= 65535", f"{nrows} < 2**31", "BLOCK * MIN_BLOCKS <= 2048"],
        steps=[dict(kernel=ks, grid=[nrows, nch], block=["BLOCK"], args=[{"name": x.name}, {"name": "part"}]),
               dict(kernel=ka, grid=[nrows, nch], block=["BLOCK"], args=args)],
    )


def layernorm_coop(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    x = m.x
    ve = vec_width(x.dtype)
    ncols, nrows, dtype = _row_facts(m)
    has_w, has_b = bool(m.facts.weight), bool(m.facts.bias)
    wdtype = (m.facts.wdtype or dtype)
    wv = ve // 4 if wdtype == "float32" else 1  # float4s per vector of a parameter
    # H200, suite shape (16 rows of 16 MB): 128 blocks of 512 threads, the weight and all the bias slices that
    # fit in shared memory, the next row bulk-prefetched into L2: 0.2085 ms after tuning (the split kernel:
    # 0.2315). In an earlier run the tuner moved both branches from NB 132 to 128 (0.225 -> 0.214 ms): with 128
    # blocks every segment is exactly 8192 vectors.
    d = pick(defaults, dict(NB=COOP_NB, BLOCK=512, W_SMEM=1 if has_w else 0, BSL=16 if has_b else 0, PF=1, PG=1, HINT=1))
    kernel = "layernorm_coop"
    src = render("layernorm_coop.cu.j2", dtype=dtype, eps=repr(float(m.facts.eps)), has_weight=has_w, has_bias=has_b,
                 wdtype=wdtype, kernel=kernel)
    seg = f"cdiv(({ncols}) // {ve}, NB)"
    it = f"cdiv({seg}, BLOCK)"
    wsm = f"W_SMEM * {seg} * {wv}" if has_w else "0"
    # bias slices in shared memory: BSL at most, and no more than the row has or the space left allows
    bs = f"min(BSL, {it}, max(0, ({MAX_SMEM - 1024} - 16 * {wsm}) // (16 * BLOCK * {wv})))" if has_b else "0"
    smem = f"({wsm} + ({bs}) * BLOCK * {wv}) * 16"
    args = [{"name": x.name}, {"name": "part"}, {"name": "count"}, *_param_args(m), {"name": "out"},
            {"kind": "int64", "value": nrows}]
    return make_spec(
        "playbook-layernorm-coop",
        "layernorm over long rows in 2 DRAM passes: a cooperative persistent grid of NB blocks holds one row "
        "at a time in registers (block b: a contiguous segment) across a grid-wide barrier per row; the weight "
        "and BSL slices of the bias stay in shared memory for the whole launch; the next row is bulk-prefetched "
        "into L2 while the block reduces, waits and stores (PF); partials merged by cdiv(NB, 32) warps at once",
        src,
        dict(NB=[66, 128, 132, 264], BLOCK=[256, 512, 768, 1024], W_SMEM=[0, 1] if has_w else [0],
             BSL=[0, 2, 4, 6, 8, 10, 12, 14, 16] if has_b else [0], PF=[0, 1], PG=[1, 2, 4], HINT=[0, 1]),
        d,
        defines={"NCOLS": ncols, "BS": bs},
        scratch=[dict(name="part", dtype="float32", size=f"4 * {nrows} * NB"),
                 dict(name="count", dtype="int32", size=nrows)],
        # x in registers: at most 64 values a thread and 128 KB a block; shared memory leaves 1 KB for the
        # kernel's own arrays; the partials are merged by warps of this block (NB <= BLOCK)
        constraints=[f"({ncols}) % {ve} == 0", f"{it} * {ve} <= 64", f"{it} * {ve} * BLOCK <= 32768",
                     f"{smem} <= {MAX_SMEM - 1024}", "NB <= BLOCK",
                     f"{nrows} < 2**31", f"({ncols}) < 2**31"],
        steps=[dict(tensor="count", value=0),
               dict(kernel=kernel, grid=["NB"], block=["BLOCK"], shared_mem=smem, args=args, cooperative=True)],
    )
