"""W8A16 in a MindSpore network: an ``nn.Dense`` whose weight is stored int8 per output channel.

Symmetric per row ``o`` of the weight ``W`` [out, in]::

    scale[o] = max_i |W[o, i]| / 127   (1 for a row of zeros)
    q[o, i]  = clip(round(W[o, i] / scale[o]), -127, 127)   int8

``Int8Dense`` holds ``q`` as an int8 Parameter and ``scale`` [out, 1] as a float32 one, and
dequantizes in the graph: ``Cast(q, float32) * scale`` -> ``MatMul(x, ., transpose_b)`` (+ bias,
activation), what ``nn.Dense.construct`` does with its float weight. So the MindIR exported from a
network with these cells holds int8 weights (a quarter of the bytes, plus one float per row), and
the activations stay float.

``fake_quantized`` is the same weight as the graph computes it (``q`` times ``scale`` in float32):
the precision plan emulates int8 by loading it into a float ``nn.Dense``.

This module imports MindSpore: only the W8A16 plan imports it (``w8a16.py``).
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype

QMAX = 127  # symmetric int8: -128 is never used, so q and -q are both representable


def quantize_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q int8 [out, in], scale float32 [out, 1])`` of a weight [out, in] (module docstring)."""
    weight = np.asarray(weight, dtype=np.float32)
    peak = np.abs(weight).max(axis=1, keepdims=True)
    scale = np.where(peak > 0, peak / QMAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scale), -QMAX, QMAX).astype(np.int8)
    return q, scale


def fake_quantized(weight: np.ndarray) -> np.ndarray:
    """The float32 weight ``Int8Dense`` computes from ``quantize_rows(weight)``."""
    q, scale = quantize_rows(weight)
    return q.astype(np.float32) * scale


class Int8Dense(nn.Cell):
    """``nn.Dense`` with an int8 weight and float32 per-row scales (module docstring); ``name``: the
    dense layer's path in its network, its Parameters' name prefix (``<name>.weight``, ``<name>.scale``)."""

    def __init__(self, dense: nn.Dense, name: str):
        super().__init__()
        q, scale = quantize_rows(dense.weight.asnumpy())
        self.weight = Parameter(Tensor(q), name=f"{name}.weight", requires_grad=False)
        self.scale = Parameter(Tensor(scale), name=f"{name}.scale", requires_grad=False)
        self.has_bias = dense.has_bias
        self.bias = dense.bias
        self.bias_add = ops.BiasAdd()
        self.matmul = ops.MatMul(transpose_b=True)
        self.activation = dense.activation
        self.activation_flag = dense.activation_flag
        self.out_channels = dense.out_channels

    def construct(self, x):
        weight = ops.cast(self.weight, mstype.float32) * self.scale
        x_shape = x.shape
        if len(x_shape) != 2:
            x = x.reshape(-1, x_shape[-1])
        x = self.matmul(x, weight)
        if self.has_bias:
            x = self.bias_add(x, self.bias)
        if self.activation_flag:
            x = self.activation(x)
        if len(x_shape) != 2:
            x = x.reshape(x_shape[:-1] + (self.out_channels,))
        return x


def dense_layers(network: nn.Cell) -> list[tuple[str, nn.Dense]]:
    """Every ``nn.Dense`` of ``network`` (the generated code's Linear layers: Gemm, MatMul by a
    constant, ``torch2ms.Linear``) with its path, in the order the network defines them."""
    return [(name, cell) for name, cell in network.cells_and_names() if isinstance(cell, nn.Dense)]


def layer_key(path: str) -> str:
    """A dense layer's name in either layout: the modules layout's path (``model.lm_head``) as the
    flat layout writes its attribute (``model_lm_head``), so a flat prefill graph (a prompt-gear
    profile is written flat) and a modules-layout decode graph name their layers alike."""
    return path.replace(".", "_")


def quantize_network(network: nn.Cell, names) -> list[str]:
    """Replace the dense layers named in ``names`` (paths from ``dense_layers``, of this network or of
    the other layout: ``layer_key``) by ``Int8Dense`` in place; returns the paths replaced. A name
    that is not a dense layer of ``network`` is an error."""
    layers = dict(dense_layers(network))
    wanted = {layer_key(n) for n in names}
    missing = sorted(wanted - {layer_key(n) for n in layers})
    if missing:
        raise KeyError(f"not a dense layer of the network: {', '.join(missing)}")
    done = []
    for name in (n for n in layers if layer_key(n) in wanted):
        *up, last = name.split(".")
        parent = network
        for key in up:
            parent = parent._cells[key]
        cell = Int8Dense(layers[name], name)
        parent.insert_child_to_cell(last, cell)
        # a cell set on its parent has its Parameters' names prefixed with the attribute: the full path again
        cell.weight.name, cell.scale.name = f"{name}.weight", f"{name}.scale"
        done.append(name)
    return done
