"""``torch2ms load-weights``: a trained state_dict into an already converted network, checked."""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, setup_cpu
from torch2ms.errors import Torch2msError


@app.command("load-weights")
def load_weights_command(
    run: Path = typer.Argument(..., help="the converted run: its recipe YAML, or its folder (then give --recipe)"),
    state_dict: Path = typer.Option(..., "--state-dict", help="torch.save(model.state_dict()) file"),
    recipe: Path | None = typer.Option(None, "--recipe", "-r", help="recipe YAML (when RUN is a folder)"),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Write network.<name>.ckpt for each stage's network.py from a state_dict, without converting again.

    Checked like a stage: the outputs against PyTorch with the same weights. A key missing, extra or of
    another shape is named (exit 2) and nothing is written."""
    from torch2ms.pipeline.workspace import RunDir
    from torch2ms.recipe import load_recipe
    from torch2ms.tools.load_weights import load_weights

    if run.is_dir():
        if recipe is None:
            raise Torch2msError(f"{run}: a run folder; give its recipe with --recipe (the model to check against)")
        r, run_dir = load_recipe(recipe), RunDir(run)
    else:
        r = load_recipe(run)
        run_dir = RunDir(Path(r.output) / r.name)
    if not state_dict.is_file():
        raise Torch2msError(f"--state-dict {state_dict}: not found")
    setup_cpu(cpu_isa)
    if r.task == "text_generation":  # two graphs, checked as generation too (torch2ms.generation.weights)
        _generation_weights(r, run_dir, state_dict)
        return
    run_dir.lock()
    try:
        written = load_weights(r, run_dir, state_dict, log=lambda m: console.print(m, highlight=False))
    finally:
        run_dir.unlock()
    for w in written:
        console.print(f"{w.stage}: {w.checkpoint}  (load with build({str(w.checkpoint)!r}))", highlight=False)


def _generation_weights(r, run_dir, state_dict: Path) -> None:
    """A transformers state_dict into a generation recipe's prefill and decode graphs."""
    from torch2ms.generation.weights import load_generation_weights

    run_dir.lock()
    try:
        written = load_generation_weights(r, run_dir.root, state_dict, log=lambda m: console.print(m, highlight=False))
    finally:
        run_dir.unlock()
    for graph in ("prefill", "decode"):
        for w in written[graph]:
            console.print(f"{graph} {w.stage}: {w.checkpoint}", highlight=False)
