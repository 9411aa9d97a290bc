"""A tiny GPT block (pre-norm, causal attention through split/view/transpose, tanh-GELU MLP): the test size of
problems/models/gpt_block.py."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim=32, heads=2, mlp=64):
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
    return [torch.randn(2, 8, 32)]


def get_init_inputs():
    return [32, 2, 64]
