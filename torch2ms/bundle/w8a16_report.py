"""The W8A16 plan's record in words: ``precision.md`` (``plan_markdown``) and the one-line texts the
CLI, the bundle's README and manifest use (the plan itself: ``w8a16.make_plan``)."""

from __future__ import annotations

from torch2ms.bundle.precision import SENSITIVITY_ROWS, fmt, more_rows
from torch2ms.pipeline.markdown import table


def _first(judged: dict) -> str:
    return judged.get("first_mismatch") or "none"


def embedding_text(plan: dict) -> str:
    """The plan's gathered tables and their precision, for precision.md, the README and the CLI."""
    return ", ".join(f"{k} {v}" for k, v in plan["embedding"].items()) or "none"


def plan_markdown(plan: dict, name: str) -> str:
    """precision.md of a W8A16 plan: the sizes, the agreement figures, the near-ties, the layers kept in float."""
    m, g, t = plan["mindir"], plan["generation"], plan["near_tie"]
    fp32, w8 = sum(m["fp32_bytes"].values()), sum(m["w8a16_bytes"].values())
    ties = f"within {t['bound']:.3g}" if t["rare"] else "none (not rare)"
    lines = [
        f"# W8A16 plan: {name}",
        "",
        f"Method: {plan['method']}. Gate: teacher-forced top-1 agreement >= {plan['bound']['w8a16_top1_agreement']}"
        ", near-ties counted as agreeing.",
        f"Search: {plan['search']['how']}.",
        "",
        *table(
            ["", "fp32", "W8A16", "ratio"],
            [["MindIRs (prefill + decode), bytes", str(fp32), str(w8), f"{m['ratio']:.3f}"]],
        ),
        "",
        f"Linear weights: {m['linear_share']:.1%} of the fp32 MindIRs, gathered tables {m['tables_share']:.1%}; "
        f"lm_head {plan['lm_head']}; tables: {embedding_text(plan)}.",
        "",
        f"Near-ties: the int8 noise floor (top-2 gap move under int8-step weight noise, {t['draws']} draws) is "
        f"{t['max_gap_move']:.3g}; {t['steps_within']} of the reference's {t['steps']} steps have top-2 gaps within "
        f"it (smallest gap {t['gaps']['min']:.3g}, median {t['gaps']['p50']:.3g}); near-ties: {ties}.",
        "",
        *table(
            ["run", "teacher-forced equal", "near-ties", "tokens equal (free-running)", "first difference"],
            [
                [
                    "every layer in int8 (emulated)",
                    plan["before"]["teacher_forced_equal"],
                    str(len(plan["before"]["near_ties"])),
                    "-",
                    _first(plan["before"]),
                ],
                [
                    "the plan (emulated)",
                    plan["after"]["teacher_forced_equal"],
                    str(len(plan["after"]["near_ties"])),
                    "-",
                    _first(plan["after"]),
                ],
                [
                    "the plan, reloaded MindIRs",
                    g["teacher_forced_equal"],
                    str(len(g["near_ties"])),
                    g["tokens_equal"],
                    g["first_difference"] or "none",
                ],
            ],
        ),
        "",
        *[f"* near-tie: {w}" for w in g["near_ties"]],
        f"Kept in float ({len(plan['keep_float'])} of {plan['layers']}): " + (", ".join(plan["keep_float"]) or "none"),
        "",
    ]
    rows = [[s["label"], fmt(s["error"]), s["measured"]] for s in plan["sensitivity"][:SENSITIVITY_ROWS]]
    if rows:
        lines += [
            "Sensitivity (worst step's logits rel error, the layer's block alone in int8):",
            "",
            *table(["layer", "rel error", "measured"], rows + more_rows(plan, 3)),
            "",
        ]
    return "\n".join(lines)
