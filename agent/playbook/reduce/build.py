"""Variant builders of the reduce family (``(match, defaults) -> KernelSpec``; the family record is
:mod:`.reduce.family`).

Every problem of the family is one reduction viewed as ``(OUTER, RLEN, INNER)``: the dims before
the reduced ones, the reduced ones (adjacent, merged into one of length RLEN) and the ones after. A
combine operator (:data:`COMBINES`) folds ``prologue(x)`` over RLEN; the result goes through the
epilogue (C statements on ``r``: divide by RLEN for a mean, sqrt for a 2-norm, ...) and is either
the output (an int64 index for argmax/argmin) or, for the "normalize" forms (L1/L2/Frobenius),
divides every element of its row (``out = x / r``).

Three variants, three templates (the shared device code is ``reduce_common.cu.j2``):

- ``rows`` (INNER == 1, the reduced dim contiguous): TPR threads per output (a sub-warp, a warp or
  a whole block), 16-byte loads after peeling the unaligned head of the row, a shuffle tree;
  normalize forms run a second loop over the row, its first CACHE_KB kilobytes kept in shared memory.
- ``cols`` (INNER > 1): threads along INNER (coalesced, 16-byte loads when INNER % 4 == 0), each
  walking every TY-th position of RLEN, the TY partials merged in shared memory.
- ``split`` (INNER == 1, few outputs with a long RLEN, the Frobenius norm): each row cut into NCH
  chunks, one block per chunk writes a partial to scratch; a second launch merges a row's partials
  (the same fixed order in every block, so deterministic, no atomics) and writes the result, or
  scales its chunk by it.
"""

from __future__ import annotations

import math

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import MAX_SMEM, make_spec, pick, render, shape_prod

__all__ = ["ARG_COMBINES", "COMBINES", "EPILOGUES", "PROLOGUES", "SPEC_PREFIXES", "cols", "rows", "split"]

COMBINES = ("sum", "prod", "max", "min", "argmax", "argmin")
ARG_COMBINES = ("argmax", "argmin")
PROLOGUES = {"none": "v", "abs": "fabsf(v)", "square": "v * v"}  # C of float v, applied to each element
# epilogue steps on the combined value r: op -> C statement ({c}: the step's constant as a float literal).
# clamp_min keeps NaN as torch.clamp_min does (fmaxf would drop it)
EPILOGUES = {
    "div_len": "r = r / (float)RLEN;",
    "sqrt": "r = sqrtf(r);",
    "add": "r = r + {c};",
    "mul": "r = r * {c};",
    "div": "r = r / {c};",
    "clamp_min": "r = (r != r) ? r : fmaxf(r, {c});",
}
SPEC_PREFIXES = {"rows": "playbook-reduce-rows-", "cols": "playbook-reduce-cols-", "split": "playbook-reduce-split-"}
STATIC_SMEM = 48 * 1024  # bytes of static shared memory a kernel may declare
SMS = 132  # H100/H200 SMs: sizes the split grid's default to a few waves


# ---------------------------------------------------------------------------------------------
# what every variant shares
def _c_float(value: float) -> str:
    text = repr(float(value))
    return text + ("f" if ("e" in text or "." in text) else ".f")


def epilogue_c(steps: list) -> list[str]:
    """The epilogue as C statements on ``float r`` (``steps``: [op, constant] pairs in order)."""
    return [EPILOGUES[op].format(c=_c_float(c)) for op, c in steps]


def _geometry(m: FamilyMatch) -> dict[str, str]:
    """OUTER, RLEN, INNER as expressions over the input's shape (the reduced dims are lo..hi)."""
    x = m.x
    lo, hi = m.facts.dims
    nd = len(x.shape)
    return {"OUTER": shape_prod(x.name, range(0, lo)), "RLEN": shape_prod(x.name, range(lo, hi + 1)),
            "INNER": shape_prod(x.name, range(hi + 1, nd))}


def _sizes(m: FamilyMatch) -> tuple[int, int, int]:
    x = m.x
    lo, hi = m.facts.dims
    return math.prod(x.shape[:lo]), math.prod(x.shape[lo:hi + 1]), math.prod(x.shape[hi + 1:])


def _common_vars(m: FamilyMatch) -> dict[str, object]:
    f = m.facts
    return dict(dtype="float32", combine=f.combine, arg=f.combine in ARG_COMBINES,
                prologue=PROLOGUES[f.prologue],
                epilogue=epilogue_c(f.epilogue), normalize=bool(f.normalize))


