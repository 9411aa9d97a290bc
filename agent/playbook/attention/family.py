"""Playbook family (registry) ``attention``: scaled-dot-product attention, forward, of three inputs q, k, v
((batch, heads, seq, dim), contiguous; k and v may have their own sequence length when there is no mask):
``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` and the explicit chain
``softmax(q @ k.transpose(-2, -1) * scale [masked_fill of a causal triu]) @ v`` (KernelBench level 1's 97,
the suite's ``attention``).

Which problems are its own: a forward that calls ``scaled_dot_product_attention`` or mentions attention
(those are refused here with the reason when they cannot be served, never handed to another family), or
one with a softmax between two matrix products (handed on, None, when it turns out not to be attention).
What the forward computes is read by running it (the model has no parameters: nothing is allocated but
the probe, in fp64 on the CPU): a probe of two keys gives the scale (row 1 sees scores 0 and ``scale``,
so its output is sigmoid(scale)) and whether the mask is causal (row 0 sees key 0 alone), then random
inputs must match ``F.scaled_dot_product_attention`` with that scale and mask. Nothing is guessed from
names.

Not covered (refused with the reason): masks other than causal (``attn_mask``), dropout, projections or
other parameters, grouped-query or broadcast heads, a value head dim other than the query's, causal
attention with Sq != Sk (PyTorch's mask is top-left aligned), bf16/fp16 head dims other than 64 and 128.
Variants: ``fa2`` (bf16/fp16 on the tensor cores, mma.sync: sm_80 and later), ``wgmma`` (bf16/fp16, Hopper's
wgmma and TMA: sm_90a) and ``simt`` (fp32 FFMA, any head dim a multiple of 4); for fp32 without a causal mask also
``regions`` / ``regions_wgmma`` (:mod:`.attention.regions`: two batched 3xTF32 GEMMs and a row softmax, one spec of
three regions, S and P in scratch; declared here, built by the regions machinery above the registry).
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook.attention.build import (TENSOR_CORE_DTYPES, TENSOR_CORE_HEAD_DIMS, attention_fa2,
                                                   attention_simt, attention_wgmma)
from kerngen.agent.playbook.attention.regions import PARTITIONED
from kerngen.agent.playbook.entry import A, C, M, PAR, Entry
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Tensor
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.leads import Lead

__all__ = ["ATTENTION", "AttentionFacts", "probe_attention"]

NAME = "attention"
SDPA = "scaled_dot_product_attention"
SOFTMAX = ("softmax", "_softmax")
PRODUCTS = ("matmul", "bmm", "einsum", "mm")
REFUSED = {"linear": "projections (nn.Linear)", "_native_multi_head_attention": "nn.MultiheadAttention (projections)"}
DTYPES = (*TENSOR_CORE_DTYPES, "float32")
PROBE_SEED = 20261123
DEFAULT_SCALE_RTOL = 1e-9  # a probed scale this close to 1/sqrt(D) is PyTorch's default
NONE_OF_THE_FORMS = ("attention: the forward computes none of the forms the playbook has (softmax(q k^T * scale) v, "
                     "with or without a causal mask, on (..., seq, dim) inputs as given)")


class AttentionFacts(Facts):
    kind: str = "attention"
    q: str
    k: str
    v: str
    dtype: str
    causal: bool
    scale: float | None  # None: PyTorch's default 1/sqrt(head dim)
    nd: int
    head_dim: int
    what: str


def _forward(g: Graph, *args: Any) -> Any:
    import torch  # the playbook imports without torch, as its other probes and tracers do

    try:
        with torch.no_grad():
            return g.run(dict(zip((t.name for t in g.inputs), args)))
    except Exception as exc:  # the forward is the problem's own code: whatever it raises, there is no answer
        raise NotCovered(f"attention: cannot run the forward on a small probe ({type(exc).__name__}); not covered "
                         "by the playbook") from None


def probe_attention(g: Graph, q: Tensor, k: Tensor) -> tuple[bool, float]:
    """(causal, scale) of the attention the graph of three inputs q, k, v computes, or :class:`NotCovered`: see
    the module's text. The graph is specialised to its shapes, so the probes keep the sequence and head dims
    and make every leading dim 1 (the heads are independent): the probe needs no more than one head's work."""
    import torch  # the playbook imports without torch, as its other probes and tracers do
    import torch.nn.functional as F

    lead, sq, sk, d = (1,) * (len(q.shape) - 2), q.shape[-2], k.shape[-2], q.shape[-1]
    qz = torch.zeros(*lead, sq, d, dtype=torch.float64)
    qz[..., 0] = 1.0  # every query row is e0
    kz = torch.zeros(*lead, sk, d, dtype=torch.float64)
    kz[..., 1, 0] = 1.0  # key 1 is e0, every other key 0: a row's scores are 0 but scale at key 1
    vz = torch.zeros(*lead, sk, d, dtype=torch.float64)
    vz[..., 1, :] = 1.0  # value 1 is 1, every other 0: a row's output is the weight of key 1
    got = _forward(g, qz, kz, vz)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(qz.shape):
        raise NotCovered("attention: the forward does not return one tensor of q's shape")
    causal = abs(float(got[(0,) * len(lead) + (0, 0)])) < 1e-12  # row 0 sees key 0 alone
    row = 1 if causal else 0
    w1, seen = float(got[(0,) * len(lead) + (row, 0)]), (2 if causal else sk)
    if not 0.0 < w1 < 1.0 or sq < 2 or sk < 2:
        raise NotCovered(NONE_OF_THE_FORMS)
    scale = math.log(w1 * (seen - 1) / (1.0 - w1))
    gen = torch.Generator().manual_seed(PROBE_SEED)
    qr = torch.randn(*lead, sq, d, generator=gen, dtype=torch.float64)
    kr = torch.randn(*lead, sk, d, generator=gen, dtype=torch.float64)
    vr = torch.randn(*lead, sk, d, generator=gen, dtype=torch.float64)
    got = _forward(g, qr, kr, vr)
    want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, scale=scale)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
            not torch.allclose(got.double(), want, rtol=1e-6, atol=1e-9):
        raise NotCovered(NONE_OF_THE_FORMS)
    return causal, scale


