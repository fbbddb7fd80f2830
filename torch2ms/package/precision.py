"""The fp16 plan: which layers to keep in fp32 on an Ascend board, and the files that tell its tools.

**Method.** The emulator (``emulate.Fp16Emulator``: the ONNX in onnxruntime, fp16 rounding of a
node's inputs, weights and outputs switchable per node, fp32 accumulation) on the run's reference
samples, against PyTorch's outputs, judged by ``judge``: ``precision.fp16_rel_error`` on every
output's ``max|a - r| / max|r|``, and ``check.task_agreement`` when the recipe sets it. The set
of nodes kept in fp32 is found by ``search.search`` (group-wise bisection ranks the nodes on the
first sample, the shortest ranked prefix kept in fp32 that meets the bound, kept blocks tried in
fp16 again), which takes "emulate this set in fp16 -> verdict" as a function and is not tied to
fp16. Every plan it accepts was emulated as a whole on every sample; those are the figures
shipped. When every node in fp16 already meets the bound nothing else is emulated.

**What it does not model.** Accumulation inside a kernel stays fp32 (true of the cube unit's
conv/matmul; vector kernels such as large reductions or softmax may accumulate in fp16 on the
board), and the board's fusions (Conv+BN+ReLU) round once where the ONNX rounds per node. The
emulation is measured against true fp16 execution where one runs here (``true_fp16``).

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

import numpy as np

from torch2ms.errors import RecipeError
from torch2ms.package import search
from torch2ms.package.emulate import Fp16Emulator, emulation_metrics
from torch2ms.package.emulate import json_error as _json_error
from torch2ms.package.emulate import sig as _sig
from torch2ms.package.search import NEGLIGIBLE, RANK_BUDGET, RELEASE_BUDGET, SCREEN_SAMPLES, Verdict
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
SEARCH = (
    f"group-wise bisection over blocks of consecutive layers (up to {RANK_BUDGET} emulations on the first "
    f"{SCREEN_SAMPLES} sample(s)) ranks the layers; the shortest ranked prefix kept in fp32 that meets the bound "
    f"(doubling, bisection); kept blocks tried in fp16 again, halved when they break it (up to {RELEASE_BUDGET}); "
    "every accepted plan emulated on all samples"
)
TABLE_ROWS = 30  # sensitivity rows in precision.md (precision.json has every node)
METHOD = (
    "onnxruntime; a node in fp16 rounds its inputs, weights and outputs to fp16, a node kept in fp32 does not; "
    "fp32 accumulation"
)


def _error(metrics: dict) -> float:
    """The worst output's relative error; a non-finite output (fp16 overflow) counts as inf."""
    return max((_json_error(m["rel_error"]) for m in metrics.values()), default=0.0)


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
    """The smallest set kept in fp32 that meets the bound, found by ``search.search`` (see the
    module docstring). ``emulator`` may be passed in to plan for several bounds; ``exhaustive``
    measures every layer alone (one emulation per layer, the reference the tests compare with)."""
    t0 = time.perf_counter()
    emu = emulator or Fp16Emulator(onnx_path, inputs, list(reference[0]))
    runs0 = emu.runs
    n = len(emu.names)
    found = _search_fp32_layers(recipe, emu, reference, exhaustive)
    before, after = found.before.detail, found.verdict.detail
    log(f"fp16 plan: {n} layers; all in fp16: rel error {before['error']}")
    log(
        f"fp16 plan: {len(found.keep)} layer(s) kept in fp32; rel error {after['error']} "
        f"({found.evaluated} emulations + {found.screened} on {SCREEN_SAMPLES} sample(s) to rank)"
    )
    sens = _sensitivity(found, emu)
    by_label = {s["label"]: s for s in sens}
    return {
        "method": METHOD,
        "search": {
            "how": "exhaustive: every layer alone" if exhaustive else SEARCH,
            "emulations": found.evaluated,
            "screening_emulations": found.screened,
            "screening_samples": SCREEN_SAMPLES if found.screened else None,
            "steps": found.steps,
            "blocks": len(found.blocks),
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


def _search_fp32_layers(recipe, emu: Fp16Emulator, reference: list[dict], exhaustive: bool):
    """``search.search`` over the emulator's layers: the fewest kept in fp32 that meet the bound
    (screened on ``SCREEN_SAMPLES`` samples first unless ``exhaustive``)."""
    all_layers = range(len(emu.names))

    def emulate(samples: int) -> Callable[[frozenset[int]], Verdict]:
        def evaluate(low: frozenset[int]) -> Verdict:
            got = emu.run(fp32=[i for i in all_layers if i not in low], samples=samples)
            j = judge(recipe, got, reference[:samples])
            return Verdict(j["ok"], _json_error(j["error"]), j)

        return evaluate

    negligible = recipe.precision.fp16_rel_error * NEGLIGIBLE
    try:
        return search.search_samples(len(emu.names), emulate, len(reference), negligible, exhaustive)
    except search.Unreachable as err:
        fp32 = err.verdict.detail
        raise RecipeError(
            f"precision.fp16_rel_error: even with every layer in fp32 the emulated outputs miss the bound "
            f"(rel error {fp32['error']} vs {recipe.precision.fp16_rel_error:g}"
            + (f", {fp32['task']['metric']} {fp32['task']['agreement']}" if fp32["task"] else "")
            + ")",
            hint="raise precision.fp16_rel_error above onnxruntime's float32 distance from PyTorch, or package "
            "with --precision fp32",
        ) from None


def _sensitivity(found, emu: Fp16Emulator) -> list[dict]:
    """Every ranked layer with the error of the block it was measured in."""
    sens = []
    for b in found.blocks:
        measured = "alone" if b.size == 1 else f"{b.size} layers {emu.labels[b.start]} .. {emu.labels[b.stop - 1]}"
        for i in b.members():
            error = b.score
            sens.append(
                {
                    "label": emu.labels[i],
                    "name": emu.names[i],
                    "op": emu.op_types[i],
                    "error": _sig(error) if math.isfinite(error) else "inf",
                    "measured": measured,
                }
            )
    return sens


# --- cache: a plan is reused while the ONNX, the samples and the bound are the same ----------------


def plan_key(recipe, onnx_path: Path, ref_path: Path) -> str:
    return search.plan_key(
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
    return search.cached_plan(run_root / "precision" / "plan.json", key, make, "fp16 plan", log)


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


def _fmt(v) -> str:
    return v if isinstance(v, str) else f"{v:.3g}"


def plan_markdown(plan: dict, model: str, truth: dict | None = None) -> str:
    """precision.md for an fp16 plan: the bound and the two runs, the fp32 layers and how the board
    keeps them, the sensitivity table, and (``truth``) the emulation against true fp16."""
    lines = _md_runs(plan, model) + _md_kept(plan) + _md_sensitivity(plan)
    if truth:
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
        "| | layers kept in fp32 | rel error | task |",
        "|---|---|---|---|",
    ]
    for label, m, k in (("all fp16", b, 0), ("with the plan", a, len(plan["keep_fp32"]))):
        task = f"{m['task']['metric']} {m['task']['agreement']:.4f}" if m["task"] else "-"
        lines.append(f"| {label} | {k} | {_fmt(_json_error(m['error']))} | {task} |")
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
                f"- `{k['label']}` ({k['op']}), alone in fp16: rel error {_fmt(_json_error(k['error']))}"
                if k["measured"] == "alone"
                else f"- `{k['label']}` ({k['op']}), estimated {_fmt(_json_error(k['error']))} from its block of "
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
    """The sensitivity table, its first ``TABLE_ROWS`` layers."""
    lines: list[str] = []
    rows = plan["sensitivity"][:TABLE_ROWS]
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
                    _fmt(_json_error(s["error"])),
                    s["measured"],
                    "fp32" if s["label"] in kept else "",
                ]
                for s in rows
            ],
        )
    if len(plan["sensitivity"]) > TABLE_ROWS:
        lines.append(f"| ... {len(plan['sensitivity']) - TABLE_ROWS} more in precision.json | | | | |")
    return lines


