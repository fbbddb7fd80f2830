"""The fp16 plan: which layers to keep in fp32 on an Ascend board, and the files that tell its tools.

**Method.** A strategy of the precision planner (``precision.py``): the emulator
(``emulate.Fp16Emulator``: the ONNX in onnxruntime, fp16 rounding of a node's inputs, weights and
outputs switchable per node, fp32 accumulation) on the run's reference samples, against PyTorch's
outputs, judged by ``judge``: ``precision.fp16_rel_error`` on every output's
``max|a - r| / max|r|``, and ``check.task_agreement`` when the recipe sets it. When every node in
fp16 already meets the bound nothing else is emulated.

**What it does not model.** Accumulation inside a kernel stays fp32 (true of the cube unit's
conv/matmul; vector kernels such as large reductions or softmax may accumulate in fp16 on the
board), and the board's fusions (Conv+BN+ReLU) round once where the ONNX rounds per node. The
emulation is measured against true fp16 execution where one runs here (``fp16_truth``).

**The files** (formats from the CANN and MindSpore Lite documentation and sources):

* ``keep_dtype.cfg`` for ATC ``--keep_dtype`` with ``--precision_mode=force_fp16``: one operator
  name of the original model per line (or ``OpType::<Ascend IR type>``). CANN ATC docs,
  "--keep_dtype" (atlasatcparam_16_0074 / atctool_0095). The names are the ONNX node names of
  ONNX ``atc.sh`` compiles (``model/model_opset11.onnx``, ``board_onnx``), the one emulated here.
* ``modify_mixlist.json`` for ATC ``--modify_mixlist`` (needs ``--precision_mode=allow_mix_precision``)
  and converter_lite: ``{"black-list": {"to-add": [...]}}``, Ascend IR op types that must not be
  lowered to fp16; CANN docs "--modify_mixlist" (atlasatcparam_16_0071, aoerc_16_0063). It works by
  op *type*: every op of a listed type stays fp32, so it is coarser (and slower) than the plan.
* converter_lite takes no per-node list: its ``[ascend_context]`` keys are input_format,
  input_shape, dynamic_dims, precision_mode (enforce_fp32 / preferred_fp32 / enforce_fp16 /
  enforce_origin / preferred_optimal), op_select_impl_mode, output_type, ... (MindSpore Lite docs,
  "Ascend Conversion Tool Description", converter_tool_ascend.md). ``preferred_optimal`` is ACL's
  ``allow_mix_precision`` (mindspore_lite ``Context.ascend.precision_mode`` docstring), and
  ``[acl_build_options] ge.exec.modify_mixlist`` passes the mixlist (same page, Table 3).

ONNX -> Ascend IR op types for the mixlist, from CANN's ONNX parser plugins
(``REGISTER_CUSTOM_OP(<IR type>).FrameworkType(ONNX).OriginOpType("ai.onnx::<v>::<ONNX type>")``)
and the ATC docs' table of quantizable layers: only these are mapped; a kept node of another type
is named in ``keep_dtype.cfg`` only, and ``precision.md`` says so.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from torch2ms.bundle import precision
from torch2ms.bundle.emulate import Fp16Emulator, emulation_metrics, json_error
from torch2ms.bundle.precision import SENSITIVITY_ROWS, Strategy, fmt, more_rows, task_text
from torch2ms.bundle.search import NEGLIGIBLE, SCREEN_SAMPLES
from torch2ms.errors import RecipeError
from torch2ms.pipeline.markdown import table

ASCEND_IR_TYPES = {
    "Conv": "Conv2D",  # 4-D weights; Conv3D for 5-D (ATC docs, quantizable layers)
    "Gemm": "MatMulV2",
    "MatMul": "BatchMatMulV2",
    "ConvTranspose": "Conv2DTranspose",
    "AveragePool": "AvgPoolV2",
    "GlobalAveragePool": "AvgPool",
    "Softmax": "SoftmaxV2",
    "BatchNormalization": "BatchNorm",
    "Relu": "Relu",
}
METHOD = (
    "onnxruntime; a node in fp16 rounds its inputs, weights and outputs to fp16, a node kept in fp32 does not; "
    "fp32 accumulation"
)


def _error(metrics: dict) -> float:
    """The worst output's relative error; a non-finite output (fp16 overflow) counts as inf."""
    return max((json_error(m["rel_error"]) for m in metrics.values()), default=0.0)


