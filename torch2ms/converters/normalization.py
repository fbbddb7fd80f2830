"""Normalization: BatchNormalization (inference form) and LayerNormalization.

BatchNorm momentum: ONNX and MindSpore both update ``moving = m * moving + (1 - m) * batch``;
PyTorch's ``momentum`` is ``1 - m``. Only the inference form (one output, running statistics)
is converted.
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported, batchnorm_in_training, converter


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
    cls = {4: "nn.BatchNorm2d", 2: "nn.BatchNorm1d", 3: "nn.BatchNorm1d"}.get(rank)
    if cls is None:
        raise Unsupported(f"input rank {rank} not supported (2, 3 or 4)")
    gamma, beta, mean, var = (em.require_const(i, n) for i, n in zip(range(1, 5), ("scale", "B", "mean", "var")))
    params = {"gamma": gamma, "beta": beta, "moving_mean": mean, "moving_variance": var}
    layer = em.layer(cls, int(em.shape(0)[1]), eps=float(epsilon), momentum=float(momentum), params=params)
    return f"{layer}({em.x(0)})"


@converter("LayerNormalization", since=17)
def layer_normalization(em, *, axis=-1, epsilon=1e-5, stash_type=1):
    """LayerNormalization(X, Scale, B?) -> Y   attrs: axis, epsilon, stash_type"""
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
    return f"{layer}({em.x(0)})"
