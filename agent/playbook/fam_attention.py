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
wgmma and TMA: sm_90a) and ``simt`` (fp32 FFMA, any head dim a multiple of 4).
"""

from __future__ import annotations

import math
from typing import Any

from kerngen.agent.playbook.build_attention import (TENSOR_CORE_DTYPES, TENSOR_CORE_HEAD_DIMS, attention_fa2,
                                                   attention_simt, attention_wgmma)
from kerngen.agent.playbook.entry import A, C, M, PAR, Entry
from kerngen.agent.playbook.family import Family
from kerngen.agent.playbook.forward_source import UNKNOWN, kwarg
from kerngen.agent.playbook.match import FamilyMatch, Read, Tensor
from kerngen.agent.playbook.not_covered import NotCovered

__all__ = ["FAMILY", "probe_attention", "recognise"]

NAME = "attention"
SDPA = "scaled_dot_product_attention"
SOFTMAX = ("softmax", "Softmax", "_softmax")
PRODUCTS = ("matmul", "bmm", "einsum", "mm")
REFUSED = {"dropout": "dropout", "Dropout": "dropout", "Linear": "projections (nn.Linear)",
           "linear": "projections (F.linear)", "MultiheadAttention": "nn.MultiheadAttention (projections)"}
DTYPES = (*TENSOR_CORE_DTYPES, "float32")
PROBE_SEQ = 7  # query and key rows of the random probe (Sq == Sk), 5 and 9 when the problem's differ
PROBE_SEED = 20261123
DEFAULT_SCALE_RTOL = 1e-9  # a probed scale this close to 1/sqrt(D) is PyTorch's default
NONE_OF_THE_FORMS = ("attention: the forward computes none of the forms the playbook has (softmax(q k^T * scale) v, "
                     "with or without a causal mask, on (..., seq, dim) inputs as given)")


def _forward(model: Any, *args: Any) -> Any:
    import torch  # the playbook imports without torch, as its other probes and tracers do

    try:
        with torch.no_grad():
            return model(*args)
    except Exception as exc:  # the forward is the problem's own code: whatever it raises, there is no answer
        raise NotCovered(f"attention: cannot run the forward on a small probe ({type(exc).__name__}); not covered "
                         "by the playbook") from None


def probe_attention(model: Any, lead: tuple[int, ...], head_dim: int, sq: int, sk: int) -> tuple[bool, float]:
    """(causal, scale) of the attention ``model`` computes, or :class:`NotCovered`: see the module's text."""
    import torch  # the playbook imports without torch, as its other probes and tracers do
    import torch.nn.functional as F

    q = torch.zeros(*lead, 2, head_dim, dtype=torch.float64)
    q[..., 0] = 1.0  # both query rows are e0
    k = torch.zeros_like(q)
    k[..., 1, 0] = 1.0  # key 0 is 0, key 1 is e0: row scores (0, scale)
    v = torch.zeros_like(q)
    v[..., 1, :] = 1.0  # value 0 is 0, value 1 is 1: a row's output is the weight of key 1
    got = _forward(model, q, k, v)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(q.shape):
        raise NotCovered("attention: the forward does not return one tensor of q's shape")
    w1, w0 = float(got[(0,) * len(lead) + (1, 0)]), float(got[(0,) * len(lead) + (0, 0)])
    if not 0.0 < w1 < 1.0:
        raise NotCovered(NONE_OF_THE_FORMS)
    scale = math.log(w1 / (1.0 - w1))
    causal = abs(w0) < 1e-12  # row 0 sees key 0 alone
    gen = torch.Generator().manual_seed(PROBE_SEED)
    q = torch.randn(*lead, sq, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(*lead, sk, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(*lead, sk, head_dim, generator=gen, dtype=torch.float64)
    got = _forward(model, q, k, v)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
            not torch.allclose(got.double(), want, rtol=1e-6, atol=1e-9):
        raise NotCovered(NONE_OF_THE_FORMS)
    return causal, scale


def _sdpa_options(r: Read) -> None:
    """Refuse what an F.scaled_dot_product_attention call asks for beyond a causal mask and a scale."""
    calls = [node for kind, _, node in r.kinds if kind == SDPA]
    if len(calls) > 1:
        raise NotCovered("attention: more than one scaled_dot_product_attention call is not covered")
    for node in calls:
        if kwarg(node, "attn_mask", 3) is not None:
            raise NotCovered("attention with an attn_mask (masks other than causal) is not covered by the playbook")
        dropout = kwarg(node, "dropout_p", 4)
        if dropout is UNKNOWN or (dropout is not None and dropout != 0):
            raise NotCovered("attention with dropout is not covered by the playbook")
        if kwarg(node, "enable_gqa") not in (None, False):
            raise NotCovered("grouped-query attention (enable_gqa) is not covered by the playbook")


def _tensors(r: Read) -> tuple[Tensor, Tensor, Tensor]:
    if r.match.params:
        raise NotCovered("attention with parameters (projections) is not covered: the playbook's kernel is the "
                         "attention core softmax(q k^T * scale) v of three inputs")
    if len(r.match.inputs) != 3:
        raise NotCovered(f"attention of {len(r.match.inputs)} inputs is not covered (q, k, v)")
    q, k, v = r.match.inputs
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
    if r.out.shape != q.shape:
        raise NotCovered(f"attention output {r.out.shape} is not q's shape {q.shape}")
    dtypes = {q.dtype, k.dtype, v.dtype, r.out.dtype}
    if len(dtypes) != 1 or q.dtype not in DTYPES:
        raise NotCovered(f"attention in {', '.join(sorted(dtypes))} is not covered (bf16, fp16 or fp32, all alike)")
    d = q.shape[-1]
    if q.dtype in TENSOR_CORE_DTYPES and d not in TENSOR_CORE_HEAD_DIMS:
        raise NotCovered(f"attention head dim {d} is not covered for {q.dtype} (the tensor-core kernel takes "
                         f"{' and '.join(map(str, TENSOR_CORE_HEAD_DIMS))})")
    if d % 4:
        raise NotCovered(f"attention head dim {d} is not covered in fp32 (a multiple of 4)")
    return q, k, v


def _recognise(r: Read) -> FamilyMatch:
    refused = sorted({REFUSED[k] for k in r.names if k in REFUSED})
    if refused:
        raise NotCovered(f"attention with {refused[0]} is not covered by the playbook")
    _sdpa_options(r)
    q, k, v = _tensors(r)
    if r.model is None:
        raise NotCovered("attention: the model did not build on the meta device; nothing to probe")
    nd, sq, sk, d = len(q.shape), q.shape[-2], k.shape[-2], q.shape[-1]
    probe_q, probe_k = (PROBE_SEQ, PROBE_SEQ) if sq == sk else ((5, 9) if sq < sk else (9, 5))
    causal, scale = probe_attention(r.model, (1,) * (nd - 3) + (2,), d, probe_q, probe_k)
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
    r.match.facts = dict(kind="attention", q=q.name, k=k.name, v=v.name, dtype=q.dtype, causal=causal,
                         scale=None if default else scale, nd=nd, head_dim=d, what=what)
    r.match.message = f"attention: {what}"
    return r.match


def recognise(r: Read) -> FamilyMatch | None:
    keyword = SDPA in r.names or "attention" in r.source.lower()
    products = sum(k in PRODUCTS for k in r.names) + r.fwd.binops.count("MatMult")
    chain = any(k in SOFTMAX for k in r.names) and products >= 2
    if not keyword and not chain:
        return None
    try:
        return _recognise(r)
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
)

FAMILY = Family(name=NAME, recognise=recognise, variants={"fa2": attention_fa2, "wgmma": attention_wgmma,
                                                                   "simt": attention_simt}, ideas=IDEAS)
