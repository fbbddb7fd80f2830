"""Small random PyTorch networks built from the blocks torch2ms supports, for property tests.

A network is a JSON-able *spec* (so a failing one can be pasted into a regression test and
into a recipe's ``model.kwargs``) turned into a module by ``build(spec)``; ``net_specs()`` is
the hypothesis strategy. Blocks: conv (kernel 1-5, stride 1-2, padding 0-2, dilation 1-2,
groups dividing the channels, optional bias/BatchNorm/activation), standalone BatchNorm and
activations (ReLU, ReLU6, Hardswish, Sigmoid, SiLU, GELU), max/avg pooling (ceil_mode, avg's
count_include_pad), bilinear resize (scale or size, align_corners both), concat of branches,
residual add, GroupNorm (random affine), ConvTranspose2d (kernel 1-4, stride 1-2, padding,
output_padding, dilation, groups, optional activation), ``F.normalize`` (p=2 or 1 over the
channels), an LSTM along each row (the row's pixels are the sequence, channels the features,
uni- or bidirectional, its outputs the new channels), and an optional linear head. BatchNorm
statistics are randomized by the model loader (recipe ``model.init``).

Every drawn block is run on the current shape while drawing; a draw PyTorch rejects or that
shrinks a side to nothing is discarded with ``assume``, so only valid networks reach a test.
"""

from __future__ import annotations

import torch
from hypothesis import assume
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

ACTIVATIONS = {
    "relu": nn.ReLU,
    "relu6": nn.ReLU6,
    "hardswish": nn.Hardswish,
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
}
MAX_CHANNELS = 16


class Resize(nn.Module):
    def __init__(self, scale: float | None, size: list[int] | None, align_corners: bool):
        super().__init__()
        self.scale, self.size, self.align_corners = scale, tuple(size) if size else None, align_corners

    def forward(self, x):
        return F.interpolate(
            x, size=self.size, scale_factor=self.scale, mode="bilinear", align_corners=self.align_corners
        )


class Residual(nn.Module):
    def __init__(self, body: nn.Module, act: nn.Module | None):
        super().__init__()
        self.body, self.act = body, act or nn.Identity()

    def forward(self, x):
        return self.act(x + self.body(x))


