"""The local names a PyTorch ``forward`` gives its children's results (``export.modules.forward_roles``),
which the generated code's locals take: only pairs the source makes unambiguous."""

from __future__ import annotations

from torch import nn
from torchvision.models.resnet import Bottleneck

from torch2ms.export.modules import forward_roles, module_roles


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()
        self.proj = nn.Identity()
        self.head = nn.Identity()

    def forward(self, x):
        a = self.act(x)  # act called twice: which call is which is not known
        b = self.act(a)
        x = self.proj(b)  # reassigns the argument: names nothing
        logits = self.head(x)
        return logits


def test_torchvision_bottleneck_names_its_shortcut():
    assert forward_roles(Bottleneck) == {"downsample": "identity"}  # out = ... is assigned by every call


def test_only_unambiguous_pairs():
    assert forward_roles(Twice) == {"head": "logits"}


def test_unreadable_source_names_nothing():
    made = type("Made", (nn.Module,), {"forward": eval("lambda self, x: self.f(x)")})
    assert forward_roles(made) == {}
    assert forward_roles(nn.Sequential) == {}  # its forward calls no attribute


def test_module_roles_by_module_path():
    model = nn.Sequential(Twice(), Twice())
    assert module_roles(model) == {"0": {"head": "logits"}, "1": {"head": "logits"}}
