"""``torch2ms diff``: the first node where a stage's generated code leaves onnxruntime."""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu
from torch2ms.errors import EXIT_CHECK_FAILED, Torch2msError


def _default_stage(run_dir) -> str:
    """The stage with a network.py that failed its check, else the first whose weights are there (a
    passed zoo model keeps only the last stage's: ``torch2ms zoo --keep``), else the first."""
    from torch2ms.stages import localized_stages

    stages = localized_stages()
    for s in stages:
        if (run_dir.read_record(s) or {}).get("status") == "failed":
            return s
    return next((s for s in stages if (run_dir.stage_dir(s) / "network.ckpt").is_file()), stages[0])


@app.command()
def diff(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="recipe YAML of a converted model"),
    stage: str | None = typer.Option(
        None,
        "--stage",
        "-s",
        help="a stage that writes network.py (default: the one that failed its check, else the first)",
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="output root (default: the recipe's `output`, runs/)"),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Name the first node where a stage's network.py leaves onnxruntime; exit 1 if one diverges.

    Compares every tensor, writes diff.json/diff.md into the stage folder."""
    from torch2ms.compare import Tolerance
    from torch2ms.divergence import localize, render_text, write_diff
    from torch2ms.pipeline.workspace import RunDir, load_npz, split_reference
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import localized_stages

    r = load_recipe(recipe)
    run_dir = RunDir(Path(out or r.output) / r.name)
    stage = stage or _default_stage(run_dir)
    if stage not in localized_stages():
        raise Torch2msError(
            f"--stage {stage!r}: choose one of {', '.join(localized_stages())} (the stages that generate network.py)"
        )
    from torch2ms.pipeline.context import RunContext
    from torch2ms.stages import PIPELINE, pipeline_stages, writer_of

    declared = next(cls() for cls in PIPELINE if cls.name == stage)
    if not declared.enabled(r):
        raise Torch2msError(
            f"--stage {stage}: the {stage} stage is disabled in {recipe} ({declared.section}.enabled: false)",
            hint=f"use --stage {writer_of('network.py', r)}",
        )
    stage_dir = run_dir.stage_dir(stage)
    ctx = RunContext(r, run_dir, stages=pipeline_stages())
    onnx_path, reference = ctx.artifact("model.onnx"), ctx.artifact("reference.npz")
    needed = [onnx_path, reference] + [stage_dir / f for f in ("network.py", "network.ckpt", "tensor_map.json")]
    missing = [str(p) for p in needed if not p.is_file()]
    pruned = [p for p in missing if Path(p).name in ((run_dir.read_record(stage) or {}).get("pruned") or {})]
    if pruned:
        raise Torch2msError(
            f"{', '.join(pruned)}: deleted by `torch2ms zoo` once {r.name!r} passed (an intermediate weight copy)",
            hint=f"diff the stage that kept its weights (--stage {writer_of('network.py', r)}), or convert again "
            "with `torch2ms convert --force` or `torch2ms zoo --keep all` after deleting the run folder",
        )
    if missing:
        raise Torch2msError(
            f"{', '.join(missing)}: not found; the {stage} stage has not run for {r.name!r}",
            hint=f"run `torch2ms convert --recipe {recipe}` first",
        )
    setup_cpu(cpu_isa)
    run_dir.lock()
    try:
        samples, _ = split_reference(load_npz(reference))
        report = localize(onnx_path, stage_dir, samples, Tolerance(r.check.rel_error, r.check.cosine), stage)
        paths = write_diff(report, stage_dir)
    finally:
        run_dir.unlock()
    out_console.print(render_text(report), highlight=False, markup=False, soft_wrap=True)  # file:line stays on one line
    console.print(f"diff: {paths[0]}  {paths[1]}", highlight=False)
    if report.first is not None:
        raise typer.Exit(EXIT_CHECK_FAILED)
