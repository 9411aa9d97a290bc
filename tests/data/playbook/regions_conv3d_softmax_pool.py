import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, pool_kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.pool1 = nn.MaxPool3d(pool_kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = torch.softmax(x, dim=1)
        x = self.pool1(x)
        return x + torch.logsumexp(x, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(2, 3, 6, 8, 8)]


def get_init_inputs():
    return [3, 4, 3, 2]
