"""A tiny LSTM and a Linear head on the last step: the test size of problems/models/lstm.py."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_in=8, hidden=16, layers=1, classes=4):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1, :])


def get_inputs():
    return [torch.randn(4, 5, 8)]


def get_init_inputs():
    return [8, 16, 1, 4]
