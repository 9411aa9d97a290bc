"""A KernelBench-style solution that is wrong: it forgets to normalize."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.exp(x - x.amax(dim=1, keepdim=True))
