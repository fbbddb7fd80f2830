"""``torch2ms check``: can this model be converted? Every node analysed, nothing converted.

The graph is analysed as the rebuild and fold stages will see it (with their passes, so a
fused ``ConvBnAct`` node is checked too) and as exported (so problems are named after the
user's ONNX nodes). All problems are reported at once, grouped by op type.
"""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.ascend.table import PRECISIONS
from torch2ms.cli_app import app, console, out_console
from torch2ms.errors import OnnxError, Torch2msError, UnsupportedOpsError

# chips with a derived op-placement table (torch2ms/ascend/ascend310.json)
ASCEND_TARGETS = ("ascend310",)


def parse_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for v in values:
        name, _, dims = v.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not name or not shape or any(d <= 0 for d in shape):
            raise Torch2msError(
                f"--shape {v!r}: expected NAME=positive integers separated by commas, e.g. input=1,3,224,224"
            )
        shapes[name] = shape
    return shapes


def _export_for(recipe_path: Path, out: Path | None) -> list[tuple]:
    """The recipe's ONNX, made by the stages up to the one that writes model.onnx (skipped when up to
    date), with its shapes and rebuild/fold settings; a text_generation recipe's two, one per graph."""
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner, writer_of

    r = load_recipe(recipe_path)
    if r.task == "text_generation":
        return _export_generation(r, out)
    runner = pipeline_runner(r, out, log=lambda m: console.print(f"[yellow]{m}[/yellow]"))
    result = runner.run(until=writer_of("model.onnx", r))
    _print_stages(result.stages)
    shapes = {i.name: tuple(i.shape) for i in r.inputs}
    return [(runner.ctx.artifact("model.onnx"), shapes, r.rebuild.fuse_conv_bn_act, r.fold)]


def _export_generation(r, out: Path | None) -> list[tuple]:
    """Both graphs of a generation recipe through their export stages (``generation.convert``)."""
    from torch2ms.generation.convert import generation_runners, run_generation

    runners = generation_runners(r, out, lambda m: console.print(f"[yellow]{m}[/yellow]"), own_processes=False)
    results = run_generation(runners, until="export")
    found = []
    for graph, runner in runners.items():
        _print_stages(results[graph].stages, f"{graph} ")
        g = runner.recipe
        shapes = {i.name: tuple(i.shape) for i in g.inputs}
        found.append((runner.ctx.artifact("model.onnx"), shapes, g.rebuild.fuse_conv_bn_act, g.fold))
    return found


def _print_stages(stages, label: str = "") -> None:
    for st in stages:
        if st.status != "not run":
            console.print(f"  {label}{st.stage:<8} {st.status}", highlight=False)
        if st.status == "failed":
            console.print(
                f"[yellow]warning:[/yellow] {st.stage} is out of tolerance against PyTorch ({st.reason});"
                " its ONNX is analysed anyway",
                highlight=False,
            )


def _check_options(model: Path | None, recipe: Path | None, target: str | None, precision: str) -> None:
    """Refuse an unknown --target or --precision, and neither or both of an ONNX file and --recipe."""
    if target is not None and target not in ASCEND_TARGETS:
        raise Torch2msError(
            f"--target {target!r} is not a chip torch2ms can place ops on", hint=", ".join(ASCEND_TARGETS)
        )
    if precision not in PRECISIONS:
        raise Torch2msError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if (model is None) == (recipe is None):
        raise Torch2msError(
            "give an ONNX file or --recipe, not both" if model else "nothing to check",
            hint="torch2ms check model.onnx  or  torch2ms check --recipe recipe.yaml",
        )


@app.command()
def check(
    model: Path | None = typer.Argument(None, help="an ONNX file (or give --recipe)"),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        "-r",
        help="recipe YAML: check its model, exported into its run folder unless that is up to date",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="output root with --recipe (default: the recipe's `output`, runs/)"
    ),
    shape: list[str] = typer.Option(
        [], "--shape", help="static shape of a dynamic input of the ONNX file, e.g. input=1,3,224,224 (repeatable)"
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="also place every op of the deployed (fold-stage) network on this chip and give its tuning advice: "
        + ", ".join(ASCEND_TARGETS),
    ),
    precision: str = typer.Option(
        "fp16", "--precision", help="with --target: the packaged precision, fp16, cube-fp16, fp32 or int8"
    ),
    converters: list[str] = typer.Option(
        [], "--converters", help="a converter plugin module for an ONNX file, as a recipe's converters (repeatable)"
    ),
) -> None:
    """Report every unsupported op and attribute of a model without converting it (exit 2 if any)."""
    _check_options(model, recipe, target, precision)
    if recipe is not None:
        if shape:
            raise Torch2msError("--shape is for an ONNX file; with --recipe the shapes are the recipe's inputs[].shape")
        for path, shapes, fuse, fold_spec in _export_for(recipe, out):  # a generation recipe: each graph
            _analyse(path, shapes, (fuse, fold_spec.enabled, fold_spec.ascend_rewrites), target, precision, True)
        return
    from torch2ms.custom.plugins import load, load_entry_points

    load_entry_points()
    for module in converters:
        load(module, [Path.cwd()])
    _analyse(model, parse_shapes(shape), (True, True, True), target, precision, False)


def _analyse(path: Path, shapes: dict, passes: tuple, target: str | None, precision: str, from_recipe: bool) -> None:
    """Every node of the ONNX ``path`` (``passes``: the rebuild's fuse, fold, the fold's Ascend rewrites):
    ``UnsupportedOpsError`` listing the problems, else the op counts and, with ``target``, the placement."""
    from torch2ms.codegen.convert import find_problems
    from torch2ms.converters.registry import format_problems
    from torch2ms.graph import load_onnx

    fuse, fold, rewrites = passes
    try:
        graph = load_onnx(path, shapes)
    except OnnxError as err:
        if not from_recipe and "dynamic shape" in err.message:
            raise OnnxError(err.message, hint="give its static shape with --shape NAME=1,3,224,224") from None
        raise
    problems = find_problems(graph, fuse, fold)
    from torch2ms.custom.plugins import describe, refusal

    if problems:
        raise UnsupportedOpsError(refusal(format_problems(problems, str(path), graph.opset)), problems)

    for line in describe():
        out_console.print(line, highlight=False, soft_wrap=True)
    counts = graph.op_counts()
    listing = ", ".join(f"{op} x{n}" for op, n in counts.items())
    out_console.print(
        f"OK {path} (opset {graph.opset}): {len(graph.nodes)} nodes of {len(counts)} op types, all convertible: "
        f"{listing}",
        highlight=False,
        soft_wrap=True,
    )
    if target is not None:
        from torch2ms.ascend.report import ascend_report, render

        rep = ascend_report(graph, precision, fuse=fuse, rewrites=rewrites)
        for line in render(rep):
            out_console.print(line, highlight=False, soft_wrap=True, markup=False)
