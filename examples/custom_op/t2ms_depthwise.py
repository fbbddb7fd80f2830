"""A converter plugin that takes MobileNetV2's 3x3 depthwise convolutions (padding 1, stride 1 or 2)
to a user C++ kernel (depthwise.cc) as ``ops.Custom(func_type="aot")``, as the fusion article replaced
a depthwise convolution with its own kernel. Every other Conv goes to torch2ms's built-in converter.
"""

from pathlib import Path

import numpy as np

import torch2ms
from torch2ms import AotKernel, Emitter

SOURCE = Path(__file__).parent / "depthwise.cc"
FLAGS = ("-O3", "-march=x86-64-v3")  # AVX2 and FMA, what this project's machines have

# stride -> its kernel; with padding 1 a 3x3 window gives (size - 1) // stride + 1 outputs per axis
KERNELS = {
    s: AotKernel(
        source=SOURCE,
        function=f"DepthwiseConv3x3S{s}",
        inputs=("x", "w", "b"),
        out_shape=f"(x[0], x[1], (x[2] - 1) // {s} + 1, (x[3] - 1) // {s} + 1)",
        out_dtype="x",
        flags=FLAGS,
    )
    for s in (1, 2)
}


@torch2ms.converter("Conv", since=1, replaces=True)
def conv(em: Emitter, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv(X, W, B) -> the user kernel for a 3x3 depthwise conv with padding 1; None: the built-in converter"""
    weight = em.const(1)
    if weight is None or em.rank(0) != 4 or auto_pad != "NOTSET" or em.dtype(0) != np.float32:
        return None
    channels = em.shape(0)[1]
    stride = tuple(strides or (1, 1))
    if group != channels or weight.shape != (channels, 1, 3, 3) or tuple(pads or (0,) * 4) != (1,) * 4:
        return None
    if tuple(dilations or (1, 1)) != (1, 1) or stride not in ((1, 1), (2, 2)):
        return None
    bias = em.const(2) if em.has_input(2) else np.zeros(channels, np.float32)
    if bias is None:
        return None
    return em.custom(KERNELS[stride[0]], 0, weight.astype(np.float32), bias.astype(np.float32))
