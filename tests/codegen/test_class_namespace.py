"""One namespace per generated class: constructor arguments stored on ``self``, stored constants,
parameters and child cells never share an attribute. A name given twice in ``__init__`` leaves the
first object unreachable (HuggingFace MobileViT's attention divided a tensor by its ``value``
projection, the cell assigned over the scale of the same name)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_net
from torch import nn

from codegen.generate import assigned_twice, generate
from codegen.test_module_layout import Net as NestedNet
from codegen.test_module_layout import check


class Scaled(nn.Module):
    """A child named ``value`` beside a scale that differs between instances (a constructor
    argument whose hint is "value"), as in MobileViT's self-attention."""

    def __init__(self, dim: int, scale: float):
        super().__init__()
        self.value = nn.Linear(dim, dim)
        self.scale = scale

    def forward(self, x):
        return self.value(x) / self.scale


class TwoScales(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Scaled(8, 2.0)
        self.b = Scaled(8, 3.0)

    def forward(self, x):
        return self.b(self.a(x))


def test_the_scan_finds_an_attribute_assigned_twice():
    src = "class A:\n    def __init__(self, value):\n        self.value = value\n        self.value = 1\n"
    assert assigned_twice(src) == ["A.value"]


def test_a_constructor_argument_does_not_take_a_childs_name(tmp_path):
    """The synthetic MobileViT clash: the scale is its own attribute, the network computes PyTorch's."""
    net, _ = check(tmp_path, TwoScales(), (2, 8))
    assert not assigned_twice(net.source), net.source
    assert "self.value(" in net.source


@pytest.mark.parametrize(
    "name, model, shape",
    [
        ("tiny_net", tiny_net, (1, 3, 32, 32)),
        ("nested", NestedNet, (1, 3, 16, 16)),
        ("two_scales", TwoScales, (2, 8)),
    ],
)
def test_no_attribute_is_assigned_twice_in_tiny_models(name, model, shape):
    net = generate(model(), shape)
    assert net.layout["layout"] == "modules", net.layout
    assert not assigned_twice(net.source), net.source


def _zoo_model(name: str) -> nn.Module:
    import torchvision

    from torch2ms.zoo import factories

    if name == "vit_16_small":
        return factories.vision_transformer(
            image_size=64, patch_size=16, num_layers=2, num_heads=3, hidden_dim=192, mlp_dim=768
        )
    if name == "convnext_small_blocks":
        return factories.convnext(channels=[48, 96, 192, 384], depths=[1, 1, 3, 1], layer_scale=1.0)
    return getattr(torchvision.models, name)(weights=None)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_16_small", "convnext_small_blocks"]
)
def test_no_attribute_is_assigned_twice_in_ci_zoo_models(name):
    """The CI zoo's torchvision families (``recipes/zoo/ci.yaml``, ViT with 2 of its 4 layers)."""
    torch.manual_seed(0)
    net = generate(_zoo_model(name), (1, 3, 64, 64))
    assert net.layout["layout"] == "modules", net.layout
    assert not assigned_twice(net.source), net.source


class MobileViT(nn.Module):
    """HuggingFace ``MobileViTForImageClassification`` (v1, ``MobileViTConfig()``): its logits."""

    def __init__(self):
        super().__init__()
        from transformers import MobileViTConfig, MobileViTForImageClassification

        self.model = MobileViTForImageClassification(MobileViTConfig()).eval()
        for m in self.model.modules():  # PyTorch's own init: at transformers' std 0.02 the logits underflow
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.reset_parameters()

    def forward(self, x):
        return self.model(pixel_values=x).logits


@pytest.mark.slow
def test_mobilevit_converts_with_the_modules_layout(tmp_path):
    """The model whose modules layout once assigned its attention scale and its ``value`` projection
    to one attribute: at 256x256 it rebuilds and computes PyTorch's logits."""
    torch.manual_seed(0)
    net, _ = check(tmp_path, MobileViT(), (1, 3, 256, 256))
    assert not assigned_twice(net.source)
