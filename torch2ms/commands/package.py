"""``torch2ms package`` and ``torch2ms verify``: deployment bundles for Atlas boards."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu


@app.command()
def package(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="recipe YAML"),
    target: str = typer.Option(
        "atlas-200i-dk-a2",
        "--target",
        "-t",
        help="board: atlas-200i-dk-a2, atlas-200i-a2, atlas-300i-pro, atlas-300i-duo, atlas-200-dk",
    ),
    out: Path = typer.Option(Path("dist"), "--out", "-o", help="folder for the archive"),
    runs: Path | None = typer.Option(None, "--runs", help="run folders root (default: the recipe's `output`, runs/)"),
    version: str | None = typer.Option(
        None, "--version", help="bundle version (default: <torch2ms version>-<recipe sha256[:8]>)"
    ),
    precision: str = typer.Option(
        "fp16",
        "--precision",
        help=(
            "conversion precision on the board: fp16 (Ascend default), cube-fp16 (Conv/MatMul in fp16, the rest fp32), "
            "fp32 (float32 kept everywhere: ATC must_keep_origin_dtype; an op without an fp32 AI Core kernel goes "
            "to the AI CPU) or "
            "int8 (the Cube layers quantized from the recipe's quantize.calibration, an INT8 plan keeping sensitive "
            "layers in float; AMCT and converter_lite configs)"
        ),
    ),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Run the stages if needed, then write <out>/<name>-<version>.tar.gz for one board."""
    from torch2ms.bundle.build import build_bundle
    from torch2ms.bundle.targets import get_target
    from torch2ms.pipeline.runner import raise_for
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    r = load_recipe(recipe)
    get_target(target)  # fail on a bad --target before a long run
    setup_cpu(cpu_isa)
    if r.task == "text_generation":  # two graphs: torch2ms.generation.bundle
        return _package_generation(r, target, out, runs, version, precision)
    if precision == "int8":  # bad calibration data: named before any stage runs
        from torch2ms.bundle import int8

        int8.calibration_samples(r, log=lambda m: None)
    runner = pipeline_runner(
        r,
        runs,
        log=lambda m: console.print(f"[yellow]{m}[/yellow]"),
        on_stage=lambda s, st: console.print(f"  {s:<8} {st}") if st != "running" else None,
        own_processes=True,  # as `convert`: the export stage's torch does not stay for the rest
    )
    result = runner.run()
    raise_for(result)
    done = build_bundle(result, out, target, version, precision, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    _print_packaged(done)


def _package_generation(r, target: str, out: Path, runs: Path | None, version: str | None, precision: str) -> None:
    """The prefill and decode graphs through the stages as `convert` runs them, then one bundle of both."""
    from torch2ms.generation.bundle import build_generation_bundle, graph_precisions
    from torch2ms.generation.convert import generation_runners, run_generation
    from torch2ms.pipeline.runner import raise_for

    graph_precisions(r, precision)  # a bad --precision before a long run
    runners = generation_runners(r, runs, lambda m: console.print(f"[yellow]{m}[/yellow]"), own_processes=True)
    for graph, runner in runners.items():
        runner.on_stage = lambda stage, state, graph=graph: (
            state not in ("running", "up to date") and console.print(f"  {graph:<8} {stage:<8} {state}")
        )
    results = run_generation(runners)
    for result in results.values():
        raise_for(result)
    log = lambda m: console.print(f"[dim]{m}[/dim]")  # noqa: E731
    _print_packaged(build_generation_bundle(results, r, out, target, version, precision, log))


def _print_packaged(done) -> None:
    from torch2ms.pipeline.workspace import sha256_file

    for name, size in done.sizes.items():
        out_console.print(f"  {size:>12,}  {name}", highlight=False)
    for w in done.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
    out_console.print(
        f"{done.path}  ({done.path.stat().st_size:,} bytes, sha256 {sha256_file(done.path)})", highlight=False
    )


@app.command()
def verify(
    bundle: Path = typer.Argument(..., help="a .tar.gz written by `torch2ms package`"),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Check a bundle: hashes, safe unpacking, and its MindIR vs PyTorch on the bundled samples."""
    from torch2ms.bundle.verify import verify_bundle

    setup_cpu(cpu_isa)
    res = verify_bundle(bundle, log=lambda m: out_console.print(m, highlight=False))
    if res.generation is not None:
        model, gen = res.manifest["model"], res.generation
        out_console.print(
            f"OK {model['name']} {model['version']}: {res.files} files intact; the bundle's infer.py generates "
            f"transformers' {gen['tokens']} tokens for the {gen['prompts']} recorded prompts (prompt gears "
            f"{', '.join(map(str, gen['gears']))})",
            highlight=False,
        )
        return
    for m in res.metrics:
        agree = f", argmax agreement {m.argmax_agreement:.6f}" if m.argmax_agreement is not None else ""
        out_console.print(
            f"  output {m.name!r}: rel error {m.rel_error:.3g}, cosine {m.cosine:.7f}{agree}", highlight=False
        )
    tol = res.manifest["tolerance"]
    model = res.manifest["model"]
    warnings = res.manifest.get("warnings", [])
    if warnings:
        out_console.print(
            f"  {len(warnings)} target warning(s) for {res.manifest['target']['board']}: see compatibility.md in the "
            "bundle",
            highlight=False,
        )
    sizes = f" and at batch {', '.join(map(str, res.batches))}" if res.batches else ""
    sizes += f" and at sequence length {', '.join(map(str, res.lengths))}" if res.lengths else ""
    out_console.print(
        f"OK {model['name']} {model['version']}: {res.files} files intact; MindIR matches PyTorch on {res.samples} "
        f"samples{sizes} "
        f"(rel error <= {tol['rel_error']:g}, cosine >= {tol['cosine']:.7g}"
        + ("" if tol.get("by", "recipe") == "recipe" else f": {tol['by']}")
        + ")",
        highlight=False,
    )
