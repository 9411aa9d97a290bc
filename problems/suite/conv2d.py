"""2-D convolution, AlexNet's first layer: 3 -> 96 channels, kernel 11, stride 4, padding 2."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (100, 3, 224, 224)
SHAPE_NAMES = ("batch", "in_channels", "height", "width")
SHAPE_DOC = "input NCHW (batch, in_channels, height, width); conv to 96 channels, k11 s4 p2, bias"
DTYPE = torch.float32
out_channels = 96
kernel_size = 11
stride = 4
padding = 2
KERNGEN_META = {
    "description": "out = conv2d(x, weight, bias, stride=4, padding=2); weight (96, in_channels, 11, 11), "
    "bias (96,); NCHW"
}


class Model(nn.Module):
    """A single Conv2d with bias."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    x = torch.randn(*SHAPE, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [SHAPE[1], out_channels, kernel_size, stride, padding]
