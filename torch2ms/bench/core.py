"""``torch2ms bench``: every way of running the converted model, timed the same way.

1. The recipe's pipeline runs first (checkpoints make that a no-op when the run is up to date).
   Batch sizes other than the recipe's get their own run of a recipe copy with the input's
   leading dimension replaced (``<run>/bench/batches/<name>_b<N>/``): the exported ONNX has a
   static batch, so it is re-exported, which is the simple and honest way to get every variant
   at that batch. That copy's compile stage is cut to one call without graph-kernel search.
2. The plain rebuild (no Conv2dBnAct, BatchNorm as its own layer) is generated with
   ``rebuild_passes(fuse_conv_bn_act=False)`` into ``<run folder>/bench/plain/``.
3. Each variant is loaded in this process and checked against PyTorch's reference outputs under
   the bound its stage passed under, read from that stage's ``stage.json`` (the recipe's, a
   noise floor's or a replay's: ``variants.variant_tolerance``), so the bench accepts what the
   conversion accepted and no more; one out of it is reported ``wrong`` and not timed.
4. Timing is round-robin: each round calls every variant once (start rotated per round), so
   machine drift hits all alike. MindSpore's mode and graph-kernel switch are process-global
   context, so each MindSpore variant's context is set before its call, outside the timed
   region; compiled graphs are cached per Cell, so switching does not recompile (checked: the
   call after a switch costs as much as any other). Outputs are converted to numpy inside the
   timed region.
5. Each variant then runs alone in a subprocess (``torch2ms.bench.worker``) for its peak RSS and
   an isolated median (which also shows whether interleaving disturbed anything).
6. The fusion report compiles the MindSpore variants once more with IR dumps on.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torch2ms.bench.variants import BY_KEY, VARIANTS, Settings, bench_folders, load, variant_tolerance
from torch2ms.compare import compare_outputs
from torch2ms.pipeline.workspace import sha256_file, write_json
from torch2ms.recipe import Recipe
from torch2ms.runtime import graph_kernel


@dataclass
class BenchOptions:
    runs: int = 30
    warmup: int = 5
    threads: int = 2
    batches: tuple[int, ...] = (1,)
    out_root: Path | None = None
    variants: tuple[str, ...] = tuple(v.key for v in VARIANTS)
    memory: bool = True  # one subprocess per variant for peak RSS
    memory_runs: int = 3
    fusion: bool = True
    timeout_s: float = 1800


@dataclass
class VariantResult:
    key: str
    label: str
    status: str = "ok"  # ok | wrong | error
    reason: str = ""
    check: dict = field(default_factory=dict)
    first_call_s: float | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    throughput_ips: float | None = None
    isolated_median_ms: float | None = None
    peak_rss_mb: float | None = None
    import_rss_mb: float | None = None
    samples_ms: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["samples_ms"] = [round(x, 3) for x in self.samples_ms]
        return d


def machine_info() -> dict:
    from torch2ms.runtime.cpu import cpu_flags

    model = "?"
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    flags = cpu_flags()
    wide = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    return {"cpu": model, "logical_cpus": os.cpu_count(), "isa_flags": wide, "load_avg_1min_at_start": load1}


def batch_recipe(recipe: Recipe, batch: int) -> Recipe:
    """The recipe with every input's leading dimension set to ``batch`` (a new run name)."""
    inputs = tuple(
        i.model_copy(update={"shape": (batch, *i.shape[1:]), "data": None, "batch": None}) for i in recipe.inputs
    )
    return recipe.model_copy(
        update={
            "name": f"{recipe.name}_b{batch}",
            "inputs": inputs,
            "check": recipe.check.model_copy(update={"samples": 1}),
            "compile": recipe.compile.model_copy(update={"graph_kernel": "off", "warmup": 0, "runs": 1}),
        }
    )


def ensure_run(recipe: Recipe, out_root: Path | None, log: Callable[[str], None]):
    """Run (or skip, when up to date) the pipeline; write its report when something ran."""
    from torch2ms.pipeline.report import write_reports
    from torch2ms.pipeline.runner import raise_for
    from torch2ms.stages import pipeline_runner

    result = pipeline_runner(recipe, out_root, log=log).run()
    if any(s.status != "up to date" for s in result.stages) or not (result.root / "report.md").exists():
        write_reports(result)
    raise_for(result)
    return result


