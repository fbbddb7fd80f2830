"""The variants ``torch2ms bench`` times, and how each one is loaded and called.

A variant is loaded into a ``Loaded`` object: ``activate()`` puts the process into the state the
variant needs (MindSpore's execution mode and graph-kernel switch are global context, so they
are set before every call, outside the timed region), ``call()`` runs one inference on prepared
framework tensors and returns numpy outputs (so the work is materialised), ``first_call_s`` is
the time of the first call (graph compilation for GRAPH_MODE variants, session creation + first
run for onnxruntime).

The same loaders run in the benchmarking process (interleaved timing) and in the one-variant
subprocesses (``torch2ms.bench.worker``) that measure peak memory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch2ms.errors import Torch2msError


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    kind: str  # torch | onnxruntime | mindspore | mindir
    stage: str = ""  # which folder of bench_folders() holds its network.py / model
    mode: str = ""  # pynative | graph
    graph_kernel: bool = False
    # the folder of bench_folders() whose stage.json holds the bound the variant is checked under:
    # the stage that checked this code (the plain rebuild runs the rebuild stage's converters
    # without the Conv2dBnAct pass; compile checked the folded network in GRAPH_MODE); "" for
    # PyTorch itself (the recipe's bound)
    checked_by: str = ""


VARIANTS = (
    Variant("torch", "PyTorch eager", "torch"),
    Variant("onnxruntime", "onnxruntime (model.onnx)", "onnxruntime", "onnx", checked_by="onnx"),
    Variant(
        "ms_pynative_plain",
        "MindSpore PyNative, plain rebuild (BN separate)",
        "mindspore",
        "plain",
        "pynative",
        checked_by="conv_bn_act",
    ),
    Variant(
        "ms_graph_plain", "MindSpore GRAPH, plain rebuild", "mindspore", "plain", "graph", checked_by="conv_bn_act"
    ),
    Variant(
        "ms_graph_conv_bn_act",
        "MindSpore GRAPH, Conv2dBnAct",
        "mindspore",
        "conv_bn_act",
        "graph",
        checked_by="conv_bn_act",
    ),
    Variant("ms_graph_folded", "MindSpore GRAPH, BN folded", "mindspore", "folded", "graph", checked_by="compile"),
    Variant(
        "ms_graph_folded_gk",
        "MindSpore GRAPH, BN folded + graph-kernel fusion",
        "mindspore",
        "folded",
        "graph",
        True,
        checked_by="compile",
    ),
    Variant("ms_mindir", "MindSpore MindIR reloaded (GraphCell)", "mindir", "mindir", "graph", checked_by="mindir"),
)
BY_KEY = {v.key: v for v in VARIANTS}


def bench_folders(recipe, run_root: Path, plain: Path) -> dict[str, Path]:
    """The run's folders the variants read, by role: where the stages that write them keep the
    reference data, the ONNX, the Conv2dBnAct network (the first network.py), the folded one (the
    last), the compile record and the MindIR; ``plain`` is the bench's own unfused rebuild."""
    from torch2ms.pipeline.context import RunContext
    from torch2ms.pipeline.workspace import RunDir
    from torch2ms.stages import pipeline_stages

    ctx = RunContext(recipe, RunDir(run_root), stages=pipeline_stages())
    return {
        "reference": ctx.artifact("reference.npz").parent,
        "onnx": ctx.artifact("model.onnx").parent,
        "conv_bn_act": ctx.artifact("network.py", first=True).parent,
        "folded": ctx.artifact("network.py").parent,
        "compile": ctx.artifact("compile.json").parent,
        "mindir": ctx.artifact("network.mindir").parent,
        "plain": plain,
    }


def variant_tolerance(variant: Variant, folders: dict[str, Path], check):
    """The bound ``variant`` is checked under: the one its stage passed under, from that stage's
    ``stage.json`` (``Tolerance.from_record``); PyTorch eager itself is held to the recipe's."""
    from torch2ms.compare import Tolerance
    from torch2ms.pipeline.workspace import RECORD

    if not variant.checked_by:
        return Tolerance(check.rel_error, check.cosine, check.argmax_agreement)
    path = folders[variant.checked_by] / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise Torch2msError(
            f"{path}: the record holding the bound {variant.key} is checked under cannot be read ({err})",
            hint="re-run `torch2ms convert` on the recipe",
        ) from err
    return Tolerance.from_record(check, record)


