"""The INT8 plan: which Cube layers to keep in float on an Ascend board, and the files for its quantizers.

**Method.** The recipe's ``quantize.calibration`` data (read through its ``preprocess``) calibrates
one per-tensor range for every activation a Cube op (Conv, ConvTranspose, MatMul, Gemm) reads
(``emulate_int8.Calibrator``: min/max, a percentile of |x|, or TensorRT's entropy threshold). The
``emulate_int8.Int8Emulator`` runs the exported ONNX as a QDQ graph, every Cube node switchable between
int8 and float, on the run's reference samples, against PyTorch's outputs. A plan meets the gate
when the task agreement with PyTorch (top-1, pixel, or detection at box IoU >= 0.5) is at least
``precision.int8_task_agreement`` and the worst output's ``max|a - r| / max|r|`` at most
``precision.int8_rel_error``. A strategy of the precision planner (``precision.py``), which finds
the set kept in float (group-wise bisection ranks the layers, the shortest ranked prefix kept in
float that meets the gate, kept blocks tried in int8 again); the accepted plan is emulated as a whole
on every sample, and those are the figures shipped. Every emulation is independent of the CPU
(``emulate_int8``), so the plan is the same on AVX2 and AVX-512 machines.

**The files** (formats from the CANN and MindSpore Lite documentation and sources):

* ``amct_quant.cfg``: AMCT's simplified post-training quantization config (text protobuf of
  ``amct_onnx/proto/calibration_config_onnx.proto``, CANN AMCT docs "Simplified PTQ Configuration
  File", atlasamct_16_0163): ``batch_num``, ``activation_offset: true`` (asymmetric activations, as
  emulated), one ``skip_layers`` per layer kept in float (ONNX node names of the file ``atc.sh``
  compiles, ``board_onnx``),
  ``common_config { arq_quantize { channel_wise } }``. It goes to ``amct_onnx.create_quant_config(...,
  config_defination=...)`` (atlasamct_16_0153), whose fake-quant and deploy ONNX ATC compiles.
* ``converter_lite.cfg`` for MindSpore Lite full quantization: ``[common_quant_param]
  quant_type=FULL_QUANT, bit_num=8``; ``[data_preprocess_param] calibrate_path=<input>:<dir>,
  calibrate_size, input_type=BIN``; ``[full_quant_param] activation_quant_method`` (MAX_MIN, KL,
  REMOVAL_OUTLIER), ``bias_correction``, ``per_channel``, ``target_device=ASCEND`` (MindSpore Lite
  docs, "Quantization", advanced/quantization.html; keys as parsed by converter_lite's
  ``config_file_parser.cc``). Its ``skip_quant_node`` takes MindIR node names, which are not the
  ONNX's, so the plan's float layers are not written there: converter_lite quantizes every layer
  (the "all INT8" row), and ``precision.md`` says so.
* ``calibration/<input>/NNNN.bin``: the calibration samples, preprocessed, float32 NCHW, raw.

**Dynamic batch** (``inputs[].batch``) is not refused: no CANN or AMCT page found limits it for a
quantized model (AMCT's create_quant_config asks an opset-11 ONNX that runs in onnxruntime; ATC's
``--dynamic_batch_size`` names no INT8 exception), so ``atc.sh`` compiles AMCT's deploy ONNX with
the same profiles as a float bundle. The calibration and the plan run at the recipe's batch.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.bundle import precision
from torch2ms.bundle.emulate import emulation_metrics, json_error, sig
from torch2ms.bundle.emulate_int8 import Calibrator, Int8Emulator, calibration_tensors
from torch2ms.bundle.int8_calibration import (  # noqa: F401  (the INT8 plan's names, as before the split)
    CALIBRATION_SUFFIXES,
    FIELD,
    calibration_samples,
    samples_digest,
)
from torch2ms.bundle.precision import SENSITIVITY_ROWS, Strategy, fmt, more_rows, task_text
from torch2ms.bundle.search import NEGLIGIBLE
from torch2ms.errors import RecipeError
from torch2ms.pipeline.markdown import table
from torch2ms.tasks.boxes import box_iou

DETECTION_IOU = 0.5  # an INT8 box "agrees" at the IoU detection benchmarks count a hit at
LITE_HEADER = (
    "# MindSpore Lite full quantization of every Cube layer (converter_lite's skip_quant_node takes MindIR node\n"
    "# names, not the plan's ONNX names): the 'all INT8' row of precision.md. converter_lite.sh uses it with\n"
    "# CONVERTER_CONFIG=converter_lite_int8.cfg; converter_lite.cfg holds it too when all INT8 meets the gate.\n"
)
LITE_METHOD = {"minmax": "MAX_MIN", "entropy": "KL", "percentile": "REMOVAL_OUTLIER"}
METHOD = (
    "onnxruntime, every optimization off, one thread; a Cube node in int8 reads its activations through "
    "QuantizeLinear -> DequantizeLinear (asymmetric, per tensor, calibrated) and its weight fake-quantized "
    "(symmetric, per output channel); float accumulation; every other node in float32"
)


# --- the gate ------------------------------------------------------------------------------------


def _image(outputs: dict, b: int) -> dict:
    return {k: v[b : b + 1] for k, v in outputs.items()}


def detection_agreement(recipe, outputs: list[dict], reference: list[dict]) -> dict:
    """PyTorch's detections found again in the INT8 outputs: same class, box IoU >= 0.5, greedy in
    PyTorch's order, at the confidence threshold the detection task chooses per image
    (``tasks.detection``); extra INT8 boxes count against it."""
    from torch2ms.postprocess import yolo
    from torch2ms.tasks.detection import params_of

    params = params_of(recipe)
    head = params.get("output") or next(iter(reference[0]))
    total = matched = extra = 0
    for got_out, ref_out in zip(outputs, reference):
        for b in range(ref_out[head].shape[0]):
            conf, _, _ = yolo.choose_conf(ref_out[head][b : b + 1], params)
            ref = yolo.detect(_image(ref_out, b), params, conf=conf)[0]
            got = yolo.detect(_image(got_out, b), params, conf=conf)[0]
            ious = box_iou(np.asarray(ref["boxes"]).reshape(-1, 4), np.asarray(got["boxes"]).reshape(-1, 4))
            free = np.ones(len(got["boxes"]), bool)
            for i in range(len(ref["boxes"])):
                cand = np.where((got["classes"] == ref["classes"][i]) & free, ious[i], -1.0)
                j = int(np.argmax(cand)) if len(cand) else -1
                if j >= 0 and cand[j] >= DETECTION_IOU:
                    free[j] = False
                    matched += 1
            total += len(ref["boxes"])
            extra += int(free.sum())
    agreement = matched / (total + extra) if total + extra else 1.0
    return {"metric": f"detection agreement (box IoU >= {DETECTION_IOU})", "agreement": round(agreement, 6)}


def task_figure(recipe, outputs: list[dict], reference: list[dict]) -> dict | None:
    if recipe.task == "detection" and recipe.postprocess.kind != "obb":  # obb: rotated boxes, the task's own IoU
        return detection_agreement(recipe, outputs, reference)
    from torch2ms.tasks import task_for

    t = task_for(recipe)
    r = t.measure(recipe, outputs, reference) if t else None
    return None if r is None else {"metric": r.metric, "agreement": round(r.agreement, 6), "figures": r.figures}


def judge(recipe, outputs: list[dict], reference: list[dict]) -> dict:
    """INT8 outputs against PyTorch's: per output metrics, the worst rel error, the task figure, the
    gate, and ``score``: how far past the gate, as a fraction of it (<= 1 meets it)."""
    metrics = emulation_metrics(outputs, reference)
    error = max((json_error(m["rel_error"]) for m in metrics.values()), default=0.0)
    task = task_figure(recipe, outputs, reference)
    p = recipe.precision
    score = error / p.int8_rel_error if math.isfinite(error) else math.inf
    if task is not None:
        allowed = max(1.0 - p.int8_task_agreement, 1e-6)
        score = max(score, (1.0 - task["agreement"]) / allowed)
    return {
        "error": error if math.isfinite(error) else "inf",
        "metrics": metrics,
        "task": task,
        "score": sig(score) if math.isfinite(score) else "inf",
        "ok": bool(score <= 1.0),
    }


# --- the plan ------------------------------------------------------------------------------------


def calibrate(recipe, onnx_path: Path, calib: list[dict]) -> dict[str, tuple[float, float]]:
    q = recipe.quantize
    cal = Calibrator(onnx_path, calibration_tensors(onnx_path, q.per_channel))
    cal.observe(calib, histograms=q.method != "minmax")
    return cal.ranges(q.method, q.percentile)


def make_plan(
    recipe,
    onnx_path: Path,
    inputs: list[dict],
    reference: list[dict],
    calib: list[dict],
    log: Callable = print,
    exhaustive: bool = False,
    emulator: Int8Emulator | None = None,
) -> dict:
    """The fewest Cube layers kept in float for the INT8 gate (module docstring)."""
    t0 = time.perf_counter()
    q = recipe.quantize
    emu = emulator or Int8Emulator(
        onnx_path, inputs, list(reference[0]), calibrate(recipe, onnx_path, calib), q.per_channel
    )
    runs0 = emu.runs
    n = len(emu.names)
    if n == 0:
        raise RecipeError(
            "precision: the model has no Cube op (Conv, ConvTranspose, MatMul, Gemm) to run in INT8",
            hint="package with --precision fp16",
        )
    floating = judge(recipe, emu.run(int8=[]), reference)
    found = precision.search_layers(INT8, recipe, emu, reference, exhaustive)
    keep = set(found.keep)
    total = sum(emu.macs) or 1
    share = sum(m for i, m in enumerate(emu.macs) if i not in keep) / total
    log(f"int8 plan: {n} Cube layers; all in INT8: {_summary(found.before.detail)}")
    log(
        f"int8 plan: {len(keep)} layer(s) kept in float, {share:.1%} of MACs in INT8: {_summary(found.verdict.detail)} "
        f"({found.evaluated} emulations + {found.screened} to rank)"
    )
    plan = _plan_record(recipe, emu, found, (len(inputs), len(calib)), share, floating, exhaustive)
    plan["emulations"] = emu.runs - runs0
    plan["seconds"] = round(time.perf_counter() - t0, 1)
    return plan


def _unreachable(recipe, d: dict) -> RecipeError:
    return RecipeError(
        f"precision.int8_task_agreement / precision.int8_rel_error: even with every layer in float the emulated "
        f"outputs miss the gate (rel error {d['error']}"
        + (f", {d['task']['metric']} {d['task']['agreement']}" if d["task"] else "")
        + ")",
        hint="loosen precision.int8_rel_error or precision.int8_task_agreement, or package with --precision fp16",
    )


INT8 = Strategy(
    name="int8 plan",
    high="float",
    low="int8",
    figure="score",
    judge=judge,
    run=lambda emu, low, samples: emu.run(int8=low, samples=samples),
    negligible=lambda recipe: NEGLIGIBLE,
    unreachable=_unreachable,
)


def _plan_record(recipe, emu: Int8Emulator, found, counts, share: float, floating: dict, exhaustive: bool) -> dict:
    """precision.json's plan (but its ``emulations`` and ``seconds``). ``counts``: (samples,
    calibration samples)."""
    q = recipe.quantize
    n = len(emu.names)
    keep = set(found.keep)
    sens = precision.sensitivity(INT8, found, emu, lambda i: {"macs": emu.macs[i]})
    by_label = {s["label"]: s for s in sens}
    return {
        "method": METHOD,
        "calibration": {
            "method": q.method,
            "percentile": q.percentile if q.method == "percentile" else None,
            "per_channel": q.per_channel,
            "samples": counts[1],
        },
        "search": precision.search_record(INT8, found, exhaustive),
        "bound": {"task_agreement": recipe.precision.int8_task_agreement, "rel_error": recipe.precision.int8_rel_error},
        "samples": counts[0],
        "layers": n,
        "macs": int(sum(emu.macs)),
        "mac_share_int8": round(share, 4),
        "mac_share_all_int8": 1.0,
        "float": floating,
        "before": found.before.detail,
        "after": found.verdict.detail,
        "keep_float": [by_label[emu.labels[i]] for i in found.keep],  # every kept layer was ranked
        "layers_int8": [emu.labels[i] for i in range(n) if i not in keep],
        "sensitivity": sens,
        "activation_ranges": {t: [sig(s, 6), z] for t, (s, z) in sorted(emu.qparams.items())},
    }


def _summary(j: dict) -> str:
    task = f", {j['task']['metric']} {j['task']['agreement']:.4f}" if j["task"] else ""
    return f"rel error {j['error']}{task}"


def plan_key(recipe, onnx_path: Path, ref_path: Path, calib: list[dict]) -> str:
    return precision.plan_key(
        recipe,
        onnx_path,
        ref_path,
        __file__,
        calibration=samples_digest(calib),
        quantize=recipe.quantize.model_dump(mode="json"),
        bound=[recipe.precision.int8_task_agreement, recipe.precision.int8_rel_error],
    )


def cached_plan(recipe, run_root: Path, onnx_path: Path, ref_path: Path, log: Callable = print) -> tuple[dict, list]:
    """The plan for this run (from ``<run>/precision/int8_plan.json`` when up to date) and the
    calibration samples. Bad calibration data fails here, before anything is written."""
    from torch2ms.pipeline.workspace import load_npz, split_reference

    calib, sources = calibration_samples(recipe, log)

    def make() -> dict:
        inputs, reference = split_reference(load_npz(ref_path))
        plan = make_plan(recipe, onnx_path, inputs, reference, calib, log)
        plan["calibration"]["sources"] = sorted({Path(s).name for s in sources})
        return plan

    key = plan_key(recipe, onnx_path, ref_path, calib)
    return precision.cached_plan(run_root / "precision" / "int8_plan.json", key, make, "int8 plan", log), calib


# --- the files for the board tools --------------------------------------------------


def amct_config(plan: dict, batches: int) -> str:
    """AMCT's simplified PTQ config (calibration_config_onnx.proto, text format)."""
    lines = [
        "# AMCT simplified post-training quantization config, written by torch2ms from the INT8 plan (precision.md).",
        "# amct_onnx.create_quant_config(config_file, model_file, config_defination='amct_quant.cfg')",
        f"batch_num: {batches}",
        "activation_offset: true",
    ]
    lines += [f'skip_layers: "{k["name"]}"' for k in plan["keep_float"] if k["name"]]
    lines += [
        "common_config {",
        "  arq_quantize {",
        f"    channel_wise: {'true' if plan['calibration']['per_channel'] else 'false'}",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def converter_lite_sections(plan: dict, input_name: str, samples: int) -> dict[str, dict[str, str]]:
    return {
        "common_quant_param": {"quant_type": "FULL_QUANT", "bit_num": "8"},
        "data_preprocess_param": {
            "calibrate_path": f"{input_name}:../../calibration/{input_name}",
            "calibrate_size": str(samples),
            "input_type": "BIN",
        },
        "full_quant_param": {
            "activation_quant_method": LITE_METHOD[plan["calibration"]["method"]],
            "bias_correction": "true",
            "per_channel": "true" if plan["calibration"]["per_channel"] else "false",
            "target_device": "ASCEND",
        },
    }


def calibration_files(calib: list[dict]) -> dict[str, bytes]:
    """``calibration/<input>/NNNN.bin``: raw float32 in the input's shape (converter_lite input_type=BIN)."""
    return {
        f"calibration/{name}/{k:04d}.bin": np.ascontiguousarray(a, np.float32).tobytes()
        for k, s in enumerate(calib)
        for name, a in s.items()
    }


def unnamed(plan: dict) -> list[str]:
    return [k["label"] for k in plan["keep_float"] if not k["name"]]


def plan_markdown(plan: dict, model: str) -> str:
    """precision.md for an INT8 plan: the gate and the three runs, the float layers, the board's
    two paths, the sensitivity table."""
    lines = _md_gate_and_runs(plan, model) + _md_kept(plan) + _md_board(plan) + _md_sensitivity(plan)
    lines += [
        "",
        "The emulation rounds activations and weights like the board's int8 Cube unit and accumulates in float; the",
        "board accumulates in int32 (exact) and requantizes, and AMCT's IFMR may choose slightly different ranges.",
        "Check on the board with `infer.py --self-check`.",
        "",
    ]
    return "\n".join(lines)


def _md_gate_and_runs(plan: dict, model: str) -> list[str]:
    """The title, the gate, the calibration, the search, and the float / all-INT8 / planned runs."""
    b, a, f = plan["before"], plan["after"], plan["float"]
    bound = plan["bound"]
    cal = plan["calibration"]
    n, k = plan["layers"], len(plan["keep_float"])

    def row(label: str, m: dict, kept: int, share: float) -> list:
        return [label, f"{n - kept} / {n}", f"{share:.1%}", fmt(json_error(m["error"])), task_text(m)]

    return [
        f"# INT8 plan: {model}",
        "",
        f"Gate: task agreement with PyTorch >= {bound['task_agreement']} (`precision.int8_task_agreement`) and rel "
        f"error <= {bound['rel_error']:g} on every output (`precision.int8_rel_error`). Calibration: {cal['method']}"
        + (f" ({cal['percentile']} percentile of |x|)" if cal.get("percentile") else "")
        + f" on {cal['samples']} sample(s), weights {'per channel' if cal['per_channel'] else 'per tensor'}. "
        f"Emulation: {plan['method']}; {plan['samples']} reference sample(s), {plan['emulations']} emulated runs, "
        f"{plan['seconds']} s.",
        "",
        f"Search: {plan['search']['how']}.",
        "",
        *table(
            ["", "Cube layers in INT8", "MACs in INT8", "rel error", "task"],
            [
                row("fp32 (onnxruntime)", f, n, 0.0),
                row("all INT8", b, 0, 1.0),
                row("INT8 with the plan", a, k, plan["mac_share_int8"]),
            ],
        ),
        "",
    ]


def _md_kept(plan: dict) -> list[str]:
    """The layers the plan keeps in float, or that it keeps none."""
    k = len(plan["keep_float"])
    lines: list[str] = []
    if not k:
        lines += ["Every Cube layer may run in INT8: `amct_quant.cfg` skips none.", ""]
    else:
        lines += ["## Kept in float", ""]
        lines += [
            f"- `{x['label']}` ({x['op']}, {x['macs']:,} MACs), score alone in INT8 {x['score']} ({x['measured']})"
            for x in plan["keep_float"]
        ]
        if unnamed(plan):
            lines += ["", "Unnamed ONNX nodes cannot go in skip_layers: " + ", ".join(unnamed(plan))]
        lines.append("")
    return lines


def _md_board(plan: dict) -> list[str]:
    """The board's two paths (ATC with AMCT, MindSpore Lite) and what each quantizes."""
    b, cal = plan["before"], plan["calibration"]
    return [
        "## For the board",
        "",
        "- ATC path: `targets/<board>/amct_quant.cfg` lists the float layers as AMCT `skip_layers` (ONNX node names "
        "of the ONNX atc.sh compiles, `model/model_opset11.onnx` where the model exports at opset 11); calibrate "
        "with AMCT on `calibration/` and compile its deploy ONNX with `atc.sh`.",
        "- MindSpore Lite path: `converter_lite_int8.cfg` runs full quantization on `calibration/` "
        f"(`activation_quant_method={LITE_METHOD[cal['method']]}`, `target_device=ASCEND`). Its `skip_quant_node` "
        "takes MindIR node names, which are not the plan's ONNX names, so it quantizes every layer: expect the "
        "'all INT8' row. "
        + (
            "All INT8 meets the gate, so `converter_lite.cfg` holds the same settings."
            if b["ok"]
            else "All INT8 misses the gate, so `converter_lite.cfg` stays fp16 "
            "(`CONVERTER_CONFIG=converter_lite_int8.cfg sh converter_lite.sh` to quantize anyway)."
        ),
        "- A dynamic batch (`inputs[].batch`) goes to ATC as for a float bundle; the plan was emulated at the "
        "recipe's batch.",
        "",
    ]


def _md_sensitivity(plan: dict) -> list[str]:
    """The sensitivity table, its first ``SENSITIVITY_ROWS`` layers."""
    rows = plan["sensitivity"][:SENSITIVITY_ROWS]
    lines = ["## Sensitivity: the gate score with one layer (or block) alone in INT8", ""]
    if not rows:
        lines += ["Not measured: with every layer in INT8 the outputs already meet the gate."]
    else:
        lines += [
            "score = max(rel error / bound, (1 - task agreement) / (1 - gate)); a block never split shares its",
            "score divided by the square root of its size.",
            "",
        ]
        kept = {x["label"] for x in plan["keep_float"]}
        lines += table(
            ["layer", "op", "MACs", "score", "measured", "kept"],
            [
                [
                    f"`{s['label']}`",
                    s["op"],
                    f"{s['macs']:,}",
                    s["score"],
                    s["measured"],
                    "float" if s["label"] in kept else "",
                ]
                for s in rows
            ]
            + more_rows(plan, 6),
        )
    return lines


def summary(plan: dict) -> dict:
    """The plan's figures for manifest.json."""
    return {
        "bound": plan["bound"],
        "calibration": {k: v for k, v in plan["calibration"].items() if k != "sources"},
        "layers": plan["layers"],
        "keep_float": [k["label"] for k in plan["keep_float"]],
        "mac_share_int8": plan["mac_share_int8"],
        "task_fp32": plan["float"]["task"],
        "task_all_int8": plan["before"]["task"],
        "task_with_plan": plan["after"]["task"],
        "rel_error_all_int8": plan["before"]["error"],
        "rel_error_with_plan": plan["after"]["error"],
    }


def precision_json(plan: dict) -> str:
    return json.dumps({k: v for k, v in plan.items() if k not in ("key", "seconds")}, indent=2) + "\n"
