"""A ViT-Base encoder block (pre-norm: LayerNorm, 12-head self-attention, residual; LayerNorm, MLP 768-3072-768
with GELU, residual), batch 32, 197 tokens."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KERNGEN_META = {"description": "ViT-B encoder block, batch 32, 197 tokens, dim 768, 12 heads, fp32"}


class Model(nn.Module):
    def __init__(self, dim=768, heads=12, mlp=3072):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def get_inputs():
    return [torch.randn(32, 197, 768)]


def get_init_inputs():
    return [768, 12, 3072]
