"""Compile settings for the folded network: jit_level O0 / O1 / O2 and graph-kernel fusion, each
compiled once (first call = compile time), checked against PyTorch's reference, then timed
interleaved (round-robin, each variant's context set before its call, outside the timer).

    python benchmarks/compile_probe.py runs/resnet50 --rounds 10
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from torch2ms.compare import compare_arrays
from torch2ms.pipeline.context import split_reference
from torch2ms.pipeline.workspace import load_npz
from torch2ms.runtime import msutil
from torch2ms.stages.compile import set_graph_mode

SETTINGS = {
    "O0 (default)": (False, None),
    "jit_level O1": (False, "O1"),
    "jit_level O2": (False, "O2"),
    "enable_graph_kernel": (True, None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--stage", default="fold")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    ms = msutil.mindspore()
    ins, outs = split_reference(load_npz(args.run / "export" / "reference.npz"))
    ref = next(iter(outs[0].values()))
    x = [ms.Tensor(v) for v in ins[0].values()]
    cells, compile_s, err = {}, {}, {}
    for name, (gk, level) in SETTINGS.items():
        set_graph_mode(ms, gk, "", level)
        try:
            cell = msutil.build_network(args.run / args.stage, f"probe_{len(cells)}")
            t = time.perf_counter()
            y = cell(*x)
            compile_s[name] = time.perf_counter() - t
        except Exception as e:  # a setting this build does not support is a result
            err[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
            continue
        y = y[0] if isinstance(y, (tuple, list)) else y
        err[name] = f"{compare_arrays('out', y.asnumpy(), ref).rel_error:.1e}"
        cells[name] = cell
    times = {k: [] for k in cells}
    keys = list(cells)
    for r in range(args.rounds + 2):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            gk, level = SETTINGS[k]
            set_graph_mode(ms, gk, "", level)
            t = time.perf_counter()
            o = cells[k](*x)
            (o[0] if isinstance(o, (tuple, list)) else o).asnumpy()
            if r >= 2:
                times[k].append((time.perf_counter() - t) * 1e3)
    base = statistics.median(times[keys[0]]) if keys else 1
    lines = [
        f"**Compile settings, {args.run.name} {args.stage}** ({args.rounds} interleaved rounds)",
        "",
        "| setting | compile s | median ms | vs O0 | rel err vs torch |",
        "|---|---|---|---|---|",
    ]
    for name in SETTINGS:
        if name in times:
            m = statistics.median(times[name])
            lines.append(f"| {name} | {compile_s[name]:.1f} | {m:.1f} | {m / base:.2f}x | {err[name]} |")
        else:
            lines.append(f"| {name} | - | - | - | {err.get(name, '?')} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.md:
        args.md.write_text(md)


if __name__ == "__main__":
    main()
