"""The onnxruntime sessions torch2ms checks against, and why each runs as it does.

onnxruntime is a *reference* here, so what it computes must not depend on the CPU. It does in one
known place: at ``ORT_ENABLE_EXTENDED`` and above, a QDQ graph (QuantizeLinear -> DequantizeLinear
around Conv / MatMul / Gemm, as a quantization-aware PyTorch model exports) is fused into
``QLinearConv`` / ``QGemm`` / ``MatMulInteger``, and MLAS runs those with integer kernels chosen by
the instruction set. Without VNNI (an AVX2-only AMD EPYC, or ``qemu-x86_64 -cpu Haswell``), the
uint8 x int8 kernels add pairs of products into saturating 16-bit lanes: a 4x64 x 64x5
``MatMulInteger`` is wrong in 10-12 of 20 outputs by up to ~2.7e4, and a fused QDQ Conv + Gemm
model's outputs move by 0.06 (measured; with VNNI, as on an AVX-512 Xeon, they are exact).

So the reference rule is: the **PyTorch model is the reference** for the export stage, and
onnxruntime, checked against it, runs a graph that holds quantization ops at ``ORT_ENABLE_BASIC``
(constant folding and redundant-node removal only, no QDQ fusion): its Q/DQ pairs then compute the
same float32 fake-quant arithmetic as PyTorch on every CPU. A graph without quantization ops runs
at onnxruntime's default level, as before. ``reference_policy`` says which, and why, and the
export stage records it in ``stage.json`` (``extra.onnxruntime``).

The other purposes, each opened where it is used: ``diff``'s probe and the loader's constant
folding (``graph/load.session_with_outputs``) run with no optimizations at all, since they read
intermediate tensors by name; the fp16 emulator (``package/compat``) too, to keep its rounding
casts, on one thread; ``bench`` measures latency at the default level, as a deployment runs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Ops whose presence makes onnxruntime's higher optimization levels substitute integer kernels.
QUANTIZATION_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
    }
)


def reference_policy(op_types) -> dict:
    """How the reference session runs a graph with these op types: ``graph_optimization`` and ``why``."""
    quantized = sorted(QUANTIZATION_OPS.intersection(op_types))
    if not quantized:
        return {"graph_optimization": "all", "why": "onnxruntime's default: the graph holds no quantization ops"}
    return {
        "graph_optimization": "basic",
        "why": (
            f"the graph holds {', '.join(quantized)}: above ORT_ENABLE_BASIC onnxruntime fuses QDQ into integer "
            "kernels whose uint8 x int8 sums saturate on CPUs without VNNI; at basic level Q/DQ stay float32 "
            "fake-quant, the arithmetic of the PyTorch model, which is the reference"
        ),
    }


def reference_session(path: Path, op_types):
    """An onnxruntime session on ``path`` under ``reference_policy(op_types)``; returns (session, policy)."""
    import onnxruntime as ort

    policy = reference_policy(op_types)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if policy["graph_optimization"] == "basic":
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]), policy


def run_reference(path: Path, op_types, samples, names) -> tuple[list[dict[str, np.ndarray]], dict]:
    """The reference session's outputs ``names`` for each sample; returns (outputs, policy)."""
    sess, policy = reference_session(path, op_types)
    return [dict(zip(names, sess.run(names, s))) for s in samples], policy
