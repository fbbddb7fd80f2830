"""Where a CANN op runs on the Ascend 310, from the derived table ``ascend310.json``.

``ai_core`` lists the ops with a TBE (AI Core) kernel and the dtypes their first input takes
(``select_format``: chosen at compile time, not listed); ``ai_cpu`` the AI CPU kernels MindSpore
registers; ``provenance`` where both came from (``torch2ms.ascend.generate`` rewrites them).

Precision: the board compiles float32 graphs in fp16 (``fp16``: ``force_fp16``; ``int8``:
convolutions and matrix products in int8 where the op lists it, everything else fp16). With
``fp32`` (``allow_fp32_to_fp16``) an op without a float32 kernel runs in float16 instead, still
on AI Core.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from torch2ms.ascend.lowering import SHAPE_ONLY

TABLE = Path(__file__).with_name("ascend310.json")
PRECISIONS = ("fp16", "cube-fp16", "fp32", "int8")  # bundle.targets.PRECISION: the ATC mode each means
QUANTIZABLE = frozenset({"Conv2D", "DepthwiseConv2D", "MatMulV2", "BatchMatMul", "Conv2DTransposeD", "AvgPool"})
AI_CORE, AI_CPU, UNSUPPORTED, NONE = "AI Core", "AI CPU", "unsupported", "none"


@dataclass(frozen=True)
class Where:
    placement: str  # AI_CORE, AI_CPU, UNSUPPORTED or NONE (shape-only, no kernel)
    dtype: str  # the dtype the op runs in
    reason: str = ""


@cache
def load(path: Path = TABLE) -> dict:
    return json.loads(Path(path).read_text())


def device_dtype(dtype: str, precision: str, op: str) -> str:
    """The dtype ``op`` computes in on the board for a graph dtype ``dtype`` packaged at ``precision``."""
    if dtype != "float32" or precision == "fp32":
        return dtype
    if precision == "int8" and op in QUANTIZABLE:
        return "int8"
    if precision == "cube-fp16":  # allow_fp32_to_fp16: the Cube ops in fp16, the rest keep float32
        return "float16" if op in QUANTIZABLE else dtype
    return "float16"


def place(op: str, dtype: str, precision: str = "fp16", table: dict | None = None) -> Where:
    """Where CANN op ``op`` runs for graph dtype ``dtype`` (a numpy dtype name) at ``precision``."""
    t = load() if table is None else table
    if op in SHAPE_ONLY:
        return Where(NONE, dtype, "shape only: no kernel")
    run = device_dtype(dtype, precision, op)
    core, cpu = t["ai_core"].get(op), t["ai_cpu"].get(op)
    if core == "select_format":
        return Where(AI_CORE, run, "dtype chosen by the op's format selection (not listed)")
    if core is not None:
        if run in core:
            return Where(AI_CORE, run)
        if run == "int8" and "float16" in core:
            return Where(AI_CORE, "float16", "no int8 kernel: runs in fp16")
        if run == "float32" and "float16" in core and precision != "fp32":  # must_keep_origin_dtype: no fallback
            return Where(AI_CORE, "float16", "no float32 kernel: runs in fp16 (allow_fp32_to_fp16)")
        why = f"dtype {run} not in its AI Core kernel's ({', '.join(core)})"
    else:
        why = "no AI Core kernel for the 310"
    if cpu is not None and (run in cpu or not cpu):
        return Where(AI_CPU, run, why)
    if cpu is not None:
        return Where(UNSUPPORTED, run, f"{why}; its AI CPU kernel takes {', '.join(cpu)}")
    return Where(UNSUPPORTED, run, f"{why}, and MindSpore registers no AI CPU kernel")
