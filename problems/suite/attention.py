"""Causal scaled-dot-product attention (flash-attention style problem)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (8, 16, 4096, 128)
SHAPE_NAMES = ("B", "H", "S", "D")
SHAPE_DOC = "(B, H, S, D): q, k, v each (batch, heads, seq_len, head_dim); causal"
DTYPE = torch.bfloat16
KERNGEN_META = {
    "description": "out = softmax(q @ k^T / sqrt(D) + causal mask) @ v per (batch, head), via "
    "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "flops": "2*B*H*S*S*D",  # 4*B*H*S*S*D for full attention, halved by the causal mask
}


class Model(nn.Module):
    """Causal multi-head attention core (no projections)."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    q = torch.randn(*SHAPE, dtype=DTYPE)
    k = torch.randn(*SHAPE, dtype=DTYPE)
    v = torch.randn(*SHAPE, dtype=DTYPE)
    return [q, k, v]


def get_init_inputs():
    return []