class Concat(nn.Module):
    def __init__(self, branches: list[nn.Module]):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], dim=1)


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm with a random affine (seeded by the loader's torch seed): 1 and 0 would hide
    a converter that mixed up or dropped them."""

    def __init__(self, groups: int, ch: int):
        super().__init__(groups, ch)
        with torch.no_grad():
            self.weight.copy_(torch.rand(ch) + 0.5)
            self.bias.copy_(torch.rand(ch) * 0.4 - 0.2)


class Normalize(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.normalize(x, p=self.p, dim=1)


class RowLSTM(nn.Module):
    """An LSTM along each row of the feature map: (N, C, H, W) -> sequences of W steps of C
    features for N*H rows -> (N, hidden * directions, H, W)."""

    def __init__(self, in_ch: int, hidden: int, bidirectional: bool):
        super().__init__()
        self.lstm = nn.LSTM(in_ch, hidden, batch_first=True, bidirectional=bidirectional)

    def forward(self, x):
        n, c, h, w = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(n * h, w, c)
        y, _ = self.lstm(rows)
        return y.reshape(n, h, w, -1).permute(0, 3, 1, 2)


def _conv_transpose(b: dict, in_ch: int) -> tuple[nn.Module, int]:
    layers: list[nn.Module] = [
        nn.ConvTranspose2d(
            in_ch,
            b["out"],
            b["k"],
            stride=b["stride"],
            padding=b["pad"],
            output_padding=b["out_pad"],
            groups=b["groups"],
            bias=b["bias"],
            dilation=b["dil"],
        )
    ]
    if b["act"]:
        layers.append(ACTIVATIONS[b["act"]]())
    return nn.Sequential(*layers), b["out"]


def _conv(b: dict, in_ch: int) -> tuple[nn.Module, int]:
    layers: list[nn.Module] = [
        nn.Conv2d(
            in_ch,
            b["out"],
            b["k"],
            stride=b["stride"],
            padding=b["pad"],
            dilation=b["dil"],
            groups=b["groups"],
            bias=b["bias"],
        )
    ]
    if b["bn"]:
        layers.append(nn.BatchNorm2d(b["out"]))
    if b["act"]:
        layers.append(ACTIVATIONS[b["act"]]())
    return nn.Sequential(*layers), b["out"]


def make_block(b: dict, in_ch: int) -> tuple[nn.Module, int]:
    """(module, output channels) for one block spec."""
    kind = b["type"]
    if kind == "conv":
        return _conv(b, in_ch)
    if kind == "bn":
        return nn.BatchNorm2d(in_ch), in_ch
    if kind == "groupnorm":
        return GroupNorm(b["groups"], in_ch), in_ch
    if kind == "convtranspose":
        return _conv_transpose(b, in_ch)
    if kind == "normalize":
        return Normalize(b["p"]), in_ch
    if kind == "lstm":
        return RowLSTM(in_ch, b["hidden"], b["bidirectional"]), b["hidden"] * (2 if b["bidirectional"] else 1)
    if kind == "act":
        return ACTIVATIONS[b["act"]](), in_ch
    if kind == "maxpool":
        return nn.MaxPool2d(b["k"], b["stride"], b["pad"], ceil_mode=b["ceil"]), in_ch
    if kind == "avgpool":
        return nn.AvgPool2d(
            b["k"], b["stride"], b["pad"], ceil_mode=b["ceil"], count_include_pad=b["count_include_pad"]
        ), in_ch
    if kind == "resize":
        return Resize(b.get("scale"), b.get("size"), b["align_corners"]), in_ch
    if kind == "residual":
        body, ch = [], in_ch
        for c in b["body"]:
            m, ch = _conv(c, ch)
            body.append(m)
        return Residual(nn.Sequential(*body), ACTIVATIONS[b["act"]]() if b["act"] else None), in_ch
    if kind == "concat":
        mods, out = [], 0
        for c in b["branches"]:
            m, ch = make_block(c, in_ch)
            mods.append(m)
            out += ch
        return Concat(mods), out
    raise ValueError(f"unknown block type {kind!r}")


class RandomNet(nn.Module):
    def __init__(self, spec: dict):
        super().__init__()
        blocks, ch = [], spec.get("in_ch", 3)
        for b in spec["blocks"]:
            m, ch = make_block(b, ch)
            blocks.append(m)
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(ch, spec["classes"]) if spec.get("classes") else None

    def forward(self, x):
        y = self.blocks(x)
        if self.head is not None:
            y = self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))
        return y


def build(spec: dict) -> nn.Module:
    """Recipe factory: ``model: {factory: "random_nets:build", kwargs: {spec: ...}}``."""
    return RandomNet(spec)


# --- hypothesis strategies --------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def conv_specs(draw, in_ch: int, same: bool = False) -> dict:
    """A conv block; ``same``: stride 1, size-preserving padding, as many channels out as in."""
    if same:
        k = draw(st.sampled_from([1, 3, 5]))
        dil = draw(st.integers(1, 2)) if k > 1 else 1
        stride, pad = 1, dil * (k - 1) // 2
    else:
        k = draw(st.integers(1, 5))
        dil = draw(st.integers(1, 2)) if k > 1 else 1
        stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 2))
    groups = draw(st.sampled_from(_divisors(in_ch)))
    out = in_ch if same else groups * draw(st.integers(1, max(1, MAX_CHANNELS // groups)))
    return {
        "type": "conv",
        "out": out,
        "k": k,
        "stride": stride,
        "pad": pad,
        "dil": dil,
        "groups": groups,
        "bias": draw(st.booleans()),
        "bn": draw(st.booleans()),
        "act": draw(st.sampled_from([None, *ACTIVATIONS])),
    }


@st.composite
def pool_specs(draw) -> dict:
    kind = draw(st.sampled_from(["maxpool", "avgpool"]))
    k = draw(st.integers(1, 4))
    spec = {
        "type": kind,
        "k": k,
        "stride": draw(st.integers(1, 2)),
        "pad": draw(st.integers(0, k // 2)),
        "ceil": draw(st.booleans()),
    }
    if kind == "avgpool":
        spec["count_include_pad"] = draw(st.booleans())
    return spec


@st.composite
def resize_specs(draw, h: int, w: int) -> dict:
    how = draw(st.sampled_from(["scale", "size"]))
    spec: dict = {"type": "resize", "align_corners": draw(st.booleans())}
    if how == "scale":
        spec["scale"] = draw(st.sampled_from([2.0, 0.5, 1.5]))
    else:
        spec["size"] = [draw(st.integers(2, 48)), draw(st.integers(2, 48))]
    return spec


@st.composite
def conv_transpose_specs(draw, in_ch: int) -> dict:
    k = draw(st.integers(1, 4))
    stride = draw(st.integers(1, 2))
    dil = draw(st.integers(1, 2)) if k > 1 else 1
    groups = draw(st.sampled_from(_divisors(in_ch)))
    return {
        "type": "convtranspose",
        "out": groups * draw(st.integers(1, max(1, MAX_CHANNELS // groups))),
        "k": k,
        "stride": stride,
        "pad": draw(st.integers(0, dil * (k - 1) // 2)),
        "out_pad": draw(st.integers(0, stride - 1)),  # onnxruntime: below stride (PyTorch: or dilation)
        "dil": dil,
        "groups": groups,
        "bias": draw(st.booleans()),
        "act": draw(st.sampled_from([None, "relu", "silu"])),
    }


KINDS = ["pool", "conv", "resize", "residual", "concat", "bn", "act", "groupnorm", "convtranspose", "normalize", "lstm"]
NEW_KINDS = ["groupnorm", "convtranspose", "normalize", "lstm"]  # the layers issue 11 added converters for
OLD_KINDS = [k for k in KINDS if k not in NEW_KINDS]


@st.composite
def block_specs(draw, ch: int, h: int, w: int, kind: str | None = None, kinds: tuple = tuple(KINDS)) -> dict:
    kind = kind or draw(st.sampled_from(list(kinds)))
    if kind == "groupnorm":
        return {"type": "groupnorm", "groups": draw(st.sampled_from(_divisors(ch)))}
    if kind == "convtranspose":
        return draw(conv_transpose_specs(ch))
    if kind == "normalize":
        return {"type": "normalize", "p": draw(st.sampled_from([2.0, 1.0]))}
    if kind == "lstm":
        return {"type": "lstm", "hidden": draw(st.integers(1, 8)), "bidirectional": draw(st.booleans())}
    if kind == "conv":
        return draw(conv_specs(ch))
    if kind == "pool":
        return draw(pool_specs())
    if kind == "resize":
        return draw(resize_specs(h, w))
    if kind == "residual":
        body = draw(st.lists(conv_specs(ch, same=True), min_size=1, max_size=2))
        return {"type": "residual", "body": body, "act": draw(st.sampled_from([None, "relu", "relu6"]))}
    if kind == "concat":
        branch = st.one_of(
            conv_specs(ch, same=True).map(lambda c: {**c, "out": c["groups"] * max(1, c["out"] // c["groups"] // 2)}),
            st.just({"type": "act", "act": "relu"}),
        )
        return {"type": "concat", "branches": draw(st.lists(branch, min_size=2, max_size=3))}
    if kind == "bn":
        return {"type": "bn"}
    return {"type": "act", "act": draw(st.sampled_from(list(ACTIVATIONS)))}


@st.composite
def net_specs(draw, max_blocks: int = 6, include: str | None = None, kinds: tuple = tuple(KINDS)) -> dict:
    """A valid network spec with its input size: {"h", "w", "in_ch", "blocks", "classes"};
    ``include``: one block after the stem is of that kind (a ``KINDS`` entry)."""
    h, w = draw(st.integers(12, 40)), draw(st.integers(12, 40))
    x = torch.zeros(1, 3, h, w)
    ch, blocks = 3, []
    first = draw(conv_specs(3))  # a stem conv, as in real models
    n = draw(st.integers(2, max_blocks))
    forced = draw(st.integers(1, n - 1)) if include else None
    for j in range(n):
        kind = include if j == forced else None
        b = first if not blocks else draw(block_specs(ch, x.shape[2], x.shape[3], kind, kinds))
        module, out_ch = make_block(b, ch)
        try:
            with torch.no_grad():
                y = module.eval()(x)
        except RuntimeError:
            assume(False)
        assume(y.shape[2] >= 2 and y.shape[3] >= 2 and y.numel() <= 64 * 48 * 48)
        if b["type"] == "resize":
            assume(tuple(y.shape[2:]) != tuple(x.shape[2:]))  # a no-op resize says nothing
        blocks.append(b)
        x, ch = y, out_ch
    classes = draw(st.one_of(st.none(), st.integers(2, 10)))
    return {"h": h, "w": w, "in_ch": 3, "blocks": blocks, "classes": classes}
