"""``torch2ms precision``: the fp16 plan of a recipe (which layers stay fp32 on the board); ``--plan int8``
and ``--plan w8a16`` (``precision_int8``, ``precision_w8a16``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu
from torch2ms.errors import RecipeError

ROWS = 15


@app.command()
def precision(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="recipe YAML"),
    runs: Path | None = typer.Option(None, "--runs", help="run folders root (default: the recipe's `output`, runs/)"),
    out: Path | None = typer.Option(None, "--out", "-o", help="folder for the plan files (default: <run>/precision)"),
    true_fp16: bool = typer.Option(
        False,
        "--true-fp16",
        help="also run the model in real fp16 here (PyTorch CPU .half(), the generated MindSpore network with fp16 "
        "parameters) and state how far the emulation is from it",
    ),
    int8: bool = typer.Option(
        False,
        "--int8",
        help="the INT8 plan instead: calibrate from the recipe's quantize section, emulate the Cube layers in INT8 "
        "(QDQ), keep layers in float until precision.int8_task_agreement and int8_rel_error hold; writes "
        "amct_quant.cfg, converter_lite.cfg, precision.md, int8_plan.json",
    ),
    kind: str = typer.Option(
        "fp16",
        "--plan",
        help="fp16 (default), int8 (as --int8), or w8a16: a text_generation recipe's Linear weights int8 per "
        "output channel in its prefill and decode MindIRs, layers kept float until precision.w8a16_top1_agreement "
        "holds; writes both MindIRs, w8a16_plan.json, precision.md",
    ),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Emulate fp16 per layer, find the fewest layers to keep in fp32 for precision.fp16_rel_error (and
    check.task_agreement), and write keep_dtype.cfg, modify_mixlist.json, converter_lite.cfg, precision.md.
    With --int8, the same for INT8."""
    from torch2ms.bundle import fp16 as plan_mod
    from torch2ms.generation import refuse_unconverted
    from torch2ms.pipeline.runner import raise_for
    from torch2ms.pipeline.workspace import load_npz, split_reference, write_json
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner, writer_of

    r = load_recipe(recipe)
    if kind == "w8a16":
        from torch2ms.commands.precision_w8a16 import w8a16_plan

        setup_cpu(cpu_isa)
        w8a16_plan(r, runs, out)
        return
    if kind not in ("fp16", "int8"):
        raise RecipeError(f"--plan {kind}: not a plan", hint="give fp16, int8 or w8a16")
    refuse_unconverted(r, "precision")
    setup_cpu(cpu_isa)
    if int8 or kind == "int8":
        from torch2ms.commands.precision_int8 import int8_plan

        int8_plan(r, runs, out)
        return
    until = "fold" if true_fp16 else "export"
    runner = pipeline_runner(
        r,
        runs,
        log=lambda m: console.print(f"[yellow]{m}[/yellow]"),
        on_stage=lambda s, st: console.print(f"  {s:<8} {st}") if st != "running" else None,
    )
    result = runner.run(until=until)
    raise_for(result)
    onnx_path, ref_path = (result.root / writer_of(n, r) / n for n in ("model.onnx", "reference.npz"))
    plan = plan_mod.cached_plan(r, result.root, onnx_path, ref_path, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    dest = out or result.root / "precision"
    dest.mkdir(parents=True, exist_ok=True)
    truth = None
    if true_fp16:
        from torch2ms.bundle.emulate import Fp16Emulator
        from torch2ms.bundle.fp16_truth import true_fp16

        ref_in, ref_out = split_reference(load_npz(ref_path))
        emulated = Fp16Emulator(onnx_path, ref_in, list(ref_out[0])).run()
        truth = true_fp16(r, ref_in, ref_out, emulated, result.root / writer_of("network.py", r))
        write_json(dest / "true_fp16.json", truth)
    _write_plan(plan, r.name, dest, truth, with_json=out is not None)
    _print_plan(plan, r.name, truth)
    out_console.print(f"plan: {dest}", highlight=False)


def _write_plan(plan: dict, name: str, dest: Path, truth: dict | None, with_json: bool) -> None:
    """The bundle's fp16 files, converter_lite's settings and precision.md (and plan.json) in ``dest``."""
    from torch2ms.bundle import fp16 as plan_mod
    from torch2ms.bundle.targets import converter_lite_cfg

    for file, text in plan_mod.bundle_files(plan).items():
        (dest / file).write_text(text)
    (dest / "converter_lite.cfg").write_text(converter_lite_cfg("fp16", plan=plan))
    (dest / "precision.md").write_text(plan_mod.plan_markdown(plan, name, truth))
    if with_json:
        (dest / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")


def _print_plan(plan: dict, name: str, truth: dict | None) -> None:
    """The plan against its bound, the layers kept, the most sensitive ones, and true fp16 if run."""

    def row(label: str, m: dict, k: int) -> str:
        task = f", {m['task']['metric']} {m['task']['agreement']:.4f}" if m["task"] else ""
        return f"  {label:<14} {k:>4} layer(s) in fp32: rel error {m['error']}{task}"

    bound = plan["bound"]
    out_console.print(
        f"fp16 plan for {name}: bound rel error <= {bound['fp16_rel_error']:g}"
        + (f", task agreement >= {bound['task_agreement']}" if bound["task_agreement"] is not None else ""),
        highlight=False,
    )
    out_console.print(row("all fp16", plan["before"], 0), highlight=False)
    out_console.print(row("with the plan", plan["after"], len(plan["keep_fp32"])), highlight=False)
    for k in plan["keep_fp32"]:
        out_console.print(f"  keep fp32: {k['label']} ({k['op']}), alone in fp16: {k['error']}", highlight=False)
    out_console.print(f"most sensitive layers (of {plan['layers']}), rel error with that layer alone in fp16:")
    for s in plan["sensitivity"][:ROWS]:
        out_console.print(f"  {s['error']!s:>10}  {s['op']:<20} {s['label']}", highlight=False)
    for engine, res in (truth or {}).items():
        if "error" in res:
            out_console.print(f"true fp16 ({engine}): not run: {res['error']}", highlight=False)
            continue
        for output, m in res["outputs"].items():
            out_console.print(
                f"true fp16 ({engine}) output {output!r}: rel error {m['true_rel_error']}, emulated "
                f"{m['emulated_rel_error']}, emulated vs true {m['emulated_vs_true']}",
                highlight=False,
            )
