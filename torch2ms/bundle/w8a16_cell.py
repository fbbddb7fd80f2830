"""W8A16 in a MindSpore network: an ``nn.Dense`` whose weight is stored int8 per output channel.

Symmetric per row ``o`` of the weight ``W`` [out, in]::

    scale[o] = max_i |W[o, i]| / 127   (1 for a row of zeros)
    q[o, i]  = clip(round(W[o, i] / scale[o]), -127, 127)   int8

``Int8Dense`` holds ``q`` as an int8 Parameter and ``scale`` [out, 1] as a float32 one, and
dequantizes in the graph: ``Cast(q, float32) * scale`` -> ``MatMul(x, ., transpose_b)`` (+ bias,
activation), what ``nn.Dense.construct`` does with its float weight. So the MindIR exported from a
network with these cells holds int8 weights (a quarter of the bytes, plus one float per row), and
the activations stay float.

**Tables.** A token embedding is a Gather on a Parameter: the generated code's
``ops.gather(self.<table>, <indices>, 0)`` (the ONNX Gather's converter), in an ``Embedding`` cell of
the modules layout or in the one cell of the flat layout. ``gather_tables`` finds every 2-D float
Parameter whose only use in its cell's ``construct`` is as such a table, whichever layout; ``quantize_tables``
stores it int8 per row (the same ``quantize_rows``: one scale per token) and has the cell gather the
int8 rows and their scales, then ``Cast`` to float32 and ``Mul`` (``gather_int8_rows``). The cell's
class is replaced by one whose ``construct`` is the generated one with that call in place of the
Gather (its source written beside the export, where MindSpore's graph parser reads it). On the
Ascend 310, GatherV2 and Cast take int8 on the AI Core (``torch2ms/ascend/ascend310.json``, from
CANN's ``aic-ascend310-ops-info.json``: ``GatherV2D`` and ``Cast`` list int8; CANN's own GatherV2
lists ``DT_INT8`` among its AI Core types, https://gitcode.com/cann/ops-nn/blob/master/experimental/index/gather_v2/op_api/gather_v2.cpp).

``fake_quantized`` is the same weight as the graph computes it (``q`` times ``scale`` in float32):
the precision plan emulates int8 by loading it into a float ``nn.Dense`` or table (a row gathered
and then scaled is the row of the scaled table, bit for bit).

This module imports MindSpore: only the W8A16 plan imports it (``w8a16.py``).
"""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype

QMAX = 127  # symmetric int8: -128 is never used, so q and -q are both representable


def row_scales(weight: np.ndarray) -> np.ndarray:
    """``scale float32 [out, 1]`` of a weight [out, in]: max |row| / 127 (1 for a row of zeros)."""
    peak = np.abs(np.asarray(weight, dtype=np.float32)).max(axis=1, keepdims=True)
    return np.where(peak > 0, peak / QMAX, 1.0).astype(np.float32)


