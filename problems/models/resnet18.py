"""ResNet-18 (torchvision's architecture, written from torch.nn layers), batch 16 at 224x224, 1000 classes."""

import torch
import torch.nn as nn

KERNGEN_META = {"description": "ResNet-18, batch 16, 3x224x224, eval-mode batch norm, fp32"}


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class Model(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        layers, c = [], 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(c, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c = c_out
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        y = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(y, 1))


def get_inputs():
    return [torch.randn(16, 3, 224, 224)]


def get_init_inputs():
    return [1000]
