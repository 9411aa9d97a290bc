"""A GPT-2-small block (pre-norm, causal 12-head attention, MLP 768-3072-768 with tanh GELU), batch 8, 1024 tokens."""

import torch
import torch.nn as nn
import torch.nn.functional as F

KERNGEN_META = {"description": "GPT-2 small block, batch 8, 1024 tokens, dim 768, 12 heads, causal, fp32"}


class Model(nn.Module):
    def __init__(self, dim=768, heads=12, mlp=3072):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, mlp)
        self.out = nn.Linear(mlp, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def get_inputs():
    return [torch.randn(8, 1024, 768)]


def get_init_inputs():
    return [768, 12, 3072]
