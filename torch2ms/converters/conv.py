"""Convolutions: ONNX ``Conv`` and the fused ``torch2ms.ConvBnAct`` made by the fusion pass.

Padding: ONNX ``pads`` are ``[top, left, bottom, right]`` (all begins, then all ends);
MindSpore's ``padding`` 4-tuple is ``(top, bottom, left, right)``. We always write
``pad_mode`` explicitly: MindSpore's default ``'same'`` pads like TensorFlow (extra pad at the
end), not like PyTorch.
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported, converter

# Activations nn.Conv2dBnAct applies itself, by the fused node's activation kind (the ONNX op,
# or the torch2ms formula node, it replaced): its `activation` string. A string makes the layer
# with its defaults, so where those differ from ONNX the converter passes the layer instead:
# GELU's string is the tanh approximation (erf GELU is nn.GELU(approximate=False)), PReLU's
# has one slope of 0.25 (ONNX: one per channel, nn.PReLU(C) holding the weights).
# LeakyReLU's alpha is Conv2dBnAct's own `alpha` (default 0.2; ONNX's is 0.01). ELU is alpha=1
# only and HardSigmoid alpha=1/6, beta=1/2 only: the fusion pass leaves the others out.
CONV_ACTIVATIONS = {
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


class _Code:
    """A keyword argument written as code (a layer), not as a literal."""

    def __init__(self, source: str):
        self.source = source

    def __repr__(self) -> str:
        return self.source


def conv_activation(em, activation: str, alpha: float, approximate: str, channels: int) -> tuple[dict, dict]:
    """``nn.Conv2dBnAct`` keyword arguments and parameters for the fused activation."""
    if activation not in CONV_ACTIVATIONS:
        raise Unsupported(f"activation {activation!r} not supported by nn.Conv2dBnAct")
    if activation == "Gelu" and approximate != "tanh":
        if approximate != "none":
            raise Unsupported(f"approximate={approximate!r} not supported")
        return {"activation": _Code("nn.GELU(approximate=False)")}, {}
    if activation == "PRelu":
        slope = em.require_const(SLOPE_INPUT, "slope").astype("float32").reshape(-1)
        return {"activation": _Code(f"nn.PReLU({channels})")}, {"activation.w": slope}
    kw = {"activation": CONV_ACTIVATIONS[activation]}
    if activation == "LeakyRelu" and float(alpha) != 0.2:
        kw["alpha"] = float(alpha)
    return kw, {}


def _squash(values) -> int | tuple:
    values = tuple(int(v) for v in values)
    return values[0] if len(set(values)) == 1 else values


def conv_geometry(em, kernel_shape, strides, dilations, pads, auto_pad) -> dict:
    """Keyword arguments shared by nn.Conv2d and nn.Conv2dBnAct, from ONNX Conv attributes."""
    if em.rank(0) != 4:
        raise Unsupported(f"only 2-D convolution is supported (input rank {em.rank(0)})")
    w = em.require_const(1, "weight")
    kernel = tuple(kernel_shape or w.shape[2:])
    strides = tuple(strides or (1, 1))
    dilations = tuple(dilations or (1, 1))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads_b, pads_e = [], []
        for size, k, s, d in zip(em.shape(0)[2:], kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            pads_b.append(small if auto_pad == "SAME_UPPER" else total - small)
            pads_e.append(total - pads_b[-1])
        pads = pads_b + pads_e
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    elif auto_pad != "NOTSET":
        raise Unsupported(f"auto_pad={auto_pad!r} not supported")
    pads = tuple(pads or (0, 0, 0, 0))
    top, left, bottom, right = pads
    kw: dict = {"kernel_size": _squash(kernel)}
    if any(s != 1 for s in strides):
        kw["stride"] = _squash(strides)
    if any(pads):
        kw["pad_mode"] = "pad"
        kw["padding"] = _squash((top, bottom, left, right))
    else:
        kw["pad_mode"] = "valid"
    if any(d != 1 for d in dilations):
        kw["dilation"] = _squash(dilations)
    return kw


@converter("Conv", since=1)
def conv(em, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv(X, W, B?) -> Y   attrs: auto_pad, dilations, group, kernel_shape, pads, strides"""
    w = em.require_const(1, "weight")
    kw = conv_geometry(em, kernel_shape, strides, dilations, pads, auto_pad)
    if group != 1:
        kw["group"] = int(group)
    params = {"weight": w}
    if em.has_input(2):
        bias = em.require_const(2, "bias")
        kw["has_bias"] = True
        params["bias"] = bias
    layer = em.layer("nn.Conv2d", int(em.shape(0)[1]), int(w.shape[0]), params=params, **kw)
    return f"{layer}({em.x(0)})"


@converter("ConvBnAct", domain="torch2ms")
def conv_bn_act(
    em, *, activation="", has_bn=1, epsilon=1e-5, momentum=0.9, alpha=0.01, approximate="none", **conv_attrs
):
    """torch2ms.ConvBnAct(X, W, B?, scale?, bias?, mean?, var?, slope?) -> Y: Conv [+ BatchNormalization] [+ activation]

    Inputs 3-6 (BatchNorm) are present only while ``has_bn``; after folding, the node keeps
    ``X, W, B`` and ``nn.Conv2dBnAct(has_bn=False)`` applies conv + bias + activation. ``alpha``
    is LeakyRelu's, ``approximate`` GELU's; input 7 is PReLU's slope, one per output channel.
    """
    unknown = set(conv_attrs) - {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}
    if unknown:
        raise Unsupported(f"attribute {sorted(unknown)} not supported")
    w = em.require_const(1, "weight")
    kw = conv_geometry(
        em,
        conv_attrs.get("kernel_shape"),
        conv_attrs.get("strides"),
        conv_attrs.get("dilations"),
        conv_attrs.get("pads"),
        conv_attrs.get("auto_pad", "NOTSET"),
    )
    group = int(conv_attrs.get("group", 1))
    if group != 1:
        kw["group"] = group
    params = {"conv.weight": w}
    if em.has_input(2):
        kw["has_bias"] = True
        params["conv.bias"] = em.require_const(2, "bias")
    if has_bn:
        scale, beta, mean, var = (em.require_const(i, n) for i, n in zip(range(3, 7), ("scale", "bias", "mean", "var")))
        # ONNX and MindSpore share the momentum convention (moving = m * moving + (1 - m) * batch);
        # PyTorch's momentum is 1 - m.
        kw.update(has_bn=True, momentum=float(momentum))  # nn.Conv2dBnAct's default momentum is 0.997
        if abs(epsilon - 1e-5) > 1e-12:
            kw["eps"] = float(epsilon)
        params.update(
            {
                "batchnorm.gamma": scale,
                "batchnorm.beta": beta,
                "batchnorm.moving_mean": mean,
                "batchnorm.moving_variance": var,
            }
        )
    if activation:
        act_kw, act_params = conv_activation(em, activation, alpha, approximate, int(w.shape[0]))
        kw.update(act_kw)
        params.update(act_params)
    layer = em.layer("nn.Conv2dBnAct", int(em.shape(0)[1]), int(w.shape[0]), params=params, **kw)
    return f"{layer}({em.x(0)})"
