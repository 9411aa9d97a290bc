import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 16))

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return []
