"""Everything a converter may use, in one module: ``@converter``, ``Unsupported``, the
``Emitter`` it is handed, ``literal`` and the dtype names. A user's converter plugin uses the same
(``torch2ms.custom``, exported lazily by ``torch2ms``), and ``Emitter.custom`` for its AOT kernel.

A converter is a function registered with ``@converter("Conv", since=11)``. It receives an
``Emitter`` for one node plus the node's ONNX attributes as keyword arguments with the spec's
defaults, and returns the Python expression that computes the node's output(s). It declares
layers (``em.layer``) and stored tensors (``em.tensor``) through the emitter and never imports
MindSpore, so the same function can be run over a whole model for analysis before anything is
written. A value it cannot express raises ``Unsupported(reason)`` naming the attribute, input or
dtype; an attribute it does not know is refused by the registry.

The emitter writes into a ``Sink``: the code builder (``torch2ms.codegen``) when generating,
``DrySink`` when only analysing. Converters see neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from torch2ms.custom.loading import LOADING_PLUGIN
from torch2ms.graph.ir import Graph, Node, Value
from torch2ms.graph.names import module_path


class Unsupported(Exception):
    """A node this converter cannot express; the message says which attribute/value."""


@dataclass(frozen=True)
class Registration:
    op_type: str
    since: int
    fn: Callable
    domain: str = ""
    plugin: str | None = None  # the user module that registered it (``torch2ms.custom.plugins``); None: built in
    replaces: bool = False  # a plugin's converter tried before the built-in one, which takes what it declines

    @property
    def signature(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else self.op_type


# (domain, op type) -> registrations sorted by ``since``; read by ``torch2ms.converters.registry``.
REGISTRY: dict[tuple[str, str], list[Registration]] = {}


def converter(*op_types: str, since: int = 1, domain: str = "", reference: str | None = None, replaces: bool = False):
    """Register the decorated function for ``op_types`` of ``domain`` from opset ``since`` on.

    For a plugin (a user's module, ``torch2ms.custom``): ``reference`` is the op as an ONNX function
    of default-domain ops (``onnx.parser`` text), what onnxruntime runs in its place for the shapes
    and the export check; ``replaces=True`` lets it take a built-in op (``Conv``) first: returning
    ``None`` hands the node to the built-in converter. Registering one (domain, op, since) twice,
    or a built-in op without ``replaces``, is a ``PluginError`` naming both."""

    def deco(fn: Callable) -> Callable:
        plugin = LOADING_PLUGIN[-1] if LOADING_PLUGIN else None
        for op in op_types:
            regs = REGISTRY.setdefault((domain, op), [])
            new = Registration(op, since, fn, domain, plugin, replaces)
            _check_new(regs, new)
            regs.append(new)
            regs.sort(key=lambda r: (r.since, r.plugin is not None))
            if reference is not None:
                from torch2ms.graph.custom import declare_reference

                declare_reference(domain, op, reference, plugin or fn.__module__)
        return fn

    return deco


def _check_new(regs: list[Registration], new: Registration) -> None:
    """A registration that would shadow another one unasked: two of one (domain, op, since), or
    a plugin's for a built-in op without ``replaces=True``."""
    from torch2ms.errors import PluginError

    op = f"{new.domain}.{new.op_type}" if new.domain else new.op_type
    who = new.plugin or new.fn.__module__
    for old in regs:
        other = old.plugin or old.fn.__module__
        if old.plugin is None and new.plugin is not None and not new.replaces:
            raise PluginError(
                f"converter plugin {who!r}: {op} is a built-in converter ({other})",
                hint="pass replaces=True to convert it first (return None to hand a node to the built-in one)",
            )
        if old.since == new.since and (old.plugin is not None or not new.replaces):
            raise PluginError(
                f"converter plugin {who!r}: {op} (since opset {new.since}) is already registered by {other!r}",
                hint="one converter per op: drop one of the two, or give the newer opset in since=",
            )


# op type -> why torch2ms refuses it (e.g. an output shape that depends on the data, which a
# static MindSpore graph cannot have); read by the registry, ``check`` and docs/operators.md.
REFUSED: dict[str, str] = {}


def refuse(*op_types: str, reason: str) -> None:
    """Declare default-domain ``op_types`` as refused with ``reason`` (said by ``check`` and the docs)."""
    for op in op_types:
        REFUSED[op] = reason


def batchnorm_in_training(node: Node) -> bool:
    """A BatchNormalization that computes batch statistics (training_mode=1, or the running-stat
    outputs of opsets before 14) rather than the inference form torch2ms converts."""
    return bool(node.attrs.get("training_mode", 0)) or len([o for o in node.outputs if o]) > 1


# numpy dtype name -> MindSpore dtype in generated code
MS_DTYPES = {
    "float32": "ms.float32",
    "float16": "ms.float16",
    "float64": "ms.float64",
    "bfloat16": "ms.bfloat16",
    "int64": "ms.int64",
    "int32": "ms.int32",
    "int16": "ms.int16",
    "int8": "ms.int8",
    "uint8": "ms.uint8",
    "uint16": "ms.uint16",
    "uint32": "ms.uint32",
    "uint64": "ms.uint64",
    "bool": "ms.bool_",
}


def ms_dtype(dtype) -> str:
    """``ms.<dtype>`` for a numpy dtype or ONNX ``TensorProto`` enum; ``Unsupported`` if MindSpore lacks it."""
    if isinstance(dtype, (int, np.integer)):
        from onnx import helper

        try:
            dtype = helper.tensor_dtype_to_np_dtype(int(dtype))
        except (KeyError, ValueError, TypeError):
            raise Unsupported(f"ONNX dtype {int(dtype)} not supported") from None
    name = np.dtype(dtype).name
    if name not in MS_DTYPES:
        raise Unsupported(f"dtype {name} not supported by MindSpore")
    return MS_DTYPES[name]


def squash(values) -> int | tuple:
    """A per-axis layer argument (kernel, stride, padding ...) as MindSpore layers take it: one int
    when every axis has the same value, else the tuple."""
    values = tuple(int(v) for v in values)
    return values[0] if len(set(values)) == 1 else values


def literal(value: Any) -> str:
    """Python source for an attribute value (tuples stay tuples, floats keep their precision)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (list, tuple)):
        items = [literal(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, float):
        # ONNX stores float attributes as float32: the shortest float32 spelling (0.9, not 0.8999999761581421).
        return str(float(str(np.float32(value)))) if np.isfinite(value) else f'float("{value}")'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


class Sink(Protocol):
    """Where an emitter's declarations go (the code builder, or ``DrySink``)."""

    def var(self, value: str) -> str: ...
    def const_expr(self, value: Value) -> str: ...
    def add_layer(self, node: Node, callee: str, args: tuple, kwargs: dict, params: dict[str, np.ndarray]) -> str: ...
    def tensor(self, array: np.ndarray, hint: str) -> str: ...
    def define(self, name: str, source: str) -> str: ...


class DrySink:
    """Analysis only: every converter runs, nothing is kept, names are placeholders."""

    def var(self, value: str) -> str:
        return "v"

    def const_expr(self, value: Value) -> str:
        return literal(value.const.item()) if value.const.ndim == 0 and value.const.dtype.kind in "fiub" else "self.c"

    def add_layer(self, node: Node, callee: str, args: tuple, kwargs: dict, params: dict[str, np.ndarray]) -> str:
        return "layer"

    def tensor(self, array: np.ndarray, hint: str) -> str:
        return "self.t"

    def define(self, name: str, source: str) -> str:
        return name


class Emitter:
    """What a converter sees of one node: its inputs as expressions, shapes, dtypes, constants,
    ``layer()`` / ``tensor()`` to declare what ``__init__`` must create, and ``define()`` for a
    module-level helper the expression calls."""

    def __init__(self, graph: Graph, node: Node, sink: Sink | None = None):
        self.graph = graph
        self.node = node
        self.sink = sink if sink is not None else DrySink()
        self.layer_name: str | None = None

    # --- reading the node ---
    def n_inputs(self) -> int:
        return len(self.node.inputs)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def value(self, i: int) -> Value:
        return self.graph.values[self.node.inputs[i]]

    def shape(self, i: int = 0) -> tuple[int, ...]:
        return tuple(self.value(i).shape)

    def rank(self, i: int = 0) -> int:
        return len(self.shape(i))

    def dtype(self, i: int = 0) -> np.dtype:
        return np.dtype(self.value(i).dtype)

    def out_shape(self, j: int = 0) -> tuple[int, ...]:
        return tuple(self.graph.values[self.node.outputs[j]].shape)

    def out_dtype(self, j: int = 0) -> np.dtype:
        return np.dtype(self.graph.values[self.node.outputs[j]].dtype)

    def n_outputs(self) -> int:
        """Outputs the node names (an omitted optional output counts as absent)."""
        return len([o for o in self.node.outputs if o])

    def const(self, i: int) -> np.ndarray | None:
        return self.value(i).const if self.has_input(i) else None

    def require_const(self, i: int, what: str) -> np.ndarray:
        c = self.const(i)
        if c is None:
            raise Unsupported(f"{what} (input {i}) must be a constant")
        return c

    # --- writing code ---
    def x(self, i: int = 0) -> str:
        """Expression for input ``i``: a variable, or a constant (literal or stored tensor)."""
        v = self.value(i)
        if v.is_const:
            return self.sink.const_expr(v)
        return self.sink.var(v.name)

    def operand(self, i: int) -> str:
        """Like ``x`` but size-1 constants become Python scalars (for broadcasting ops)."""
        v = self.value(i)
        if v.is_const and v.const.size == 1 and v.const.ndim <= 1 and v.const.dtype.kind in "fiu":
            return literal(v.const.reshape(()).item())
        return self.x(i)

    def name_hint(self, default: str) -> str:
        """The node's PyTorch module path as an identifier hint (``default`` if it has none)."""
        return "_".join(module_path(self.node.name)) or default

    def shape_code(self, shape: tuple[int, ...]) -> str:
        """Source for a static shape written into the code (reshape targets, broadcast shapes)."""
        return repr(tuple(int(d) for d in shape))

    def out_shape_code(self, j: int = 0) -> str:
        """``shape_code`` of output ``j``'s shape."""
        return self.shape_code(self.out_shape(j))

    def layer(self, callee: str, *args, params: dict[str, np.ndarray] | None = None, **kwargs) -> str:
        """Declare ``self.<name> = callee(*args, **kwargs)`` holding ``params``; returns ``self.<name>``."""
        name = self.sink.add_layer(self.node, callee, args, kwargs, dict(params or {}))
        self.layer_name = name
        return f"self.{name}"

    def tensor(self, array: np.ndarray, hint: str) -> str:
        """A constant tensor stored in the checkpoint; returns its ``self.<name>`` expression."""
        return self.sink.tensor(np.asarray(array), hint)

    def define(self, name: str, source: str) -> str:
        """Module-level ``source`` (a helper ``nn.Cell`` or function called ``name``) written once
        above the network class, for an op that is a loop rather than one call (the recurrent
        layers); returns ``name``, e.g. for ``layer()``. Define a base class before its subclass."""
        return self.sink.define(name, source)

    def custom(self, kernel, *inputs: int | np.ndarray) -> str:
        """Call the user's AOT kernel (``torch2ms.custom.aot.AotKernel``) on ``inputs``: node input
        indices, or arrays (stored in the checkpoint, e.g. a weight). A cell declares its ``ops.Custom``
        with the kernel's shape and dtype inference in ``__init__``; that inference, evaluated on these
        inputs' shapes, must give the node's ONNX output shape."""
        from torch2ms.custom.aot import check_inference

        shapes = [list(self.shape(i)) if isinstance(i, int) else list(np.shape(i)) for i in inputs]
        check_inference(kernel, self, shapes)
        args = [
            self.x(i) if isinstance(i, int) else self.tensor(i, f"{self.name_hint('custom')}_{kernel.inputs[k]}")
            for k, i in enumerate(inputs)
        ]
        self.define("os", "import os")  # the cell finds its library beside network.py
        cls = self.define(kernel.cell, kernel.cell_source())
        return f"{self.layer(cls)}({', '.join(args)})"