def quantize_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q int8 [out, in], scale float32 [out, 1])`` of a weight [out, in] (module docstring)."""
    weight = np.asarray(weight, dtype=np.float32)
    scale = row_scales(weight)
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


def gather_int8_rows(table, scale, indices):
    """Rows ``indices`` of the int8 ``table`` [V, H] in float32: ``Cast(Gather(table)) * Gather(scale)``
    (``scale`` [V, 1], one per row)."""
    return ops.cast(ops.gather(table, indices, 0), mstype.float32) * ops.gather(scale, indices, 0)


def _gathers(source: str, attr: str) -> list[tuple[int, int, str]]:
    """``(start, end, indices)`` of each ``ops.gather(self.<attr>, <indices>, 0)`` in ``source`` (a
    call the formatter may have split over lines)."""
    found = []
    for head in re.finditer(rf"ops\.gather\(\s*self\.{attr}\s*,", source):
        depth, i = 0, head.end()
        for i in range(head.end(), len(source)):  # the indices end at the first top-level comma
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(source[i], 0)
            if depth == 0 and source[i] == ",":
                break
        tail = re.match(r",\s*0\s*,?\s*\)", source[i:])
        if tail:
            found.append((head.start(), i + tail.end(), source[head.end() : i].strip()))
    return found


def gather_tables(network: nn.Cell) -> list[tuple[str, nn.Cell, str]]:
    """``(path, cell, attribute)`` of every 2-D float32 Parameter that its cell's ``construct`` uses
    only as the table of an axis-0 ``ops.gather`` (module docstring); ``path``: ``<cell path>.<attribute>``."""
    found = []
    for prefix, cell in network.cells_and_names():
        try:
            source = inspect.getsource(type(cell).construct)
        except (OSError, TypeError):
            continue
        for attr, param in cell._params.items():
            if len(param.shape) != 2 or param.dtype != mstype.float32:
                continue
            uses = len(re.findall(rf"self\.{attr}\b", source))
            if uses and uses == len(_gathers(source, attr)):
                found.append((f"{prefix}.{attr}" if prefix else attr, cell, attr))
    return found


def _int8_class(cls: type, attrs: set[str], folder: Path) -> type:
    """``cls`` with every table gather of ``attrs`` in its source replaced by ``gather_int8_rows``, its
    source written to ``folder`` and executed in a copy of its module's namespace (MindSpore's graph
    parser resolves a name in the module of the class and reads the source from its file)."""
    source = textwrap.dedent(inspect.getsource(cls))
    for attr in sorted(attrs):
        for start, end, indices in reversed(_gathers(source, attr)):
            source = f"{source[:start]}gather_int8_rows(self.{attr}, self.{attr}_scale, {indices}){source[end:]}"
    name = f"{cls.__module__}_w8a16_{cls.__name__}_{'_'.join(sorted(attrs))}"
    path = Path(folder) / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    module = types.ModuleType(name)
    module.__dict__.update({k: v for k, v in vars(sys.modules[cls.__module__]).items() if not k.startswith("__")})
    module.__dict__.update(__name__=name, __file__=str(path), gather_int8_rows=gather_int8_rows)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module.__dict__[cls.__name__]


def quantize_tables(network: nn.Cell, names, folder: Path) -> list[str]:
    """Store the tables named in ``names`` (paths from ``gather_tables``, or their ``layer_key``) int8
    per row, gathered by ``gather_int8_rows`` (module docstring), in place; the rewritten classes'
    source goes to ``folder``. Returns the paths replaced; a name that is not a table is an error."""
    tables = {path: (cell, attr) for path, cell, attr in gather_tables(network)}
    wanted = {layer_key(n) for n in names}
    missing = sorted(wanted - {layer_key(p) for p in tables})
    if missing:
        raise KeyError(f"not a gathered table of the network: {', '.join(missing)}")
    chosen = [p for p in tables if layer_key(p) in wanted]
    owners: dict[int, tuple[nn.Cell, set[str]]] = {}
    for path in chosen:
        cell, attr = tables[path]
        owners.setdefault(id(cell), (cell, set()))[1].add(attr)
    classes: dict = {}
    for cell, attrs in owners.values():
        key = (type(cell), frozenset(attrs))
        if key not in classes:
            classes[key] = _int8_class(type(cell), attrs, folder)
        cell.__class__ = classes[key]
    for path in chosen:
        cell, attr = tables[path]
        q, scale = quantize_rows(getattr(cell, attr).asnumpy())
        delattr(cell, attr)
        setattr(cell, attr, Parameter(Tensor(q), name=path, requires_grad=False))
        setattr(cell, f"{attr}_scale", Parameter(Tensor(scale), name=f"{path}_scale", requires_grad=False))
        getattr(cell, attr).name, getattr(cell, f"{attr}_scale").name = path, f"{path}_scale"
    return chosen