def _acc_bytes(m: FamilyMatch) -> int:
    return 16 if m.facts.combine in ARG_COMBINES else 4  # struct {float; long long} is 16 bytes


def _name(m: FamilyMatch, variant: str) -> str:
    return SPEC_PREFIXES[variant] + m.facts.op.replace("_", "-")


def _pow2_at_most(n: float, lo: int, hi: int) -> int:
    p = lo
    while p * 2 <= min(n, hi):
        p *= 2
    return p


def _what(m: FamilyMatch) -> str:
    return (m.facts.formula or m.facts.op)


# ---------------------------------------------------------------------------------------------
def rows(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    geo = _geometry(m)
    _, rlen, _ = _sizes(m)
    normalize = bool(m.facts.normalize)
    tpr = _pow2_at_most(rlen / 4 / 8, 4, 1024)  # ~8 vectors a thread before the tree
    block = max(tpr, 256)
    row_kb = rlen * 4 // 1024
    # a normalize pass re-reads the row: keep half of a long row (up to 128 KB) on chip, which also
    # leaves one block a SM, so the rows in flight fit in L2 for the rest
    cache = 0 if not normalize or row_kb < 32 else min(128, -(-(row_kb // 2) // 32) * 32)
    d = pick(defaults, dict(TPR=tpr, BLOCK=block, UNROLL=4, HINT=0, CACHE_KB=cache))
    if d["CACHE_KB"] and d["TPR"] != d["BLOCK"]:  # several rows a block asked for: they share no cache
        d["CACHE_KB"] = 0
    kernel = f"reduce_{m.facts.op}_rows"
    src = render("reduce_rows.cu.j2", kernel=kernel, **_common_vars(m))
    tunables = dict(TPR=[4, 8, 16, 32, 64, 128, 256, 512, 1024], BLOCK=[128, 256, 512, 1024], UNROLL=[1, 2, 4, 8],
                    HINT=[0, 1], CACHE_KB=[0, 32, 64, 96, 128, 160, 200])
    smem = "CACHE_V * 16" if normalize else "0"
    defines = dict(geo)
    defines["CACHE_V"] = f"min(({geo['RLEN']}) // 4, CACHE_KB * 64)" if normalize else "0"
    red_bytes = f"(BLOCK // 32 + 1) * {_acc_bytes(m)}"
    constraints = [f"({geo['INNER']}) == 1", f"({geo['RLEN']}) >= 1", "BLOCK % TPR == 0",
                   # with fewer than 32 long rows one block a row leaves the GPU idle: the split variant's case
                   f"({geo['OUTER']}) >= 32 or ({geo['RLEN']}) <= 65536",
                   f"cdiv({geo['OUTER']}, BLOCK // TPR) < 2**31"]
    if normalize:
        constraints += ["CACHE_KB == 0 or TPR == BLOCK",
                        f"min(({geo['RLEN']}) // 4, CACHE_KB * 64) * 16 + {red_bytes} <= {MAX_SMEM}"]
    else:  # nothing is read twice: the tunable stays (one catalogue idea for every form) but only 0 is admissible
        constraints.append("CACHE_KB == 0")
    return make_spec(
        _name(m, "rows"),
        f"{_what(m)}, reduced over a contiguous dim: TPR threads per row (BLOCK/TPR rows a block), 16-byte loads after "
        f"the row's unaligned head, UNROLL loads in flight a thread, a shuffle tree (+ shared memory across warps)"
        + ("; a second loop divides the row by the result, its first CACHE_KB KB re-read from shared memory"
           if normalize else ""),
        src, tunables, d,
        defines={k: v for k, v in defines.items() if k != "INNER"},
        constraints=constraints,
        steps=[dict(kernel=kernel, grid=[f"cdiv({geo['OUTER']}, BLOCK // TPR)"], block=["BLOCK"], shared_mem=smem,
                    args=[{"name": m.x.name}, {"name": "out"}])],
    )


# ---------------------------------------------------------------------------------------------
def cols(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    geo = _geometry(m)
    _, rlen, inner = _sizes(m)
    vec = 1 if inner % 4 == 0 else 0
    tx = _pow2_at_most(inner / (4 if vec else 1), 4, 32)
    ty = max(32 // tx, min(256 // tx, _pow2_at_most(rlen, 1, 256)))  # at least a warp a block
    d = pick(defaults, dict(TX=tx, TY=ty, UNROLL=4, VEC=vec, HINT=0))
    kernel = f"reduce_{m.facts.op}_cols"
    src = render("reduce_cols.cu.j2", kernel=kernel, **_common_vars(m))
    acc = _acc_bytes(m)
    vw = "(4 if VEC else 1)"
    nib = f"cdiv({geo['INNER']}, TX * {vw})"
    normalize = bool(m.facts.normalize)
    return make_spec(
        _name(m, "cols"),
        f"{_what(m)}, reduced over a strided dim: TX threads along the contiguous inner dims (coalesced, 16-byte loads "
        f"when VEC), TY threads splitting the reduced dim, UNROLL rows in flight a thread, the TY partials merged in "
        f"shared memory" + ("; a second loop divides by the result" if normalize else ""),
        src,
        dict(TX=[4, 8, 16, 32, 64, 128], TY=[1, 2, 4, 8, 16, 32, 64, 128, 256], UNROLL=[1, 2, 4, 8], VEC=[0, 1],
             HINT=[0, 1]),
        d,
        defines={**geo, "NIB": nib, "VW": vw},
        constraints=[f"({geo['INNER']}) > 1", f"({geo['RLEN']}) >= 1", "TX * TY <= 1024",
                     f"VEC == 0 or ({geo['INNER']}) % 4 == 0",
                     f"TX * TY * {vw} * {acc} + TX * {vw} * 4 <= {STATIC_SMEM}",
                     f"{nib} * ({geo['OUTER']}) < 2**31"],
        steps=[dict(kernel=kernel, grid=[f"{nib} * ({geo['OUTER']})"], block=["TX * TY"],
                    args=[{"name": m.x.name}, {"name": "out"}])],
    )


# ---------------------------------------------------------------------------------------------
def split(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    geo = _geometry(m)
    outer, rlen, _ = _sizes(m)
    block, u = 256, 4
    # a few waves of blocks over the whole problem, each chunk long enough to keep every thread busy
    want = max(2, 8 * SMS // max(outer, 1))
    nch = _pow2_at_most(min(want, max(2, rlen // (block * 4 * u))), 2, 4096)
    d = pick(defaults, dict(BLOCK=block, UNROLL=u, NCH=nch, HINT=0))
    arg = m.facts.combine in ARG_COMBINES
    normalize = bool(m.facts.normalize)
    kp, kf = f"reduce_{m.facts.op}_part", f"reduce_{m.facts.op}_{'scale' if normalize else 'finish'}"
    src = render("reduce_split.cu.j2", kernel_part=kp, kernel_finish=kf, **_common_vars(m))
    span = f"round_up(cdiv({geo['RLEN']}, NCH), 4)"
    nchr = f"cdiv({geo['RLEN']}, {span})"
    parts = [{"name": "part_v"}] + ([{"name": "part_i"}] if arg else [])
    scratch = [dict(name="part_v", dtype="float32", size=f"({geo['OUTER']}) * {nchr}")]
    if arg:
        scratch.append(dict(name="part_i", dtype="int64", size=f"({geo['OUTER']}) * {nchr}"))
    grid2 = f"({geo['OUTER']}) * {nchr}" if normalize else geo["OUTER"]
    return make_spec(
        _name(m, "split"),
        f"{_what(m)}, reduced over a long contiguous dim: each row cut into NCH chunks, a block per chunk writes a "
        f"partial to scratch (16-byte loads, UNROLL in flight a thread); a second launch merges a row's partials in a "
        f"fixed order (deterministic, no atomics) and "
        + ("divides its chunk (walked in reverse, to meet the first launch's last reads in L2) by the result"
           if normalize else "writes the result"),
        src,
        dict(BLOCK=[128, 256, 512, 1024], UNROLL=[1, 2, 4, 8], NCH=[2 ** k for k in range(1, 13)], HINT=[0, 1]),
        d,
        defines={"OUTER": geo["OUTER"], "RLEN": geo["RLEN"], "SPAN": span, "NCHR": nchr},
        scratch=scratch,
        constraints=[f"({geo['INNER']}) == 1",
                     # shorter rows gain nothing from a split: one block a row (the rows variant) reads them at once
                     f"({geo['RLEN']}) >= 4096", f"({geo['OUTER']}) * {nchr} < 2**31"],
        steps=[dict(kernel=kp, grid=[f"({geo['OUTER']}) * {nchr}"], block=["BLOCK"], args=[{"name": m.x.name}] + parts),
               dict(kernel=kf, grid=[grid2], block=["BLOCK"], args=[{"name": m.x.name}] + parts + [{"name": "out"}])],
    )
