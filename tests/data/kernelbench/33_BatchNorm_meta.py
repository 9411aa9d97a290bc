import torch
import torch.nn as nn

KERNGEN_META = {"atol": 1e-3, "rtol": 2e-3, "flops": "2 * x.numel", "min_bytes": 12345,
                "description": "BatchNorm2d in eval mode (running stats are buffers)"}

class Model(nn.Module):
    """
    BatchNorm2d with our optional KERNGEN_META metadata.
    """
    def __init__(self, num_features: int):
        super(Model, self).__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)

batch_size = 4
features = 8
dim1 = 16
dim2 = 16

def get_inputs():
    x = torch.randn(batch_size, features, dim1, dim2)
    return [x]

def get_init_inputs():
    return [features]
