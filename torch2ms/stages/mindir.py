"""Stage 5, mindir: export the folded network to MindIR for the board, reload it, re-check.

Exported in GRAPH_MODE without graph-kernel fusion (fused kernels built for this host's CPU
would not run on an Ascend board); reloaded with ``mindspore.load`` + ``nn.GraphCell`` and
checked vs PyTorch.
"""

from __future__ import annotations

from pathlib import Path

from torch2ms import msutil
from torch2ms.pipeline.stage import Stage, StageOutput


class MindirStage(Stage):
    name = "mindir"
    summary = "network.mindir for the board, reloaded with mindspore.load and checked"
    section = "mindir"
    reads = ("network.py", "network.ckpt")
    writes = ("network.mindir",)

    def enabled(self, recipe) -> bool:
        return recipe.mindir.enabled

    def notes(self, record: dict) -> str:
        return f"{record.get('counts', {}).get('mindir_bytes', 0) / 1e6:.1f} MB"

    def run(self, ctx, out: Path) -> StageOutput:
        ms = msutil.mindspore()
        inputs = ctx.reference_inputs()
        names = list(ctx.reference()[1][0])
        msutil.set_graph_mode(ms)
        cell = msutil.build_network(ctx.artifact("network.py").parent, "mindir")
        example = [ms.Tensor(v) for v in inputs[0].values()]
        ms.export(cell, *example, file_name=str(out / "network"), file_format="MINDIR")
        graph = ms.load(str(out / "network.mindir"))
        loaded = ms.nn.GraphCell(graph)
        outputs = msutil.run_cell(loaded, inputs, names)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        size = (out / "network.mindir").stat().st_size
        return StageOutput(outputs, counts={"mindir_bytes": size})
