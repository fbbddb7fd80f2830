"""MindSpore helpers used by the stages: import it with the right CPU setting, load a generated
network, run it on the reference inputs, time it."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from torch2ms.runtime.cpu import configure_cpu
from torch2ms.runtime.threads import budget


def mindspore():
    """Import MindSpore after the CPU ISA choice is in the environment; quiet its C++ log."""
    configure_cpu()
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms

    _count_page_cache_as_available()
    _cap_runtime_threads(ms)
    _synchronous_pynative(ms)
    return ms


def _synchronous_pynative(ms) -> None:
    """PyNative waits for each op to finish (``ms.runtime.launch_blocking()``) instead of queueing it
    to MindSpore's dispatch threads, which spin while they wait. On a CPU the queue overlaps nothing,
    and an op's error is raised at the statement that called it. PyNative then costs less CPU and
    wall time (benchmarks/results/design_measurements.md); GRAPH mode is unchanged."""
    ms.runtime.launch_blocking()


def _cap_runtime_threads(ms) -> None:
    """MindSpore's CPU runtime threads at the thread budget (``runtime.threads``), once."""
    n = budget()
    if n is not None and ms.get_context("runtime_num_threads") != n:
        ms.set_context(runtime_num_threads=n)


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes the kernel can hand out now: MemAvailable, which counts the page cache it drops on
    demand (None where there is no /proc/meminfo)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _count_page_cache_as_available() -> None:
    """MindSpore 2.10's ``load_checkpoint`` refuses a .ckpt larger than ``SC_AVPHYS_PAGES`` (MemFree),
    which leaves out the page cache. After a zoo has written gigabytes of checkpoints, MemFree sits
    near 200 MB with 18 GB available, and alexnet's 244 MB and inception_resnet_v2's 223 MB
    checkpoints were refused ("exceeds current available memory 216551424 bytes"). Its check asks
    ``serialization._get_available_memory``; this answers with MemAvailable instead, and falls back to
    MindSpore's own figure without /proc/meminfo. A checkpoint larger than MemAvailable still fails."""
    try:
        from mindspore.train import serialization
    except ImportError:
        return
    own = serialization._get_available_memory
    if getattr(own, "torch2ms", False):
        return

    def get_available_memory():
        mem = available_memory()
        return own() if mem is None else mem

    get_available_memory.torch2ms = True
    serialization._get_available_memory = get_available_memory


def set_graph_mode(ms, graph_kernel: bool = False, flags: str = "", jit_level: str | None = None) -> None:
    """GRAPH_MODE with or without graph-kernel fusion (its flags go through the environment)."""
    kwargs = {"mode": ms.GRAPH_MODE, "enable_graph_kernel": graph_kernel}
    if jit_level:
        kwargs["jit_config"] = {"jit_level": jit_level}
    if flags:
        os.environ["MS_DEV_GRAPH_KERNEL_FLAGS"] = flags
    else:
        os.environ.pop("MS_DEV_GRAPH_KERNEL_FLAGS", None)
    ms.set_context(**kwargs)


def load_network_module(path: Path, tag: str):
    # Named after the code, not hash(path): hash() of a str changes with every process
    # (PYTHONHASHSEED) and the path with every --out, and MindSpore writes this module name
    # into every node name of the exported MindIR.
    name = f"torch2ms_generated_{tag}_{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # MindSpore's graph parser needs the module importable
    # No __pycache__/network.*.pyc beside it: the folder is the stage's output, hashed into its record,
    # and a .pyc holds network.py's mtime, so a re-run or a resume would record other artifacts.
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


def build_network(stage_dir: Path, tag: str):
    """The stage's network with its checkpoint's weights. Its Parameters are not initialised first
    (``no_init_parameters``): the random init would be one more copy of the weights, replaced at once."""
    module = load_network_module(stage_dir / "network.py", tag)
    with _no_init_parameters():
        return module.build(str(stage_dir / "network.ckpt"))


def _no_init_parameters():
    try:
        from mindspore.nn.utils import no_init_parameters
    except ImportError:  # MindSpore announces its removal after 2.9; without it the init just costs memory
        return contextlib.nullcontext()
    return no_init_parameters()


def run_cell(
    cell, inputs: list[dict[str, np.ndarray]], output_names: list[str], seconds: list[float] | None = None
) -> list[dict[str, np.ndarray]]:
    """``cell`` on each sample, outputs as arrays; ``seconds``, if given, gets each call's wall time
    (outputs materialised)."""
    ms = mindspore()
    results = []
    for sample in inputs:
        args = [ms.Tensor(v) for v in sample.values()]
        t = time.perf_counter()
        out = cell(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        results.append({name: o.asnumpy() for name, o in zip(output_names, outs)})
        if seconds is not None:
            seconds.append(time.perf_counter() - t)
    return results


def time_cell(cell, sample: dict[str, np.ndarray], warmup: int, runs: int) -> dict:
    """First-call seconds (includes graph compilation), then median/p90 of ``runs`` calls."""
    ms = mindspore()
    args = [ms.Tensor(v) for v in sample.values()]

    def call():
        out = cell(*args)
        (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()  # materialise

    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    times.sort()
    return {
        "first_call_s": round(first, 4),
        "median_ms": round(statistics.median(times) * 1e3, 3),
        "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3, 3),
        "runs": runs,
    }
