"""Variant builders of the ``scan`` family (:mod:`.scan.family`): ``rows`` (the scanned dim is the
innermost: a row group per row, tiles carried along it), ``split`` (the same tile scan over chunks of
few long rows: chunk totals, their scan, the chunks' scans) and ``cols`` (an outer dim: a thread per
column). x is viewed as (outer, L, inner) around the scanned dim; the output's length along it may be
one less than x's (a scan of x narrowed by one)."""

from __future__ import annotations

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.render import make_spec, pick, render, shape_prod

__all__ = ["rows_defaults", "scan_cols", "scan_rows", "scan_split", "split_defaults"]

MAX_VALUES_PER_THREAD = 32  # ITEMS * VEC: the tile a thread holds in registers
# From this many rows on, the rows kernel alone fills an H100/H200 (132 SMs x 4 blocks of 512 threads): the split
# kernels' extra pass over the data only costs there, so they are not offered.
SPLIT_FEW_ROWS = 1024


def _view(m: FamilyMatch) -> dict[str, str]:
    """Expressions of the (outer, L, inner) view, the output length and the offset of the first x read."""
    f, x = m.facts, m.facts.x
    rank, dim = len(m.tensors()[x]), f.dim
    return {"NOUTER": shape_prod(x, range(dim)), "LIN": f"{x}.shape[{dim}]", "NINNER": shape_prod(x, range(dim + 1, rank)),
            "LOUT": f"out.shape[{dim}]", "XOFF": str(f.start)}


def _args(m: FamilyMatch) -> list[dict]:
    args = [{"name": m.facts.x}]
    if m.facts.mask:
        args.append({"name": m.facts.mask})
    return args


def _describe(m: FamilyMatch) -> str:
    f = m.facts
    masked = f" of {f.x} * {f.mask} ({f.mask_dtype} mask)" if f.mask else ""
    return f"{f.form} cum{f.op}{masked} along dim {f.dim}"


def _source(m: FamilyMatch, template: str, **names: object) -> str:
    f = m.facts
    return render(template, op=f.op, reverse=bool(f.reverse), exclusive=bool(f.exclusive),
                  mask=f.mask_dtype or "", **names)


def _row_len(m: FamilyMatch) -> int:
    return m.tensors()["out"][m.facts.dim]


def rows_defaults(length: int, vec: int) -> dict[str, int]:
    """Threads per row so that a tile of 4 vectors a thread covers the row (at most 512 threads: longer
    rows take several tiles), and blocks of at least 256 threads (several short rows a block)."""
    tpr = 32
    while tpr < 512 and tpr * 4 * vec < length:
        tpr *= 2
    return dict(TPR=tpr, BLOCK=max(tpr, 256), ITEMS=4, VEC=vec, CACHE_HINT=0, PF=0, MIN_BLOCKS=1)


