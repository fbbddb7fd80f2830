"""``torch2ms profile``: where each way of running the model spends its time, kernel by kernel.

1. The recipe's pipeline runs first (up to date: a no-op), as for ``torch2ms bench``, whose
   folders and loaders the variants reuse (``torch2ms.bench.variants``).
2. Each variant runs in its own subprocess (``torch2ms.profile.worker``) on the first reference
   sample: one call outside the profile (compilation, warm-up), then ``calls`` calls under the
   profiler, with the wall time of those calls.
3. ``summarize`` turns the kernels into the figures compared: kernels per call, time per op type,
   time per module path cut at ``depth`` levels (``backbone.layer1``), and the small-op share:
   the share of kernel time spent in kernels whose mean time per occurrence is under
   ``small_ms``, the serial small kernels graph-kernel fusion is meant to merge.

The figures are per call; kernel times come from the profilers (MindSpore's own kernel timer,
``torch.profiler``'s CPU time of each top-level ATen op) and are compared with the wall time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch2ms.recipe import Recipe

DEFAULT_VARIANTS = ("torch", "ms_pynative_plain", "ms_graph_folded", "ms_graph_folded_gk")
LABELS = {"torch": "PyTorch eager"}


@dataclass
class ProfileOptions:
    calls: int = 10
    threads: int = 2
    depth: int = 2
    small_ms: float = 0.1
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    out_root: Path | None = None
    timeout_s: float = 1800


def cut(path: str | None, depth: int) -> str | None:
    """``path`` cut to its first ``depth`` components; '' (the top level) stays ''."""
    if path is None:
        return None
    return ".".join(path.split(".")[:depth])


def torch_module(path: str | None, names: set[str] | None) -> str | None:
    """The PyTorch module a MindSpore scope path belongs to: its longest prefix that is a PyTorch
    module name (``pool.max_pool2d`` -> ``pool``: a generated wrapper's own child; ``stem.0.conv`` ->
    ``stem.0``: a Conv2dBnAct, which also holds the time of the BatchNorm and activation fused
    into it); the path itself without ``names``."""
    if not path or names is None:
        return path
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in names:
            return ".".join(parts[:n])
    return path


def summarize(raw: dict, small_ms: float, depth: int, names: set[str] | None = None) -> dict:
    """The figures of one profiled variant (``raw``: wall time and kernels, per call); ``names``:
    the PyTorch model's module names, onto which MindSpore's scope paths are mapped."""
    kernels = raw["kernels"]
    total = sum(k["ms_per_call"] for k in kernels)
    types: dict[str, dict] = defaultdict(lambda: {"kernels_per_call": 0.0, "ms_per_call": 0.0})
    for k in kernels:
        types[k["type"]]["kernels_per_call"] += k["per_call"]
        types[k["type"]]["ms_per_call"] += k["ms_per_call"]
    small = [k for k in kernels if k["per_call"] and k["ms_per_call"] / k["per_call"] < small_ms]
    scoped = any(k["module"] for k in kernels)
    modules: dict[str, float] | None = None
    if scoped:
        modules = defaultdict(float)
        for k in kernels:
            modules[cut(torch_module(k["module"], names), depth) or "(top level)"] += k["ms_per_call"]
    small_ms_total = sum(k["ms_per_call"] for k in small)
    return {
        "wall_ms_per_call": round(raw["wall_ms_per_call"], 4),
        "kernel_ms_per_call": round(total, 4),
        "kernels_per_call": round(sum(k["per_call"] for k in kernels), 2),
        "small_kernels_per_call": round(sum(k["per_call"] for k in small), 2),
        "small_ms_per_call": round(small_ms_total, 4),
        "small_op_share": round(small_ms_total / total, 4) if total else None,
        "op_types": {
            t: {
                "kernels_per_call": round(v["kernels_per_call"], 2),
                "ms_per_call": round(v["ms_per_call"], 4),
                "share": round(v["ms_per_call"] / total, 4) if total else None,
            }
            for t, v in sorted(types.items(), key=lambda kv: -kv[1]["ms_per_call"])
        },
        "modules": {m: round(v, 4) for m, v in sorted(modules.items(), key=lambda kv: -kv[1])} if scoped else None,
        "modules_note": "" if scoped else "the profiler names these kernels without their module scope",
        "kernels": kernels,
    }


def _spec(key: str, recipe: Recipe, folders: dict[str, Path], options: ProfileOptions) -> dict:
    from torch2ms.bench.variants import Settings
    from torch2ms.runtime import graph_kernel

    settings = Settings(options.threads, graph_kernel.flags(recipe.compile), recipe.compile.jit_level)
    return {
        "variant": key,
        "recipe": recipe.model_dump(mode="json"),
        "base_dir": recipe.base_dir,
        "folders": {k: str(p) for k, p in folders.items()},
        "settings": settings.__dict__,
        "calls": options.calls,
    }


def run_profile(recipe: Recipe, options: ProfileOptions, log: Callable[[str], None] = print) -> tuple[dict, Path]:
    """Profile every variant of ``options``; returns (profile data, the run folder)."""
    from torch2ms.bench.core import ensure_plain, ensure_run, machine_info, run_worker
    from torch2ms.bench.variants import BY_KEY, bench_folders
    from torch2ms.runtime.cpu import cpu_choice

    t0 = time.perf_counter()
    root = ensure_run(recipe, options.out_root, log).root
    # the bench's own unfused rebuild is generated only for the variants that run it
    plain = (
        ensure_plain(recipe, root, log)
        if any(BY_KEY[k].stage == "plain" for k in options.variants if k in BY_KEY)
        else root / "bench" / "plain"
    )
    folders = bench_folders(recipe, root, plain)
    raws: dict[str, dict | str] = {}
    for key in sorted(options.variants, key=lambda k: k != "torch"):  # torch first: its module names
        log(f"profiling {LABELS.get(key) or BY_KEY[key].label}: {options.calls} calls")
        raw, err = run_worker(_spec(key, recipe, folders, options), options.timeout_s, "torch2ms.profile.worker")
        raws[key] = raw if raw is not None else err
    names = set(raws["torch"]["module_names"]) if isinstance(raws.get("torch"), dict) else None
    variants: dict[str, dict] = {}
    for key in options.variants:
        label, raw = LABELS.get(key) or BY_KEY[key].label, raws[key]
        if isinstance(raw, str):
            variants[key] = {"label": label, "error": raw}
            continue
        variants[key] = {"label": label, **summarize(raw, options.small_ms, options.depth, names)}
    data = {
        "recipe": recipe.name,
        "machine": machine_info(),
        "cpu_setting": cpu_choice().to_dict() if cpu_choice() else None,
        "calls": options.calls,
        "threads": options.threads,
        "depth": options.depth,
        "small_ms": options.small_ms,
        "sample": "the first reference sample (reference.npz), the same for every variant",
        "torch_modules": sorted(names) if names else None,
        "variants": variants,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return data, root
