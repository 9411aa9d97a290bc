"""A Linear layer followed by GELU: out = gelu(x @ W^T + b), a transformer MLP's up-projection."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (8192, 8192, 2048)  # 8192 tokens, hidden 2048 -> 8192 (4x), as in a GPT MLP
SHAPE_NAMES = ("M", "N", "K")
SHAPE_DOC = "MxNxK: x (M, K) @ W^T (W: (N, K)) + b (N,), then exact GELU"
DTYPE = torch.bfloat16
KERNGEN_META = {
    "description": "out = gelu(x @ W^T + b) (nn.Linear(K, N), exact erf GELU); x (M, K), W (N, K), b (N,)",
    "flops": "2*M*N*K",
}


def shape_of_inputs(shapes):
    """SHAPE from the op's arguments' shapes (an exported op's fallback, and its first call's check): x (M, K), then
    the parameters, the weight (N, K) first."""
    (m, k), (n, _), *_ = shapes
    return (m, n, k)


class Model(nn.Module):
    """nn.Linear then GELU (approximate='none')."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


def get_inputs():
    M, N, K = SHAPE
    return [torch.randn(M, K, dtype=DTYPE)]


def get_init_inputs():
    M, N, K = SHAPE
    return [K, N]