def split_defaults(length: int, vec: int) -> dict[str, int]:
    """Chunks of 4 tiles of 256 threads, made smaller (fewer tiles, then fewer threads) until a row has at
    least two of them."""
    tpr, tiles, items = min(rows_defaults(length, vec)["TPR"], 256), 4, 4
    while -(-length // (tiles * tpr * items * vec)) < 2 and (tiles > 1 or tpr > 32):
        if tiles > 1:
            tiles //= 2
        else:
            tpr //= 2
    return dict(TPR=tpr, BLOCK=tpr, ITEMS=items, VEC=vec, CACHE_HINT=0, PF=0, MIN_BLOCKS=1, CHUNK_TILES=tiles)


def _vec_ok(v: dict[str, str]) -> str:
    """16-byte vectors need every row of x, of the mask and of the output to start 16-byte aligned."""
    return f"VEC == 1 or (({v['LIN']}) % 4 == 0 and ({v['LOUT']}) % 4 == 0 and {v['XOFF']} % 4 == 0)"


def _vec_default(m: FamilyMatch) -> int:
    f, shape = m.facts, m.tensors()[m.facts.x]
    return 4 if shape[f.dim] % 4 == 0 and _row_len(m) % 4 == 0 and f.start % 4 == 0 else 1


ROW_TUNABLES = dict(TPR=[32, 64, 128, 256, 512, 1024], BLOCK=[32, 64, 128, 256, 512, 1024], ITEMS=[1, 2, 4, 8], VEC=[1, 4],
                    CACHE_HINT=[0, 1], PF=[0, 1], MIN_BLOCKS=[1, 2, 3, 4])


def scan_rows(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    v = _view(m)
    kernel = f"cum{m.facts.op}_rows"
    d = pick(defaults, rows_defaults(_row_len(m), _vec_default(m)))
    return make_spec(
        "playbook-scan-rows",
        f"{_describe(m)}: TPR threads per row, each warp a contiguous segment of the tile in coalesced VEC-wide "
        "loads, lane scans in registers, warp scans by shuffles, one shared-memory exchange of warp totals a "
        "tile, the row total carried across tiles (PF: the next tile's loads in flight meanwhile); one read and "
        "one write",
        _source(m, "scan_rows.cu.j2", split=False, kernel=kernel, kernel_reduce="", kernel_offsets=""),
        ROW_TUNABLES, d,
        defines={"NROWS": v["NOUTER"], "LIN": v["LIN"], "LOUT": v["LOUT"], "XOFF": v["XOFF"]},
        constraints=[f"{v['NINNER']} == 1", "BLOCK % TPR == 0", f"ITEMS * VEC <= {MAX_VALUES_PER_THREAD}",
                     _vec_ok(v), f"{v['LOUT']} + TPR * ITEMS * VEC < 2**31", "BLOCK * MIN_BLOCKS <= 2048",
                     f"cdiv({v['NOUTER']}, BLOCK // TPR) < 2**31"],
        steps=[dict(kernel=kernel, grid=[f"cdiv({v['NOUTER']}, BLOCK // TPR)"], block=["BLOCK"],
                    args=[*_args(m), {"name": "out"}])],
    )


def scan_split(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    v = _view(m)
    op = m.facts.op
    kr, ko, ks = f"cum{op}_chunk_totals", f"cum{op}_chunk_offsets", f"cum{op}_chunks"
    d = pick(defaults, split_defaults(_row_len(m), _vec_default(m)))
    chunk = "(CHUNK_TILES * TPR * ITEMS * VEC)"
    nch = f"cdiv({v['LOUT']}, {chunk})"
    nrows = v["NOUTER"]
    return make_spec(
        "playbook-scan-split",
        f"{_describe(m)} over few long rows: every row in chunks of CHUNK_TILES tiles over many blocks; kernel 1 "
        "the chunks' totals, kernel 2 a warp per row scans them into offsets, kernel 3 re-scans every chunk "
        "from its offset (the rows kernel's tile scan); 2 reads and 1 write",
        _source(m, "scan_rows.cu.j2", split=True, kernel=ks, kernel_reduce=kr, kernel_offsets=ko),
        {**ROW_TUNABLES, "CHUNK_TILES": [1, 2, 4, 8, 16, 32]}, d,
        defines={"NROWS": nrows, "LIN": v["LIN"], "LOUT": v["LOUT"], "XOFF": v["XOFF"], "NCH": nch,
                 "CHUNK": chunk},
        scratch=[dict(name="part", dtype="float32", size=f"{nrows} * {nch}")],
        constraints=[f"{nrows} < {SPLIT_FEW_ROWS}", f"{v['NINNER']} == 1", "BLOCK == TPR",
                     f"ITEMS * VEC <= {MAX_VALUES_PER_THREAD}", _vec_ok(v), f"{nch} * {chunk} < 2**31", f"{nch} >= 2",
                     "BLOCK * MIN_BLOCKS <= 2048"],
        steps=[dict(kernel=kr, grid=[nch, nrows], block=["BLOCK"], args=[*_args(m), {"name": "part"}]),
               dict(kernel=ko, grid=[nrows], block=[32], args=[{"name": "part"}]),
               dict(kernel=ks, grid=[nch, nrows], block=["BLOCK"],
                    args=[*_args(m), {"name": "part"}, {"name": "out"}])],
    )


def scan_cols(m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    if m.facts.dim == len(m.tensors()[m.facts.x]) - 1:
        raise ValueError("the scanned dim is the innermost: no columns for the column kernel (the rows kernel's case)")
    v = _view(m)
    kernel = f"cum{m.facts.op}_cols"
    d = pick(defaults, dict(BLOCK=256, UNROLL=4, CACHE_HINT=0))
    ncols = f"({v['NOUTER']}) * ({v['NINNER']})"
    return make_spec(
        "playbook-scan-cols",
        f"{_describe(m)}: a thread per column of the (outer, L, inner) view walks the scanned dim with UNROLL "
        "coalesced loads in flight (PyTorch's serial order for outer dims)",
        _source(m, "scan_cols.cu.j2", kernel=kernel),
        dict(BLOCK=[64, 128, 256, 512, 1024], UNROLL=[1, 2, 4, 8, 16], CACHE_HINT=[0, 1]), d,
        defines={k: v[k] for k in ("NOUTER", "NINNER", "LIN", "LOUT", "XOFF")},
        constraints=[f"{v['NINNER']} > 1", f"{v['LOUT']} + UNROLL < 2**31", f"cdiv({ncols}, BLOCK) < 2**31"],
        steps=[dict(kernel=kernel, grid=[f"cdiv({ncols}, BLOCK)"], block=["BLOCK"], args=[*_args(m), {"name": "out"}])],
    )

