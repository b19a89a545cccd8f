"""The user-defined model of docs/your-own-models.md (a copy of its ``mynet.py``): a small
ResNet-style CNN with BatchNorm, no ``forward_features``; bench/independent_starts.py
loads it as ``bench.models.mynet:make``, saved as plain state_dicts (``.pt`` + sidecar)."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x):
        return torch.relu(x + self.bn(self.conv(x)))


class SmallResNet(nn.Module):
    def __init__(self, num_classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.block = Block(width)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Linear(width * 4, num_classes)  # the classifier: the last nn.Linear

    def forward(self, x):
        return self.head(self.pool(self.block(self.stem(x))).flatten(1))


def make(num_classes=10, width=16):
    return SmallResNet(num_classes, width)
