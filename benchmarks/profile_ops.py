"""Where the time goes: per-op-type time per inference for MindSpore (its own profiler, GRAPH_MODE)
and for onnxruntime (its session profiler) on the same run folder and input.

MindSpore 2.10's ``mindspore.Profiler`` works on CPU: ``FRAMEWORK/cpu_op_type_info_0.csv``
holds per-op-type totals over the profiled steps. onnxruntime's JSON trace has one event per
node; its ``op_name`` gives the (fused) kernel type. Each side runs in its own subprocess.

    python benchmarks/profile_ops.py runs/deeplabv3plus --stage fold [--graph-kernel] --steps 3
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MS_CHILD = r"""
import os, sys, time
sys.path.insert(0, {repo!r})
from torch2ms.runtime import msutil
from torch2ms.stages.compile import set_graph_mode
from torch2ms.pipeline.context import split_reference
from torch2ms.pipeline.workspace import load_npz
from pathlib import Path
ms = msutil.mindspore()
set_graph_mode(ms, {gk!r}, "", None)
run = Path({run!r})
ins, _ = split_reference(load_npz(run / "export" / "reference.npz"))
cell = msutil.build_network(run / {stage!r}, "prof")
x = [ms.Tensor(v) for v in ins[0].values()]
def call():
    o = cell(*x); (o[0] if isinstance(o, (tuple, list)) else o).asnumpy()
call(); call()
t = time.perf_counter()
for _ in range({steps}): call()
print("@@WALL", (time.perf_counter() - t) / {steps} * 1e3, flush=True)
prof = ms.Profiler(output_path={out!r})
for _ in range({steps}): call()
prof.analyse()
"""

ORT_CHILD = r"""
import sys, time, json
import onnxruntime as ort
sys.path.insert(0, {repo!r})
from torch2ms.pipeline.context import split_reference
from torch2ms.pipeline.workspace import load_npz
from pathlib import Path
run = Path({run!r})
ins, _ = split_reference(load_npz(run / "export" / "reference.npz"))
o = ort.SessionOptions(); o.intra_op_num_threads = {threads}; o.log_severity_level = 3
sess = ort.InferenceSession(str(run / "export" / "model.onnx"), o, providers=["CPUExecutionProvider"])
sess.run(None, ins[0]); sess.run(None, ins[0])
t = time.perf_counter()
for _ in range({steps}): sess.run(None, ins[0])
print("@@WALL", (time.perf_counter() - t) / {steps} * 1e3, flush=True)
o.enable_profiling = True; o.profile_file_prefix = {out!r} + "/ort"
sess = ort.InferenceSession(str(run / "export" / "model.onnx"), o, providers=["CPUExecutionProvider"])
sess.run(None, ins[0])
for _ in range({steps}): sess.run(None, ins[0])
print("@@PROFILE", sess.end_profiling(), flush=True)
"""


def _wall(stdout: str) -> float | None:
    return next((float(ln.split()[1]) for ln in stdout.splitlines() if ln.startswith("@@WALL")), None)


def profile_mindspore(run: Path, stage: str, gk: bool, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="t2ms_prof_") as out:
        code = MS_CHILD.format(repo=str(REPO), run=str(run.resolve()), stage=stage, gk=gk, steps=steps, out=out)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "GLOG_v": "3"}
        )
        files = list(Path(out).rglob("cpu_op_type_info_0.csv"))
        if not files:
            raise RuntimeError(f"MindSpore profiler wrote nothing: {proc.stderr.strip().splitlines()[-1:]}")
        ops = {}
        with open(files[0]) as f:
            for row in csv.DictReader(f):
                ops[row["op_type"]] = (
                    float(row["total_compute_time"]) / steps,
                    int(row["execution_frequency(per-step)"]),
                )
        return {"wall_ms": _wall(proc.stdout), "ops": ops}


def profile_ort(run: Path, threads: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="t2ms_prof_") as out:
        code = ORT_CHILD.format(repo=str(REPO), run=str(run.resolve()), threads=threads, steps=steps, out=out)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        path = next((ln.split(" ", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("@@PROFILE")), None)
        if path is None:
            raise RuntimeError(f"onnxruntime profiling failed: {proc.stderr.strip().splitlines()[-1:]}")
        events = json.loads(Path(path).read_text())
        per = defaultdict(lambda: [0.0, 0])
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                op = e.get("args", {}).get("op_name", "?")
                per[op][0] += e["dur"] / 1e3
                per[op][1] += 1
        runs = steps + 1
        return {"wall_ms": _wall(proc.stdout), "ops": {k: (v[0] / runs, v[1] // runs) for k, v in per.items()}}


def table(title: str, prof: dict) -> str:
    total = sum(t for t, _ in prof["ops"].values())
    lines = [
        f"**{title}**: {total:.1f} ms in kernels per inference (wall {prof['wall_ms']:.1f} ms)",
        "",
        "| op type | per inference ms | share | kernels |",
        "|---|---|---|---|",
    ]
    for op, (t, n) in sorted(prof["ops"].items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {op} | {t:.1f} | {t / total:.0%} | {n} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--stage", default="fold")
    ap.add_argument("--graph-kernel", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    from torch2ms.runtime.cpu import configure_cpu

    configure_cpu()
    ms_prof = profile_mindspore(args.run, args.stage, args.graph_kernel, args.steps)
    ort_prof = profile_ort(args.run, args.threads, args.steps)
    md = (
        f"### Per-op time, {args.run.name}\n\n"
        + table(f"MindSpore GRAPH {args.stage}{' + graph kernel' if args.graph_kernel else ''}", ms_prof)
        + "\n"
        + table("onnxruntime", ort_prof)
    )
    print(md)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(md)


if __name__ == "__main__":
    main()
