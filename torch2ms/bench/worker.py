"""One-variant subprocess: ``python -m torch2ms.bench.worker SPEC.json``.

``measure``: load one variant, time it alone, and report the process's peak RSS
(``VmHWM``) next to the RSS right after the framework import, so the table can show both
the total a deployment pays and the share the model itself adds. Only the variant's own
framework is imported (a MindSpore variant never imports torch).

``dump``: compile one MindSpore variant with ``save_graphs`` on, into ``SPEC['dump_dir']``, for
the fusion report (``torch2ms.bench.fusion``).

The result is the last stdout line, ``@@RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from torch2ms.runtime.memory import peak_rss_mb, rss_mb

RESULT = "@@RESULT "


def _import_framework(kind: str) -> None:
    if kind == "torch":
        import torch  # noqa: F401
    elif kind == "onnxruntime":
        import onnxruntime  # noqa: F401
    else:
        from torch2ms.runtime import msutil

        msutil.mindspore()


def measure(spec: dict) -> dict:
    from torch2ms.bench.variants import BY_KEY, Settings, load
    from torch2ms.pipeline.workspace import load_npz, split_reference
    from torch2ms.recipe import parse_recipe

    variant = BY_KEY[spec["variant"]]
    _import_framework(variant.kind)
    baseline = rss_mb()
    recipe = parse_recipe(spec["recipe"], "bench", spec["base_dir"])
    folders = {k: Path(v) for k, v in spec["folders"].items()}
    inputs, _ = split_reference(load_npz(folders["reference"] / "reference.npz"))
    loaded = load(variant, folders, recipe, Settings(**spec["settings"]), inputs[0])
    for _ in range(spec["warmup"]):
        loaded.call()
    times = []
    for _ in range(spec["runs"]):
        t0 = time.perf_counter()
        loaded.call()
        times.append(time.perf_counter() - t0)
    return {
        "first_call_s": loaded.first_call_s,
        "median_ms": statistics.median(times) * 1e3,
        "peak_rss_mb": peak_rss_mb(),
        "import_rss_mb": baseline,
    }


def dump(spec: dict) -> dict:
    from torch2ms.runtime import msutil
    from torch2ms.runtime.msutil import set_graph_mode

    ms = msutil.mindspore()
    os.environ["MS_DEV_DUMP_IR_PASSES"] = "graph_build"
    set_graph_mode(ms, spec["graph_kernel"], spec.get("graph_kernel_flags", ""), spec.get("jit_level"))
    ms.set_context(save_graphs=1, save_graphs_path=spec["dump_dir"], runtime_num_threads=spec["threads"])
    from torch2ms.pipeline.workspace import load_npz, split_reference

    inputs, _ = split_reference(load_npz(Path(spec["reference"]) / "reference.npz"))
    cell = msutil.build_network(Path(spec["network"]), "dump")
    out = cell(*[ms.Tensor(v) for v in inputs[0].values()])
    (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()
    return {"dump_dir": spec["dump_dir"]}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = {"measure": measure, "dump": dump}[spec["action"]](spec)
    sys.stdout.write("\n" + RESULT + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
