"""Exact (erf) GELU, elementwise (KernelBench level-1 26 style)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (16384, 4096)  # 64Mi elements
SHAPE_NAMES = ("rows", "cols")
SHAPE_ARITY = (1, 2, 3, 4)
SHAPE_DOC = "input shape (any 1 to 4 dims; elementwise)"
DTYPE = torch.float32
KERNGEN_META = {"description": "out = gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2))), elementwise"}


class Model(nn.Module):
    """GELU with the exact erf formulation (approximate='none')."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    x = torch.randn(*SHAPE, dtype=DTYPE) * 3.0
    return [x]


def get_init_inputs():
    return []
