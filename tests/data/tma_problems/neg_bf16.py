"""-x of a bf16 tensor of 4 dims whose rows (100) are no multiple of a TMA box's: the problem of
the ``tensormap`` tests (tests/kernels/tma.py)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x


def get_inputs():
    return [torch.randn(2, 3, 100, 128, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
