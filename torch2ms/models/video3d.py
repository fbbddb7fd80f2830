"""A small 3-D CNN video classifier (PyTorch): Conv3d -> BatchNorm3d -> ReLU blocks, as in C3D
and the 3-D ResNets (Tran et al. 2015, Hara et al. 2018), sized for a test.

Shapes for a 1x3x8x112x112 clip (N, C, frames, H, W) with ``width=16``:

    input                      1 x   3 x 8 x 112 x 112
    stem (3x7x7, s 1x2x2)      1 x  16 x 8 x  56 x  56
    pool (1x3x3, s 1x2x2)      1 x  16 x 8 x  28 x  28
    layer1 (residual block)    1 x  16 x 8 x  28 x  28
    layer2 (s 2, residual)     1 x  32 x 4 x  14 x  14
    layer3 (s 2, residual)     1 x  64 x 2 x   7 x   7
    global average pool, fc    1 x num_classes

Every convolution followed by batch norm has ``bias=False`` and its output feeds only that batch
norm, so each Conv3d -> BatchNorm3d (-> ReLU) chain can be fused and folded.
"""

from __future__ import annotations

from torch import nn

__all__ = ["Video3DNet", "video3d"]


def conv_bn_relu(c_in: int, c_out: int, kernel, stride=1, padding=1, relu: bool = True) -> nn.Sequential:
    layers = [nn.Conv3d(c_in, c_out, kernel, stride, padding, bias=False), nn.BatchNorm3d(c_out)]
    return nn.Sequential(*layers, *([nn.ReLU(inplace=True)] if relu else []))


class BasicBlock3d(nn.Module):
    """Two 3x3x3 Conv3d -> BatchNorm3d, the identity (or a strided 1x1x1 projection) added before the last ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = conv_bn_relu(c_in, c_out, 3, stride)
        self.conv2 = conv_bn_relu(c_out, c_out, 3, relu=False)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = conv_bn_relu(c_in, c_out, 1, stride, padding=0, relu=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(self.conv2(self.conv1(x)) + identity)


class Video3DNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16, in_channels: int = 3):
        super().__init__()
        self.stem = conv_bn_relu(in_channels, width, (3, 7, 7), (1, 2, 2), (1, 3, 3))
        self.pool = nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1))
        self.layer1 = BasicBlock3d(width, width)
        self.layer2 = BasicBlock3d(width, 2 * width, stride=2)
        self.layer3 = BasicBlock3d(2 * width, 4 * width, stride=2)
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.pool(self.stem(x)))))
        return self.fc(self.avgpool(x).flatten(1))


def video3d(num_classes: int = 10, width: int = 16, in_channels: int = 3) -> Video3DNet:
    return Video3DNet(num_classes, width, in_channels)
