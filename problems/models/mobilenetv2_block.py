"""A MobileNetV2 inverted residual block (1x1 expand x6 - BN - ReLU6, depthwise 3x3 - BN - ReLU6, 1x1 project - BN,
identity), 32 channels at 56x56, batch 32."""

import torch
import torch.nn as nn

KERNGEN_META = {"description": "MobileNetV2 inverted residual, 32 -> 192 -> 32 channels, 56x56, batch 32, fp32"}


class Model(nn.Module):
    def __init__(self, channels=32, expand=6):
        super().__init__()
        hidden = channels * expand
        self.block = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        return x + self.block(x)


def get_inputs():
    return [torch.randn(32, 32, 56, 56)]


def get_init_inputs():
    return [32, 6]
