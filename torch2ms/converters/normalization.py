"""Normalization: BatchNormalization (inference form), LayerNormalization, InstanceNormalization,
GroupNormalization, RMSNormalization, LpNormalization, MeanVarianceNormalization, LRN.

BatchNorm momentum: ONNX and MindSpore both update ``moving = m * moving + (1 - m) * batch``;
PyTorch's ``momentum`` is ``1 - m``. Only the inference form (one output, running statistics)
is converted: rank 2 and 3 as ``nn.BatchNorm1d``, 4 as ``nn.BatchNorm2d``, 5 (3-D CNNs) as
``nn.BatchNorm3d``, whose parameters sit on an inner ``bn2d`` cell.

Instance and group normalization are one layer, ``nn.GroupNorm`` (``nn.InstanceNorm2d`` has no
CPU kernel): instance normalization is group normalization with one channel per group. ONNX's
GroupNormalization changed its affine parameters at opset 21: opset 18 scales and shifts per
*group* (``scale``/``bias`` of length ``num_groups``), opset 21 per *channel* like PyTorch; the
per-group form is repeated over each group's channels.

The rest are written as formulas over ``ops`` (MindSpore's ``RmsNorm`` kernel is Ascend-only)::

    RMSNormalization          y = x / sqrt(mean(x^2 over axes axis..) + epsilon) * scale
    LpNormalization           y = x / ||x||_p along axis          (0 where the norm is 0)
    MeanVarianceNormalization y = (x - mean) / (sqrt(mean(x^2) - mean^2) + 1e-9) over axes
    LRN                       y = x / (bias + alpha / size * sum of x^2 over size channels)^beta

``nn.LRN`` sums over ``depth_radius`` channels each side and does not divide ``alpha`` by the
window, so ONNX's ``size`` becomes ``depth_radius = (size - 1) / 2`` and ``alpha / size``.
onnxruntime, which loads every model torch2ms converts, takes only an odd ``size`` and 4-D input,
as ``nn.LRN`` does.

Attribute values onnxruntime refuses (GroupNormalization ``stash_type=0``, LpNormalization
``p=3``) never reach a converter and are not checked again here. RMSNormalization's and
GroupNormalization's ``stash_type=1`` (statistics in float32) holds for float32 input; for
float16 input RMSNormalization computes the mean of squares in float32.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, batchnorm_in_training, converter, literal

# Below the smallest normal float32: dividing by max(norm, _TINY) leaves a zero vector at zero
# (as ONNX specifies) and changes nothing else.
_TINY = float(np.finfo(np.float32).tiny)


@converter("BatchNormalization", since=1)
def batch_normalization(
    em, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, consumed_inputs=None, is_test=None
):
    """BatchNormalization(X, scale, B, input_mean, input_var) -> Y   attrs: epsilon, momentum, training_mode"""
    if batchnorm_in_training(em.node):
        raise Unsupported("training_mode=1 (batch statistics) not supported; export the model in eval mode")
    if not spatial:
        raise Unsupported("spatial=0 not supported")
    rank = em.rank(0)
    cls = {5: "nn.BatchNorm3d", 4: "nn.BatchNorm2d", 2: "nn.BatchNorm1d", 3: "nn.BatchNorm1d"}.get(rank)
    if cls is None:
        raise Unsupported(f"input rank {rank} not supported (2, 3, 4 or 5)")
    gamma, beta, mean, var = (em.require_const(i, n) for i, n in zip(range(1, 5), ("scale", "B", "mean", "var")))
    params = {"gamma": gamma, "beta": beta, "moving_mean": mean, "moving_variance": var}
    if rank == 5:  # nn.BatchNorm3d holds an nn.BatchNorm2d over (N, C, D * H, W)
        params = {f"bn2d.{k}": v for k, v in params.items()}
    layer = em.layer(cls, int(em.shape(0)[1]), eps=float(epsilon), momentum=float(momentum), params=params)
    return f"{layer}({em.x(0)})"


@converter("LayerNormalization", since=17)
def layer_normalization(em, *, axis=-1, epsilon=1e-5, stash_type=1):
    """LayerNormalization(X, Scale, B?) -> Y, Mean?, InvStdDev?   attrs: axis, epsilon, stash_type"""
    rank = em.rank(0)
    axis = axis % rank
    normalized = tuple(int(d) for d in em.shape(0)[axis:])
    gamma = em.require_const(1, "scale")
    params = {"gamma": gamma.reshape(normalized)}
    if em.has_input(2):
        params["beta"] = em.require_const(2, "bias").reshape(normalized)
    else:
        params["beta"] = 0 * gamma.reshape(normalized)
    layer = em.layer(
        "nn.LayerNorm", normalized, begin_norm_axis=axis, begin_params_axis=axis, epsilon=float(epsilon), params=params
    )
    x = em.x(0)
    if len(em.node.outputs) == 1:
        return f"{layer}({x})"
    # The statistics outputs, over the normalized axes, kept
    axes = tuple(range(axis, rank))
    stats = [
        f"ops.mean({x}, axis={axes!r}, keep_dims=True)",
        f"ops.rsqrt(ops.var({x}, axis={axes!r}, keepdims=True) + {literal(float(epsilon))})",
    ]
    return ", ".join([f"{layer}({x})"] + stats[: len(em.node.outputs) - 1])


def _group_norm(em, groups: int, gamma: np.ndarray, beta: np.ndarray, epsilon: float) -> str:
    if em.rank(0) < 3:
        raise Unsupported(f"input rank {em.rank(0)} not supported (3 or more: N, C, spatial...)")
    channels = int(em.shape(0)[1])
    kw = {} if abs(epsilon - 1e-5) < 1e-12 else {"eps": float(epsilon)}
    params = {"gamma": gamma.astype(np.float32), "beta": beta.astype(np.float32)}
    layer = em.layer("nn.GroupNorm", int(groups), channels, params=params, **kw)
    return f"{layer}({em.x(0)})"


@converter("InstanceNormalization", since=1)
def instance_normalization(em, *, epsilon=1e-5):
    """InstanceNormalization(input, scale, B) -> output   attrs: epsilon; as nn.GroupNorm(C, C)"""
    scale, bias = em.require_const(1, "scale"), em.require_const(2, "B")
    return _group_norm(em, em.shape(0)[1], scale, bias, epsilon)


@converter("GroupNormalization", since=18)
def group_normalization_18(em, *, num_groups, epsilon=1e-5):
    """GroupNormalization(X, scale, bias) -> Y   attrs: num_groups, epsilon; scale and bias per group (opset 18-20)"""
    per_group = int(em.shape(0)[1]) // int(num_groups)
    scale, bias = em.require_const(1, "scale"), em.require_const(2, "bias")
    return _group_norm(em, num_groups, np.repeat(scale, per_group), np.repeat(bias, per_group), epsilon)


@converter("GroupNormalization", since=21)
def group_normalization(em, *, num_groups, epsilon=1e-5, stash_type=1):
    """GroupNormalization(X, scale, bias) -> Y   attrs: num_groups, epsilon, stash_type; scale and bias per channel"""
    scale, bias = em.require_const(1, "scale"), em.require_const(2, "bias")
    return _group_norm(em, num_groups, scale, bias, epsilon)


@converter("RMSNormalization", since=23)
def rms_normalization(em, *, axis=-1, epsilon=1e-5, stash_type=1):
    """RMSNormalization(X, scale) -> Y   attrs: axis, epsilon, stash_type"""
    rank = em.rank(0)
    axes = tuple(range(axis % rank, rank))
    x = em.x(0)
    if em.dtype(0) == np.float16 and stash_type == 1:  # stash_type=1: the mean of squares in float32
        mean_sq = f"ops.mean(ops.square(ops.cast({x}, ms.float32)), axis={axes!r}, keep_dims=True)"
        inv = f"ops.cast(ops.rsqrt({mean_sq} + {literal(float(epsilon))}), ms.float16)"
    else:
        inv = f"ops.rsqrt(ops.mean(ops.square({x}), axis={axes!r}, keep_dims=True) + {literal(float(epsilon))})"
    return f"{x} * {inv} * {em.operand(1)}"


@converter("LpNormalization", since=1)
def lp_normalization(em, *, axis=-1, p=2):
    """LpNormalization(input) -> output   attrs: axis, p (1 or 2)"""
    x, dim = em.x(0), axis % em.rank(0)
    if p == 1:
        norm = f"ops.sum(ops.abs({x}), dim={dim}, keepdim=True)"
    else:  # ops.norm has no float64 kernel
        norm = f"ops.sqrt(ops.sum(ops.square({x}), dim={dim}, keepdim=True))"
    return f"{x} / ops.clamp({norm}, min={_TINY!r})"  # a zero vector stays zero


@converter("MeanVarianceNormalization", since=9)
def mean_variance_normalization(em, *, axes=(0, 2, 3)):
    """MeanVarianceNormalization(X) -> Y   attrs: axes; (X - mean) / (std + 1e-9)"""
    rank = em.rank(0)
    dims = tuple(sorted(int(a) % rank for a in axes))
    x = em.x(0)
    mean = f"ops.mean({x}, axis={dims!r}, keep_dims=True)"
    # std as ONNX defines it: sqrt(E[x^2] - E[x]^2), not the two-pass variance
    std = f"ops.sqrt(ops.mean(ops.square({x}), axis={dims!r}, keep_dims=True) - ops.square({mean}))"
    return f"({x} - {mean}) / ({std} + 1e-09)"


@converter("LRN", since=1)
def lrn(em, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    """LRN(X) -> Y   attrs: size, alpha, beta, bias; as nn.LRN"""
    kw = {"depth_radius": (size - 1) // 2, "alpha": float(np.float32(alpha) / np.float32(size)), "beta": float(beta)}
    if bias != 1.0:
        kw["bias"] = float(bias)
    return f"{em.layer('nn.LRN', **kw)}({em.x(0)})"
