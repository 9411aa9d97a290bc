"""ModelNew for linear_problem.py: the same layer under the same name, applied by hand."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        nn.init.zeros_(self.fc.weight)  # whatever it starts from, it takes the reference's weights

    def forward(self, x):
        return torch.clamp_min(x @ self.fc.weight.t() + self.fc.bias, 0.0)
