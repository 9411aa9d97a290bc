"""Split-K for the wgmma convolution (:mod:`.conv.build_wgmma`), as the GEMM core has it (:mod:`.gemm.build_wgmma`):
SPLIT_K k slices per output tile, each a work unit of the persistent grid (the core's ``gw_decode`` gives a unit its
slice's k tiles), write raw fp32 partial tiles into a scratch tensor laid out as the output (``partials[slice]`` in
NCHW); a second kernel adds the slices in slice order (the same sum every run) and applies the conv's epilogue
(bias, batch norm, residual, activation: whatever the traced chain holds) before the store.

Where it pays: late ResNet layers (7 x 7 or 14 x 14 outputs, K = 9 x 512) have 28-50 output tiles of 128 x 128 for an
H200's 132 SMs (ResNet18's layer4 convolutions lost to cuDNN 0.36 against 0.22 ms with 28 busy SMs). So an output of
fewer tiles than the grid gets a filling default (:func:`fill_defaults`): the largest split whose units still fit one
wave and whose slices keep at least ``MIN_SLICE_KT`` k tiles (``SHORT_SLICE_KT`` where none does), else one consumer
warpgroup (64-row tiles, twice the tiles); every other spec is built as before (byte for byte).
"""

from __future__ import annotations

from typing import Any

from kerngen.expr import cdiv

from kerngen.agent.playbook.gemm.build_wgmma import MAX_SPLIT_FLOATS, MAX_SPLIT_OUTPUTS, SPLIT_VALUES

__all__ = ["MIN_SLICE_KT", "SHORT_SLICE_KT", "SPLIT_CHOICES", "SUM_KERNEL", "fill_defaults", "split_plan"]

SUM_KERNEL = "conv_wgmma_sum"
PARTIALS = "partials"
# a split spec's SPLIT_K values: the GEMM's, and 1 (the same two launches with one slice) so that the tuner can see
# whether splitting pays at all without leaving the spec
SPLIT_CHOICES = (1, *SPLIT_VALUES)
# k tiles a slice keeps at least when a default splits: the ring (2-4 slots) fills and drains once per unit
MIN_SLICE_KT = 4
# ... and where no split keeps that many, the floor before one consumer warpgroup is tried: ResNet18's r13 (a 1 x 1
# stride-2 downsample, K = 128: 4 k tiles) took 0.0297 ms at SPLIT_K 2 against CWG 1's 0.0485 (H200, 2026-11-28,
# docs/measurements/2026-11-28-4xh200-c.md): short slices still beat half-height tiles there
SHORT_SLICE_KT = 2


def fill_defaults(cfg: dict[str, int], asked: dict[str, int], g: int, rows: int, ocg: int, kr: int) -> dict[str, int]:
    """What to add to the defaults ``cfg`` (the family's merged with ``asked``) of a convolution of ``g`` groups,
    ``rows`` GEMM rows, ``ocg`` channels a group and ``kr`` k elements a group (KR) so that its output tiles fill the
    persistent grid (CTAS blocks): {} when they already do, else a SPLIT_K (the largest value whose units fit one wave,
    each slice ``MIN_SLICE_KT`` k tiles or more, else ``SHORT_SLICE_KT``, the partials within their limit) or, when no
    split fits, CWG 1 (two 64-row tiles for one 128-row tile) if the doubled tiles fit one wave and CWG was not asked
    for."""
    bm, ctas = 64 * cfg["WGM"] * cfg["CWG"], cfg["CTAS"]
    tiles = g * cdiv(rows, bm) * cdiv(ocg, cfg["BN"])
    if tiles >= ctas:
        return {}
    kt = cdiv(kr, cfg["BK"])
    outputs = rows * g * ocg
    for floor in (MIN_SLICE_KT, SHORT_SLICE_KT):
        fits = [s for s in SPLIT_VALUES if tiles * s <= ctas and kt // s >= floor and (s - 1) * cdiv(kt, s) < kt
                and s * outputs <= MAX_SPLIT_FLOATS and outputs < MAX_SPLIT_OUTPUTS]
        if fits:
            return {"SPLIT_K": max(fits)}
    if cfg["CWG"] == 2 and "CWG" not in asked and 2 * tiles <= ctas:
        return {"CWG": 1}
    return {}


def split_plan(steps: list[dict[str, Any]], scratch: list[dict[str, Any]], constraints: list[str],
               tunables: dict[str, list[int]], defaults: dict[str, int], *, split: int, total: str, ktiles: str,
               epi_args: list[dict[str, Any]]) -> str:
    """Turn the one-launch plan (its last step the main kernel) into split-K's, in place: the main kernel writes
    ``partials`` ([SPLIT_K][N][OC][positions], fp32) instead of taking the epilogue's tensors and the output, the sum
    kernel (one thread per output, ``total`` of them) follows with them; SPLIT_K tunable, ``split`` by default, every
    slice non-empty (``ktiles``: k tiles of a group's GEMM). Returns the description's sentence."""
    main = steps[-1]
    main["args"] = [*main["args"][:2], {"name": PARTIALS}]
    steps.append(dict(kernel=SUM_KERNEL, grid=[f"cdiv({total}, 256)"], block=[256],
                      args=[{"name": PARTIALS}, *epi_args]))
    scratch.append(dict(name=PARTIALS, dtype="float32", size=f"SPLIT_K * {total}"))
    constraints += [f"(SPLIT_K - 1) * cdiv({ktiles}, SPLIT_K) < {ktiles}",  # every k slice has a k tile
                    f"{total} < {MAX_SPLIT_OUTPUTS}", f"SPLIT_K * {total} <= {MAX_SPLIT_FLOATS}"]
    tunables["SPLIT_K"], defaults["SPLIT_K"] = list(SPLIT_CHOICES), split
    return ("; split-K: SPLIT_K k slices per output tile (each a unit of the persistent grid) write fp32 partial "
            "tiles that a second kernel adds in slice order before the conv's epilogue")
