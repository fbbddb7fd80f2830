"""MobileNetV2 with its 3x3 depthwise convolutions on a user AOT kernel against the built-in one.

Runs (or finds up to date) examples/custom_op/mobilenet_v2_depthwise.yaml and its control
mobilenet_v2_builtin.yaml (the same settings, MindSpore's own depthwise kernel), then times, in
one process and interleaved round by round:

* the two fold-stage networks in GRAPH_MODE (what the compile stage times), whole model;
* one depthwise layer alone per MindSpore kernel, at each stride and size MobileNetV2 has.

Writes benchmarks/results/custom_op.json and .md. Usage:
``.venv/bin/python benchmarks/custom_op.py [--runs 20] [--out runs]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "custom_op"
RESULTS = REPO / "benchmarks" / "results"
# (channels, size, stride) of MobileNetV2's depthwise layers at 224x224, one of each kind
LAYERS = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 2), (384, 14, 1), (960, 7, 1)]


def converted(recipe_name: str, out: Path) -> Path:
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    recipe = load_recipe(EXAMPLE / f"{recipe_name}.yaml")
    result = pipeline_runner(recipe, out, log=lambda m: print(m, flush=True), own_processes=True).run()
    bad = [s.stage for s in result.stages if s.status not in ("passed", "up to date")]
    if bad:
        sys.exit(f"{recipe_name}: stages {bad} did not pass")
    return out / recipe.name / "fold"


def interleaved(calls: dict, runs: int) -> dict[str, float]:
    """Median ms of each call, round-robin over ``runs`` rounds (start rotated), after one warm-up."""
    names = list(calls)
    for f in calls.values():
        f()
    times = {n: [] for n in names}
    for r in range(runs):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            calls[n]()
            times[n].append((time.perf_counter() - t) * 1e3)
    return {n: statistics.median(v) for n, v in times.items()}


def layer_cells(ms, channels: int, stride: int):
    """One depthwise layer: the plugin's kernel cell and nn.Conv2d(group=C), the same weights."""
    import t2ms_depthwise
    from mindspore import nn, ops

    from torch2ms.custom.aot import build

    kernel = t2ms_depthwise.KERNELS[stride]
    library = build(kernel, "Conv")[0]  # the cached build
    rng = np.random.default_rng(0)
    w = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)

    class Custom(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = ops.Custom(
                f"{library}:{kernel.function}",
                out_shape=eval(f"lambda x, w, b: {kernel.out_shape}"),  # noqa: S307 - the plugin's own
                out_dtype=lambda x, w, b: x,
                func_type="aot",
            )
            self.w, self.b = ms.Tensor(w), ms.Tensor(b)

        def construct(self, x):
            return self.op(x, self.w, self.b)

    conv = nn.Conv2d(channels, channels, 3, stride, pad_mode="pad", padding=1, group=channels, has_bias=True)
    conv.weight.set_data(ms.Tensor(w))
    conv.bias.set_data(ms.Tensor(b))
    return Custom(), conv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path, default=REPO / "runs")
    args = ap.parse_args()
    sys.path.insert(0, str(EXAMPLE))
    folders = {name: converted(f"mobilenet_v2_{name}", args.out) for name in ("builtin", "depthwise")}
    from torch2ms.custom.aot import KERNELS
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    msutil.set_graph_mode(ms)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    nets = {name: msutil.build_network(folder, f"bench_{name}") for name, folder in folders.items()}
    outs = {n: net(x).asnumpy() for n, net in nets.items()}
    model = interleaved({n: (lambda net=net: net(x).asnumpy()) for n, net in nets.items()}, args.runs)
    layers = []
    for c, size, stride in LAYERS:
        custom, conv = layer_cells(ms, c, stride)
        t = ms.Tensor(np.random.default_rng(1).standard_normal((1, c, size, size)).astype(np.float32))
        err = float(np.abs(custom(t).asnumpy() - conv(t).asnumpy()).max())
        calls = {"custom": lambda f=custom, t=t: f(t).asnumpy(), "builtin": lambda f=conv, t=t: f(t).asnumpy()}
        ms_ = interleaved(calls, args.runs)
        layers.append({"channels": c, "size": size, "stride": stride, "max_abs_diff": err, **ms_})
    data = {
        "model_ms": model,
        "model_max_abs_diff": float(np.abs(outs["builtin"] - outs["depthwise"]).max()),
        "layers_ms": layers,
        "runs": args.runs,
        "kernel_flags": list(next(iter(KERNELS.values())).flags),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "custom_op.json").write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