def _sdpa_options(g: Graph) -> None:
    """Refuse what a scaled_dot_product_attention call asks for beyond a causal mask and a scale."""
    calls = [n for n in g.live() if n.op == SDPA]
    if len(calls) > 1:
        raise NotCovered("attention: more than one scaled_dot_product_attention call is not covered")
    for n in calls:
        if n["attn_mask"] is not None:
            raise NotCovered("attention with an attn_mask (masks other than causal) is not covered by the playbook")
        if n["dropout_p"] != 0:
            raise NotCovered("attention with dropout is not covered by the playbook")
        if n["enable_gqa"]:
            raise NotCovered("grouped-query attention (enable_gqa) is not covered by the playbook")


def _tensors(g: Graph) -> tuple[Tensor, Tensor, Tensor]:
    if g.params:
        raise NotCovered("attention with parameters (projections) is not covered: the playbook's kernel is the "
                         "attention core softmax(q k^T * scale) v of three inputs")
    if len(g.inputs) != 3:
        raise NotCovered(f"attention of {len(g.inputs)} inputs is not covered (q, k, v)")
    q, k, v = g.inputs
    if len(q.shape) < 3 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        raise NotCovered("attention inputs must be (batch, heads, seq, dim) tensors of one rank")
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise NotCovered(f"attention with broadcast or grouped-query heads (q {q.shape}, k {k.shape}, v {v.shape}) "
                         "is not covered")
    if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        raise NotCovered(f"attention operands do not match: q {q.shape}, k {k.shape}, v {v.shape}")
    if v.shape[-1] != q.shape[-1]:
        raise NotCovered(f"attention with a value head dim {v.shape[-1]} other than the query's {q.shape[-1]} is not "
                         "covered")
    if g.out.shape != q.shape:
        raise NotCovered(f"attention output {g.out.shape} is not q's shape {q.shape}")
    dtypes = {q.dtype, k.dtype, v.dtype, g.out.dtype}
    if len(dtypes) != 1 or q.dtype not in DTYPES:
        raise NotCovered(f"attention in {', '.join(sorted(dtypes))} is not covered (bf16, fp16 or fp32, all alike)")
    d = q.shape[-1]
    if q.dtype in TENSOR_CORE_DTYPES and d not in TENSOR_CORE_HEAD_DIMS:
        raise NotCovered(f"attention head dim {d} is not covered for {q.dtype} (the tensor-core kernel takes "
                         f"{' and '.join(map(str, TENSOR_CORE_HEAD_DIMS))})")
    if d % 4:
        raise NotCovered(f"attention head dim {d} is not covered in fp32 (a multiple of 4)")
    return q, k, v


