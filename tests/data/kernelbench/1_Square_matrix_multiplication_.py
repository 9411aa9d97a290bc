import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Square matrix product C = A @ B (sample in KernelBench level-1 format).
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        # A and B are (N, N); the result is (N, N)
        return torch.matmul(A, B)

N = 64

def get_inputs():
    A = torch.randn(N, N)
    B = torch.randn(N, N)
    return [A, B]

def get_init_inputs():
    return []  # No special initialization inputs needed
