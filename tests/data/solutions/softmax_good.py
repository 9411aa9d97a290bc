"""A KernelBench-style solution for the built-in softmax: ModelNew computes the same thing another way."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        print("the user's own print: it must not reach kerngen's answer")
        return e / e.sum(dim=1, keepdim=True)
