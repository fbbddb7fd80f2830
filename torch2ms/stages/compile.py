"""Stage 4, compile: GRAPH_MODE build of the folded network with the recipe's fusion settings.

Records the compile (first call) seconds and the median latency of the compiled network next to
the PyNative rebuild's, measured in the same process on the same input. ``graph_kernel: auto``
builds with and without graph-kernel fusion and keeps the faster one (on this CPU, fusion was
measured slower for ResNet18, so it is not assumed to help). Checked: compiled outputs vs
PyTorch.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch2ms import msutil
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import write_json


def source_stage(recipe) -> str:
    return "fold" if recipe.fold.enabled else "rebuild"


def set_graph_mode(ms, graph_kernel: bool, flags: str, jit_level: str | None) -> None:
    kwargs = {"mode": ms.GRAPH_MODE, "enable_graph_kernel": graph_kernel}
    if jit_level:
        kwargs["jit_config"] = {"jit_level": jit_level}
    if flags:
        os.environ["MS_DEV_GRAPH_KERNEL_FLAGS"] = flags
    else:
        os.environ.pop("MS_DEV_GRAPH_KERNEL_FLAGS", None)
    ms.set_context(**kwargs)


class CompileStage(Stage):
    name = "compile"

    def source_stage(self, ctx) -> str:
        return source_stage(ctx.recipe)

    def run(self, ctx, out: Path) -> StageOutput:
        ms = msutil.mindspore()
        spec = ctx.recipe.compile
        src = ctx.stage_dir(self.source_stage(ctx))
        inputs = ctx.reference_inputs()
        names = list(ctx.reference()[1][0])

        ms.set_context(mode=ms.PYNATIVE_MODE)
        pynative = msutil.time_cell(
            msutil.build_network(ctx.stage_dir("rebuild"), "compile_pynative"), inputs[0], spec.warmup, spec.runs
        )

        variants = {"auto": [False, True], "on": [True], "off": [False]}[spec.graph_kernel]
        timings, cells = {}, {}
        for gk in variants:
            key = "graph_kernel" if gk else "graph"
            set_graph_mode(ms, gk, spec.graph_kernel_flags if gk else "", spec.jit_level)
            cell = msutil.build_network(src, f"compile_{key}")
            timings[key] = msutil.time_cell(cell, inputs[0], spec.warmup, spec.runs)
            cells[key] = cell
        chosen = min(timings, key=lambda k: timings[k]["median_ms"])
        set_graph_mode(
            ms, chosen == "graph_kernel", spec.graph_kernel_flags if chosen == "graph_kernel" else "", spec.jit_level
        )
        outputs = msutil.run_cell(cells[chosen], inputs, names)
        ms.set_context(mode=ms.PYNATIVE_MODE, enable_graph_kernel=False)
        extra = {
            "source": src.name,
            "chosen": chosen,
            "compile_s": timings[chosen]["first_call_s"],
            "median_ms": timings[chosen]["median_ms"],
            "pynative_median_ms": pynative["median_ms"],
            "speedup_vs_pynative": round(pynative["median_ms"] / timings[chosen]["median_ms"], 2),
            "variants": {"pynative_rebuild": pynative, **timings},
        }
        write_json(out / "compile.json", extra)
        return StageOutput(outputs, extra=extra)
