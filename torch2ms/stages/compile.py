"""Stage 4, compile: GRAPH_MODE build of the folded network with the recipe's fusion settings.

Records the compile (first call) seconds and the median latency of the compiled network next to
the PyNative rebuild's, measured in the same process on the same input. ``graph_kernel: auto``
builds with and without graph-kernel fusion and keeps the faster one (on this CPU, fusion was
not assumed to help: measure it). Checked: compiled outputs vs
PyTorch.
"""

from __future__ import annotations

from pathlib import Path

from torch2ms import msutil
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import write_json


class CompileStage(Stage):
    name = "compile"
    summary = "GRAPH_MODE build of the folded network, compile time and latency vs PyNative"
    section = "compile"
    reads = ("network.py", "network.ckpt")
    writes = ("compile.json",)

    def notes(self, record: dict) -> str:
        e = record.get("extra", {})
        speed = (
            f"{e.get('median_ms')} ms vs PyNative {e.get('pynative_median_ms')} ms ({e.get('speedup_vs_pynative')}x)"
        )
        return f"{e.get('chosen')}: {speed}, compile {e.get('compile_s')} s"

    def run(self, ctx, out: Path) -> StageOutput:
        ms = msutil.mindspore()
        spec = ctx.recipe.compile
        src = ctx.artifact("network.py").parent
        inputs = ctx.reference_inputs()
        names = list(ctx.reference()[1][0])

        ms.set_context(mode=ms.PYNATIVE_MODE)
        pynative = msutil.time_cell(
            msutil.build_network(ctx.stage_dir(ctx.first_writer("network.py")), "compile_pynative"),
            inputs[0],
            spec.warmup,
            spec.runs,
        )

        variants = {"auto": [False, True], "on": [True], "off": [False]}[spec.graph_kernel]
        timings, cells = {}, {}
        for gk in variants:
            key = "graph_kernel" if gk else "graph"
            msutil.set_graph_mode(ms, gk, spec.graph_kernel_flags if gk else "", spec.jit_level)
            cell = msutil.build_network(src, f"compile_{key}")
            timings[key] = msutil.time_cell(cell, inputs[0], spec.warmup, spec.runs)
            cells[key] = cell
        chosen = min(timings, key=lambda k: timings[k]["median_ms"])
        gk = chosen == "graph_kernel"
        msutil.set_graph_mode(ms, gk, spec.graph_kernel_flags if gk else "", spec.jit_level)
        outputs = msutil.run_cell(cells[chosen], inputs, names)
        ms.set_context(mode=ms.PYNATIVE_MODE, enable_graph_kernel=False)
        extra = {
            "source": src.name,
            "chosen": chosen,
            "compile_s": timings[chosen]["first_call_s"],
            "median_ms": timings[chosen]["median_ms"],
            "pynative_median_ms": pynative["median_ms"],
            "speedup_vs_pynative": round(pynative["median_ms"] / timings[chosen]["median_ms"], 2),
            "variants": {"pynative_plain": pynative, **timings},
        }
        write_json(out / "compile.json", extra)
        return StageOutput(outputs, extra=extra)
