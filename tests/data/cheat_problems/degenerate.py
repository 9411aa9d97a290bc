"""Cheat 9: a degenerate problem. Softmax over a dim of size 1 is 1.0 everywhere, whatever the
input: a kernel that writes the constant 1.0 is "correct" and infinitely fast. The harness's
baseline must flag it (Baseline.degenerate) before a search spends GPU time on it."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(4096, 1)]


def get_init_inputs():
    return []
