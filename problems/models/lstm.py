"""A 2-layer LSTM (input 256, hidden 512), 64 steps, batch 64, and a Linear head on the last step."""

import torch
import torch.nn as nn

KERNGEN_META = {"description": "LSTM 2 layers, input 256, hidden 512, 64 steps, batch 64, head 512 -> 10, fp32"}


class Model(nn.Module):
    def __init__(self, d_in=256, hidden=512, layers=2, classes=10):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1, :])


def get_inputs():
    return [torch.randn(64, 64, 256)]


def get_init_inputs():
    return [256, 512, 2, 10]
