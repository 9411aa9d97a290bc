import torch
import torch.nn as nn

from torch.distributions import Pareto

class Model(nn.Module):
    """
    Mean hinge loss; inputs come from a torch.distributions sampler and are put on the GPU with
    .cuda() / device="cuda" (patterns seen in KernelBench files and forks).
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))

batch_size = 128
input_shape = (64,)
dim = 1

def get_inputs():
    predictions = Pareto(0.01, 1.5).sample((batch_size, *input_shape)).cuda()
    targets = torch.randint(0, 2, (batch_size, 1), device="cuda").float() * 2 - 1
    return [predictions, targets]

def get_init_inputs():
    return []