# --- how honest is the emulation: against true fp16 execution available here ---------------------


def true_fp16(recipe, reference_in: list[dict], reference_out: list[dict], emulated: list[dict], fold_dir=None) -> dict:
    """Run the model in real fp16 (PyTorch ``.half()`` on CPU; the generated MindSpore network with
    fp16 parameters and inputs on CPU, from ``fold_dir``) and compare each with PyTorch fp32 and
    with the emulation: per output, the true fp16 error, the emulated error, and
    ``max|emulated - true| / max|PyTorch|``."""
    results = {}
    results["pytorch"] = _guard(lambda: _torch_fp16(recipe, reference_in))
    if fold_dir is not None:
        results["mindspore"] = _guard(lambda: _mindspore_fp16(fold_dir, reference_in, list(reference_out[0])))
    out = {}
    for engine, got in results.items():
        if isinstance(got, str):
            out[engine] = {"error": got}
            continue
        out[engine] = {"outputs": _agreement(got, emulated, reference_out)}
    return out


def _guard(fn):
    try:
        return fn()
    except Exception as err:  # a kernel without fp16 support: say which, measure the others
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"


def _torch_fp16(recipe, samples: list[dict]) -> list[dict]:
    import torch

    from torch2ms.model_loader import build_model, flatten_outputs

    model = build_model(recipe).eval().half()
    with torch.no_grad():
        return [
            {
                k: v.float().numpy()
                for k, v in flatten_outputs(model(*[torch.from_numpy(a).half() for a in s.values()])).items()
            }
            for s in samples
        ]