def _attention(g: Graph) -> FamilyMatch:
    live = g.live()
    refused = sorted({REFUSED[n.op] for n in live if n.op in REFUSED})
    if any(n.op == "dropout" and n["train"] and n["p"] for n in live):
        refused.insert(0, "dropout")
    if refused:
        raise NotCovered(f"attention with {refused[0]} is not covered by the playbook")
    _sdpa_options(g)
    q, k, v = _tensors(g)
    nd, sq, sk, d = len(q.shape), q.shape[-2], k.shape[-2], q.shape[-1]
    sdpa = next((n for n in live if n.op == SDPA), None)
    if sdpa is not None and len(live) == 1 and [sdpa["query"], sdpa["key"], sdpa["value"]] == [q.name, k.name, v.name]:
        causal, scale = bool(sdpa["is_causal"]), sdpa["scale"] if sdpa["scale"] is not None else 1.0 / math.sqrt(d)
    else:
        causal, scale = probe_attention(g, q, k)
    if causal and sq != sk:
        raise NotCovered(f"causal attention with Sq {sq} != Sk {sk} is not covered (PyTorch's causal mask is "
                         "top-left aligned)")
    if not scale > 0.0:  # the kernels take a row's max of q k^T before scaling: a positive scale only
        raise NotCovered(f"attention with a scale of {scale:.6g} (not positive) is not covered")
    default = abs(scale * math.sqrt(d) - 1.0) < DEFAULT_SCALE_RTOL
    bh = math.prod(q.shape[:-2])
    scale_text = f"1/sqrt({d})" if default else f"{scale:.6g}"
    what = (f"softmax({q.name} {k.name}^T * {scale_text}{' + causal mask' if causal else ''}) {v.name}: "
            f"{bh} heads of {sq} x {sk}, head dim {d}")
    facts = AttentionFacts(q=q.name, k=k.name, v=v.name, dtype=q.dtype, causal=causal,
                           scale=None if default else scale, nd=nd, head_dim=d, what=what)
    return FamilyMatch.of(g, facts, f"attention: {what}")


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    keyword = any(n.op == SDPA or "attention" in n.module_type.lower() for n in live)
    products = sum(n.op in PRODUCTS for n in live)
    chain = any(n.op in SOFTMAX for n in live) and products >= 2
    if not keyword and not chain:
        return None
    try:
        return _attention(g)
    except NotCovered:
        if keyword:
            raise
        return None  # a softmax between two products that is no attention: the other families say what they cover


