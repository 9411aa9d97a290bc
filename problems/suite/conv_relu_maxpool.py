"""Conv 3x3 (padding 1, bias) -> ReLU -> MaxPool2d(2): a small fused CNN block."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (128, 3, 32, 32)
SHAPE_NAMES = ("batch", "in_channels", "height", "width")
SHAPE_DOC = "input NCHW (batch, in_channels, height, width); conv to 64 channels k3 p1, ReLU, 2x2 max pool"
DTYPE = torch.float32
out_channels = 64
kernel_size = 3
padding = 1
pool = 2
KERNGEN_META = {
    "description": "out = max_pool2d(relu(conv2d(x, weight, bias, padding=1)), 2); weight (64, in_channels, "
    "3, 3), bias (64,); NCHW"
}


class Model(nn.Module):
    """Conv2d + ReLU + MaxPool2d."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, pool):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(pool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.relu(self.conv(x)))


def get_inputs():
    x = torch.randn(*SHAPE, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [SHAPE[1], out_channels, kernel_size, padding, pool]