def _mindspore_fp16(fold_dir: Path, samples: list[dict], names: list[str]) -> list[dict]:
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = msutil.build_network(Path(fold_dir), "fp16check")
    for p in net.get_parameters():
        if p.dtype == ms.float32:
            p.set_dtype(ms.float16)
    got = msutil.run_cell(net, [{k: v.astype(np.float16) for k, v in s.items()} for s in samples], names)
    dtypes = {str(v.dtype) for g in got for v in g.values()}
    if dtypes != {"float16"}:
        raise TypeError(f"the network's outputs are {sorted(dtypes)}, not float16: some kernels ran in float32")
    return [{k: v.astype(np.float32) for k, v in g.items()} for g in got]


def _agreement(true: list[dict], emulated: list[dict], reference: list[dict]) -> dict:
    t, e = emulation_metrics(true, reference), emulation_metrics(emulated, reference)
    out = {}
    for name in reference[0]:
        scale = max(float(np.abs(r[name]).max()) for r in reference) or 1.0
        gap = max(float(np.abs(a[name].astype(np.float64) - b[name]).max()) for a, b in zip(emulated, true)) / scale
        out[name] = {
            "true_rel_error": t[name]["rel_error"],
            "emulated_rel_error": e[name]["rel_error"],
            "emulated_vs_true": _sig(gap) if math.isfinite(gap) else "inf",
            "true_argmax_agreement": t[name]["argmax_agreement"],
            "emulated_argmax_agreement": e[name]["argmax_agreement"],
        }
    return out


def truth_markdown(truth: dict) -> list[str]:
    lines = [
        "## The emulation against true fp16 execution here",
        "",
        "rel error = max |x - PyTorch fp32| / max |PyTorch fp32|;",
        "emulated vs true = max |emulated - true| / max |PyTorch fp32|.",
        "",
        "| engine | output | true fp16 rel error | emulated rel error | emulated vs true |",
        "|---|---|---|---|---|",
    ]
    names = {"pytorch": "PyTorch CPU `.half()`", "mindspore": "MindSpore CPU, fp16 parameters and inputs"}
    for engine, r in truth.items():
        if "error" in r:
            lines.append(f"| {names[engine]} | - | not run: {r['error']} | | |")
            continue
        for out, m in r["outputs"].items():
            figures = (m["true_rel_error"], m["emulated_rel_error"], m["emulated_vs_true"])
            lines.append(f"| {names[engine]} | {out} | " + " | ".join(map(str, figures)) + " |")
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