def judge(recipe, outputs: list[dict], reference: list[dict]) -> dict:
    """Emulated outputs against PyTorch's: per output metrics, the worst error, the task figure,
    and whether they meet the recipe's fp16 bound."""
    from torch2ms.tasks import task_for

    metrics = emulation_metrics(outputs, reference)
    error = _error(metrics)
    t = task_for(recipe)
    task = t.measure(recipe, outputs, reference) if t else None
    gate = recipe.check.task_agreement
    ok = error <= recipe.precision.fp16_rel_error and (gate is None or task is None or task.agreement >= gate)
    return {
        "error": error if math.isfinite(error) else "inf",
        "metrics": metrics,
        "task": None if task is None else {"metric": task.metric, "agreement": round(task.agreement, 6)},
        "ok": bool(ok),
    }


def make_plan(
    recipe,
    onnx_path: Path,
    inputs: list[dict],
    reference: list[dict],
    log: Callable = print,
    emulator=None,
    exhaustive: bool = False,
) -> dict:
    """The smallest set kept in fp32 that meets the bound, found by the planner's search
    (``precision.search_layers``). ``emulator`` may be passed in to plan for several bounds; ``exhaustive``
    measures every layer alone (one emulation per layer, the reference the tests compare with)."""
    t0 = time.perf_counter()
    emu = emulator or Fp16Emulator(onnx_path, inputs, list(reference[0]))
    runs0 = emu.runs
    n = len(emu.names)
    found = precision.search_layers(FP16, recipe, emu, reference, exhaustive)
    before, after = found.before.detail, found.verdict.detail
    log(f"fp16 plan: {n} layers; all in fp16: rel error {before['error']}")
    log(
        f"fp16 plan: {len(found.keep)} layer(s) kept in fp32; rel error {after['error']} "
        f"({found.evaluated} emulations + {found.screened} on {SCREEN_SAMPLES} sample(s) to rank)"
    )
    sens = precision.sensitivity(FP16, found, emu)
    by_label = {s["label"]: s for s in sens}
    return {
        "method": METHOD,
        "search": {
            **precision.search_record(FP16, found, exhaustive),
            "screening_samples": SCREEN_SAMPLES if found.screened else None,
        },
        "bound": {"fp16_rel_error": recipe.precision.fp16_rel_error, "task_agreement": recipe.check.task_agreement},
        "samples": len(inputs),
        "layers": n,
        "before": before,
        "after": after,
        "keep_fp32": [
            {k: by_label[emu.labels[i]][k] for k in ("label", "name", "op", "error", "measured")} for i in found.keep
        ],
        "sensitivity": sens,
        "emulations": emu.runs - runs0,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _unreachable(recipe, fp32: dict) -> RecipeError:
    return RecipeError(
        f"precision.fp16_rel_error: even with every layer in fp32 the emulated outputs miss the bound "
        f"(rel error {fp32['error']} vs {recipe.precision.fp16_rel_error:g}"
        + (f", {fp32['task']['metric']} {fp32['task']['agreement']}" if fp32["task"] else "")
        + ")",
        hint="raise precision.fp16_rel_error above onnxruntime's float32 distance from PyTorch, or package "
        "with --precision fp32",
    )


FP16 = Strategy(
    name="fp16 plan",
    high="fp32",
    low="fp16",
    figure="error",
    judge=judge,
    run=lambda emu, low, samples: emu.run(fp32=sorted(set(range(len(emu.names))) - set(low)), samples=samples),
    negligible=lambda recipe: recipe.precision.fp16_rel_error * NEGLIGIBLE,
    unreachable=_unreachable,
)


def plan_key(recipe, onnx_path: Path, ref_path: Path) -> str:
    return precision.plan_key(
        recipe,
        onnx_path,
        ref_path,
        __file__,
        precision=recipe.precision.model_dump(mode="json"),
        task_agreement=recipe.check.task_agreement,
    )


def cached_plan(recipe, run_root: Path, onnx_path: Path, ref_path: Path, log: Callable = print) -> dict:
    """The plan for this run, from ``<run>/precision/plan.json`` when it is up to date."""
    from torch2ms.pipeline.workspace import load_npz, split_reference

    def make() -> dict:
        inputs, reference = split_reference(load_npz(ref_path))
        return make_plan(recipe, onnx_path, inputs, reference, log)

    key = plan_key(recipe, onnx_path, ref_path)
    return precision.cached_plan(run_root / "precision" / "plan.json", key, make, "fp16 plan", log)


# --- the files for the board tools -------------------------------------------------------------


def keep_dtype_text(plan: dict) -> str:
    """ATC --keep_dtype: one operator name of the original model per line."""
    names = [k["name"] for k in plan["keep_fp32"] if k["name"]]
    return "".join(f"{n}\n" for n in names)


def mixlist(plan: dict) -> dict:
    """ATC --modify_mixlist / converter_lite ge.exec.modify_mixlist: the kept nodes' Ascend IR types."""
    types = sorted({ASCEND_IR_TYPES[k["op"]] for k in plan["keep_fp32"] if k["op"] in ASCEND_IR_TYPES})
    return {"black-list": {"to-add": types}} if types else {}


def unmapped(plan: dict) -> list[dict]:
    return [k for k in plan["keep_fp32"] if k["op"] not in ASCEND_IR_TYPES]


def converter_lite_settings(plan: dict) -> dict[str, dict[str, str]]:
    """Config sections for converter_lite: enforce_fp16 without a plan; with one, mixed precision
    with the mixlist black-listing the kept nodes' types (converter_lite has no per-node list)."""
    if not plan["keep_fp32"] or not mixlist(plan):
        return {"ascend_context": {"precision_mode": "enforce_fp16"}}
    return {
        "ascend_context": {"precision_mode": "preferred_optimal"},
        "acl_build_options": {"ge.exec.modify_mixlist": "modify_mixlist.json"},
    }


def bundle_files(plan: dict) -> dict[str, str]:
    """Files for ``targets/<board>/`` (empty without a plan: ATC and converter_lite run as before)."""
    files = {"keep_dtype.cfg": keep_dtype_text(plan)} if keep_dtype_text(plan) else {}
    if mixlist(plan):
        files["modify_mixlist.json"] = json.dumps(mixlist(plan), indent=2) + "\n"
    return files


def search_markdown(record: dict) -> list[str]:
    """How the plan was found and what it cost."""
    screened = (
        f" and {record['screening_emulations']} on the first {record['screening_samples']} sample(s) to rank the layers"
        if record["screening_emulations"]
        else ""
    )
    steps = ", ".join(f"{k} {v}" for k, v in record["steps"].items())
    return [
        f"Search: {record['how']}. It took {record['emulations']} emulations on every sample ({steps}){screened}.",
        "",
    ]


def plan_markdown(plan: dict, model: str, truth: dict | None = None) -> str:
    """precision.md for an fp16 plan: the bound and the two runs, the fp32 layers and how the board
    keeps them, the sensitivity table, and (``truth``) the emulation against true fp16."""
    lines = _md_runs(plan, model) + _md_kept(plan) + _md_sensitivity(plan)
    if truth:
        from torch2ms.bundle.fp16_truth import truth_markdown

        lines += ["", *truth_markdown(truth)]
    lines += [
        "",
        "The emulation keeps accumulation in fp32 and rounds per ONNX node; the board may accumulate vector",
        "kernels (reductions, softmax) in fp16 and rounds once per fused kernel. Check on the board with",
        "`infer.py --self-check`.",
        "",
    ]
    return "\n".join(lines)


def _md_runs(plan: dict, model: str) -> list[str]:
    """The title, the bound, the search, and the all-fp16 / planned runs."""
    b, a = plan["before"], plan["after"]
    bound = plan["bound"]
    gate = f" and task agreement >= {bound['task_agreement']}" if bound["task_agreement"] is not None else ""
    lines = [
        f"# fp16 plan: {model}",
        "",
        f"Bound: rel error <= {bound['fp16_rel_error']:g} on every output (`precision.fp16_rel_error`){gate}. "
        f"Emulation: {plan['method']}; {plan['samples']} reference sample(s), {plan['layers']} layers, "
        f"{plan['emulations']} emulated runs.",
        "",
        *search_markdown(plan["search"]),
    ]
    runs = (("all fp16", b, 0), ("with the plan", a, len(plan["keep_fp32"])))
    lines += table(
        ["", "layers kept in fp32", "rel error", "task"],
        [[label, k, fmt(json_error(m["error"])), task_text(m)] for label, m, k in runs],
    )
    lines.append("")
    return lines


def _md_kept(plan: dict) -> list[str]:
    """The layers kept in fp32 and how the board's files keep them, or that none is."""
    lines: list[str] = []
    if not plan["keep_fp32"]:
        lines += ["Every layer may run in fp16: no keep_dtype.cfg or modify_mixlist.json is needed.", ""]
    else:
        lines += ["## Kept in fp32", ""]
        lines += [
            (
                f"- `{k['label']}` ({k['op']}), alone in fp16: rel error {fmt(json_error(k['error']))}"
                if k["measured"] == "alone"
                else f"- `{k['label']}` ({k['op']}), estimated {fmt(json_error(k['error']))} from its block of "
                f"{k['measured']}"
            )
            for k in plan["keep_fp32"]
        ]
        lines += [
            "",
            "On the board: `atc.sh` passes `--keep_dtype=keep_dtype.cfg` (ONNX node names of the file it compiles;",
            "ATC may rename nodes it fuses, so check its log for names it did not find). `modify_mixlist.json`",
            "black-lists the kept nodes' Ascend IR types for `--precision_mode=allow_mix_precision` and for",
            "converter_lite",
            "(`converter_lite.cfg`: precision_mode=preferred_optimal + ge.exec.modify_mixlist); it keeps *every* op",
            "of those types in fp32, which is more than the plan and slower. converter_lite reads the MindIR, whose",
            "node names differ from the ONNX's, and has no per-node list.",
        ]
        missing = unmapped(plan)
        if missing:
            lines += [
                "",
                "Not in modify_mixlist.json (no verified Ascend IR type): "
                + ", ".join(f"`{k['label']}` ({k['op']})" for k in missing)
                + "; only `keep_dtype.cfg` (ATC) keeps them.",
            ]
        unnamed = [k for k in plan["keep_fp32"] if not k["name"]]
        if unnamed:
            lines += ["", "Unnamed ONNX nodes cannot go in keep_dtype.cfg: " + ", ".join(k["label"] for k in unnamed)]
        lines.append("")
    return lines


def _md_sensitivity(plan: dict) -> list[str]:
    """The sensitivity table, its first ``SENSITIVITY_ROWS`` layers."""
    lines: list[str] = []
    rows = plan["sensitivity"][:SENSITIVITY_ROWS]
    lines += ["## Sensitivity: rel error at the outputs with one layer alone in fp16", ""]
    if not rows:
        lines += ["Not measured: with every layer in fp16 the outputs already meet the bound."]
    else:
        lines += [
            "A layer measured alone has its own figure; the layers of a block that was not split share the block's",
            "error alone in fp16 divided by the square root of its size (separate roundings add in quadrature).",
            "",
        ]
        kept = {k["label"] for k in plan["keep_fp32"]}
        lines += table(
            ["layer", "op", "rel error", "measured", "kept"],
            [
                [
                    f"`{s['label']}`",
                    s["op"],
                    fmt(json_error(s["error"])),
                    s["measured"],
                    "fp32" if s["label"] in kept else "",
                ]
                for s in rows
            ]
            + more_rows(plan, 5),
        )
    return lines


def summary(plan: dict) -> dict:
    """The plan's figures for manifest.json."""
    return {
        "bound": plan["bound"],
        "rel_error_all_fp16": plan["before"]["error"],
        "rel_error_with_plan": plan["after"]["error"],
        "task_all_fp16": plan["before"]["task"],
        "task_with_plan": plan["after"]["task"],
        "keep_fp32": [k["label"] for k in plan["keep_fp32"]],
        "layers": plan["layers"],
    }
