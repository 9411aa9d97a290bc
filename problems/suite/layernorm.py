"""LayerNorm over the last three dims, with elementwise affine (KernelBench level-1 40 style)."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (16, 64, 256, 256)
SHAPE_NAMES = ("batch", "features", "dim1", "dim2")
SHAPE_DOC = "input (batch, features, dim1, dim2); normalized over the last 3 dims"
DTYPE = torch.float32
KERNGEN_META = {
    "description": "out = nn.LayerNorm((features, dim1, dim2))(x): per-sample mean/var over the last "
    "3 dims, eps 1e-5, then * weight + bias (both of shape (features, dim1, dim2))"
}


class Model(nn.Module):
    """Layer normalization with a learned weight and bias over ``normalized_shape``."""

    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    x = torch.randn(*SHAPE, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [tuple(SHAPE[-3:])]
