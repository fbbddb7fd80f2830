"""One class per PyTorch class where instances differ only by an optional child: a ResNet block
with and without ``downsample`` is one ``Block(..., downsample=None)``, the child built at the
call site; checkpoint keys stay the state_dict's and the network computes PyTorch's outputs."""

from __future__ import annotations

import ast

from torch import nn

from codegen.test_module_layout import check, classes_of


class Block(nn.Module):
    """torchvision's BasicBlock in small: ``downsample`` only where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layers = nn.Sequential(Block(8, 8), Block(8, 16, 2), Block(16, 16), Block(16, 32, 2))

    def forward(self, x):
        return self.layers(self.stem(x))


def test_a_block_with_and_without_downsample_is_one_class(tmp_path):
    net, cell = check(tmp_path, TinyResNet(), (1, 3, 16, 16), fold=True)
    classes = classes_of(net.source)
    assert set(classes) == {"Block", "Net"}, sorted(classes)
    init = ast.unparse(classes["Block"].body[1])
    assert init.startswith("def __init__(self, in_channels, out_channels, stride, downsample=None)"), init
    assert "self.downsample = downsample" in init
    construct = ast.unparse(classes["Block"].body[2])
    assert "if self.downsample is not None:" in construct
    root = ast.unparse(classes["Net"])
    assert root.count("downsample=nn.SequentialCell(") == 2 and root.count("Block(") == 4
    names = {p.name for p in cell.get_parameters()}
    assert {"layers.1.downsample.0.conv.weight", "layers.3.downsample.0.conv.bias"} <= names, sorted(names)
    assert not [n for n in names if n.startswith(("layers.0.downsample", "layers.2.downsample"))]
