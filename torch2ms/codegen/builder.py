"""Build ``network.py`` (one ``nn.Cell`` class, one statement per node) and its weights.

Layers with weights become attributes created in ``__init__`` (named after the PyTorch module
path); weight-free ops are calls in ``construct``; constant tensors the graph needs become
non-trainable ``Parameter``s stored in the checkpoint beside the code, and scalar constants
are written as literals. ``tensor_map`` ties each generated statement to the ONNX tensor it
computes, the ONNX tensors it reads, and its line: what divergence localization
(``torch2ms.divergence``) walks.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torch2ms import __version__
from torch2ms.codegen.batch import BatchDependent, BatchVariant, Recorder, Replay, merge_all, resolve_tensors
from torch2ms.codegen.format import format_source
from torch2ms.codegen.generated import GeneratedNetwork, build_function
from torch2ms.codegen.linemap import assign_lines
from torch2ms.converters.api import MS_DTYPES, Emitter, Unsupported, literal
from torch2ms.converters.registry import call_converter, lookup
from torch2ms.graph.ir import Graph, Node, Value
from torch2ms.graph.names import SHADOWABLE, Namer, module_path, node_module, snake

WIDTH = 100


@dataclass
class Call:
    """``callee(arg, ..., key=value, ...)``, rendered on one line or one argument per line."""

    callee: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def parts(self) -> list[str]:
        return [literal(a) for a in self.args] + [f"{k}={literal(v)}" for k, v in self.kwargs.items()]

    def render(self, prefix: str, indent: str) -> list[str]:
        args = ", ".join(self.parts())
        one = f"{indent}{prefix}{self.callee}({args})"
        if len(one) <= WIDTH:
            return [one]
        inner = indent + "    "
        if len(inner + args) <= WIDTH:
            return [f"{indent}{prefix}{self.callee}(", inner + args, f"{indent})"]
        return [f"{indent}{prefix}{self.callee}("] + [f"{inner}{p}," for p in self.parts()] + [f"{indent})"]


@dataclass
class Statement:
    targets: list[str]
    expr: str
    node: Node


class CodeBuilder:
    """Generates one ``nn.Cell`` from a graph; the ``Sink`` its converters' emitters write into."""

    def __init__(self, graph: Graph, class_name: str = "Network", batch: BatchVariant | None = None):
        self.graph = graph
        self.class_name = class_name
        # ``batch``: the same graph at another batch size; sizes that move with it become ``batch * a + c``
        self.batch = batch
        self.batch_used = False
        self.attr_names = Namer()
        self.var_names = Namer()
        self.layers: list[tuple[str, Call]] = []
        self.layer_params: dict[str, list[str]] = {}  # layer attribute -> its parameters' names
        self.param_origin: dict[str, list[str]] = {}  # parameter -> the ONNX nodes it was made for
        self.node: Node | None = None  # the node being converted
        self.tensors: list[tuple[str, Value]] = []
        self.tensor_of: dict[str, str] = {}
        self.params: dict[str, np.ndarray] = {}
        self.statements: list[Statement] = []
        self.returns: list[str] = []
        self.var_of: dict[str, str] = {}
        self.definitions: dict[str, str] = {}  # module-level helpers (Emitter.define), in order
        for name in graph.inputs:
            self.var_of[name] = self.var_names.keep(name) if name in SHADOWABLE else self.var_names(name)
        self.batch_var = self.var_names("batch") if batch is not None else None
        self.seq_var = self.var_names("seq") if batch is not None and batch.seq is not None else None
        self.seq_used = False

    # --- naming ---
    def _hint(self, node: Node) -> str:
        path = module_path(node.name)
        return "_".join(path) if path else ""

    def layer_attr(self, node: Node) -> str:
        return self.attr_names(self._hint(node) or snake(node.op_type))

    # --- the Sink an Emitter writes into ---
    def var(self, value: str) -> str:
        return self.var_of.get(value, "_undefined")

    def add_layer(self, node: Node, callee: str, args: tuple, kwargs: dict, params: dict[str, np.ndarray]) -> str:
        name = self.layer_attr(node)
        self.layers.append((name, Call(callee, args, kwargs)))
        self.layer_params[name] = list(params)
        for pname, arr in params.items():
            self.params[f"{name}.{pname}"] = np.ascontiguousarray(arr)
            self.param_origin[f"{name}.{pname}"] = list(node.origin)
        return name

    def tensor(self, array: np.ndarray, hint: str) -> str:
        return f"self.{self.tensor_attr(array, hint)}"

    def define(self, name: str, source: str) -> str:
        if self.definitions.setdefault(name, source) != source:
            raise ValueError(f"two different definitions of {name!r} in the generated code")
        return name

    def var_for(self, node: Node, emitter: Emitter, j: int) -> str:
        if emitter.layer_name and j == 0:
            hint = emitter.layer_name
        elif node.op_type == "Unstack" and node.domain == "torch2ms":
            hint = self.var(node.inputs[0])  # the parts of ``keys`` are ``keys_0``, ``keys_1``, ...
        else:
            path, op = self._hint(node), snake(node.op_type)
            # "/layer1/layer1.0/relu_2/Relu" is the 3rd call of module `relu`: don't repeat the op.
            hint = path if re.sub(r"_\d+$", "", path).endswith(op) else f"{path}_{op}" if path else op
        if len(node.outputs) > 1:
            hint = f"{hint}_{j}"
        return self.var_names(hint)

    def tensor_attr(self, array: np.ndarray, hint: str) -> str:
        # equal arrays are stored once within a module; two modules' (five RMSNorms' all-ones weights)
        # stay apart, each read by its own module and mapped to its own state_dict key (weight_map.py)
        module = ".".join(node_module(self.node, self.graph.scopes)) if self.node is not None else ""
        key = hashlib.sha1(array.tobytes() + str(array.shape).encode() + str(array.dtype).encode()).hexdigest()
        key = f"{module}:{key}"
        if key not in self.tensor_of:
            name = self.attr_names(hint.replace("onnx::", "const_"))
            self.tensor_of[key] = name
            self.tensors.append((name, Value(name, tuple(array.shape), array.dtype, array)))
            self.params[name] = np.ascontiguousarray(array)
            self.param_origin[name] = list(self.node.origin) if self.node is not None else []
        return self.tensor_of[key]

    def const_expr(self, v: Value) -> str:
        if v.const.ndim == 0 and v.const.dtype.kind in "fiub":
            return literal(v.const.item())
        return self.tensor(v.const, v.name)

    # --- conversion ---
    def emit_node(self, node: Node) -> None:
        self.node = node
        reg = lookup(node.op_type, self.graph.opset, node.domain)
        if reg is None:
            raise Unsupported("no converter")
        if self.batch is None:
            em = Emitter(self.graph, node, self)
            expr = call_converter(reg, em, node)
        else:
            em, expr = self._emit_batch_agnostic(reg, node)
        targets = []
        for j, out in enumerate(node.outputs):
            if not out or self.graph.use_count(out) == 0:
                targets.append("_")
                continue
            var = self.var_for(node, em, j)
            self.var_of[out] = var
            targets.append(var)
        self.statements.append(Statement(targets, expr, node))

    def _emit_batch_agnostic(self, reg, node: Node) -> tuple[Emitter, str]:
        """Convert ``node`` against every graph of ``self.batch`` and write the sizes that move
        with the batch (and the sequence length) in terms of them (``torch2ms.codegen.batch``)."""
        b = self.batch
        where = f"{node.op_type} node {node.name!r}"
        recorder = Recorder(self, b.graph)
        em = Emitter(self.graph, node, recorder)
        exprs = [call_converter(reg, em, node)]
        labels = [b.describe(k) for k in range(len(b.points()))]
        replays = []
        for k, graph in enumerate(b.graphs()):
            other = b.node_for(node, k)
            replay = Replay(self, recorder.log, where, (labels[0], labels[k + 1]))
            try:
                exprs.append(call_converter(reg, Emitter(graph, other, replay), other))
            except (Unsupported, ValueError, IndexError, KeyError) as err:  # a converter given the other shapes
                raise BatchDependent(f"{where}: converts at {labels[0]} but not at {labels[k + 1]}: {err}") from None
            replay.done()
            replays.append(replay)
        exprs = resolve_tensors(self, replays, exprs, where, labels, b.longest)
        expr, used = merge_all(exprs, b.points(), self.symbol_names(), where)
        self.batch_used |= self.batch_var in used
        self.seq_used |= self.seq_var in used
        return em, expr

    def symbol_names(self) -> list[str]:
        b = self.batch
        if b.seq is None:
            return [self.batch_var]
        return [self.batch_var, self.seq_var] if b.batch_moves else [self.seq_var]

    def build(
        self, header: str, layout: str = "flat", modules: dict[str, str] | None = None, roles: dict | None = None
    ) -> GeneratedNetwork:
        """The code for the graph: one flat class, or (``layout="modules"``) one class per PyTorch
        module structure (``torch2ms.codegen.modules``; ``modules``: module path -> PyTorch class,
        ``roles``: PyTorch class -> the names its ``forward`` gives its values)."""
        for node in self.graph.nodes:
            self.emit_node(node)
        # An output the loader folded into a constant (a model returning a Shape) is returned
        # as a stored tensor; declared before rendering, as __init__ must create it.
        for o in self.graph.outputs:
            if o not in self.var_of and self.graph.values[o].const.size == 0:
                raise Unsupported(f"output {o!r} is an empty constant (MindSpore stores no empty Parameter)")
        self.returns = [self.var_of.get(o) or self.tensor(self.graph.values[o].const, o) for o in self.graph.outputs]
        if self.batch is not None:
            for o in self.graph.outputs:
                first = self.graph.values[o].const
                for g in self.batch.graphs():
                    other = g.values[o].const
                    if first is not None and (other is None or not np.array_equal(first, other)):
                        raise BatchDependent(f"output {o!r} is a constant that depends on the batch")
        if layout == "modules" and self.seq_used:
            # ModuleLayout threads one size symbol (batch) through its cells; the length stays flat
            net = self.render(header)
            net.layout = {"layout": "flat", "modules_failed": "a sequence-length profile is written flat"}
            return net
        if layout == "modules":
            from torch2ms.codegen.modules import ModuleLayout

            try:
                return ModuleLayout(self, modules or {}, roles or {}).render_file(header)
            except Exception as err:  # noqa: BLE001 - a grouping bug must not cost the conversion: flat, and say why
                net = self.render(header)
                net.layout = {"layout": "flat", "modules_failed": f"{type(err).__name__}: {err}"}
                return net
        return self.render(header)

    def _mindspore_names(self) -> list[str]:
        """The names the flat code takes from ``mindspore`` (an unused import is a lint error)."""
        code = [st.expr for st in self.statements] + list(self.definitions.values())
        code += [" ".join([call.callee, *call.parts()]) for _, call in self.layers]
        ops = any(re.search(r"\bops\.", c) for c in code)
        parameter = bool(self.tensors) or any(re.search(r"\bParameter\(", c) for c in code)
        return [*(["Parameter"] if parameter else []), "nn", *(["ops"] if ops else [])]

    def render(self, header: str) -> GeneratedNetwork:
        # one element per line: tensor_map records len(out) as each statement's line number
        out = [
            *header.rstrip().splitlines(),
            *(["import os", ""] if self.params else []),
            "import mindspore as ms",
            f"from mindspore import {', '.join(self._mindspore_names())}",
        ]
        if self.tensors:
            out.append("from mindspore.common.initializer import initializer")
        shapes = {n: tuple(self.graph.values[n].shape) for n in self.graph.inputs}
        out += [
            "",
            "INPUT_SHAPES = {" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in shapes.items()) + "}",
            "",
            "",
        ]
        for source in self.definitions.values():
            out += [*source.strip("\n").splitlines(), "", ""]
        out += [
            f"class {self.class_name}(nn.Cell):",
            f'    """The ONNX graph {self.graph.name!r} as one MindSpore cell; see the module docstring."""',
            "",
        ]
        out += ["    def __init__(self):", "        super().__init__()"]
        for name, call in self.layers:
            out += call.render(f"self.{name} = ", "        ")
        for name, v in self.tensors:
            dtype = MS_DTYPES.get(str(v.dtype), "ms.float32")
            init = f'initializer("zeros", {literal(tuple(v.shape))}, {dtype})'
            decl = f'Parameter({init}, name="{name}", requires_grad=False)'
            out.append(f"        self.{name} = {decl}")
        args = ", ".join(["self"] + [self.var_of[n] for n in self.graph.inputs])
        out += ["", f"    def construct({args}):"]
        if self.batch_used:
            out.append(f"        {self.batch_var} = {self.var_of[self.batch.source]}.shape[0]")
        if self.seq_used:
            out.append(f"        {self.seq_var} = {self.var_of[self.batch.seq_source]}.shape[1]")
        tensor_map = []
        for st in self.statements:
            lhs = ", ".join(st.targets)
            out.append(f"        {lhs} = {st.expr}")
            inputs = [i for i in st.node.inputs if i and not self.graph.values[i].is_const]
            for onnx_name, var in zip(st.node.outputs, st.targets):
                if var != "_":
                    tensor_map.append(
                        {
                            "tensor": onnx_name,
                            "var": var,
                            "line": len(out),
                            "node": st.node.name,
                            "op": st.node.op_type,
                            "origin": st.node.origin,
                            "inputs": inputs,
                        }
                    )
        out.append(f"        return {', '.join(self.returns)}")
        out += ["", "", *build_function(self.class_name, bool(self.params))]
        counts: dict[str, int] = {}
        for _, call in self.layers:
            counts[call.callee] = counts.get(call.callee, 0) + 1
        source = self.batch.source if self.batch_used else None
        text, formatter = format_source("\n".join(out))
        if formatter:  # each statement at its line of the formatted file
            lines = assign_lines(text)
            for e in tensor_map:
                e["line"] = lines.get((self.class_name, e["var"]), [e["line"]])[0]  # flat: one assignment each
        net = GeneratedNetwork(text, self.class_name, self.params, tensor_map, dict(sorted(counts.items())), source)
        net.param_origin = self.param_origin
        return net


def class_name_for(name: str) -> str:
    parts = [p for p in snake(name).split("_") if p]
    cls = "".join(p[:1].upper() + p[1:] for p in parts) or "Network"
    return cls if cls[0].isalpha() else f"Net{cls}"


def header_for(class_name: str, source: str, sha256: str, opset: int, recipe: str, notes: list[str]) -> str:
    lines = [
        f'"""{class_name}: MindSpore network generated by torch2ms {__version__}.',
        "",
        f"Source: {source} (sha256 {sha256[:16]}, opset {opset}); recipe: {recipe}.",
        "Weights: network.ckpt beside this file; `build()` returns the network ready for inference.",
    ]
    if notes:
        lines += ["", "Conventions:"]  # wrapped at the generated file's line length
        lines += [textwrap.fill(n, 100, initial_indent="- ", subsequent_indent="  ") for n in notes]
    lines.append('"""')
    return "\n".join(lines)
