"""What ``torch2ms convert`` itself costs: wall time and peak RSS per stage, cold and warm.

For each recipe, the pipeline runs in a child process exactly as ``torch2ms convert`` runs it
(same Runner, same CPU setting, the export stage in a process of its own); the child prints a
timestamp whenever a stage starts or ends, and this process samples the child's RSS every 50 ms
(psutil), so each stage gets its wall time (run + check + commit) and the peak RSS seen while it
ran. The process tree is counted twice: the sum of its processes' RSS (a page shared by k
processes counted k times), and the sum of their PSS (``tree_pss``: each such page once; every
0.5 s, as reading it costs CPU), which is what the tree takes from the machine when MindSpore's
kernel-build server and its forked workers run beside the conversion. Where the stage records
them (``stage.json``: ``cpu_seconds``, ``memory.peak_rss_mb``, the process's exact high-water
mark during the stage), those are shown too, and the child's CPU seconds in all (user + system,
``getrusage``): on a machine shared with other work, CPU seconds say more than wall time. Cold: a
fresh output folder. Warm: the same command again (every stage up to date). Writes a markdown table.

``--code DIR`` runs another checkout's torch2ms (e.g. ``git archive`` of an older commit) for a
before/after table measured side by side.

    python benchmarks/convert_cost.py recipes/deeplabv3plus.yaml recipes/resnet50.yaml \
        recipes/mobilenet_v2.yaml --md benchmarks/results/convert_cost.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
PSS_EVERY = 10  # the tree's PSS on every 10th sample (0.5 s): see run_once

DRIVER = r"""
import json, sys, time
t_proc = float(sys.argv[3])
print("@@" + json.dumps({"event": "python_start", "t": time.time()}), flush=True)
from torch2ms.runtime.cpu import configure_cpu
configure_cpu()
from torch2ms.pipeline.report import write_reports
from torch2ms.pipeline.runner import Runner
from torch2ms.recipe import load_recipe
def on_stage(stage, state):
    print("@@" + json.dumps({"event": state, "stage": stage, "t": time.time()}), flush=True)
print("@@" + json.dumps({"event": "imported", "t": time.time()}), flush=True)
import inspect
# as `torch2ms convert`: the export stage in its own process (an older checkout has no such option),
# over the stage list torch2ms.stages builds (an older checkout's Runner builds it itself)
own = {"own_processes": True} if "own_processes" in inspect.signature(Runner).parameters else {}
try:
    from torch2ms.stages import pipeline_runner as Runner
except ImportError:
    pass
r = Runner(load_recipe(sys.argv[1]), sys.argv[2], log=lambda m: None, on_stage=on_stage, **own)
res = r.run()
write_reports(res)
print("@@" + json.dumps({"event": "done", "t": time.time(), "passed": res.passed,
      "stages": {s.stage: (s.record or {}).get("seconds") for s in res.stages}}), flush=True)
