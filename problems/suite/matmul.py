"""Matrix multiplication C = A @ B (KernelBench level-1 1/2 style)."""

import torch
import torch.nn as nn

# kerngen built-in: the loader may override SHAPE / DTYPE (``--shape``, ``--dtype``).
SHAPE = (4096, 4096, 4096)
SHAPE_NAMES = ("M", "N", "K")
SHAPE_ARITY = (1, 3)
SHAPE_DOC = "MxNxK: A (M, K) @ B (K, N) -> C (M, N); a single N means NxNxN"
DTYPE = torch.float32
KERNGEN_META = {
    "description": "C = A @ B with A (M, K), B (K, N), row-major; inputs scaled by K**-0.25 so C is O(1) "
    "and an fp32 check at 1e-4 is meaningful (TF32 or fp16 accumulation fails it)",
    "flops": "2*M*N*K",
}


def canonical_shape(shape):
    return tuple(shape) * 3 if len(shape) == 1 else tuple(shape)


def shape_of_inputs(shapes):
    """SHAPE from the inputs' shapes (an exported op's fallback at another shape): A (M, K), B (K, N)."""
    (m, k), (_, n) = shapes
    return (m, n, k)


class Model(nn.Module):
    """Single matrix multiplication."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    M, N, K = canonical_shape(SHAPE)
    scale = K ** -0.25
    A = torch.randn(M, K, dtype=DTYPE) * scale
    B = torch.randn(K, N, dtype=DTYPE) * scale
    return [A, B]


def get_init_inputs():
    return []
