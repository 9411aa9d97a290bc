"""The ``attention`` family's fp32 candidates of several regions (issue #32's mechanism), declared here as
:class:`..family.Partitioned` and built above the registry (:func:`..regions.family_of`): the attention partitioned
without this family, so that the front end's decomposition (:func:`..partition.partition`:
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

import math

from kerngen.agent.playbook.family import FamilyMatch, Partitioned
from kerngen.agent.playbook.leads import Lead

__all__ = ["PARTITIONED"]


def _why_not(m: FamilyMatch) -> str:
    f = m.facts
    if f.dtype != "float32":
        return f"the two-GEMM candidate is fp32's ({f.dtype} attention has fa2 and wgmma)"
    if f.causal:
        return "causal attention is not covered by the two-GEMM candidate (its softmax has no mask)"
    return _scratch_why_not(m)


def _scratch_why_not(m: FamilyMatch) -> str:
    """S and P grow with Sq x Sk: offered only where they are not larger than q, k, v and out together (the head
    dim large against the lengths, as KernelBench 97's 1,024 against 512). There the two GEMMs are the work; where S
    and P are larger, the flash-style kernel that never writes them is the one to run, and scratch of many times the
    problem's own bytes could exceed the GPU's memory (a harness error stops the search)."""
    g, f = m.graph, m.facts
    shapes = [g.shape(t) if g is not None else None for t in (f.q, f.k, f.v)]
    if any(s is None or len(s) < 2 for s in shapes):
        return "the two-GEMM candidate needs q, k and v's shapes"
    q, k, v = shapes
    lead = math.prod(q[:-2])
    sp = 2 * lead * q[-2] * k[-2]
    qkvo = math.prod(q) + math.prod(k) + math.prod(v) + lead * q[-2] * v[-1]
    if sp > qkvo:
        return (f"S and P ({_bytes(4 * sp)}) would be larger than q, k, v and out together ({_bytes(4 * qkvo)}): "
                "the flash-style kernel's case")
    return ""


def _bytes(n: int) -> str:
    return next(f"{n / 2**e:.2f} {unit}" for e, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B")) if n >= 2**e
                or not e)


def _two_gemms(*prefer: str) -> Partitioned:
    return Partitioned(what="two GEMMs around a softmax", leads=(Lead.contraction, Lead.softmax, Lead.contraction),
                       prefer={Lead.contraction: prefer}, why_not=_why_not)


# per candidate: the gemm variants its two GEMMs run on, the first offered at the region's shapes
PARTITIONED = {"regions": _two_gemms("tf32x3", "tiled"), "regions_wgmma": _two_gemms("wgmma")}
