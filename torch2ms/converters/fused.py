"""The ``torch2ms``-domain nodes the formula passes make from written-out activations and
normalizations (``passes/activations.py``, ``passes/norms.py``): one MindSpore call or layer each
instead of the formula.

Silu(x) = x * sigmoid(x); Gelu(x) = x * Phi(x) with ``approximate='none'`` (erf) or
``'tanh'`` (0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))); Mish(x) = x *
tanh(softplus(x)); HardSwish(x) = x * relu6(x + 3) / 6. LayerNormalization normalizes over the
axes from ``axis`` to the end (nn.LayerNorm's ``begin_norm_axis``), GroupNormalization over
each group of ``C / num_groups`` channels and the spatial axes (nn.GroupNorm), both with one
gamma / beta per normalized element / channel. RMSNormalization (no MindSpore cell on CPU) is
``x * rsqrt(mean(x^2) + eps) * gamma`` in one expression.
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported, converter, literal


@converter("Silu", domain="torch2ms")
def silu(em):
    """torch2ms.Silu(X) -> X * Sigmoid(X)"""
    return f"ops.silu({em.x(0)})"


@converter("Gelu", domain="torch2ms")
def gelu(em, *, approximate="none"):
    """torch2ms.Gelu(X) -> 0.5 * X * (1 + Erf(X / sqrt2))   attrs: approximate ('none' | 'tanh')"""
    if approximate == "none":
        return f"ops.gelu({em.x(0)})"
    if approximate == "tanh":
        return f'ops.gelu({em.x(0)}, approximate="tanh")'
    raise Unsupported(f"approximate={approximate!r} not supported")


@converter("Mish", domain="torch2ms")
def mish(em):
    """torch2ms.Mish(X) -> X * Tanh(Softplus(X))"""
    return f"ops.mish({em.x(0)})"


@converter("HardSwish", domain="torch2ms")
def hard_swish(em):
    """torch2ms.HardSwish(X) -> X * HardSigmoid(X; 1/6, 1/2)"""
    return f"ops.hardswish({em.x(0)})"


@converter("LayerNormalization", domain="torch2ms")
def layer_normalization(em, *, axis=-1, epsilon=1e-5):
    """torch2ms.LayerNormalization(X, Scale, B) -> Y   attrs: axis, epsilon (any opset)"""
    axis = axis % em.rank(0)
    normalized = tuple(int(d) for d in em.shape(0)[axis:])
    params = {
        "gamma": em.require_const(1, "scale").reshape(normalized),
        "beta": em.require_const(2, "bias").reshape(normalized),
    }
    kw = {} if axis == em.rank(0) - 1 else {"begin_norm_axis": axis, "begin_params_axis": axis}
    if abs(epsilon - 1e-7) > 1e-12:  # nn.LayerNorm's default epsilon is 1e-7
        kw["epsilon"] = float(epsilon)
    layer = em.layer("nn.LayerNorm", normalized, params=params, **kw)
    return f"{layer}({em.x(0)})"


@converter("GroupNormalization", domain="torch2ms")
def group_normalization(em, *, num_groups=1, epsilon=1e-5):
    """torch2ms.GroupNormalization(X, Scale, B) -> Y   attrs: num_groups, epsilon (Scale, B: one per channel)"""
    if em.rank(0) < 3:
        raise Unsupported(f"input rank {em.rank(0)} not supported (N, C, ...)")
    channels = int(em.shape(0)[1])
    params = {"gamma": em.require_const(1, "scale").reshape(-1), "beta": em.require_const(2, "bias").reshape(-1)}
    kw = {} if abs(epsilon - 1e-5) <= 1e-12 else {"eps": float(epsilon)}
    layer = em.layer("nn.GroupNorm", int(num_groups), channels, params=params, **kw)
    return f"{layer}({em.x(0)})"


@converter("RMSNormalization", domain="torch2ms")
def rms_normalization(em, *, axis=-1, epsilon=1e-5):
    """torch2ms.RMSNormalization(X, Scale) -> X / sqrt(mean(X^2 over axes axis..) + epsilon) * Scale"""
    axes = tuple(range(axis % em.rank(0), em.rank(0)))
    x = em.x(0)
    inv = f"ops.rsqrt(ops.mean(ops.square({x}), axis={axes!r}, keep_dims=True) + {literal(float(epsilon))})"
    return f"{x} * {inv} * {em.operand(1)}"
