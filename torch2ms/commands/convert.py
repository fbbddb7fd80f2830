"""``torch2ms convert``: run the five stages for one recipe."""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu
from torch2ms.errors import EXIT_INTERRUPTED


@app.command()
def convert(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="recipe YAML"),
    out: Path | None = typer.Option(None, "--out", "-o", help="output root (default: the recipe's `output`, runs/)"),
    from_stage: str | None = typer.Option(None, "--from", help="re-run from this stage on (see the list above)"),
    force: bool = typer.Option(False, "--force", help="re-run every stage"),
    one_process: bool = typer.Option(
        False, "--one-process", help="run the export stage in this process too (for a debugger or a profiler)"
    ),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Run every stage of a recipe in order, skipping what is up to date; exit 0 only if all pass.

    The stages:"""
    from torch2ms.pipeline.report import print_table, write_reports
    from torch2ms.pipeline.runner import raise_for
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    r = load_recipe(recipe)
    setup_cpu(cpu_isa)
    if r.task == "text_generation":  # two graphs, each stage checked as generation (torch2ms.generation.convert)
        _convert_generation(r, out, from_stage, force, not one_process)
        return
    # the export stage in a process of its own: torch does not stay resident through the later stages
    runner = pipeline_runner(
        r, out, log=lambda m: console.print(f"[yellow]{m}[/yellow]"), own_processes=not one_process
    )
    status = console.status("starting", spinner="dots")
    current = {}

    def on_stage(stage: str, state: str) -> None:
        current["stage"] = stage
        if state == "running":
            status.update(
                f"[bold]{stage}[/bold]: running (stages done: {', '.join(current.get('done', [])) or 'none'})"
            )
        else:
            current.setdefault("done", []).append(stage)
            console.print(f"  {stage:<8} {state}")

    runner.on_stage = on_stage
    try:
        with status:
            result = runner.run(from_stage=from_stage, force=force)
    except KeyboardInterrupt:
        stage = current.get("stage", "start")
        again = f"torch2ms convert --recipe {recipe}" + (f" --out {out}" if out else "")
        console.print(
            f"[red]interrupted during stage {stage!r}[/red]; completed stages are kept. Resume with: {again}",
            highlight=False,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    write_reports(result)
    print_table(result, out_console)
    console.print(f"report: {result.root / 'report.md'}  ({result.seconds:.1f} s)")
    raise_for(result)


def _convert_generation(r, out: Path | None, from_stage: str | None, force: bool, own_processes: bool) -> None:
    """The prefill and decode graphs of a text_generation recipe through the stages in turn; one report
    and one table per graph, exit 1 when a stage fails (its check, or its generation's)."""
    from torch2ms.generation.convert import generation_runners, run_generation
    from torch2ms.pipeline.report import print_table, write_reports
    from torch2ms.pipeline.runner import raise_for

    runners = generation_runners(r, out, lambda m: console.print(f"[yellow]{m}[/yellow]"), own_processes)
    for graph, runner in runners.items():
        # the stages run in turn, each run skipping the earlier ones: those are not shown again
        runner.on_stage = lambda stage, state, graph=graph: (
            state not in ("running", "up to date") and console.print(f"  {graph:<8} {stage:<8} {state}")
        )
    results = run_generation(runners, from_stage, force)
    for result in results.values():
        write_reports(result)
        print_table(result, out_console)
        console.print(f"report: {result.root / 'report.md'}  ({result.seconds:.1f} s)")
    for result in results.values():
        raise_for(result)


def _stage_help() -> str:
    from torch2ms.stages import PIPELINE

    return "\n\n".join(f"{cls.name}: {cls.summary}" for cls in PIPELINE)


convert.__doc__ += "\n\n" + _stage_help()
