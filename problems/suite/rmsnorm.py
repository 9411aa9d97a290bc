"""RMSNorm of the rows of a matrix, LLaMA style: computed in fp32, cast back, times a weight."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (8192, 8192)
SHAPE_NAMES = ("rows", "hidden")
SHAPE_DOC = "input (rows, hidden); normalized over hidden (dim -1)"
DTYPE = torch.bfloat16
eps = 1e-6
KERNGEN_META = {
    "description": "out = weight * (x.float() * rsqrt(mean(x.float()**2, dim=-1) + eps)).to(x.dtype), "
    "eps 1e-6, weight of shape (hidden,)"
}


class Model(nn.Module):
    """RMS normalization over the last dim with a learned weight (as in LLaMA)."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        var = h.pow(2).mean(dim=-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


def get_inputs():
    x = torch.randn(*SHAPE, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [SHAPE[-1], eps]