@dataclass
class Loaded:
    variant: Variant
    call: Callable[[], list[np.ndarray]]
    run_on: Callable[[dict[str, np.ndarray]], list[np.ndarray]]  # one sample -> outputs (for checks)
    activate: Callable[[], None]
    set_sample: Callable[[dict[str, np.ndarray]], None]
    first_call_s: float = 0.0


@dataclass(frozen=True)
class Settings:
    threads: int
    graph_kernel_flags: str = ""
    jit_level: str | None = None


def load(
    variant: Variant, folders: dict[str, Path], recipe, settings: Settings, sample: dict[str, np.ndarray]
) -> Loaded:
    """Load ``variant`` from ``folders`` (stage name -> folder), prepare ``sample``, make the first call."""
    loader = {"torch": _torch, "onnxruntime": _onnxruntime, "mindspore": _mindspore, "mindir": _mindir}[variant.kind]
    loaded = loader(variant, folders, recipe, settings)
    loaded.set_sample(sample)
    loaded.activate()
    t0 = time.perf_counter()
    loaded.call()
    loaded.first_call_s = time.perf_counter() - t0
    return loaded


def _torch(variant, folders, recipe, settings) -> Loaded:
    import torch

    from torch2ms.model_loader import build_model, flatten_outputs

    torch.set_num_threads(settings.threads)
    model = build_model(recipe).eval()
    state = {}

    def run(args) -> list[np.ndarray]:
        with torch.inference_mode():
            return [t.numpy() for t in flatten_outputs(model(*args)).values()]

    def set_sample(sample):
        state["args"] = [torch.from_numpy(np.ascontiguousarray(v)) for v in sample.values()]

    return Loaded(
        variant,
        lambda: run(state["args"]),
        lambda s: run([torch.from_numpy(np.ascontiguousarray(v)) for v in s.values()]),
        lambda: None,
        set_sample,
    )


def _onnxruntime(variant, folders, recipe, settings) -> Loaded:
    from torch2ms.graph.onnxrt import BENCHMARK, session

    sess = session(folders["onnx"] / "model.onnx", BENCHMARK, threads=settings.threads)
    state = {}

    def set_sample(sample):
        state["feed"] = dict(sample)

    return Loaded(
        variant, lambda: sess.run(None, state["feed"]), lambda s: sess.run(None, dict(s)), lambda: None, set_sample
    )


def _ms_context(ms, variant: Variant, settings: Settings) -> Callable[[], None]:
    from torch2ms.runtime.msutil import set_graph_mode

    if variant.mode == "pynative":
        return lambda: ms.set_context(mode=ms.PYNATIVE_MODE, enable_graph_kernel=False)
    flags = settings.graph_kernel_flags if variant.graph_kernel else ""
    return lambda: set_graph_mode(ms, variant.graph_kernel, flags, settings.jit_level)


def _ms_threads(ms, threads: int) -> None:
    """Both thread knobs MindSpore 2.10 has for CPU; neither could be shown to cap CPU use on
    this 2-core machine (see benchmarks/README.md), so the default pool is what runs."""
    ms.set_context(runtime_num_threads=threads)
    try:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    except (AttributeError, RuntimeError, ValueError):  # older API, or already set in this process
        pass


def _ms_loaded(ms, variant, cell, settings) -> Loaded:
    activate = _ms_context(ms, variant, settings)
    state = {}

    def run(args) -> list[np.ndarray]:
        out = cell(*args)
        return [o.asnumpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]

    def set_sample(sample):
        state["args"] = [ms.Tensor(v) for v in sample.values()]

    return Loaded(
        variant, lambda: run(state["args"]), lambda s: run([ms.Tensor(v) for v in s.values()]), activate, set_sample
    )


def _mindspore(variant, folders, recipe, settings) -> Loaded:
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    _ms_threads(ms, settings.threads)
    _ms_context(ms, variant, settings)()
    cell = msutil.build_network(folders[variant.stage], f"bench_{variant.key}")
    return _ms_loaded(ms, variant, cell, settings)


def _mindir(variant, folders, recipe, settings) -> Loaded:
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    _ms_threads(ms, settings.threads)
    _ms_context(ms, variant, settings)()
    cell = ms.nn.GraphCell(ms.load(str(folders["mindir"] / "network.mindir")))
    return _ms_loaded(ms, variant, cell, settings)