def ensure_plain(recipe: Recipe, run_root: Path, log: Callable[[str], None]) -> Path:
    """``<run>/bench/plain``: the rebuild without Conv+BN+Act fusion, regenerated when the ONNX changes."""
    from torch2ms.codegen.convert import generate_network
    from torch2ms.passes import rebuild_passes
    from torch2ms.pipeline.context import RunContext
    from torch2ms.pipeline.workspace import RunDir
    from torch2ms.stages import pipeline_stages

    plain = run_root / "bench" / "plain"
    ctx = RunContext(recipe, RunDir(run_root), log=log, stages=pipeline_stages())
    stamp = {
        "model.onnx": sha256_file(ctx.artifact("model.onnx")),
        "passes": "rebuild_passes(fuse_conv_bn_act=False)",
    }
    stamp_file = plain / "bench_stamp.json"
    if stamp_file.is_file() and (plain / "network.py").is_file() and json.loads(stamp_file.read_text()) == stamp:
        return plain
    log(f"generating the plain rebuild (BatchNorm separate) in {plain}")
    plain.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".plain.", dir=plain.parent))
    generate_network(ctx, tmp, rebuild_passes(fuse_conv_bn_act=False), "bench_plain_gen")
    write_json(tmp / "bench_stamp.json", stamp)
    if plain.exists():
        shutil.rmtree(plain)
    os.replace(tmp, plain)
    return plain


def _child_env() -> dict:
    from torch2ms.runtime.cpu import cpu_choice

    env = dict(os.environ)
    choice = cpu_choice()
    if choice is not None:
        env["TORCH2MS_CPU_ISA"] = choice.isa
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("GLOG_v", "3")
    return env


