"""A ResNet basic block (conv3x3-BN-ReLU-conv3x3-BN + identity, ReLU), 64 channels at 56x56, batch 32."""

import torch
import torch.nn as nn

KERNGEN_META = {"description": "ResNet basic block, 64 channels, 56x56, batch 32, eval-mode batch norm, fp32"}


class Model(nn.Module):
    def __init__(self, channels=64):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def get_inputs():
    return [torch.randn(32, 64, 56, 56)]


def get_init_inputs():
    return [64]
