"""Target-compatibility report: what would bite on an Ascend board, found before flashing it.

* **Operators.** A small table of ONNX and MindSpore operators that are known to have no Ascend
  AI Core kernel, to fall back to the slow AI CPU, or to need a check on the board (from the CANN
  operator lists and ATC restrictions). It is a heuristic: the ATC / converter_lite log on the
  board is authoritative. Every hit is listed with its count and the first node.
* **Dynamic shapes.** Static OM compilation needs fixed dimensions; any symbolic dimension on a
  graph input or output is reported, except dimension 0 when an input's is named ``batch``: the
  export's for ``inputs[].batch``, compiled as batch profiles (ATC ``--dynamic_batch_size``).
* **Host-only fused kernels.** Graph-kernel fusion (AKG) builds kernels for the exporting host's
  CPU; they must not be in the MindIR. The mindir stage exports without graph-kernel fusion;
  this checks it by scanning the MindIR's operator and function names for fusion markers.
* **fp16 budget.** Ascend's converters default to fp16 (converter_lite ``enforce_fp16``, ATC
  ``force_fp16``) and the 310-series cube units compute convolutions/matmuls from fp16 inputs
  even in the fp32-preferring modes. Measured here, on the reference samples, by running the
  ONNX in onnxruntime with weights, inputs and every intermediate float tensor rounded to fp16
  (accumulation stays fp32, as in the cube unit). This approximates the board's numbers; it
  does not model fp16 accumulation inside vector kernels (large reductions, softmax). The same
  emulation, switchable per node (``emulate.Fp16Emulator``), makes the fp16 plan (``precision.py``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from torch2ms.bundle.emulate import Fp16Emulator, fp16_emulation, json_error
from torch2ms.pipeline.markdown import table

__all__ = ["Fp16Emulator"]  # its old home: the emulators live in emulate.py

# op -> (level, why). level: "error" will not compile; "slow" runs on AI CPU; "check" verify on board.
ONNX_OPS = {
    "NonZero": ("error", "data-dependent output shape; static OM compilation needs fixed shapes"),
    "Unique": ("error", "data-dependent output shape; static OM compilation needs fixed shapes"),
    "Loop": ("error", "control flow is not supported by ATC for ONNX models"),
    "If": ("error", "control flow is not supported by ATC for ONNX models"),
    "Scan": ("error", "control flow is not supported by ATC for ONNX models"),
    "NonMaxSuppression": ("slow", "AI CPU kernel; consider NMS on the host"),
    "ScatterND": ("slow", "usually an AI CPU kernel"),
    "GatherND": ("slow", "usually an AI CPU kernel"),
    "ScatterElements": ("slow", "usually an AI CPU kernel"),
    "GridSample": ("check", "support depends on the CANN version and the mode/padding attributes"),
    "Einsum": ("check", "limited ATC support; rewrite as MatMul/Transpose if ATC rejects it"),
}
MINDIR_OPS = {
    "MaxPool3DWithArgmax": (
        "check",
        "MindSpore lowers this MaxPool2d (padding/ceil_mode) to a 3-D pooling that also computes argmax "
        "indices; check that converter_lite maps it to an Ascend kernel for your CANN version",
    ),
    "Custom": ("error", "custom kernels built on the host do not run on the board"),
}
FUSION_MARKERS = ("GraphKernel", "graph_kernel", "Fused_", "akg")
RESIZE_MODES_OK = {"nearest", "linear"}


def scan_onnx(path: Path) -> dict:
    import onnx

    m = onnx.load(str(path))
    ops: Counter = Counter()
    first: dict[str, str] = {}
    findings = []
    for n in m.graph.node:
        ops[n.op_type] += 1
        first.setdefault(n.op_type, n.name)
        if n.op_type == "Resize":
            mode = next((a.s.decode() for a in n.attribute if a.name == "mode"), "nearest")
            if mode not in RESIZE_MODES_OK:
                findings.append(
                    {
                        "where": "onnx",
                        "op": "Resize",
                        "level": "check",
                        "count": 1,
                        "first": n.name,
                        "why": f"mode={mode!r}: only nearest/linear resizes are on every Ascend target",
                    }
                )
    for op, (level, why) in ONNX_OPS.items():
        if ops[op]:
            findings.append(
                {"where": "onnx", "op": op, "level": level, "count": ops[op], "first": first[op], "why": why}
            )
    dynamic = []
    # dimension 0 named "batch" on an input is inputs[].batch's, served by batch profiles (atc.sh,
    # converter_lite.cfg); the outputs' dimension 0 follows it, whatever the exporter named it
    batched = any(
        v.type.tensor_type.shape.dim and v.type.tensor_type.shape.dim[0].dim_param == "batch" for v in m.graph.input
    )
    for kind, vals in (("input", m.graph.input), ("output", m.graph.output)):
        for v in vals:
            dims = v.type.tensor_type.shape.dim
            if any(
                (d.dim_param or d.dim_value <= 0) and not (k == 0 and batched and d.dim_param)
                for k, d in enumerate(dims)
            ):
                dynamic.append(f"{kind} {v.name!r}: {[d.dim_param or d.dim_value for d in dims]}")
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"opset": opset, "ops": dict(sorted(ops.items())), "findings": findings, "dynamic": dynamic}


def _mindir_op(op_type: str) -> str:
    # MindIR names primitives 'REF::Conv2D:32' (namespace::name:id)
    name = op_type.split("::", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in name else name


def scan_mindir(path: Path) -> dict:
    from mindspore.train import mind_ir_pb2

    m = mind_ir_pb2.ModelProto()
    m.ParseFromString(Path(path).read_bytes())
    ops: Counter = Counter()
    first: dict[str, str] = {}
    graphs = [m.graph, *m.functions]
    for g in graphs:
        for n in g.node:
            op = _mindir_op(n.op_type)
            ops[op] += 1
            first.setdefault(op, n.name)
    skip = {"Load", "MakeTuple", "TupleGetItem", "UpdateState", "Depend", "Constant", "Return"}
    compute = {k: v for k, v in sorted(ops.items()) if k not in skip}
    findings = [
        {"where": "mindir", "op": op, "level": level, "count": ops[op], "first": first[op], "why": why}
        for op, (level, why) in MINDIR_OPS.items()
        if ops[op] and op != "Custom"
    ]
    from torch2ms.custom.aot import board_finding, mindir_kernels

    kernels = mindir_kernels(m)  # a user's AOT kernel: AI Core when the plugin gave its Ascend kernel
    for function in sorted(kernels):
        level, why = board_finding(function, Path(path).parent)
        findings.append({"where": "mindir", "op": "Custom", "level": level, "count": 1, "first": function, "why": why})
    if ops["Custom"] and not kernels:
        level, why = MINDIR_OPS["Custom"]
        findings.append(
            {
                "where": "mindir",
                "op": "Custom",
                "level": level,
                "count": ops["Custom"],
                "first": first["Custom"],
                "why": why,
            }
        )
    names = [g.name for g in m.functions] + list(ops)
    fused = sorted({n for n in names if any(mark in n for mark in FUSION_MARKERS)})
    return {"ops": compute, "findings": findings, "fused_kernels": fused}


def build_report(
    onnx_path: Path, mindir_path: Path, inputs, reference, precision: str, tolerance: dict, plan: dict | None = None
) -> dict:
    """``plan``: the fp16 plan (``precision.py``), whose all-fp16 emulation is reused here."""
    onnx_scan = scan_onnx(onnx_path)
    mindir_scan = scan_mindir(mindir_path)
    fp16 = plan["before"]["metrics"] if plan else fp16_emulation(onnx_path, inputs, reference)
    warnings = []
    for f in onnx_scan["findings"] + mindir_scan["findings"]:
        warnings.append(f"[{f['level']}] {f['where']} op {f['op']} x{f['count']} (first: {f['first']}): {f['why']}")
    for d in onnx_scan["dynamic"]:
        warnings.append(f"[error] dynamic shape on {d}: fix it at export time")
    if mindir_scan["fused_kernels"]:
        warnings.append(
            f"[error] host-only fused kernels in the MindIR: {', '.join(mindir_scan['fused_kernels'][:5])}; re-export "
            "without graph-kernel fusion"
        )
    worst = max((json_error(v["rel_error"]) for v in fp16.values()), default=0.0)  # 'nan': fp16 overflow
    kept = len(plan["keep_fp32"]) if plan else 0
    if kept:
        worst = json_error(plan["after"]["error"])
    if worst > tolerance["rel_error"]:
        where = (
            f" with the fp16 plan's {kept} layer(s) in fp32 (precision.md; ~{json_error(plan['before']['error']):.3g}"
            " with every layer in fp16)"
            if kept
            else ""
        )
        warnings.append(
            f"[precision] fp16 execution is expected to move outputs by a relative error of ~{worst:.3g}{where} "
            f"(recipe tolerance {tolerance['rel_error']:g}): compare on the board with `infer.py --self-check --rtol "
            f"{max(worst * 3, tolerance['rel_error']):.2g}`"
        )
    return {
        "precision": precision,
        "onnx": onnx_scan,
        "mindir": mindir_scan,
        "fp16_emulation": {
            "method": "onnxruntime; weights, inputs and every float intermediate rounded to fp16, fp32 accumulation",
            "metrics": fp16,
        },
        "fp16_plan": None if plan is None else {"keep_fp32": kept, "rel_error_with_plan": plan["after"]["error"]},
        "warnings": warnings,
    }


def ascend_placement(onnx_path: Path, shapes: dict, precision: str, fuse: bool, rewrites: bool, soc: str) -> dict:
    """Every op of the deployed (fold-stage) network placed on AI Core / AI CPU, with the tuning
    advice (``torch2ms.ascend``). The placement table is the Ascend 310's; for another chip it is
    the nearest public list, and the report says so."""
    from torch2ms.ascend.report import ascend_report
    from torch2ms.graph import load_onnx

    rep = ascend_report(load_onnx(onnx_path, shapes), precision, fuse=fuse, rewrites=rewrites)
    rep["target_soc"] = soc
    return rep


def placement_warnings(rep: dict) -> list[str]:
    """One warning per op type the placement puts off AI Core."""
    return [
        f"[{'slow' if g['placement'] == 'AI CPU' else 'error'}] {g['op']} x{g['count']} runs on {g['placement']} "
        f"({', '.join(g['calls'])}; first at {g['where'][0]}): {g['reason']}"
        for g in rep["placement"]["off_ai_core"]
    ]


def report_markdown(rep: dict, target, model: str) -> str:
    lines = [f"# Target compatibility: {model} on {target.board} ({target.soc_version})", ""]
    if rep["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in rep["warnings"]] + [""]
    else:
        lines += [
            "No warnings: every operator is outside the known-problem table, shapes are static, no fused host kernels.",
            "",
        ]
    lines += [
        "## fp16 error budget",
        "",
        f"Conversion precision chosen: `{rep['precision']}`. The 310-series cube units take fp16 inputs in every mode,",
        "so expect at least this error against PyTorch on the board (" + rep["fp16_emulation"]["method"] + "):",
        "",
    ]
    lines += table(
        ["output", "rel error", "max abs", "cosine", "argmax agreement"],
        [
            [name, m["rel_error"], m["max_abs"], m["cosine"], "-" if (a := m["argmax_agreement"]) is None else a]
            for name, m in rep["fp16_emulation"]["metrics"].items()
        ],
    )
    plan = rep.get("fp16_plan")
    if plan:
        lines += [
            "",
            f"fp16 plan (precision.md): {plan['keep_fp32']} layer(s) kept in fp32, emulated rel error "
            f"{plan['rel_error_with_plan']} with them.",
        ]
    if rep.get("aipp"):
        lines += ["", *aipp_markdown(rep["aipp"])]
    if rep.get("ascend"):
        from torch2ms.ascend.report import markdown

        lines += [""] + markdown(rep["ascend"])
        if rep["ascend"]["target_soc"] != "Ascend310":
            lines += [
                f"The placement uses the Ascend 310's op list, the nearest public one: {target.soc_version}'s own "
                "list may place some ops differently.",
            ]
    lines += [
        "",
        "## Checks",
        "",
        f"- Dynamic shapes: {'; '.join(rep['onnx']['dynamic']) or 'none (all dimensions fixed)'}",
        f"- Host-only fused kernels in the MindIR: {', '.join(rep['mindir']['fused_kernels']) or 'none'}",
        f"- ONNX opset {rep['onnx']['opset']}; operators: "
        + ", ".join(f"{k} x{v}" for k, v in rep["onnx"]["ops"].items()),
        "- MindIR operators: " + ", ".join(f"{k} x{v}" for k, v in rep["mindir"]["ops"].items()),
        "",
        (
            "The operator table is a heuristic (CANN operator lists, ATC restrictions); the ATC / converter_lite "
            "log on the board is authoritative."
        ),
        "",
    ]
    return "\n".join(lines)


def aipp_markdown(check: dict) -> list[str]:
    """The AIPP section: max |AIPP - recipe preprocessing| per config and image, and the bound."""
    images = check["images"]
    lines = [
        "## AIPP vs the recipe's preprocessing",
        "",
        f"Each shipped AIPP config, run through a {check['method']}. The bound is what fp16 (and, for YUV input,",
        "the integer colour conversion) can explain; a config above it would change the model's input on the board.",
        "",
    ]
    rows = [
        [
            name,
            r["input_format"] + (f" ({r['standard']})" if r["standard"] else ""),
            *(f"{r['max_error'][i]:.3g}" for i in images),
            f"{r['bound']:.3g}",
        ]
        for name, r in check["configs"].items()
    ]
    return lines + table(["config", "input", *images, "bound"], rows)
