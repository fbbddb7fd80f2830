"""A converter plugin for the example's custom op: ONNX ``t2ms.example.SiluMul`` -> a C++ AOT kernel.

A recipe names this module in ``converters:``; torch2ms imports it in every process that converts.
"""

from pathlib import Path

import torch2ms
from torch2ms import AotKernel, Emitter

SILU_MUL = AotKernel(
    source=Path(__file__).parent / "silu_mul.cc",
    function="SiluMul",
    inputs=("x", "y"),
    out_shape="x",  # the output has x's shape and dtype
    out_dtype="x",
)

# What onnxruntime runs for the op (the loader's shapes, the export check): the same math in ONNX ops.
REFERENCE = """
<domain: "t2ms.example", opset_import: ["" : 17]>
SiluMul (x, y) => (z) {
    s = Sigmoid(x)
    xs = Mul(x, s)
    z = Mul(xs, y)
}
"""


@torch2ms.converter("SiluMul", domain="t2ms.example", reference=REFERENCE)
def silu_mul(em: Emitter) -> str:
    """SiluMul(x, y) -> x * sigmoid(x) * y"""
    return em.custom(SILU_MUL, 0, 1)
