import torch
import torch.nn as nn

class Model(nn.Module):
    """Degenerate on purpose: the mean of many uniform numbers is ~0.5 whatever the seed."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=1)

batch_size = 4
dim = 1 << 22

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
