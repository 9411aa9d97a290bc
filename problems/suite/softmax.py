"""Softmax over the rows of a matrix (KernelBench level-1 style)."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (4096, 65536)
SHAPE_NAMES = ("rows", "cols")
SHAPE_DOC = "input (rows, cols); softmax over dim 1"
DTYPE = torch.float32
KERNGEN_META = {"description": "out = softmax(x, dim=1) for x of shape (rows, cols)"}


class Model(nn.Module):
    """Softmax along dim 1 of a 2-D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    x = torch.randn(*SHAPE, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return []
