"""Why is MindSpore slow on this CPU? Sweep the oneDNN ISA cap (and a few other CPU knobs), each
in a fresh subprocess because oneDNN reads its environment once, before the first primitive.

For every setting the child builds a generated network (default: the resnet50 run's folded
network), runs it in GRAPH_MODE with ``ONEDNN_VERBOSE=1``, and reports the first-call and median
latency, the relative error against the PyTorch reference, and which oneDNN implementations ran
(with their summed execution time on the last call). Writes a markdown table.

    python benchmarks/cpu_isa.py --run runs/resnet50 --runs 3 --md benchmarks/results/cpu_isa.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SETTINGS = [
    ("default", {}),
    ("AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("AVX2_VNNI", {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI"}),
    ("AVX512_CORE", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
    ("AVX512_CORE_VNNI", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}),
    ("AVX512_CORE_BF16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
    ("AVX512_CORE_AMX", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}),
    ("AVX", {"ONEDNN_MAX_CPU_ISA": "AVX"}),
    ("SSE41", {"ONEDNN_MAX_CPU_ISA": "SSE41"}),
    ("AVX2, 1 thread", {"ONEDNN_MAX_CPU_ISA": "AVX2", "T2MS_THREADS": "1"}),
    (
        "AVX2, OMP_NUM_THREADS=1 KMP/OMP pinning",
        {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1", "OMP_PROC_BIND": "true"},
    ),
    ("default, PyNative", {"T2MS_MODE": "pynative"}),
    ("AVX2, PyNative", {"ONEDNN_MAX_CPU_ISA": "AVX2", "T2MS_MODE": "pynative"}),
]

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {repo!r})
os.environ.setdefault("GLOG_v", "3")
import numpy as np
import mindspore as ms
from pathlib import Path
from torch2ms.runtime import msutil
from torch2ms.compare import compare_arrays
from torch2ms.pipeline.context import split_reference
from torch2ms.pipeline.workspace import load_npz
run = Path({run!r})
mode = ms.PYNATIVE_MODE if os.environ.get("T2MS_MODE") == "pynative" else ms.GRAPH_MODE
ctx = dict(mode=mode)
if os.environ.get("T2MS_THREADS"):
    ctx["runtime_num_threads"] = int(os.environ["T2MS_THREADS"])
ms.set_context(**ctx)
ins, outs = split_reference(load_npz(run / "export" / "reference.npz"))
cell = msutil.build_network(run / {stage!r}, "isa")
x = [ms.Tensor(v) for v in ins[0].values()]
def call():
    o = cell(*x)
    return (o[0] if isinstance(o, (tuple, list)) else o).asnumpy()
t = time.perf_counter(); y = call(); first = time.perf_counter() - t
times = []
for _ in range({runs}):
    print("@@CALL", flush=True)
    t = time.perf_counter(); y = call(); times.append(time.perf_counter() - t)
m = compare_arrays("out", y, next(iter(outs[0].values())))
times.sort()
result = dict(first_s=first, median_ms=times[len(times) // 2] * 1e3, rel_error=m.rel_error)
print("@@RESULT " + json.dumps(result), flush=True)
"""


def run_setting(label: str, env_extra: dict, run: Path, stage: str, runs: int, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONEDNN_", "DNNL_", "OMP_"))}
    env.update(env_extra)
    env["ONEDNN_VERBOSE"] = "1"
    code = CHILD.format(repo=str(REPO), run=str(run.resolve()), stage=stage, runs=runs)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"setting": label, "error": f"timeout after {timeout:.0f} s"}
    lines = proc.stdout.splitlines()
    result = next((json.loads(ln.split(" ", 1)[1]) for ln in lines if ln.startswith("@@RESULT")), None)
    if result is None:
        return {"setting": label, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    isa = next((ln.split("isa:", 1)[1] for ln in lines if ",isa:" in ln), "?")
    nthr = next((ln.split("nthr:", 1)[1] for ln in lines if "nthr:" in ln), "?")
    last = max(i for i, ln in enumerate(lines) if ln.startswith("@@CALL"))
    impls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ln in lines[last:]:
        if ",primitive,exec," in ln:
            f = ln.split(",")
            impls[f"{f[5]} {f[6]}"][0] += 1
            impls[f"{f[5]} {f[6]}"][1] += float(f[-1])
    return {
        "setting": label,
        "isa": isa,
        "threads": nthr,
        **result,
        "wall_s": round(time.perf_counter() - t0, 1),
        "impls": {k: [v[0], round(v[1], 2)] for k, v in impls.items()},
    }


def to_markdown(rows: list[dict], title: str) -> str:
    out = [
        f"### {title}",
        "",
        (
            "| setting | oneDNN ISA | thr | first call s | median ms | rel err vs torch | implementations on the "
            "last call (count, summed ms) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['setting']} | - | - | - | - | - | {r['error']} |")
            continue
        impls = "; ".join(
            f"{k} x{n} {ms:.0f} ms" for k, (n, ms) in sorted(r["impls"].items(), key=lambda kv: -kv[1][1])
        )
        out.append(
            f"| {r['setting']} | {r['isa']} | {r['threads']} | {r['first_s']:.2f} | {r['median_ms']:.1f} | "
            f"{r['rel_error']:.2g} | {impls} |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=REPO / "runs" / "resnet50", help="a converted run folder")
    ap.add_argument("--stage", default="fold", help="which generated network to run (rebuild or fold)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--only", nargs="*", help="setting labels to run (default: all)")
    ap.add_argument("--md", type=Path, help="write the markdown table here")
    ap.add_argument("--json", type=Path, help="write the raw rows here")
    args = ap.parse_args()
    rows = []
    for label, env in SETTINGS:
        if args.only and label not in args.only:
            continue
        row = run_setting(label, env, args.run, args.stage, args.runs, args.timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    md = to_markdown(rows, f"oneDNN settings, {args.run.name} {args.stage} network, GRAPH_MODE unless noted")
    print(md)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
