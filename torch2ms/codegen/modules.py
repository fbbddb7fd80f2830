"""The ``modules`` layout of ``network.py``: the PyTorch module tree as MindSpore classes.

The converters emit one statement per node into the flat ``CodeBuilder``; this layer only
groups those statements by the node's module scope (``/backbone/layer1/layer1.0/conv1/Conv``
is module ``backbone.layer1.0.conv1``; ``relu_2`` is the third call of ``relu``) and renames:

- a module whose nodes are one layer call (a ``Conv`` that became ``nn.Conv2dBnAct``) is that
  layer, as an attribute of its parent at PyTorch's path (``self.conv1``);
- a weight-free leaf (``ReLU``, ``Flatten``) is its statements, written in the parent;
- a module whose children are numbered (``Sequential``, ``ModuleList``) is an
  ``nn.SequentialCell`` when its children run as a chain, else an ``nn.CellList`` whose items
  the parent calls one by one (numbers fused away are ``nn.Identity()``, so indices stay
  PyTorch's);
- every other module is an ``nn.Cell`` class named after its PyTorch class (``modules.json``
  of the export stage) with one ``construct`` statement per node, child calls in between.

Instances whose code differs only in numbers or strings (channels, strides, shapes) are one
class: the values that differ become constructor arguments (``Bottleneck(256, 64, 1)``).
Parameter names follow the attribute paths, so they are PyTorch's ``state_dict`` keys where
MindSpore's cells allow (``conv1.conv.weight`` inside ``nn.Conv2dBnAct``).

A module whose nodes interleave with its parent's (a value leaves it and comes back) cannot be
one call: its statements stay in the parent and ``record["inlined"]`` names it and why.
"""

from __future__ import annotations

import heapq
import io
import re
import shutil
import subprocess
import tokenize
from dataclasses import dataclass, field

import numpy as np

from torch2ms.codegen.generated import GeneratedNetwork, build_function
from torch2ms.converters.api import MS_DTYPES, literal
from torch2ms.graph.names import Namer, module_path, snake

