"""The activation a fused MindSpore cell applies itself: ``nn.Conv2dBnAct``, ``nn.Dense`` and
``nn.DenseBnAct`` take an ``activation`` string, by the fused node's activation kind (the ONNX op,
or the torch2ms formula node, it replaced).

A string makes the activation layer with its defaults, so where those differ from ONNX the
converter passes the layer instead: GELU's string is the tanh approximation (erf GELU is
``nn.GELU(approximate=False)``), PReLU's has one slope of 0.25 (ONNX: one per channel,
``nn.PReLU(C)`` holding the weights). LeakyReLU's alpha is the cell's own ``alpha`` (default 0.2;
ONNX's is 0.01) where the cell has one (``nn.Dense`` has not: ``nn.LeakyReLU(alpha)``). ELU is
alpha=1 only and HardSigmoid alpha=1/6, beta=1/2 only: the fusion pass leaves the others out.

The BatchNorm a fused cell holds (``has_bn=True``) comes from the fused node's inputs 3-6 the
same way for both cells: ``cell_batchnorm``.
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported, literal

CELL_ACTIVATIONS = {
    "Relu": "relu",
    "Relu6": "relu6",
    "Sigmoid": "sigmoid",
    "Silu": "silu",
    "Gelu": "gelu",
    "Mish": "mish",
    "HardSigmoid": "hsigmoid",
    "HardSwish": "hswish",
    "Elu": "elu",
    "Tanh": "tanh",
    "LeakyRelu": "leakyrelu",
    "PRelu": "prelu",
}
SLOPE_INPUT = 7  # PReLU's per-channel slope on a fused node


class Code:
    """A keyword argument written as code (a layer), not as a literal."""

    def __init__(self, source: str):
        self.source = source

    def __repr__(self) -> str:
        return self.source


def cell_activation(
    em, activation: str, alpha: float, approximate: str, channels: int, cell: str, has_alpha: bool = True
) -> tuple[dict, dict]:
    """The fused cell's keyword arguments and parameters for ``activation``."""
    if activation not in CELL_ACTIVATIONS:
        raise Unsupported(f"activation {activation!r} not supported by {cell}")
    if activation == "Gelu" and approximate != "tanh":
        if approximate != "none":
            raise Unsupported(f"approximate={approximate!r} not supported")
        return {"activation": Code("nn.GELU(approximate=False)")}, {}
    if activation == "PRelu":
        slope = em.require_const(SLOPE_INPUT, "slope").astype("float32").reshape(-1)
        return {"activation": Code(f"nn.PReLU({channels})")}, {"activation.w": slope}
    if activation == "LeakyRelu" and float(alpha) != 0.2:
        if has_alpha:
            return {"activation": "leakyrelu", "alpha": float(alpha)}, {}
        return {"activation": Code(f"nn.LeakyReLU({literal(float(alpha))})")}, {}
    return {"activation": CELL_ACTIVATIONS[activation]}, {}


BN_INPUTS = ("scale", "bias", "mean", "var")  # the fused node's inputs 3-6 while has_bn


def cell_batchnorm(em, momentum: float, epsilon: float, default_momentum: float) -> tuple[dict, dict]:
    """The fused cell's keyword arguments and ``batchnorm.*`` parameters for its BatchNorm.

    ONNX and MindSpore share the momentum convention (moving = m * moving + (1 - m) * batch;
    PyTorch's momentum is 1 - m); only the cells' defaults differ (Conv2dBnAct 0.997, DenseBnAct 0.9).
    """
    scale, beta, mean, var = (em.require_const(i, n) for i, n in zip(range(3, 7), BN_INPUTS))
    kw = {"has_bn": True}
    if abs(momentum - default_momentum) > 1e-7:
        kw["momentum"] = float(momentum)
    if abs(epsilon - 1e-5) > 1e-12:
        kw["eps"] = float(epsilon)
    params = {
        "batchnorm.gamma": scale,
        "batchnorm.beta": beta,
        "batchnorm.moving_mean": mean,
        "batchnorm.moving_variance": var,
    }
    return kw, params
