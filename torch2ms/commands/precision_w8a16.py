"""``torch2ms precision --plan w8a16``: the W8A16 plan of a ``text_generation`` recipe (its Linear
weights int8 in the prefill and decode MindIRs, the layers that break generation kept in float)."""

from __future__ import annotations

from pathlib import Path

from torch2ms.cli_app import console, out_console
from torch2ms.errors import RecipeError


def w8a16_plan(r, runs: Path | None, out: Path | None) -> None:
    """Both graphs converted up to the fold stage (checked as generation), then the plan: MindIRs in
    ``<out>/prefill``, ``<out>/decode``, ``w8a16_plan.json`` and ``precision.md`` (default
    ``<run>/precision/w8a16``)."""
    import json

    from torch2ms.bundle import w8a16, w8a16_report
    from torch2ms.generation.convert import generation_runners, run_generation
    from torch2ms.pipeline.runner import raise_for

    if r.task != "text_generation":
        raise RecipeError(
            f"task: {r.task}: --plan w8a16 plans the prefill and decode graphs of a text_generation recipe",
            hint="for one graph use --plan fp16 or --plan int8",
        )
    runners = generation_runners(r, runs, lambda m: console.print(f"[yellow]{m}[/yellow]"), own_processes=True)
    for graph, runner in runners.items():
        runner.on_stage = lambda stage, state, graph=graph: (
            state not in ("running", "up to date") and console.print(f"  {graph:<8} {stage:<8} {state}")
        )
    for result in run_generation(runners, until="fold").values():
        raise_for(result)
    root = runners["prefill"].run_dir.root.parent
    dest = out or root / "precision" / "w8a16"
    paths = w8a16.w8a16_mindirs(r, root, dest, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    plan = json.loads(paths["plan"].read_text())
    (dest / "precision.md").write_text(w8a16_report.plan_markdown(plan, r.name))
    m, g, t = plan["mindir"], plan["generation"], plan["near_tie"]
    out_console.print(
        f"w8a16 plan for {r.name}: teacher-forced top-1 agreement >= {plan['bound']['w8a16_top1_agreement']}; "
        f"{len(plan['int8'])}/{plan['layers']} layers in int8 (tables: {w8a16_report.embedding_text(plan)}), kept "
        "float: " + (", ".join(plan["keep_float"]) or "none"),
        highlight=False,
    )
    out_console.print(
        f"  MindIRs {sum(m['w8a16_bytes'].values())} bytes, {m['ratio']:.3f}x fp32's {sum(m['fp32_bytes'].values())} "
        f"(Linear weights {m['linear_share']:.1%}, tables {m['tables_share']:.1%} of fp32); reloaded: tokens equal "
        f"{g['tokens_equal']}, teacher-forced {g['teacher_forced_equal']}, near-ties {len(g['near_ties'])} (int8 "
        f"noise floor {t['max_gap_move']:.3g}, {t['steps_within']}/{t['steps']} steps within it), first difference "
        f"{g['first_difference'] or 'none'}",
        highlight=False,
    )
    for v in plan["violations"]:
        out_console.print(f"  {v}", highlight=False)
    out_console.print(f"plan: {dest}  ({plan['emulations']} emulations, {plan['seconds']} s)", highlight=False)
