"""A 3-layer MLP (Linear-ReLU-Linear-ReLU-Linear), batch 1024, 4096 wide: GEMM-bound."""

import torch
import torch.nn as nn

KERNGEN_META = {"description": "MLP 4096 -> 4096 -> 4096 -> 1024 with ReLU, batch 1024, fp32"}


class Model(nn.Module):
    def __init__(self, d_in=4096, hidden=4096, d_out=1024):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(1024, 4096)]


def get_init_inputs():
    return [4096, 4096, 1024]
