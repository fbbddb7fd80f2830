"""Which MindSpore spelling of an op is fastest on CPU (GRAPH_MODE)? Alternatives the code
generator could emit, each checked against the current spelling and timed interleaved
(round-robin) in one process. Shapes are the ones DeepLabV3+ 512x512 / ResNet-50 224 meet.

    python benchmarks/codegen_probe.py --rounds 20 --md benchmarks/results/codegen_probe.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from torch2ms.runtime import msutil

ms = msutil.mindspore()
nn, ops = ms.nn, ms.ops


class Spelling(nn.Cell):
    """One spelling of an op; ``kind`` is a constant, so GRAPH_MODE compiles only its branch."""

    def __init__(self, kind: str, size: int = 0, c: int = 0):
        super().__init__()
        self.kind, self.size = kind, size
        self.mp_pad = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        self.mp_valid = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="valid")
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.zero_pad = ops.Pad(((0, 0), (0, 0), (1, 1), (1, 1)))
        self.resize_v2 = ops.ResizeBilinearV2(align_corners=False, half_pixel_centers=True)
        if c:
            rng = np.random.default_rng(0)
            self.conv = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1, has_bias=True)
            self.conv.bias.set_data(ms.Tensor(rng.standard_normal(c).astype(np.float32)))
            self.w = ms.Parameter(ms.Tensor(self.conv.weight.asnumpy()), name="w")
            self.b = ms.Parameter(ms.Tensor(self.conv.bias.asnumpy()), name="b")

    def construct(self, x):
        if self.kind == "maxpool_pad":
            return self.mp_pad(x)
        if self.kind == "maxpool_neginf_valid":
            return self.mp_valid(ops.pad(x, (1, 1, 1, 1), value=float("-inf")))
        if self.kind == "maxpool_zero_valid":
            return self.mp_valid(self.zero_pad(x))
        if self.kind == "maxpool_functional":
            return ops.max_pool2d(x, 3, 2, 1)
        if self.kind == "conv_module":
            return ops.relu(self.conv(x))
        if self.kind == "conv_functional":
            return ops.relu(ops.conv2d(x, self.w, self.b, padding=1))
        if self.kind == "interpolate":
            return ops.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        if self.kind == "resize_v2":
            return self.resize_v2(x, (self.size, self.size))
        if self.kind == "mean":
            return ops.mean(x, axis=(2, 3), keep_dims=True)
        return self.gap(x)


def maxpool_cases(c, hw):
    # inputs are made non-negative (post-ReLU, as in ResNet stems) so zero padding is exact
    return (
        f"MaxPool 3x3/2 pad 1, 1x{c}x{hw}x{hw}",
        (1, c, hw, hw),
        {
            "nn.MaxPool2d(pad_mode='pad', padding=1)  [current]": Spelling("maxpool_pad"),
            "ops.pad(-inf) + nn.MaxPool2d('valid')": Spelling("maxpool_neginf_valid"),
            "ops.Pad (zeros; exact only after ReLU) + nn.MaxPool2d('valid')": Spelling("maxpool_zero_valid"),
            "ops.max_pool2d(x, 3, 2, 1)": Spelling("maxpool_functional"),
        },
    )


def conv_bias_cases(c, hw):
    return (
        f"Conv 3x3 + bias + ReLU, 1x{c}x{hw}x{hw}",
        (1, c, hw, hw),
        {
            "nn.Conv2d(has_bias=True) + ops.relu  [current]": Spelling("conv_module", c=c),
            "ops.conv2d(x, w, bias) + ops.relu": Spelling("conv_functional", c=c),
        },
    )


def resize_cases(c, hw, out):
    return (
        f"bilinear resize 1x{c}x{hw}x{hw} -> {out}x{out}",
        (1, c, hw, hw),
        {
            "ops.interpolate(size, bilinear)  [current]": Spelling("interpolate", out),
            "ops.ResizeBilinearV2(half_pixel_centers)": Spelling("resize_v2", out),
        },
    )


def gap_cases(c, hw):
    return (
        f"global average pool 1x{c}x{hw}x{hw}",
        (1, c, hw, hw),
        {
            "ops.mean(axis=(2,3), keep_dims=True)  [current]": Spelling("mean"),
            "nn.AdaptiveAvgPool2d(1)": Spelling("adaptive"),
        },
    )


def run_case(title, shape, cells, rounds):
    ms.set_context(mode=ms.GRAPH_MODE)
    x = ms.Tensor(np.abs(np.random.default_rng(1).standard_normal(shape)).astype(np.float32))  # post-ReLU-like
    outs = {k: c(x).asnumpy() for k, c in cells.items()}  # compiles
    ref = next(iter(outs.values()))
    times = {k: [] for k in cells}
    keys = list(cells)
    for r in range(rounds + 2):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            t = time.perf_counter()
            cells[k](x).asnumpy()
            if r >= 2:
                times[k].append((time.perf_counter() - t) * 1e3)
    base = statistics.median(times[keys[0]])
    lines = [f"**{title}**", "", "| spelling | median ms | vs current | max abs diff |", "|---|---|---|---|"]
    for k in keys:
        m = statistics.median(times[k])
        diff = float(np.abs(outs[k] - ref).max()) if outs[k].shape == ref.shape else float("nan")
        lines.append(f"| {k} | {m:.2f} | {m / base:.2f}x | {diff:.2g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--md")
    args = ap.parse_args()
    cases = [
        maxpool_cases(64, 112),
        maxpool_cases(64, 256),
        resize_cases(21, 128, 512),
        resize_cases(256, 32, 128),
        gap_cases(2048, 32),
    ]
    md = "\n".join(run_case(*c, args.rounds) for c in cases)
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