"""


def run_once(recipe: Path, out: Path, code: Path = REPO) -> dict:
    t0 = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(recipe), str(out), str(t0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
    )
    samples: list[tuple[float, float, float | None]] = []  # (time, tree RSS MB, tree PSS MB or None)
    stop = threading.Event()

    def sample() -> None:
        p = psutil.Process(proc.pid)
        for n in itertools.count():
            if stop.is_set():
                break
            try:
                own = p.memory_info().rss
                children = p.children(recursive=True)
            except psutil.Error:  # the child has ended
                break
            tree, rss = [p], own
            for c in children:  # a child may end between the listing and its reading (ruff's runs)
                try:
                    rss += c.memory_info().rss
                    tree.append(c)
                except psutil.Error:
                    pass
            # PSS walks every page table of the tree: at 50 ms on a 2 GB export process it took half a core
            # and slowed the export by 6.5 s of 20; so every PSS_EVERY-th sample (RSS: every one)
            pss = rss if len(tree) == 1 else tree_pss(tree) if n % PSS_EVERY == 0 else None
            samples.append((time.time(), rss / 2**20, pss / 2**20 if pss is not None else None))
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    events = [json.loads(line[2:]) for line in proc.stdout if line.startswith("@@")]
    proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stop.set()
    th.join()
    t_end = time.time()
    marks = [(e["stage"], e["t"]) for e in events if e.get("stage")]
    imported = next((e["t"] for e in events if e["event"] == "imported"), t0)
    done = next((e for e in events if e["event"] == "done"), {})
    stages = {}
    start = imported
    for i, (stage, t) in enumerate(marks):
        if i + 1 < len(marks) and marks[i + 1][0] == stage:  # running -> finished
            continue
        first = next(tt for s, tt in marks if s == stage)
        begin = first if first < t else start
        window = [(rss, pss) for ts, rss, pss in samples if begin <= ts <= t]
        stages[stage] = {
            "wall_s": round(t - begin, 1),
            "peak_rss_mb": round(max(r for r, _ in window), 0) if window else None,
            "peak_pss_mb": _peak(q for _, q in window),
        }
        rec_path = out / json.loads(recipe_name(recipe)) / stage / "stage.json"
        rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {}
        ran = any(e.get("stage") == stage and e["event"] == "running" for e in events)
        if ran and rec.get("cpu_seconds") is not None:
            stages[stage]["cpu_s"] = round(rec["cpu_seconds"], 1)
            stages[stage]["record_peak_rss_mb"] = rec["memory"]["peak_rss_mb"]
            extra = rec.get("extra") or {}
            if "decision" in extra:  # compile: how many timed rounds, and each variant's first call
                stages[stage]["decision"] = extra["decision"]
                stages[stage]["first_call_s"] = {k: v.get("first_call_s") for k, v in extra["variants"].items()}
        start = t
    return {
        "total_s": round(t_end - t0, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "startup_s": round(imported - t0, 1),
        "peak_rss_mb": round(max(r for _, r, _ in samples), 0) if samples else None,
        "peak_pss_mb": _peak(q for _, _, q in samples),
        "passed": done.get("passed"),
        "stages": stages,
    }


def _peak(values) -> float | None:
    seen = [v for v in values if v is not None]
    return round(max(seen), 0) if seen else None


def tree_pss(tree) -> int:
    """Bytes of memory a process tree holds: the sum of each process's PSS (``smaps_rollup``), which
    counts a page shared by k processes (a forked child's copy-on-write pages, the shared libraries
    that MindSpore's kernel-build server maps too) 1/k times in each. The sum of RSS counts it k
    times."""
    total = 0
    for q in tree:
        try:
            with open(f"/proc/{q.pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
        except (OSError, StopIteration):  # ended since it was listed: nothing to count
            pass
    return total


def recipe_name(recipe: Path) -> str:
    import yaml

    return json.dumps(yaml.safe_load(recipe.read_text())["name"])


def to_markdown(results: dict) -> str:
    stages = ["export", "rebuild", "fold", "compile", "mindir"]
    lines = [
        "| recipe | run | "
        + " | ".join(f"{s} s / MB" for s in stages)
        + " | startup s | total s | CPU s | peak MB (tree RSS / tree PSS) |",
        "|---|---|" + "---|" * (len(stages) + 4),
    ]
    for name, runs in results.items():
        for kind, r in runs.items():
            cells = []
            for s in stages:
                st = r["stages"].get(s)
                cells.append(
                    f"{st['wall_s']} / {st['peak_rss_mb']:.0f}"
                    if st and st["peak_rss_mb"]
                    else (f"{st['wall_s']} / -" if st else "-")
                )
            lines.append(
                f"| {name} | {kind} | "
                + " | ".join(cells)
                + f" | {r['startup_s']} | {r['total_s']} | {r.get('cpu_s', '-')} | {r['peak_rss_mb']:.0f}"
                + f" / {r.get('peak_pss_mb') or r['peak_rss_mb']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipes", nargs="+", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout whose torch2ms runs (default: this one)")
    ap.add_argument("--cold-only", action="store_true")
    args = ap.parse_args()
    results = {}
    for recipe in args.recipes:
        with tempfile.TemporaryDirectory(prefix="torch2ms_cost_") as out:
            name = recipe.stem
            results[name] = {"cold": run_once(recipe.resolve(), Path(out), args.code.resolve())}
            if not args.cold_only:
                results[name]["warm"] = run_once(recipe.resolve(), Path(out), args.code.resolve())
            print(json.dumps({name: results[name]}), flush=True)
    md = to_markdown(results)
    print(md)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(md)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
