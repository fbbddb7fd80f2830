"""Stage 5, mindir: export the folded network to MindIR for the board, reload it, re-check.

Exported in GRAPH_MODE without graph-kernel fusion (fused kernels built for this host's CPU
would not run on an Ascend board); reloaded with ``mindspore.load`` + ``nn.GraphCell`` and
checked vs PyTorch. Over 1 GB of weights, the weights go to ``network_variables/`` beside the graph
``network.mindir`` (``torch2ms.runtime.mindir_layout``). With ``inputs[].batch`` dimension 0 of those inputs
is exported as dynamic, and the reloaded MindIR is checked at every listed size (the runner compares each with PyTorch).
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.custom.aot import carry_into_mindir, running_in
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.runtime import mindir_layout, msutil
from torch2ms.runtime.memory import release_freed


class MindirStage(Stage):
    name = "mindir"
    summary = "network.mindir for the board, reloaded with mindspore.load and checked"
    section = "mindir"
    reads = ("network.py", "network.ckpt")
    writes = ("network.mindir",)

    def enabled(self, recipe) -> bool:
        return recipe.mindir.enabled

    def notes(self, record: dict) -> str:
        counts = record.get("counts", {})
        sizes = counts.get("batch_sizes")
        files = counts.get("mindir_files", 1)
        split = f" in {files} files (graph + {mindir_layout.VARIABLES}/)" if files > 1 else ""
        lengths = counts.get("sequence_lengths")
        return (
            f"{counts.get('mindir_bytes', 0) / 1e6:.1f} MB{split}"
            + (f", batch {sizes}" if sizes else "")
            + (f", sequence {lengths}" if lengths else "")
        )

    def run(self, ctx, out: Path) -> StageOutput:
        ms = msutil.mindspore()
        inputs = ctx.reference_inputs()
        names = list(ctx.reference()[1][0])
        msutil.set_graph_mode(ms)
        cell = msutil.build_network(ctx.artifact("network.py").parent, "mindir")
        # with inputs[].batch, dimension 0 of those inputs is dynamic (None): the board tools pick the sizes
        # and with inputs[].sequence dimension 1 (the length)
        dynamic = {i.name for i in ctx.recipe.inputs if len(i.batch_sizes()) > 1}
        profiled = {i.name for i in ctx.recipe.inputs if i.sequence}
        example = []
        for name, v in inputs[0].items():
            shape = [
                None if (k == 0 and name in dynamic) or (k == 1 and name in profiled) else d
                for k, d in enumerate(v.shape)
            ]
            example.append(ms.Tensor(shape=shape, dtype=ms.Tensor(v).dtype) if None in shape else ms.Tensor(v))
        written = mindir_layout.export(ms, cell, *example, folder=out)
        # its Parameters are in the file now; the reloaded graph holds its own copy. The exported cell
        # and its compiled graph sit in reference cycles: collected here, not beside the GraphCell's run
        del cell
        release_freed()
        graph_file = (out / mindir_layout.GRAPH).resolve()
        kernels = carry_into_mindir(ctx.artifact("network.py").parent, out, graph_file)
        with running_in(out if kernels else None):  # a Custom op's kernels/x.so is found from the MindIR's folder
            graph = ms.load(str(graph_file))
            loaded = ms.nn.GraphCell(graph)
            outputs = msutil.run_cell(loaded, inputs, names)
            batches = {n: msutil.run_cell(loaded, [s], names)[0] for n, (s, _) in ctx.batch_reference().items()}
            lengths = {n: msutil.run_cell(loaded, [s], names)[0] for n, (s, _) in ctx.sequence_reference().items()}
        ms.set_context(mode=ms.PYNATIVE_MODE)
        counts = {"mindir_bytes": sum(p.stat().st_size for p in written), "mindir_files": len(written)}
        if kernels:
            counts["custom_kernels"] = kernels
        if dynamic:
            counts["batch_sizes"] = list(ctx.recipe.batch_sizes())
        if profiled:
            counts["sequence_lengths"] = list(ctx.recipe.sequence_lengths())
        return StageOutput(outputs, counts=counts, batches=batches or None, lengths=lengths or None)