# positional argument names of the layers converters declare, for constructor argument names
POSITIONAL = {
    **dict.fromkeys(
        ("nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "nn.Conv2dBnAct", "Conv3dBnAct", "nn.Conv2dTranspose"),
        ("in_channels", "out_channels", "kernel_size"),
    ),
    "nn.Conv1dTranspose": ("in_channels", "out_channels", "kernel_size"),
    "nn.Conv3dTranspose": ("in_channels", "out_channels", "kernel_size"),
    "nn.Dense": ("in_channels", "out_channels"),
    "nn.DenseBnAct": ("in_channels", "out_channels"),
    "nn.BatchNorm1d": ("num_features",),
    "nn.BatchNorm2d": ("num_features",),
    "nn.BatchNorm3d": ("num_features",),
    "nn.LayerNorm": ("normalized_shape",),
    "nn.GroupNorm": ("num_groups", "num_channels"),
    "nn.PReLU": ("channel",),
    "nn.LSTM": ("input_size", "hidden_size"),
    "initializer": ("init", "shape"),
}
# MindSpore's defaults of the keyword arguments converters pass: a keyword at its default in
# every instance of a class is left out, one that differs becomes a constructor argument
_CONV = {"stride": 1, "pad_mode": "same", "padding": 0, "dilation": 1, "group": 1, "has_bias": False}
_POOL = {"kernel_size": 1, "stride": 1, "pad_mode": "valid", "padding": 0}
DEFAULTS = {
    **dict.fromkeys(("nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "nn.Conv1dTranspose"), _CONV),
    **dict.fromkeys(("nn.Conv2dTranspose", "nn.Conv3dTranspose"), {**_CONV, "output_padding": 0}),
    "nn.Conv2dBnAct": {**_CONV, "has_bn": False, "momentum": 0.997, "eps": 1e-05, "activation": None},
    "nn.Dense": {"has_bias": True, "activation": None},
    "nn.DenseBnAct": {"has_bias": True, "has_bn": False, "momentum": 0.9, "eps": 1e-05, "activation": None},
    **dict.fromkeys(("nn.MaxPool1d", "nn.MaxPool2d", "nn.MaxPool3d"), {**_POOL, "dilation": 1, "ceil_mode": False}),
    **dict.fromkeys(("nn.AvgPool1d", "nn.AvgPool2d", "nn.AvgPool3d"), {**_POOL, "ceil_mode": False}),
    **dict.fromkeys(("nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d"), {"eps": 1e-05, "momentum": 0.9}),
    "nn.GroupNorm": {"eps": 1e-05},
}
# keyword order of MindSpore's signatures (the rest keep the converter's order, after these)
ORDER = [
    "kernel_size", "stride", "pad_mode", "padding", "output_padding", "dilation", "group", "has_bias", "has_bn",
    "momentum", "eps", "activation", "ceil_mode",
]  # fmt: skip
NAMED = {n for names in POSITIONAL.values() for n in names} | set(ORDER) - {"init"}
# attribute names a MindSpore Cell uses itself
CELL_NAMES = set(
    "construct cells training phase parameters cls_name name compile run insert_child_to_cell update_parameters_name "
    "param_prefix to_float set_train bprop cell_init_args parameter_layout_dict".split()
)
_SKIP = {tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}


def tokens(text: str) -> list[tokenize.TokenInfo]:
    return [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in _SKIP]


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def rename(expr: str, names: dict[str, str], attrs: dict[str, str]) -> str:
    """``expr`` with variables renamed by ``names`` and ``self.<attr>`` by ``attrs`` (to an
    expression: ``self.conv1``, ``self.branches[0]``); keyword names and other attributes kept."""
    toks, starts = tokens(expr), _offsets(expr)
    edits = []
    for k, t in enumerate(toks):
        if t.type != tokenize.NAME:
            continue
        prev = toks[k - 1].string if k else ""
        if prev == ".":
            if k >= 2 and toks[k - 2].string == "self" and t.string in attrs:
                a = toks[k - 2]
                edits.append((starts[a.start[0] - 1] + a.start[1], starts[t.end[0] - 1] + t.end[1], attrs[t.string]))
            continue
        if k + 1 < len(toks) and toks[k + 1].string == "=":
            continue
        if t.string in names:
            edits.append((starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1], names[t.string]))
    for begin, end, text in reversed(edits):
        expr = expr[:begin] + text + expr[end:]
    return expr


def _named(hint: str) -> bool:
    """A hint that names what the value is (a layer argument), not only where it is used."""
    return hint == "channels" or hint in NAMED


@dataclass
class Lit:
    """A number or string in a class's code: a constructor argument where instances differ."""

    text: str
    hint: str


@dataclass
class ChildRef:
    scope: Scope


@dataclass
class Opt:
    """``, key=value`` of a layer call, left out where it is MindSpore's default in every instance."""

    key: str
    value: list  # pieces
    default: str


def lit_pieces(text: str, hint: str) -> list:
    out = []
    for p in pieces(text):
        out.append(Lit(p.text, hint) if isinstance(p, Lit) else p)
    if len(out) == 1 and isinstance(out[0], str) and out[0] in ("None", "True", "False"):
        return [Lit(out[0], hint)]
    return out


def call_pieces(call) -> list:
    """Pieces of a layer call with every keyword of ``DEFAULTS`` present (as ``Opt``)."""
    out = [f"{call.callee}("]
    names = POSITIONAL.get(call.callee, ())
    for k, a in enumerate(call.args):
        out += ([", "] if k else []) + lit_pieces(literal(a), names[k] if k < len(names) else "value")
    defaults = DEFAULTS.get(call.callee, {})
    kwargs = {**call.kwargs, **{k: call.kwargs.get(k, v) for k, v in defaults.items()}}
    kwargs = dict(sorted(kwargs.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))
    for k, v in kwargs.items():
        value = lit_pieces(literal(v), k)
        if k in defaults:
            out.append(Opt(k, value, literal(defaults[k])))
        else:
            out += [f", {k}=", *value]
    out.append(")")
    return out


def pieces(line: str) -> list:
    """``line`` split into fixed text and ``Lit`` (with a name hint from the call it is an argument of)."""
    toks, starts = tokens(line), _offsets(line)
    out, pos, stack = [], 0, []  # stack: [callee, positional index, keyword]
    for k, t in enumerate(toks):
        begin = starts[t.start[0] - 1] + t.start[1]
        end = starts[t.end[0] - 1] + t.end[1]
        if t.string == "(":
            callee = ""
            j = k - 1
            while j >= 0 and (toks[j].type == tokenize.NAME or toks[j].string == "."):
                callee = toks[j].string + callee
                j -= 1
            stack.append([callee, 0, None])
        elif t.string in ")]}" and stack and t.string == ")":
            stack.pop()
        elif t.string == "," and stack:
            stack[-1][1] += 1
            stack[-1][2] = None
        elif t.type == tokenize.NAME and k + 1 < len(toks) and toks[k + 1].string == "=" and stack:
            stack[-1][2] = t.string
        if t.type in (tokenize.NUMBER, tokenize.STRING):
            hint = "value"
            for callee, idx, kw in reversed(stack):
                if kw:
                    hint = kw
                    break
                if callee:
                    names = POSITIONAL.get(callee, ())
                    hint = names[idx] if idx < len(names) else snake(callee.split(".")[-1]) or "value"
                    break
            out += [line[pos:begin], Lit(t.string, hint)]
            pos = end
    out.append(line[pos:])
    return [p for p in out if p != ""]


@dataclass(eq=False)
class Scope:
    """One call of one PyTorch module: its own statements and its children's."""

    raw: str
    attr: str  # the name in the parent (call suffix dropped: relu_2 -> relu)
    module: str  # PyTorch module path
    parent: Scope | None
    children: dict[str, Scope] = field(default_factory=dict)
    stmts: list[int] = field(default_factory=list)
    members: set[int] = field(default_factory=set)
    kind: str = "class"
    body: Body | None = None
    group: Group | None = None
    args: list[str] = field(default_factory=list)  # constructor arguments (after grouping)

    @property
    def first(self) -> int:
        return min(self.members)


@dataclass
class Body:
    """A class's code for one instance, before grouping: logical lines of pieces."""

    init: list[list]
    construct: list[list]
    signature: list[str]
    entries: list[tuple[int, list[str]]]  # statement index -> local names of its targets
    params: dict[str, str]  # parameter path relative to the instance -> builder parameter key
    needs_batch: bool = False


@dataclass
class Group:
    name: str
    base: str
    instances: list[Scope]
    key: tuple
    params: list[str] = field(default_factory=list)
    varying: list[int] = field(default_factory=list)  # literal positions that are parameters
    param_of: dict[int, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


class ModuleLayout:
    def __init__(self, builder, classes: dict[str, str]):
        self.b = builder
        self.classes = classes
        b = builder
        self.onnx_of = {v: k for k, v in b.var_of.items()}
        self.producer: dict[str, int] = {}
        self.reads: list[list[str]] = []
        self.refs: list[list[str]] = []
        self.batch = b.batch_var if b.batch_used else None
        self.layer_names = {name for name, _ in b.layers}
        self.layer_calls = dict(b.layers)
        self.tensor_names = {name for name, _ in b.tensors}
        for i, st in enumerate(b.statements):
            for t in st.targets:
                if t != "_":
                    self.producer[t] = i
        var_names = set(self.producer) | {b.var_of[n] for n in b.graph.inputs}
        for st in b.statements:
            toks = tokens(st.expr)
            reads, refs = [], []
            for k, t in enumerate(toks):
                if t.type != tokenize.NAME:
                    continue
                prev = toks[k - 1].string if k else ""
                if prev == ".":
                    if k >= 2 and toks[k - 2].string == "self":
                        refs.append(t.string)
                    continue
                if k + 1 < len(toks) and toks[k + 1].string == "=":
                    continue
                if t.string in var_names or t.string == self.batch:
                    reads.append(t.string)
            self.reads.append(list(dict.fromkeys(reads)))
            self.refs.append(list(dict.fromkeys(refs)))
        self.used_outside: dict[str, set[int]] = {}
        for i, r in enumerate(self.reads):
            for v in r:
                self.used_outside.setdefault(v, set()).add(i)
        self.returned = set()
        for r in b.returns:
            self.returned.add(r)
        self.inlined: list[dict] = []
        self.renamed: list[dict] = []
        self.groups: list[Group] = []
        self.group_of: dict[tuple, Group] = {}
        self.class_names: set[str] = {b.class_name, *b.definitions} | {"ms", "nn", "ops", "Parameter", "initializer"}

    # --- the tree ---
    def scope_path(self, node) -> list[str]:
        """The module path of a node, from its TorchScript-style name, else (dynamo) from the
        exporter's metadata for the first ONNX node it stands for."""
        if node.name.startswith("/"):
            path = module_path(node.name)
            return ".".join(path).split(".") if path else []
        scopes = self.b.graph.scopes
        scope = next((scopes[o] for o in node.origin if o in scopes), "")
        return scope.split(".") if scope else []

    def tree(self) -> Scope:
        root = Scope("", "", "", None)
        paths = [self.scope_path(st.node) for st in self.b.statements]
        siblings: dict[str, set[str]] = {}
        for p in paths:
            for k in range(len(p)):
                siblings.setdefault(".".join(p[:k]), set()).add(p[k])
        for i, p in enumerate(paths):
            s = root
            for k, comp in enumerate(p):
                if comp not in s.children:
                    raw = ".".join(p[: k + 1])
                    attr = self.normalize(s.module, comp, siblings.get(".".join(p[:k]), set()))
                    module = f"{s.module}.{attr}" if s.module else attr
                    s.children[comp] = Scope(raw, attr, module, s)
                s = s.children[comp]
            s.stmts.append(i)
        self._members(root)
        return root

    def normalize(self, parent: str, comp: str, siblings: set[str]) -> str:
        m = re.fullmatch(r"(.+)_(\d+)", comp)
        if self.classes:
            full = f"{parent}.{comp}" if parent else comp
            if full in self.classes or not m:
                return comp
            return m[1] if (f"{parent}.{m[1]}" if parent else m[1]) in self.classes else comp
        return m[1] if m and m[1] in siblings else comp

    def _members(self, s: Scope) -> set[int]:
        s.members = set(s.stmts)
        for c in s.children.values():
            s.members |= self._members(c)
        s.children = dict(sorted(s.children.items(), key=lambda kv: kv[1].first))
        return s.members

    # --- interfaces and order ---
    def interface(self, members: set[int]) -> tuple[list[str], list[str]]:
        """(variables read from outside, variables used outside), in order."""
        ins, outs = [], []
        for i in sorted(members):
            for v in self.reads[i]:
                if v != self.batch and self.producer.get(v, -1) not in members and v not in ins:
                    ins.append(v)
            for t in self.b.statements[i].targets:
                if t != "_" and (t in self.returned or any(j not in members for j in self.used_outside.get(t, ()))):
                    outs.append(t)
        return ins, outs

    def order(self, units: list[tuple[object, set[int]]]) -> list[int]:
        """Unit indices in an order that respects every data dependency (earliest first); the
        units caught in a cycle are left out."""
        unit_of = {i: k for k, (_, m) in enumerate(units) for i in m}
        deps = [set() for _ in units]
        for k, (_, m) in enumerate(units):
            for i in m:
                for v in self.reads[i]:
                    p = self.producer.get(v)
                    if p is not None and p in unit_of and unit_of[p] != k:
                        deps[k].add(unit_of[p])
        users = [[] for _ in units]
        for k, d in enumerate(deps):
            for j in d:
                users[j].append(k)
        count = [len(d) for d in deps]
        heap = [(min(units[k][1]), k) for k in range(len(units)) if not count[k]]
        heapq.heapify(heap)
        out = []
        while heap:
            _, k = heapq.heappop(heap)
            out.append(k)
            for u in users[k]:
                count[u] -= 1
                if not count[u]:
                    heapq.heappush(heap, (min(units[u][1]), u))
        return out

    def settle(self, s: Scope) -> None:
        """Inline the children whose nodes interleave with ``s``'s (no order makes them one call)."""
        while True:
            units = [(i, {i}) for i in s.stmts] + [(c, c.members) for c in s.children.values()]
            done = set(self.order(units))
            if len(done) == len(units):
                break
            stuck = [u for k, (u, _) in enumerate(units) if isinstance(u, Scope) and k not in done]
            # the first child in a cycle: one that reads something computed after it started
            victim = next(
                (c for c in stuck if any(self.producer.get(v, -1) > c.first for v in self.interface(c.members)[0])),
                stuck[0],
            )
            self.inline(s, victim)
        for c in s.children.values():
            self.settle(c)

    def inline(self, s: Scope, c: Scope) -> None:
        ins, _ = self.interface(c.members)
        late = [v for v in ins if self.producer.get(v, -1) > c.first]
        self.inlined.append(
            {
                "module": c.module,
                "class": self.classes.get(c.module),
                "why": f"its nodes interleave with {s.module or 'the network'}'s: it reads "
                f"{self.onnx_of.get(late[0], late[0]) if late else 'a value'} computed after it starts",
            }
        )
        del s.children[next(k for k, v in s.children.items() if v is c)]
        s.stmts = sorted(s.stmts + c.stmts)
        for k, g in c.children.items():
            g.parent, g.attr = s, f"{c.attr}_{g.attr}"
            s.children[f"{c.raw}.{k}"] = g
        s.children = dict(sorted(s.children.items(), key=lambda kv: kv[1].first))

    # --- kinds ---
    def classify(self, s: Scope) -> None:
        for c in s.children.values():
            self.classify(c)
        if s.parent is None:
            s.kind = "class"
        elif not s.children:
            layers = [r for i in s.stmts for r in self.refs[i] if r in self.layer_names]
            tensors = [r for i in s.stmts for r in self.refs[i] if r in self.tensor_names]
            if len(s.stmts) == 1 and len(layers) == 1 and not tensors:
                s.kind = "layer"
            elif not layers and not tensors:
                s.kind = "inline"
            else:
                s.kind = "class"
        elif not s.stmts and all(c.attr.isdigit() for c in s.children.values()):
            s.kind = "container"
        elif not s.stmts and self.classes.get(s.module) == "Sequential":
            s.kind = "container"  # named children (add_module): an nn.SequentialCell if they run as a chain
        else:
            s.kind = "class"
        if s.kind == "container":
            for c in s.children.values():
                if c.kind == "inline" or (c.kind == "layer" and not self.pure(c)):
                    c.kind = "class"
            if not all(c.attr.isdigit() for c in s.children.values()) and not self.chain(s):
                s.kind = "class"

    def pure(self, s: Scope) -> bool:
        """A layer call taking the one variable (the statement is ``self.<layer>(<var>)``)."""
        i = s.stmts[0]
        st = self.b.statements[i]
        return len(self.reads[i]) == 1 and st.expr == f"self.{self.refs[i][0]}({self.reads[i][0]})"

    def emitted(self, s: Scope) -> tuple[list[int], list[Scope]]:
        """The statements written in ``s``'s own ``construct`` and the cells it calls."""
        stmts, cells = list(s.stmts), []
        for c in s.children.values():
            for u, _ in self.expand(c, ""):
                if u.kind in ("inline", "layer"):
                    stmts += u.stmts
                else:
                    cells.append(u)
        return stmts, cells

    def uses_batch(self, s: Scope) -> bool:
        if self.batch is None:
            return False
        stmts, cells = self.emitted(s)
        return any(self.batch in self.reads[i] for i in stmts) or any(self.batch_arg(c) for c in cells)

    def batch_input(self, ins: list[str]) -> str | None:
        """The input whose dimension 0 is the batch (at both batch sizes the code was compared at)."""
        bv = self.b.batch
        for v in ins:
            name = self.onnx_of.get(v)
            if name is None:
                continue
            a, o = self.b.graph.values.get(name), bv.graph.values.get(name)
            if a is not None and o is not None and a.shape and o.shape:
                if a.shape[0] == bv.batch and o.shape[0] == bv.other:
                    return v
        return None

    def batch_arg(self, s: Scope) -> bool:
        """Whether ``s``'s cell takes ``batch`` as an argument (it uses it, and no input carries it)."""
        if s.kind == "container":
            return any(self.batch_arg(c) for c in s.children.values())
        if s.kind != "class" or not self.uses_batch(s):
            return False
        return self.batch_input(self.interface(s.members)[0]) is None

    def chain(self, s: Scope) -> bool:
        """A container whose children run one after the other on one value (a ModuleList is
        never one: PyTorch calls its items)."""
        if self.classes.get(s.module) in ("ModuleList", "ModuleDict"):
            return False
        kids = list(s.children.values())
        digits = all(c.attr.isdigit() for c in kids)
        if digits and [c.attr for c in kids] != sorted((c.attr for c in kids), key=int):
            return False
        ins, outs = self.interface(s.members)
        if len(ins) != 1 or len(outs) != 1:
            return False
        prev = ins[0]
        for c in kids:
            if c.kind == "container" and not self.chain(c):
                return False  # an nn.CellList is not callable
            ci, co = self.interface(c.members)
            if ci != [prev] or len(co) != 1 or self.batch_arg(c):
                return False
            prev = co[0]
        return prev == outs[0]

    # --- code of one class instance ---
    def expand(self, c: Scope, access: str) -> list[tuple[Scope, str]]:
        if c.kind == "container" and not self.chain(c):
            out = []
            for k in c.children.values():
                out += self.expand(k, f"{access}[{k.attr}]")
            return out
        return [(c, access)]

    def ctor(self, c: Scope) -> list:
        """Pieces of the expression that creates ``c``'s cell."""
        if c.kind == "layer":
            flat = next(r for r in self.refs[c.stmts[0]] if r in self.layer_names)
            return call_pieces(self.layer_calls[flat])
        if c.kind == "class":
            return [ChildRef(c)]
        if not all(k.attr.isdigit() for k in c.children.values()):  # named: the keys are the attribute names
            out = ["nn.SequentialCell(OrderedDict(["]
            for k in c.children.values():
                out += [f'("{k.attr}", ', *self.ctor(k), "), "]
            out[-1] = ")]))"
            return out
        kids = {int(k.attr): k for k in c.children.values()}
        out = ["nn.SequentialCell([" if self.chain(c) else "nn.CellList(["]
        for n in range(max(kids) + 1):
            out += (self.ctor(kids[n]) if n in kids else ["nn.Identity()"]) + [", "]
        out[-1] = "])"
        return out

    def params_of(self, c: Scope, path: str) -> dict[str, str]:
        if c.kind == "layer":
            flat = next(r for r in self.refs[c.stmts[0]] if r in self.layer_names)
            return {f"{path}.{p}": f"{flat}.{p}" for p in self.b.layer_params[flat]}
        if c.kind == "class":
            return {f"{path}.{k}": v for k, v in c.body.params.items()}
        out = {}
        for k in c.children.values():
            out.update(self.params_of(k, f"{path}.{k.attr}"))
        return out

    def render(self, s: Scope) -> None:
        """``s.body``: the instance's ``__init__`` and ``construct``, local names throughout."""
        for c in s.children.values():
            self._render_tree(c)
        b = self.b
        root = s.parent is None
        self.prefix = snake(s.module.replace(".", "_")) + "_" if s.module else ""
        self.raw_prefix = f"{s.raw}." if s.raw else ""
        attrs = Namer(CELL_NAMES)
        names = Namer({"batch"} if self.batch else set())
        local: dict[str, str] = {}
        init: list[list] = []
        lines: list[list] = []
        entries: list[tuple[int, list[str]]] = []
        params: dict[str, str] = {}
        attr_expr: dict[str, str] = {}
        made: dict[str, tuple[str, list, dict]] = {}  # module attr -> (attribute, ctor, params)
        if root:
            ins, outs = [b.var_of[n] for n in b.graph.inputs], []
            for v in ins:
                local[v] = names(v)
        else:
            ins, outs = self.interface(s.members)
            for k, v in enumerate(ins):
                local[v] = names("x" if k == 0 else f"x{k}")
        args = [local[v] for v in ins]
        needs = self.uses_batch(s)
        head: list[list] = []
        if needs:
            if root:
                head.append([f"batch = {local[b.var_of[b.batch.source]]}.shape[0]"])
            else:
                src = self.batch_input(ins)
                if src is None:
                    args.append("batch")
                else:
                    head.append([f"batch = {local[src]}.shape[0]"])
            local[self.batch] = "batch"
        units: list[tuple[object, set[int]]] = [((i, None), {i}) for i in s.stmts]
        for c in s.children.values():
            if c.kind == "inline":
                units.append(((c, None), c.members))
                continue
            if not c.attr.isidentifier() and c.kind != "container":
                self.renamed.append({"module": c.module, "why": "not a Python identifier", "attr": f"m{c.attr}"})
            name = c.attr if c.attr.isidentifier() else f"m{c.attr}"
            ctor = self.ctor(c)
            key = c.attr
            if key in made and made[key][1] == ctor and self._same_params(made[key][2], c):
                attr = made[key][0]
            else:
                attr = attrs(name)
                if attr != name:
                    self.renamed.append({"module": c.module, "why": "a second, different call", "attr": attr})
                init.append([f"self.{attr} = ", *ctor])
                made.setdefault(key, (attr, ctor, self.params_of(c, attr)))
                params.update(self.params_of(c, attr))
            for unit, access in self.expand(c, f"self.{attr}"):
                units.append(((unit, access), unit.members))
        done = self.order(units)
        assert len(done) == len(units), f"no order for {s.module!r}"  # settle() made one possible
        own_tensors: dict[str, str] = {}
        for k in done:
            (u, access), _ = units[k]
            if isinstance(u, int) or u.kind == "inline":
                stmts = [u] if isinstance(u, int) else u.stmts
                hint = None if isinstance(u, int) else u.attr
                for i in stmts:
                    self._statement(i, hint, local, names, attrs, attr_expr, init, own_tensors, params, lines, entries)
            elif u.kind == "layer":
                i = u.stmts[0]
                flat = next(r for r in self.refs[i] if r in self.layer_names)
                attr_expr[flat] = access
                hint = re.sub(r"\W+", "_", access[5:]).strip("_")
                self._statement(i, hint, local, names, attrs, attr_expr, init, own_tensors, params, lines, entries)
            else:
                cin, cout = self.interface(u.members)
                call_args = [local[v] for v in cin] + (["batch"] if self.batch_arg(u) else [])
                hint = re.sub(r"\W+", "_", access[5:]).strip("_")
                targets = []
                for j, v in enumerate(cout):
                    local[v] = names(hint if len(cout) == 1 else f"{hint}_{j}")
                    targets.append(local[v])
                    last = u.children[max(u.children, key=lambda k: u.children[k].first)] if u.children else None
                    if u.kind == "container" and last is not None and last.kind == "layer":
                        # a SequentialCell runs its layers itself: its output is the last one's
                        p = self.producer[v]
                        entries.append((p, [local[v] if t == v else "_" for t in b.statements[p].targets]))
                lines.append([f"{', '.join(targets)} = {access}({', '.join(call_args)})"])
        if root:
            for r in b.returns:  # an output the loader folded into a stored constant
                if r.startswith("self.") and r[5:] in self.tensor_names and r[5:] not in own_tensors:
                    self._tensor(r[5:], attrs, init, own_tensors, params)
            renames = {**attr_expr, **{t: f"self.{n}" for t, n in own_tensors.items()}}
            rets = [rename(r, local, renames) for r in b.returns]
        else:
            rets = [local[v] for v in outs]
        lines.append([f"return {', '.join(rets)}"])
        construct = [[f"def construct(self, {', '.join(args)}):"], *head, *lines]
        body_lines = init + construct
        signature = []
        for line in body_lines:
            for p in line:
                if isinstance(p, Opt):
                    signature.append(f", {p.key}=" + "".join("#" if isinstance(q, Lit) else q for q in p.value))
                elif isinstance(p, Lit):
                    signature.append("#")
                elif isinstance(p, ChildRef):
                    signature.append(f"<{p.scope.group.name}>")
                else:
                    signature.append(p)
        s.body = Body(init, construct, signature, entries, params, needs)

    def _same_params(self, known: dict[str, str], c: Scope) -> bool:
        # only the cell's arrays decide (two calls of one module read the same weights)
        ours = list(self.params_of(c, "_").values())
        theirs = list(known.values())
        return len(ours) == len(theirs) and all(
            np.array_equal(self.b.params[a], self.b.params[t]) for a, t in zip(ours, theirs)
        )

    def _tensor(self, flat: str, attrs, init, own_tensors, params) -> None:
        hint = re.sub(r"_\d+$", "", flat)
        if self.prefix and hint.startswith(self.prefix):  # encoder_pos_embedding in encoder: pos_embedding
            hint = hint[len(self.prefix) :]
        hint = hint.rsplit("_", 1)[-1] if len(hint) > 24 else hint
        name = attrs(hint or "const")
        own_tensors[flat] = name
        v = dict(self.b.tensors)[flat]
        dtype = MS_DTYPES.get(str(v.dtype), "ms.float32")
        init.append(
            pieces(
                f'self.{name} = Parameter(initializer("zeros", {literal(tuple(v.shape))}, {dtype}), '
                f'name="{name}", requires_grad=False)'
            )
        )
        params[name] = flat

    def _layer_name(self, node) -> str | None:
        """A layer's PyTorch name, when the weights it reads are named after it inside this module
        (``out_proj.weight`` -> ``out_proj``, ``in_proj_bias`` -> ``in_proj``): MultiheadAttention's
        projections, which PyTorch calls functionally, so that no ONNX scope names them."""
        for name in node.inputs:
            if self.raw_prefix and name.startswith(self.raw_prefix):
                head = re.sub(r"_(weight|bias)$", "", name[len(self.raw_prefix) :].split(".")[0])
                if head.isidentifier() and head not in ("weight", "bias"):
                    return snake(head)
        return None

    def _statement(self, i, hint, local, names, attrs, attr_expr, init, own_tensors, params, lines, entries):
        st = self.b.statements[i]
        for r in self.refs[i]:
            if r in self.layer_names and r not in attr_expr:
                attr = attrs(self._layer_name(st.node) or snake(self.layer_calls[r].callee.split(".")[-1]))
                attr_expr[r] = f"self.{attr}"
                init.append([f"self.{attr} = ", *call_pieces(self.layer_calls[r])])
                params.update({f"{attr}.{p}": f"{r}.{p}" for p in self.b.layer_params[r]})
            elif r in self.tensor_names and r not in own_tensors:
                self._tensor(r, attrs, init, own_tensors, params)
        expr = rename(st.expr, local, {**attr_expr, **{t: f"self.{n}" for t, n in own_tensors.items()}})
        live = [t for t in st.targets if t != "_"]
        toks = tokens(expr)
        if len(live) == 1 and len(st.targets) == 1 and len(toks) == 1 and toks[0].type == tokenize.NAME:
            if toks[0].string in local.values():  # `y = x`: no statement, y is x
                local[live[0]] = toks[0].string
                entries.append((i, [toks[0].string]))
                return
        base = hint or snake(st.node.op_type)
        targets = []
        for j, t in enumerate(st.targets):
            if t == "_":
                targets.append("_")
                continue
            local[t] = names(base if len(st.targets) == 1 else f"{base}_{j}")
            targets.append(local[t])
        entries.append((i, targets))
        lines.append(pieces(f"{', '.join(targets)} = {expr}"))

    def _render_tree(self, c: Scope) -> None:
        if c.kind in ("class",):
            self.render(c)
            self._group(c)
        else:
            for k in c.children.values():
                self._render_tree(k)

    def _group(self, s: Scope) -> None:
        base = (
            (self.classes.get(s.module) or "").lstrip("_")
            or "".join(p[:1].upper() + p[1:] for p in snake(s.attr).split("_"))
            or "Block"
        )
        if not base.isidentifier() or not base[0].isalpha():
            base = f"Block{base}"
        key = (base, tuple(s.body.signature))
        g = self.group_of.get(key)
        if g is None:
            n = sum(1 for x in self.groups if x.base == base)
            name = base if n == 0 else f"{base}{n + 1}"
            while name in self.class_names:
                name += "_"
            self.class_names.add(name)
            g = Group(name, base, [], key)
            self.group_of[key] = g
            self.groups.append(g)
        g.instances.append(s)
        s.group = g

    # --- grouping: constructor arguments ---
    def literals(self, s: Scope) -> list[Lit]:
        out = []
        for line in s.body.init + s.body.construct:
            for p in line:
                if isinstance(p, Lit):
                    out.append(p)
                elif isinstance(p, Opt):
                    out += [q for q in p.value if isinstance(q, Lit)]
                elif isinstance(p, ChildRef):
                    out += [Lit(a, h) for a, h in zip(p.scope.args, p.scope.group.params)]
        return out

    def finish_group(self, g: Group) -> None:
        vectors = [self.literals(s) for s in g.instances]
        n = len(vectors[0])
        varying = [k for k in range(n) if len({v[k].text for v in vectors}) > 1]
        namer = Namer({"self"})
        by_values: dict[tuple, list[tuple[str, str]]] = {}  # values -> [(kind, parameter)]
        for k in varying:
            hint = vectors[0][k].hint
            values = tuple(v[k].text for v in vectors)
            kind = "channels" if "channels" in hint else hint
            # one argument for equal values of one kind (conv1's out_channels, conv2's in_channels); a
            # size in construct (a reshape target) takes a layer's argument of equal values
            known = by_values.setdefault(values, [])
            same = [p for kd, p in known if kd == kind or not (_named(kd) and _named(kind))]
            if same:
                g.param_of[k] = same[0]
                continue
            name = namer(hint)
            g.params.append(name)
            g.param_of[k] = name
            known.append((kind, name))
        first = {}
        for k in varying:
            first.setdefault(g.param_of[k], k)
        for s, vec in zip(g.instances, vectors):
            s.args = [vec[first[p]].text for p in g.params]
        g.lines = self.class_lines(g.instances[0], g)

    def class_lines(self, s: Scope, g: Group | None) -> list[str]:
        """The class's source (logical lines, indented), literals that vary replaced by parameters."""
        k = 0
        attrs_needed = []

        def text(line: list, in_init: bool) -> str:
            nonlocal k
            out = ""
            for p in line:
                if isinstance(p, Opt):
                    named = any(g and g.param_of.get(k + j) for j in range(sum(isinstance(q, Lit) for q in p.value)))
                    value = text(p.value, in_init)
                    if named or value != p.default:
                        out += f", {p.key}={value}"
                elif isinstance(p, Lit):
                    name = g.param_of.get(k) if g else None
                    if name and not in_init and name not in attrs_needed:
                        attrs_needed.append(name)
                    out += p.text if name is None else (name if in_init else f"self.{name}")
                    k += 1
                elif isinstance(p, ChildRef):
                    args = []
                    for a in p.scope.args:
                        name = g.param_of.get(k) if g else None
                        args.append(a if name is None else name)
                        k += 1
                    out += f"{p.scope.group.name}({', '.join(args)})"
                else:
                    out += p
            return out.replace("(, ", "(")

        init = [text(line, True) for line in s.body.init]
        construct = [text(line, False) for line in s.body.construct]
        params = g.params if g else []
        out = [f"    def __init__(self{''.join(', ' + p for p in params)}):", "        super().__init__()"]
        out += [f"        self.{a} = {a}" for a in attrs_needed]
        out += [f"        {line}" for line in init]
        out += ["", f"    {construct[0]}"] + [f"        {line}" for line in construct[1:]]
        return out

    # --- the file ---
    def render_file(self, header: str):
        b = self.b
        root = self.tree()
        self.settle(root)
        self.classify(root)
        self.render(root)
        for g in self.groups:
            self.finish_group(g)
        root_lines = self.class_lines(root, None)
        classes = [(g.name, g.lines, g) for g in self.groups] + [(b.class_name, root_lines, None)]
        body = []
        for name, lines, g in classes:
            if g:
                n = len(g.instances)
                doc = f"PyTorch {g.base}: {g.instances[0].module}" + (f" and {n - 1} more" if n > 1 else "")
                doc = f'    """{doc if len(doc) < 88 else f"PyTorch {g.base} ({n} instances)"}."""'
            else:
                doc = f'    """Generated from {b.graph.name!r}; see the module docstring."""'

            body += [f"class {name}(nn.Cell):", doc, "", *lines, "", ""]
        text = "\n".join(body + [source for source in b.definitions.values()])
        used = {t.string for t in tokens_safe(text)} | ({"ms"} if b.params else set())
        imports = []
        if b.params or "OrderedDict" in used:
            imports += [
                *(["import os"] if b.params else []),
                *(["from collections import OrderedDict"] if "OrderedDict" in used else []),
                "",
            ]
        if "ms" in used:
            imports.append("import mindspore as ms")
        names = [n for n in ("Parameter", "nn", "ops") if n in used]
        if names:
            imports.append(f"from mindspore import {', '.join(names)}")
        if "initializer" in used:
            imports.append("from mindspore.common.initializer import initializer")
        shapes = {n: tuple(b.graph.values[n].shape) for n in b.graph.inputs}
        out = [*header.rstrip().splitlines(), "", *imports, ""]
        out += ["INPUT_SHAPES = {" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in shapes.items()) + "}", "", ""]
        for source in b.definitions.values():
            out += [*source.strip("\n").splitlines(), "", ""]
        out += body
        out += build_function(b.class_name, bool(b.params))
        source, formatter = format_source("\n".join(out))
        # tensor_map: each statement of each instance, at its line of the (shared) class
        lines = assign_lines(source)
        tensor_map = []
        params: dict[str, np.ndarray] = {}
        self._collect(root, "", b.class_name, lines, tensor_map, params)
        # in the order the network computes them (divergence takes the first that leaves tolerance)
        tensor_map.sort(key=lambda e: e.pop("index"))
        counts: dict[str, int] = {}
        for _, call in b.layers:
            counts[call.callee] = counts.get(call.callee, 0) + 1
        # a node is in a module when its statement belongs to a PyTorch module (its class, its layer
        # attribute, or inline as a weight-free leaf of one), not to the network's own code
        in_class = sum(len(self.b.statements[i].node.origin) for i in root.members - set(root.stmts))
        total = sum(len(st.node.origin) for st in b.statements)
        record = {
            "layout": "modules",
            "classes": {g.name: {"pytorch": g.base, "instances": len(g.instances)} for g in self.groups},
            "inlined": self.inlined,
            "renamed": self.renamed,
            "nodes_in_modules": in_class,
            "nodes": total,
            "formatter": formatter,
        }
        net = GeneratedNetwork(
            source,
            b.class_name,
            params,
            tensor_map,
            dict(sorted(counts.items())),
            b.batch.source if b.batch_used else None,
        )
        net.layout = record
        net.param_origin = {k: b.param_origin.get(flat, []) for k, flat in self.sources.items()}
        return net

    def _collect(self, s: Scope, path: str, cls: str, lines, tensor_map, params) -> None:
        b = self.b
        if not hasattr(self, "sources"):
            self.sources = {}
        if s.parent is None:
            for k, flat in s.body.params.items():
                params[k] = b.params[flat]
                self.sources[k] = flat
        for i, targets in s.body.entries:
            st = b.statements[i]
            inputs = [x for x in st.node.inputs if x and not b.graph.values[x].is_const]
            for onnx_name, var in zip(st.node.outputs, targets):
                if var == "_":
                    continue
                line = lines.get((cls, var), lines.get((cls, "")))
                tensor_map.append(
                    {
                        "index": i,
                        "tensor": onnx_name,
                        "var": var,
                        "line": line,
                        "node": st.node.name,
                        "op": st.node.op_type,
                        "origin": st.node.origin,
                        "inputs": inputs,
                        "module": s.module,
                        "class": cls,
                        "where": f"network.py:{line} in {cls}.construct",
                    }
                )
        for c in s.children.values():
            self._collect_child(c, lines, tensor_map, params)

    def _collect_child(self, c: Scope, lines, tensor_map, params) -> None:
        if c.kind == "class":
            self._collect(c, c.module, c.group.name, lines, tensor_map, params)
        elif c.kind == "container":
            for k in c.children.values():
                self._collect_child(k, lines, tensor_map, params)


def tokens_safe(text: str) -> list:
    try:
        return tokens(text)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


def format_source(source: str) -> tuple[str, str | None]:
    """``source`` through ``ruff format`` at line length 100 (a requirement of torch2ms); as it is
    when ruff cannot be run."""
    ruff = shutil.which("ruff")
    if ruff is None:
        try:
            from ruff.__main__ import find_ruff_bin

            ruff = find_ruff_bin()
        except (ImportError, FileNotFoundError):
            return source, None
    try:
        done = subprocess.run(
            [ruff, "format", "--isolated", "--line-length", "100", "--stdin-filename", "network.py", "-"],
            input=source,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return source, None
    if done.returncode != 0:
        return source, None
    return done.stdout, "ruff format --line-length 100"


def assign_lines(source: str) -> dict[tuple[str, str], int]:
    """(class, variable) -> line of the ``construct`` statement assigning it; (class, "") -> the
    ``def construct`` line (where its arguments come in)."""
    import ast

    out = {}
    for c in ast.parse(source).body:
        if not isinstance(c, ast.ClassDef):
            continue
        for f in c.body:
            if isinstance(f, ast.FunctionDef) and f.name == "construct":
                out[(c.name, "")] = f.lineno
                for a in f.args.args:
                    out[(c.name, a.arg)] = f.lineno
                for st in f.body:
                    if isinstance(st, ast.Assign):
                        for t in st.targets:
                            for n in ast.walk(t):
                                if isinstance(n, ast.Name):
                                    out.setdefault((c.name, n.id), st.lineno)
    return out
