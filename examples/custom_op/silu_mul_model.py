"""A model with a ``torch.library`` custom op, ``t2ms_example::silu_mul`` (a fused x * sigmoid(x) * y),
exported by the TorchScript exporter into the custom ONNX domain ``t2ms.example`` through a symbolic."""

import torch
from torch import nn

DOMAIN = "t2ms.example"


@torch.library.custom_op("t2ms_example::silu_mul", mutates_args=())
def silu_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x) * y


@silu_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


def _symbolic(g, x, y):
    return g.op(f"{DOMAIN}::SiluMul", x, y).setType(x.type())


torch.onnx.register_custom_op_symbolic("t2ms_example::silu_mul", _symbolic, 11)


class GatedBlock(nn.Module):
    """conv -> silu_mul(conv, gate) -> conv."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.gate = nn.Conv2d(3, channels, 1)
        self.head = nn.Conv2d(channels, 4, 3, padding=1)

    def forward(self, x):
        return self.head(silu_mul(self.conv(x), self.gate(x)))


def gated_block(channels: int = 8) -> nn.Module:
    return GatedBlock(channels)
