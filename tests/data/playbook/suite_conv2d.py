import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 96, kernel_size=11, stride=4, padding=2)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(100, 3, 224, 224)]


def get_init_inputs():
    return []