def run_worker(spec: dict, timeout: float, module: str = "torch2ms.bench.worker") -> tuple[dict | None, str]:
    """Run ``module`` (a worker printing ``@@RESULT {json}`` last) on ``spec``; (result, error message)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, path],
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=os.getcwd(),
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    finally:
        os.unlink(path)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT ") :]), ""
    tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [f"exit code {proc.returncode}"]
    return None, tail[0][:300]


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def check_variant(variant, folders: dict[str, Path], recipe: Recipe, outs: list, ref_out: list) -> dict:
    """``variant``'s outputs against PyTorch's under the bound its stage passed under: the worst
    output's error and that output's bound, with where the bound came from (``bound_by``)."""
    tol = variant_tolerance(variant, folders, recipe.check)
    metrics = compare_outputs(outs, ref_out)
    violations = [f"{m.name}: {x}" for m in metrics for x in tol.violations(m)]
    worst = max(metrics, key=lambda m: m.rel_error if np.isfinite(m.rel_error) else np.inf)
    bound = tol.bound(worst.name)
    return {
        "passed": not violations,
        "rel_error": worst.rel_error,
        "cosine": worst.cosine,
        "bound_rel_error": bound["rel_error"],
        "bound_cosine": bound["cosine"],
        "bound_by": bound["by"],
        "bound_stage": folders[variant.checked_by].name if variant.checked_by else "",
        "violations": violations,
    }


def bench_batch(
    recipe: Recipe, folders: dict[str, Path], batch: int, options: BenchOptions, log: Callable[[str], None]
) -> dict[str, VariantResult]:
    from torch2ms.pipeline.workspace import load_npz, split_reference

    inputs, ref_out = split_reference(load_npz(folders["reference"] / "reference.npz"))
    names = list(ref_out[0])
    settings = Settings(options.threads, graph_kernel.flags(recipe.compile), recipe.compile.jit_level)
    variants = [BY_KEY[k] for k in options.variants]
    results = {v.key: VariantResult(v.key, v.label) for v in variants}
    loaded = {}
    for v in variants:
        r = results[v.key]
        log(f"batch {batch}: loading and checking {v.label}")
        try:
            lv = load(v, folders, recipe, settings, inputs[0])
            r.first_call_s = round(lv.first_call_s, 4)
            lv.activate()
            outs = [dict(zip(names, lv.run_on(s))) for s in inputs]
        except Exception as err:  # a variant that cannot run is a result, not a crash of the bench
            r.status, r.reason = (
                "error",
                f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300],
            )
            continue
        r.check = check_variant(v, folders, recipe, outs, ref_out)
        violations = r.check["violations"]
        if violations:
            r.status, r.reason = "wrong", "; ".join(violations)[:300]
            continue
        loaded[v.key] = lv
    keys = list(loaded)
    times: dict[str, list[float]] = {k: [] for k in keys}
    log(f"batch {batch}: {options.warmup} warm-up + {options.runs} timed rounds over {len(keys)} variants, round-robin")
    for rnd in range(options.warmup + options.runs):
        shift = rnd % max(1, len(keys))
        for k in keys[shift:] + keys[:shift]:
            lv = loaded[k]
            lv.activate()
            t0 = time.perf_counter()
            lv.call()
            dt = time.perf_counter() - t0
            if rnd >= options.warmup:
                times[k].append(dt * 1e3)
    for k in keys:
        ts = sorted(times[k])
        r = results[k]
        r.samples_ms = times[k]
        if ts:
            r.median_ms = round(statistics.median(ts), 3)
            r.p90_ms = round(_percentile(ts, 0.9), 3)
            r.throughput_ips = round(batch / (r.median_ms / 1e3), 3)
    loaded.clear()
    gc.collect()
    if options.memory:
        for v in variants:
            r = results[v.key]
            if r.status != "ok":
                continue
            log(f"batch {batch}: {v.label} alone in a subprocess (peak RSS)")
            spec = {
                "action": "measure",
                "variant": v.key,
                "recipe": recipe.model_dump(mode="json"),
                "base_dir": recipe.base_dir,
                "folders": {k: str(p) for k, p in folders.items()},
                "settings": settings.__dict__,
                "warmup": min(1, options.warmup),
                "runs": options.memory_runs,
            }
            res, err = run_worker(spec, options.timeout_s)
            if res is None:
                r.reason = f"memory subprocess failed: {err}"
                continue
            r.isolated_median_ms = round(res["median_ms"], 3)
            r.peak_rss_mb = round(res["peak_rss_mb"], 1)
            r.import_rss_mb = round(res["import_rss_mb"], 1)
    return results


def fusion_for(folders: dict[str, Path], options: BenchOptions, settings: Settings) -> dict:
    from torch2ms.bench.fusion import fusion_report

    def run_dump(network: Path, gk: bool, dump_dir: Path) -> str:
        spec = {
            "action": "dump",
            "network": str(network),
            "reference": str(folders["reference"]),
            "graph_kernel": gk,
            "graph_kernel_flags": settings.graph_kernel_flags if gk else "",
            "jit_level": settings.jit_level,
            "threads": settings.threads,
            "dump_dir": str(dump_dir),
        }
        res, err = run_worker(spec, options.timeout_s)
        return "" if res else err

    wanted = [v for v in VARIANTS if v.kind == "mindspore" and v.mode == "graph" and v.key in options.variants]
    return fusion_report(run_dump, {v.key: (folders[v.stage], v.graph_kernel) for v in wanted})


def run_bench(recipe: Recipe, options: BenchOptions, log: Callable[[str], None] = print) -> tuple[dict, Path]:
    """Benchmark every variant at every batch size; returns (bench data, bench folder)."""
    from torch2ms.pipeline.workspace import RunDir
    from torch2ms.runtime.cpu import cpu_choice

    t_start = time.perf_counter()
    main = ensure_run(recipe, options.out_root, log)
    root = main.root
    bench_dir = root / "bench"
    recipe_batch = recipe.inputs[0].shape[0]
    machine = machine_info()
    data: dict = {
        "recipe": recipe.name,
        "machine": machine,
        "cpu_setting": cpu_choice().to_dict() if cpu_choice() else None,
        "options": {
            "runs": options.runs,
            "warmup": options.warmup,
            "threads": options.threads,
            "batches": list(options.batches),
            "memory_runs": options.memory_runs,
        },
        "versions": _versions(),
        "variants": {v.key: v.label for v in VARIANTS if v.key in options.variants},
        "batches": {},
    }
    settings = Settings(options.threads, graph_kernel.flags(recipe.compile), recipe.compile.jit_level)
    folders_b1 = None
    for batch in options.batches:
        if batch == recipe_batch:
            r, run_root = recipe, root
        else:
            r = batch_recipe(recipe, batch)
            log(f"batch {batch}: converting {r.name} (static batch, re-exported)")
            run_root = ensure_run(r, bench_dir / "batches", log).root
        plain = ensure_plain(r, run_root, log)
        folders = bench_folders(r, run_root, plain)
        if folders_b1 is None:
            folders_b1 = folders
        lock = RunDir(run_root)
        lock.lock()
        try:
            results = bench_batch(r, folders, batch, options, log)
        finally:
            lock.unlock()
        data["batches"][str(batch)] = {k: v.to_dict() for k, v in results.items()}
    if options.fusion and folders_b1 is not None:
        log("fusion report: compiling the GRAPH variants with IR dumps")
        data["fusion"] = fusion_for(folders_b1, options, settings)
    data["seconds"] = round(time.perf_counter() - t_start, 1)
    machine["load_avg_1min_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return data, bench_dir


def _versions() -> dict:
    from torch2ms.pipeline.fingerprint import framework_versions

    return framework_versions()
