"""DeepLabV3+ semantic segmentation model (PyTorch).

Chen et al. 2018, "Encoder-Decoder with Atrous Separable Convolution for
Semantic Image Segmentation". A dilated ResNet-50 encoder feeds an Atrous
Spatial Pyramid Pooling (ASPP) module; a light decoder fuses the ASPP output
with stride-4 low-level features and the logits are upsampled to the input
size. Like the common reference implementations, the ASPP and decoder use
plain (not depthwise-separable) convolutions.

Shapes for a 1x3x512x512 input with ``output_stride=16``:

    input                          1 x    3 x 512 x 512
    backbone.layer1 (low-level)    1 x  256 x 128 x 128   (stride 4)
    backbone.layer4                1 x 2048 x  32 x  32   (stride 16, dilated)
    aspp (5 branches, concat)      1 x 1280 x  32 x  32
    aspp.project                   1 x  256 x  32 x  32
    decoder.low_level              1 x   48 x 128 x 128
    upsampled ASPP + concat        1 x  304 x 128 x 128
    decoder.fuse                   1 x  256 x 128 x 128
    classifier                     1 x  num_classes x 128 x 128
    output (bilinear upsample)     1 x  num_classes x 512 x 512

With ``output_stride=8`` layer3 is dilated too, so layer4 and the ASPP run at
64 x 64 and the ASPP rates are doubled (12, 24, 36).

Every convolution followed by batch norm has ``bias=False`` and its output
feeds only that batch norm, so Conv->BN->ReLU chains can be fused on export.
Module names (``aspp.branches.0``, ``aspp.pool``, ``aspp.project``,
``decoder.low_level``, ``decoder.fuse``, ``classifier``) carry through to the
ONNX node names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet50

__all__ = ["DeepLabV3Plus", "deeplabv3plus"]


def _conv_bn_relu(in_ch: int, out_ch: int, kernel_size: int = 1, dilation: int = 1) -> nn.Sequential:
    """Conv2d(bias=False) -> BatchNorm2d -> ReLU, 'same' padding."""
    padding = dilation * (kernel_size - 1) // 2
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel_size, padding=padding, dilation=dilation, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
    )


class ResNetBackbone(nn.Module):
    """Dilated torchvision ResNet-50 returning (layer1, layer4) features."""

    def __init__(self, replace_stride_with_dilation: list[bool]) -> None:
        super().__init__()
        resnet = resnet50(weights=None, replace_stride_with_dilation=replace_stride_with_dilation)
        self.conv1 = resnet.conv1
        self.bn1 = resnet.bn1
        self.relu = resnet.relu
        self.maxpool = resnet.maxpool
        self.layer1 = resnet.layer1
        self.layer2 = resnet.layer2
        self.layer3 = resnet.layer3
        self.layer4 = resnet.layer4

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        low_level = self.layer1(x)
        x = self.layer4(self.layer3(self.layer2(low_level)))
        return low_level, x


class ASPP(nn.Module):
    """Atrous Spatial Pyramid Pooling: 1x1 + three atrous 3x3 + image pooling."""

    def __init__(self, in_ch: int, rates: tuple[int, int, int], out_ch: int = 256) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [_conv_bn_relu(in_ch, out_ch)] + [_conv_bn_relu(in_ch, out_ch, 3, dilation=r) for r in rates]
        )
        # Image-level pooling branch; upsampled back to the feature size in forward.
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), *_conv_bn_relu(in_ch, out_ch))
        self.project = nn.Sequential(
            *_conv_bn_relu(out_ch * (len(rates) + 2), out_ch),
            nn.Dropout(0.1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [branch(x) for branch in self.branches]
        pooled = self.pool(x)
        pooled = F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.project(torch.cat(feats + [pooled], dim=1))


class Decoder(nn.Module):
    """Fuse upsampled ASPP features with reduced low-level features."""

    def __init__(self, low_level_ch: int = 256, aspp_ch: int = 256, reduced_ch: int = 48) -> None:
        super().__init__()
        self.low_level = _conv_bn_relu(low_level_ch, reduced_ch)
        self.fuse = nn.Sequential(
            *_conv_bn_relu(aspp_ch + reduced_ch, 256, 3),
            *_conv_bn_relu(256, 256, 3),
        )

    def forward(self, low_level: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        low_level = self.low_level(low_level)
        x = F.interpolate(x, size=low_level.shape[-2:], mode="bilinear", align_corners=False)
        return self.fuse(torch.cat([x, low_level], dim=1))


class DeepLabV3Plus(nn.Module):
    """DeepLabV3+ with a dilated ResNet-50 backbone; returns (N, C, H, W) logits."""

    def __init__(self, num_classes: int = 21, output_stride: int = 16) -> None:
        super().__init__()
        if output_stride == 16:
            dilation, rates = [False, False, True], (6, 12, 18)
        elif output_stride == 8:
            dilation, rates = [False, True, True], (12, 24, 36)
        else:
            raise ValueError(f"output_stride must be 8 or 16, got {output_stride}")
        self.backbone = ResNetBackbone(dilation)
        self.aspp = ASPP(2048, rates)
        self.decoder = Decoder()
        self.classifier = nn.Conv2d(256, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        low_level, features = self.backbone(x)
        y = self.decoder(low_level, self.aspp(features))
        y = self.classifier(y)
        return F.interpolate(y, size=size, mode="bilinear", align_corners=False)


def deeplabv3plus(num_classes: int = 21, output_stride: int = 16) -> nn.Module:
    """Build a randomly initialised DeepLabV3+ (ResNet-50, output stride 16 or 8)."""
    return DeepLabV3Plus(num_classes=num_classes, output_stride=output_stride)
