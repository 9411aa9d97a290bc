"""A VGG-style stack: two conv3x3-ReLU pairs with 2x2 max pools (64 then 128 channels), batch 16 at 112x112."""

import torch
import torch.nn as nn

KERNGEN_META = {"description": "VGG-style conv stack 3-64-64-pool-128-128-pool, batch 16, 112x112, fp32"}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))

    def forward(self, x):
        return self.features(x)


def get_inputs():
    return [torch.randn(16, 3, 112, 112)]


def get_init_inputs():
    return []
