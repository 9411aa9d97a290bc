import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Matrix times a Python float scalar, C = A * s (a non-tensor input, as in KernelBench).
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, s: float) -> torch.Tensor:
        return A * s

M = 256
N = 128

def get_inputs():
    A = torch.randn(M, N)
    s = 3.14
    return [A, s]

def get_init_inputs():
    return []  # No special initialization inputs needed
