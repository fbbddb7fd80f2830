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


class Fp16Fragile(nn.Module):
    """One fp16-fragile spot between ordinary layers, fine in float32:

    * ``cancel``: ``(y + 1000) - 1000``. fp16 keeps 0.5 of absolute precision at 1000, so y loses
      ~0.25; float32 loses ~3e-5.
    * ``overflow``: a 1x1 conv whose weights are scaled by 1e5, then ``* 1e-5``: its outputs pass
      fp16's largest value (65504) and become inf.

    Either way two nodes must stay fp32: the one that makes the value and the one that takes it
    (a node in fp16 rounds its inputs too)."""

    def __init__(self, classes: int = 5, kind: str = "cancel"):
        super().__init__()
        self.kind = kind
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.big = nn.Conv2d(8, 8, 1)
        with torch.no_grad():
            self.big.weight.mul_(1e5)
            self.big.bias.mul_(1e5)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        y = self.conv(x)
        y = (y + 1000.0) - 1000.0 if self.kind == "cancel" else self.big(y) * 1e-5
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def fp16_fragile(classes: int = 5, kind: str = "cancel") -> nn.Module:
    return Fp16Fragile(classes, kind)


class FakeQuantNet(nn.Module):
    """A quantization-aware model as PyTorch runs it: uint8 activations and per-channel int8 weights
    fake-quantized around two convolutions and a linear head, with constant scales (buffers). It
    exports as QDQ, which onnxruntime's default optimizations fuse into uint8 x int8 QLinearConv /
    QGemm kernels (saturating without VNNI)."""

    def __init__(self, width: int = 64, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.fc = nn.Linear(width, classes)
        for name in ("conv1", "conv2", "fc"):
            w = getattr(self, name).weight.detach()
            scale = (w.abs().amax(dim=tuple(range(1, w.dim()))) / 127).clamp_min(1e-8)
            self.register_buffer(f"{name}_scale", scale.float())
            self.register_buffer(f"{name}_zero", torch.zeros(w.shape[0], dtype=torch.int32))

    @staticmethod
    def _activation(x):
        return torch.fake_quantize_per_tensor_affine(x, 0.05, 128, 0, 255)

    def _weight(self, name):
        w = getattr(self, name).weight
        return torch.fake_quantize_per_channel_affine(
            w, getattr(self, f"{name}_scale"), getattr(self, f"{name}_zero"), 0, -128, 127
        )

    def forward(self, x):
        x = self._activation(x)
        x = self._activation(F.relu(F.conv2d(x, self._weight("conv1"), self.conv1.bias, 1, 1)))
        x = self._activation(F.relu(F.conv2d(x, self._weight("conv2"), self.conv2.bias, 1, 1)))
        return F.linear(x.mean((2, 3)), self._weight("fc"), self.fc.bias)


def fake_quant_net(width: int = 64, classes: int = 10) -> nn.Module:
    return FakeQuantNet(width, classes)


class TinyText(nn.Module):
    """Token ids (int64) and a padding mask: embeddings, one masked self-attention, masked mean
    pooling, a classifier; returns the logits and the predicted label (an int64 output)."""

    def __init__(self, vocab: int = 50, dim: int = 16, classes: int = 3, mask_dtype: str = "int64"):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(64, dim)
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids, attention_mask):
        positions = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1  # CumSum positions
        h = self.norm(self.embed(input_ids) + self.position(positions))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        valid = attention_mask.bool()
        bias = torch.where(valid[:, None, :], 0.0, torch.finfo(h.dtype).min)  # additive mask
        attn = torch.softmax(q @ k.transpose(1, 2) / h.shape[-1] ** 0.5 + bias, dim=-1)
        h = h + attn @ v
        weights = valid.to(h.dtype)[..., None]
        pooled = (h * weights).sum(1) / weights.sum(1)
        logits = self.head(pooled)
        return {"logits": logits, "label": logits.argmax(-1)}


def tiny_text(vocab: int = 50, dim: int = 16, classes: int = 3) -> nn.Module:
    return TinyText(vocab, dim, classes)


class TinyEncoder(nn.Module):
    """A ViT-style encoder block on a patch embedding: PyTorch's own MultiheadAttention (its
    projections called functionally, so no ONNX scope names them) and two LayerNorms whose default
    weights (ones, zeros) the exporter merges into shared initializers."""

    def __init__(self, dim: int = 16, heads: int = 2, classes: int = 4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.ln_1 = nn.LayerNorm(dim)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        h = self.ln_1(x)
        x = x + self.self_attention(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.ln_2(x))
        return self.head(x.mean(1))


def tiny_encoder() -> nn.Module:
    return TinyEncoder()


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * weight``, as transformers' Llama and Qwen2 write it; the weight
    starts at ones."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class NormBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = RMSNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return x + self.proj(self.norm(x))


class TinyRMSNet(nn.Module):
    """Two residual blocks of an RMSNorm and a Linear, as a decoder's layers are, and a final RMSNorm:
    three norms whose weights are equal (ones) until trained."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.blocks = nn.ModuleList([NormBlock(width) for _ in range(2)])
        self.norm = RMSNorm(width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def tiny_rms_net() -> nn.Module:
    return TinyRMSNet()


class TwoInputs(nn.Module):
    """An image and a feature vector, joined before the head: a model with two batch-carrying inputs."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 + 4, classes)

    def forward(self, image, extra):
        pooled = torch.relu(self.conv(image)).mean((2, 3))
        return self.head(torch.cat([pooled, extra], 1))


def two_inputs(classes: int = 3) -> nn.Module:
    return TwoInputs(classes)


class Scaled(nn.Module):
    """An image and a rank-0 scale: ``relu(conv(x) * scale - threshold)`` with both scalars graph inputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image, scale, threshold):
        return torch.relu(self.conv(image) * scale - threshold)


def scaled() -> nn.Module:
    return Scaled()
