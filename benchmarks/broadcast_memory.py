"""What one elementwise node after a conv costs MindSpore's CPU runtime in GRAPH_MODE, by spelling.

A chain of ``--layers`` 3x3 convs (``--channels`` x ``--size``²), each followed by one spelling of a
per-channel scale or shift. Each spelling runs in a fresh process (so one's memory pool does not
hide another's): peak RSS after one call, above the process's peak before the call, in GRAPH_MODE
and PyNative. A broadcasting ``Mul`` / ``Add`` keeps two ``size_t`` indices per output element in
its kernel (16 bytes), and in GRAPH_MODE the kernel lives as long as the graph: the reason the
fold stage folds a per-channel constant Mul / Add into the conv before it (``passes/fold_affine.py``).

    python benchmarks/broadcast_memory.py [--layers 20 --channels 64 --size 160] [--md results/broadcast_memory.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SPELLINGS = {
    "conv alone": "y",
    "y * 2.0 (a scalar)": "y * 2.0",
    "y * same-shape tensor": "y * self.full",
    "ops.bias_add(y, b[C])": "ops.bias_add(y, self.b)",
    "y * p[1, C, 1, 1]": "y * self.p",
    "y + p[1, C, 1, 1]": "y + self.p",
}

# MindSpore's GRAPH_MODE parses ``construct`` from its source file, so the child is a file, not ``-c``.
CHILD = """
import json, resource, sys
import numpy as np
from torch2ms.runtime import msutil
ms = msutil.mindspore()
from mindspore import Parameter, Tensor, nn, ops
mode, n, c, h = sys.argv[1], *map(int, sys.argv[2:5])
ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
rng = np.random.default_rng(0)


def param(*shape):
    return Parameter(Tensor(rng.uniform(0.5, 1.5, shape).astype(np.float32)), requires_grad=False)


class Layer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1)
        self.p, self.b, self.full = param(1, c, 1, 1), param(c), param(1, c, h, h)

    def construct(self, x):
        y = self.conv(x)
        return ops.relu(EXPR)


net = nn.SequentialCell([Layer() for _ in range(n)])
x = Tensor(rng.uniform(-1, 1, (1, c, h, h)).astype(np.float32))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
net(x).asnumpy()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"above_mb": round(after - before)}))
"""


def measure(mode: str, expr: str, layers: int, channels: int, size: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "spelling.py"
        script.write_text(CHILD.replace("EXPR", expr))
        out = subprocess.run(
            [sys.executable, str(script), mode, str(layers), str(channels), str(size)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return json.loads(out.strip().splitlines()[-1])["above_mb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    act_mb = args.channels * args.size**2 * 4 / 2**20
    rows = []
    for name, expr in SPELLINGS.items():
        graph = measure("graph", expr, args.layers, args.channels, args.size)
        pynative = measure("pynative", expr, args.layers, args.channels, args.size)
        rows.append(f"| `{name}` | {graph} | {pynative} |")
        print(rows[-1], flush=True)
    text = "\n".join(
        [
            f"# One elementwise node after each of {args.layers} convs, {args.channels}x{args.size}² "
            f"({act_mb:.2f} MB an activation)",
            "",
            "Peak RSS above the process's peak before the first call, MB; each row a fresh process.",
            "",
            "| after each conv | GRAPH_MODE | PyNative |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )
    if args.md:
        args.md.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
