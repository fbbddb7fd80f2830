"""Small PyTorch models for tests: they convert in seconds but exercise the same paths as the
zoo (Conv+BN+ReLU chains, a residual add, pooling, a resize, a linear head)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 5, width: int = 8):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU6())
        self.proj = nn.Sequential(nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width))
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        y = self.stem(x)
        y = F.relu(self.proj(self.block(y)) + y)
        y = self.pool(y)
        y = F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def tiny_net(num_classes: int = 5, width: int = 8) -> nn.Module:
    return TinyNet(num_classes, width)


class TinySeg(nn.Module):
    """Two outputs (a dict), like torchvision's segmentation models."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.out = nn.Conv2d(8, classes, 1)
        self.aux = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        f = self.body(x)
        return {"out": self.out(f), "aux": torch.sigmoid(self.aux(f))}


def tiny_seg(classes: int = 3) -> nn.Module:
    return TinySeg(classes)


class _WeightFree(nn.Module):
    def forward(self, x):
        y = F.max_pool2d(torch.relu(x), 2)
        return torch.sigmoid(y) * y


def weight_free() -> nn.Module:
    """No parameters at all: the generated network has no checkpoint to load."""
    return _WeightFree()
