"""The ``attention`` family's fp32 candidates of several regions (issue #32's mechanism, :mod:`..regions`): the
attention partitioned without this family, so that the front end's decomposition (:func:`..partition.partition`:
``scaled_dot_product_attention`` as ``softmax((q @ k^T) * scale) @ v``) or the forward's own explicit chain is cut
into three regions, two batched GEMMs and a row softmax, their kernels joined into one spec:

- region 0, ``S = (q @ k^T) * scale``: the gemm family's batched contraction (B*H batches, k read transposed in
  place), the scale in its epilogue; region 1, ``P = softmax(S)`` over the last dim: the softmax family's row
  kernel; region 2, ``O = P @ v``: the gemm family again. S and P live in scratch (``r0_out``, ``r1_out``).
- ``regions``: both GEMMs on the 3xTF32 mma.sync kernel (``tf32x3``, fp32-accurate) where its tiles divide the
  shapes, else the FFMA ``tiled`` GEMM; ``regions_wgmma``: both on the wgmma 3xTF32 core (Hopper alone).

Why: on one H200, KernelBench level 1's 97 (32 x 32 heads of 512 x 512, head dim 1024) runs 83.6 ms in the FFMA
``simt`` kernel against torch.compile's 25.0 ms (two batched GEMMs and a softmax): at head dim 1024 the work is two
GEMMs of 0.55 TFLOP each, which the tensor cores do at fp32 accuracy in 3xTF32. fp32 only (bf16/fp16 have ``fa2``
and ``wgmma``); no causal mask (the joined spec has no masked softmax), no dropout, no attn_mask (the family refuses
those itself).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kerngen.harness.spec.spec import KernelSpec

from kerngen.agent.playbook.family import FamilyMatch
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["PREFER", "attention_regions", "attention_regions_wgmma"]

# per candidate: the gemm variants its two GEMMs run on, the first offered at the region's shapes
PREFER = {"regions": ("tf32x3", "tiled"), "regions_wgmma": ("wgmma",)}
_SKIP = frozenset({"attention"})  # the partition asks every other family
_CACHE: dict[tuple, tuple[Any, FamilyMatch]] = {}  # (graph id, precision, variant) -> (graph, regions match)


def _pick(prefer: tuple[str, ...], regions: tuple[Any, ...], offers: list[Any]) -> list[tuple[str, ...]]:
    choice = []
    for r, o in zip(regions, offers):
        if r.lead != Lead.contraction:
            choice.append(o.offered[0].variant)
            continue
        v = next((p for p in prefer if o.get(p) is not None), None)
        if v is None:
            raise NotCovered(f"region {r.index} ({r.match.message}): {o.why_not(prefer[0]) or o.reason}")
        choice.append(v)
    return [tuple(choice)]


def _joined(m: FamilyMatch, variant: str) -> FamilyMatch:
    """The regions match of ``m``'s graph partitioned without the attention family (cached per graph)."""
    key = (id(m.graph), m.precision, variant)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is m.graph:
        return hit[1]
    from kerngen.agent.playbook import regions  # the regions machinery imports the registry, which imports us

    part = regions.partition(m.graph, _SKIP)
    if not part.covered:
        raise NotCovered(f"not cut into regions without the attention family: {part.why}")
    if [r.lead for r in part.regions] != [Lead.contraction, Lead.softmax, Lead.contraction]:
        raise NotCovered("not cut into two GEMMs around a softmax: "
                         + " | ".join(f"{r.match.family}[{', '.join(r.nodes)}]" for r in part.regions))
    for r in part.regions:
        r.match.precision = m.precision
    rm = regions.regions_match(part, {}, exhaustive=False, pick=partial(_pick, PREFER[variant]))
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[key] = (m.graph, rm)
    return rm


def _build(variant: str, m: FamilyMatch, defaults: dict[str, int]) -> KernelSpec:
    f = m.facts
    if f.dtype != "float32":
        raise ValueError(f"the two-GEMM candidate is fp32's ({f.dtype} attention has fa2 and wgmma)")
    if f.causal:
        raise ValueError("causal attention is not covered by the two-GEMM candidate (its softmax has no mask)")
    if m.graph is None:
        raise ValueError("the two-GEMM candidate needs the problem's graph")
    try:
        rm = _joined(m, variant)
    except NotCovered as exc:
        raise ValueError(str(exc)) from None
    return rm.facts.family.variants["v0"](rm, defaults)


attention_regions = partial(_build, "regions")
attention_regions_wgmma = partial(_build, "regions_wgmma")
