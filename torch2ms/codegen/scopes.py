"""The module tree of a flat ``CodeBuilder``: its statements grouped by the PyTorch module
each node came from (``/backbone/layer1/layer1.0/conv1/Conv`` is module
``backbone.layer1.0.conv1``; ``relu_2`` is the third call of ``relu``), with the dataflow that
decides what each module's cell reads and returns, in which order the cells can run, and which
kind of code each module becomes (a class, a layer attribute, a container, inline statements).
"""

from __future__ import annotations

import heapq
import re
import tokenize
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch2ms.codegen.pieces import tokens
from torch2ms.graph.names import node_module

if TYPE_CHECKING:
    from torch2ms.codegen.bodies import Body


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
    optional: list | None = None  # the pieces creating its class's optional child, when it has it

    @property
    def first(self) -> int:
        return min(self.members)


class Scopes:
    """The scope tree of one builder, and the dataflow questions asked about its scopes."""

    def __init__(self, builder, classes: dict[str, str]):
        b = self.b = builder
        self.classes = classes  # module path -> PyTorch class
        self.onnx_of = {v: k for k, v in b.var_of.items()}
        self.batch = b.batch_var if b.batch_used else None
        self.layer_names = {name for name, _ in b.layers}
        self.layer_calls = dict(b.layers)
        self.tensor_names = {name for name, _ in b.tensors}
        self.producer = {t: i for i, st in enumerate(b.statements) for t in st.targets if t != "_"}
        self.reads: list[list[str]] = []
        self.refs: list[list[str]] = []
        self._scan()
        self.used_outside: dict[str, set[int]] = {}
        for i, r in enumerate(self.reads):
            for v in r:
                self.used_outside.setdefault(v, set()).add(i)
        self.returned = set(b.returns)
        self.inlined: list[dict] = []
        # ``y = x`` statements (a Cast to the dtype ``x`` has, an Identity the exporter kept): y -> x
        self.alias_of = {
            st.targets[0]: self.reads[i][0]
            for i, st in enumerate(b.statements)
            if len(st.targets) == 1 and st.targets[0] != "_" and self.reads[i] and st.expr == self.reads[i][0]
        }

    def _scan(self) -> None:
        """Each statement's variables read and ``self.<attr>`` referenced, in order."""
        var_names = set(self.producer) | {self.b.var_of[n] for n in self.b.graph.inputs}
        for st in self.b.statements:
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

    # --- the tree ---
    def scope_path(self, node) -> list[str]:
        """The module path of a node (``graph.names.node_module``)."""
        return node_module(node, self.b.graph.scopes)

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
        """(variables read from outside, variables used outside), in order. A variable that is only
        one of the inputs under another name (``passthroughs``) is not returned: the caller has it."""
        ins, outs = [], []
        for i in sorted(members):
            for v in self.reads[i]:
                if v != self.batch and self.producer.get(v, -1) not in members and v not in ins:
                    ins.append(v)
            for t in self.b.statements[i].targets:
                if t != "_" and self._used_outside(t, members) and self.source(t, members) is None:
                    outs.append(t)
        return ins, outs

    def passthroughs(self, members: set[int]) -> list[tuple[str, str]]:
        """(variable, the input it is) for each variable of ``members`` used outside them that is an
        input under another name (a norm's upcast of an input already float32, read by the residual)."""
        out = []
        for i in sorted(members):
            for t in self.b.statements[i].targets:
                if t != "_" and self._used_outside(t, members) and (src := self.source(t, members)) is not None:
                    out.append((t, src))
        return out

    def source(self, v: str, members: set[int]) -> str | None:
        """The input of ``members`` that ``v`` is, through their ``y = x`` statements, or None."""
        while v in self.alias_of and self.producer[v] in members:
            v = self.alias_of[v]
        return v if self.producer.get(v, -1) not in members else None

    def _used_outside(self, t: str, members: set[int]) -> bool:
        return t in self.returned or any(j not in members for j in self.used_outside.get(t, ()))

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
        s.kind = self._kind(s)
        if s.kind == "container":
            for c in s.children.values():
                if c.kind == "inline" or (c.kind == "layer" and not self.pure(c)):
                    c.kind = "class"
            if not all(c.attr.isdigit() for c in s.children.values()) and not self.chain(s):
                s.kind = "class"

    def _kind(self, s: Scope) -> str:
        if s.parent is None:
            return "class"
        if not s.children:
            layers = [r for i in s.stmts for r in self.refs[i] if r in self.layer_names]
            tensors = [r for i in s.stmts for r in self.refs[i] if r in self.tensor_names]
            if len(s.stmts) == 1 and len(layers) == 1 and not tensors:
                return "layer"
            return "inline" if not layers and not tensors else "class"
        if not s.stmts and all(c.attr.isdigit() for c in s.children.values()):
            return "container"
        if not s.stmts and self.classes.get(s.module) == "Sequential":
            return "container"  # named children (add_module): an nn.SequentialCell if they run as a chain
        return "class"

    def pure(self, s: Scope) -> bool:
        """A layer call taking the one variable (the statement is ``self.<layer>(<var>)``)."""
        i = s.stmts[0]
        st = self.b.statements[i]
        return len(self.reads[i]) == 1 and st.expr == f"self.{self.refs[i][0]}({self.reads[i][0]})"

    def layer_of(self, s: Scope) -> str:
        """The builder's layer attribute a ``layer`` scope's one statement calls."""
        return next(r for r in self.refs[s.stmts[0]] if r in self.layer_names)

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

    def expand(self, c: Scope, access: str) -> list[tuple[Scope, str]]:
        """The cells a parent calls for child ``c``: its items when it is an ``nn.CellList``."""
        if c.kind == "container" and not self.chain(c):
            out = []
            for k in c.children.values():
                out += self.expand(k, f"{access}[{k.attr}]")
            return out
        return [(c, access)]

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


@dataclass
class Group:
    """One generated class: the instances that share its code, and its constructor arguments."""

    name: str
    base: str
    instances: list[Scope]
    key: tuple
    optional: str | None = None  # the child some instances lack (``downsample``), a constructor argument
    params: list[str] = field(default_factory=list)
    defaults: dict[str, str] = field(default_factory=dict)  # argument -> the value most instances take
    varying: list[int] = field(default_factory=list)  # literal positions that are parameters
    param_of: dict[int, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    @property
    def rep(self) -> Scope:
        """The instance whose code the class is written from: one with the optional child."""
        return next((s for s in self.instances if s.optional is not None), self.instances[0])
