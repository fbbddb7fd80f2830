"""``torch2ms precision --int8``: the INT8 plan of a recipe (which Cube layers stay in float)."""

from __future__ import annotations

import json
from pathlib import Path

from torch2ms.cli_app import console, out_console

ROWS = 15


def int8_plan(r, runs: Path | None, out: Path | None) -> None:
    from torch2ms.bundle import int8
    from torch2ms.bundle.targets import converter_lite_cfg
    from torch2ms.pipeline.runner import raise_for
    from torch2ms.stages import pipeline_runner, writer_of

    int8.calibration_samples(r, log=lambda m: None)  # bad calibration data: named, before any stage runs
    runner = pipeline_runner(
        r,
        runs,
        log=lambda m: console.print(f"[yellow]{m}[/yellow]"),
        on_stage=lambda s, st: console.print(f"  {s:<8} {st}") if st != "running" else None,
    )
    result = runner.run(until="export")
    raise_for(result)
    onnx_path, ref_path = (result.root / writer_of(n, r) / n for n in ("model.onnx", "reference.npz"))
    plan, calib = int8.cached_plan(r, result.root, onnx_path, ref_path, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    dest = out or result.root / "precision"
    dest.mkdir(parents=True, exist_ok=True)
    name = r.inputs[0].name
    (dest / "amct_quant.cfg").write_text(int8.amct_config(plan, len(calib)))
    cfg = converter_lite_cfg("int8", quant=int8.converter_lite_sections(plan, name, len(calib)))
    (dest / "converter_lite_int8.cfg").write_text(int8.LITE_HEADER + cfg)
    (dest / "precision.md").write_text(int8.plan_markdown(plan, r.name))
    if out is not None:
        (dest / "int8_plan.json").write_text(json.dumps(plan, indent=2) + "\n")

    def row(label: str, m: dict, layers: str) -> str:
        task = f", {m['task']['metric']} {m['task']['agreement']:.4f}" if m["task"] else ""
        return f"  {label:<18} {layers:>14}: rel error {m['error']}{task}"

    n, k = plan["layers"], len(plan["keep_float"])
    b = plan["bound"]
    out_console.print(
        f"int8 plan for {r.name}: task agreement >= {b['task_agreement']}, rel error <= {b['rel_error']:g}; "
        f"calibration {plan['calibration']['method']} on {plan['calibration']['samples']} sample(s)",
        highlight=False,
    )
    out_console.print(row("fp32", plan["float"], "0 in INT8"), highlight=False)
    out_console.print(row("all INT8", plan["before"], f"{n}/{n} in INT8"), highlight=False)
    out_console.print(
        row("INT8 with the plan", plan["after"], f"{n - k}/{n} in INT8") + f", {plan['mac_share_int8']:.1%} of MACs",
        highlight=False,
    )
    for x in plan["keep_float"]:
        out_console.print(f"  keep float: {x['label']} ({x['op']}), score alone in INT8 {x['score']}", highlight=False)
    out_console.print(f"plan: {dest}  ({plan['emulations']} emulations, {plan['seconds']} s)", highlight=False)