_FA2, _WGMMA, _SIMT = frozenset({"fa2"}), frozenset({"wgmma"}), frozenset({"simt"})
IDEAS = (
    Entry("attn-wgmma", "FlashAttention-3 on Hopper (sm_90a): one producer warpgroup hands its registers to the "
          "others (setmaxnreg) and issues TMA copies of the Q tile and of K and V tiles into a ring of 128-byte-"
          "swizzled shared memory, each completing on an mbarrier; two consumer warpgroups of 64 query rows each "
          "issue S = Q K^T with wgmma straight from shared memory and, right behind it, O += P V of the tile before "
          "(P from registers, V transposed by its descriptor), and run the online softmax of S while that product "
          "still runs (exp2, the scale folded into one FFMA, O rescaled only when a row max grew by more than 2^8); "
          "slots freed through mbarriers, causal tiles above the diagonal skipped, the longest query tiles first.",
          C, "the FlashAttention-3 paper: 1.5-2.0x FlashAttention-2 on an H100 in bf16",
          "wgmma", ({}, {"STAGES": 2}, {"BLOCK_N": 96}), round0=True),
    Entry("attn-wgmma-tile", "Re-shape the Hopper attention tile: longer key tiles (176 keys: fewer softmax passes "
          "and barriers per product), three consumer warpgroups on 192 query rows at head dim 64 (more products in "
          "flight per producer), one consumer of 64 rows (twice the blocks, two of them resident per SM), or a "
          "third K/V stage.", PAR, "0-15%", "wgmma",
          ({"BLOCK_N": 176, "STAGES": 2}, {"BLOCK_N": 112}, {"CWG": 3, "BLOCK_N": 64, "PINGPONG": 0},
           {"CWG": 1, "BLOCK_N": 128, "PINGPONG": 0}, {"BLOCK_N": 64, "STAGES": 4}), after=_WGMMA),
    Entry("attn-wgmma-pingpong", "Ping-pong two consumer warpgroups (FlashAttention-3's inter-warpgroup "
          "schedule), or stop: with turns each issues its products only in its turn, handed over through named "
          "barriers, so one warpgroup's softmax runs while the other's products occupy the tensor cores; without, "
          "both issue as soon as their tiles have landed.", A,
          "0-10% where the tensor cores idle during the softmax", "wgmma",
          ({"PINGPONG": 0}, {"PINGPONG": 1, "CWG": 2}, {"PINGPONG": 1, "CWG": 2, "BLOCK_N": 176, "STAGES": 2}),
          after=_WGMMA),
    Entry("attn-fa2", "FlashAttention-2 on the tensor cores: one block per 128 query rows and head (4 warps of 32 "
          "rows, Q re-read from shared memory at head dim 128; Q held in registers at 64), K and V tiles streamed "
          "through a cp.async ring into swizzled shared memory, S = Q K^T and O += P V with mma.sync m16n8k16 fed "
          "by ldmatrix, the online softmax in fp32 registers (exp2, the scale folded into one FFMA, the max moved "
          "and O rescaled only when a row grew by more than 2^8, the row sums as one more mma of P with ones), P "
          "converted to 16 bits in registers and never stored; the causal tiles above the "
          "diagonal skipped and the longest query tiles launched first.", C,
          "O(S) memory instead of the S x S score matrix; FlashAttention-2 reaches ~70% of the mma.sync peak",
          "fa2", ({}, {"BLOCK_N": 32}, {"WARPS": 8, "QSMEM": 0}), round0=True),
    Entry("attn-fa2-tile", "Re-shape the attention tile: 64 query rows per block (twice the blocks, more of them "
          "resident per SM, a shorter causal tail), or 4 warps of 32 rows each (every K/V fragment feeds two "
          "mmas, half the ldmatrix traffic per FLOP; at head dim 128 Q is then re-read from shared memory at "
          "every k step, as FlashAttention-2 does, so O and S fit in 255 registers), or 8 such warps on 256 "
          "rows, or 128 keys per tile (fewer softmax rescales and barriers).",
          PAR, "0-15%", "fa2",
          ({"BLOCK_M": 64, "WARPS": 4, "QSMEM": 0}, {"BLOCK_M": 128, "WARPS": 4, "QSMEM": 0},
           {"BLOCK_M": 128, "WARPS": 4, "QSMEM": 1}, {"BLOCK_M": 256, "WARPS": 8, "QSMEM": 1, "BLOCK_N": 32},
           {"BLOCK_N": 128, "WARPS": 8, "QSMEM": 0}), after=_FA2),
    Entry("attn-fa2-pipeline", "Deepen the K/V cp.async ring to 3 or 4 stages so more key tiles are in flight "
          "while the tensor cores work on this one (shorter key tiles keep the shared memory in bounds).", A,
          "0-10% where the loads are exposed", "fa2", ({"STAGES": 3}, {"STAGES": 4, "BLOCK_N": 32}), after=_FA2),
    Entry("attn-fa2-pingpong", "Ping-pong two groups of 4 warps on the tensor cores (FlashAttention-3's schedule, "
          "with mma.sync): while one group runs its softmax the other runs its mmas (P V of the tile before, then "
          "Q K^T of this one), the turn handed over through a named barrier, the K/V ring in 3 slots guarded by "
          "one all-thread named barrier a tile.", A, "0-20% where the tensor pipe idles during the softmax", "fa2",
          ({"WARPS": 8, "QSMEM": 0, "STAGES": 3, "PINGPONG": 1},
           {"BLOCK_M": 256, "WARPS": 8, "QSMEM": 1, "STAGES": 3, "PINGPONG": 1, "BLOCK_N": 32}), after=_FA2),
    Entry("attn-fa2-layout", "Pad the shared-memory rows by 16 bytes instead of XOR-swizzling the 16-byte chunks: "
          "simpler addresses for ldmatrix and cp.async at the cost of a little shared memory; both are free of "
          "bank conflicts.", M, "0-3%", "fa2", ({"SWIZZLE": 0},), after=_FA2),
    Entry("attn-simt", "fp32 attention in FFMA (fp32 stays fp32, no TF32): one block per 16 query rows and head "
          "with Q in shared memory; per key tile the head dim is split over the warps for S = Q K^T (register "
          "tiles, partial sums met in shared memory), the online softmax with exp2 and the scale folded in, and "
          "O += P V with O in registers and every V element read once per block.", C,
          "O(S) memory; FFMA-bound at large head dims", "simt", ({}, {"BLOCK_N": 32}), round0=True),
    Entry("attn-simt-warps", "Four warps instead of eight in the fp32 attention: twice the O columns per thread "
          "(more FFMAs per shared-memory broadcast of P) and a larger head-dim slice per warp.", PAR, "0-15%",
          "simt", ({"WARPS": 4}, {"WARPS": 4, "BLOCK_N": 32}), after=_SIMT),
    Entry("attn-regions-wgmma", "fp32 attention as PyTorch runs it, on Hopper's tensor cores at fp32 accuracy: "
          "S = (Q K^T) * scale as a batched GEMM on the wgmma 3xTF32 core (K read transposed in place, the scale in "
          "its epilogue) into a scratch buffer, a row softmax of S into a second one, then O = P V on the same core; "
          "three regions' kernels in one spec.", C, "two GEMMs at the wgmma core's 3xTF32 rate instead of FFMA; "
          "S and P each written and read once (at large head dims the GEMMs dominate)", "regions_wgmma", ({},),
          round0=True),
    Entry("attn-regions", "fp32 attention as PyTorch runs it, at fp32 accuracy on the tensor cores: S = (Q K^T) * "
          "scale as a batched 3xTF32 mma.sync GEMM (the FFMA GEMM where its tiles do not divide the shape; K read "
          "transposed in place, the scale in its epilogue) into a scratch buffer, a row softmax of S into a second "
          "one, then O = P V; three regions' kernels in one spec.", C,
          "two GEMMs at the 3xTF32 rate instead of FFMA; S and P each written and read once", "regions", ({},),
          round0=True),
)

ATTENTION = Family(name=NAME, leads=frozenset({Lead.attention, Lead.contraction}), recognise=_recognise,
                   constraints=("scaled_dot_product_attention, or softmax between two products",
                                "q, k, v inputs only", "causal or no mask", "no dropout", "no projections",
                                "one head dim"),
                   variants={"fa2": attention_fa2, "wgmma": attention_wgmma, "simt": attention_simt},
                   partitioned=PARTITIONED, ideas=IDEAS)
