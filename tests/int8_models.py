"""Small PyTorch models for the INT8 tests (``test_int8.py``).

* ``int8_sensitive``: conv -> ReLU -> conv_mid -> ReLU -> linear, where conv_mid's input
  carries one activation of 1e4 (a constant spike added before it, its effect removed right after,
  so the float network computes as if it were absent). Per-tensor int8 spends its 255 steps on
  [0, 1e4], 39 apart, and every ordinary activation (~1) rounds to 0: conv_mid is the one layer
  INT8 breaks. Its weights and the other layers are ordinary.
* ``int8_plain``: the same without the spike and without BatchNorm, for the MindSpore cross-check
  (weights of the generated network are the ONNX's, node for node).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class Int8Sensitive(nn.Module):
    def __init__(self, classes: int = 6, spike: float = 1e4, size: int = 16):
        super().__init__()
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.conv_mid = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.head = nn.Linear(16 * (size // 2) ** 2, classes)
        with torch.no_grad():  # no bias: the logits depend on the features only, which INT8 of conv_mid erases
            self.conv_mid.bias.zero_()
            self.head.bias.zero_()
        s = torch.zeros(1, 8, size, size)
        s[0, 0, size // 2, size // 2] = spike
        self.register_buffer("spike", s)

    def forward(self, x):
        h = functional.relu(self.conv_in(x))
        effect = functional.conv2d(self.spike, self.conv_mid.weight, padding=1, stride=2)
        h = functional.relu(self.conv_mid(h + self.spike) - effect)
        return self.head(torch.flatten(h, 1))


class Int8Plain(nn.Module):
    def __init__(self, classes: int = 6):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = nn.Linear(16 * 8 * 8, classes)

    def forward(self, x):
        h = functional.relu(self.conv1(x))
        h = functional.relu(self.conv2(h))
        return self.fc(torch.flatten(h, 1))


def int8_sensitive(classes: int = 6) -> nn.Module:
    return Int8Sensitive(classes)


def int8_plain(classes: int = 6) -> nn.Module:
    return Int8Plain(classes)
