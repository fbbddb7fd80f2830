"""Rendering one instance of a module: its ``__init__`` (child cells, layers, stored tensors)
and its ``construct`` (its statements and child calls in an order the dataflow allows), with
local names throughout, as pieces that ``classes`` compares between instances."""

from __future__ import annotations

import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from torch2ms.codegen.arguments import Source
from torch2ms.codegen.locals import Locals
from torch2ms.codegen.pieces import CELL_NAMES, ChildRef, Lit, Opt, call_pieces, owned, pieces, rename, tokens
from torch2ms.codegen.scopes import Scope, Scopes
from torch2ms.converters.api import MS_DTYPES, literal
from torch2ms.graph.names import SHADOWABLE, Namer, snake

# a primitive created and called in one expression: ``ops.ResizeBilinearV2(align_corners=False)(``
PRIMITIVE = re.compile(r"\bops\.([A-Z]\w*)\([^()]*\)\(")


@dataclass
class Body:
    """A class's code for one instance, before grouping: logical lines of pieces."""

    init: list[list]
    construct: list[list]
    signature: list[str]
    # statement index -> local names of its targets, and which top-level assignment of each name
    entries: list[tuple[int, list[str], list[int]]]
    params: dict[str, str]  # parameter path relative to the instance -> builder parameter key
    attributes: set[str] = field(default_factory=set)  # the names ``__init__`` assigns on self


@dataclass
class _Draft:
    """The code of one instance while it is written."""

    scope: Scope
    attrs: Namer
    loc: Locals
    prefix: str  # the module path as a name prefix (encoder_), stripped from stored tensors' names
    raw_prefix: str  # the raw module path with a dot, which weight names of this module start with
    init: list[list] = field(default_factory=list)
    lines: list[list] = field(default_factory=list)
    entries: list[tuple[int, list[str], list[int]]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    attr_expr: dict[str, str] = field(default_factory=dict)  # builder layer attribute -> expression
    own_tensors: dict[str, str] = field(default_factory=dict)  # builder tensor attribute -> attribute
    primitives: dict[str, str] = field(default_factory=dict)  # a primitive built once -> its attribute
    ins: dict[str, int] = field(default_factory=dict)  # an argument's variable -> its index
    # local names that say what the value is: the PyTorch forward's, a child's results' (cos, sin) and
    # an unstacked part's (keys_0); not an op's (unsqueeze_2) nor a child's own (blocks_3)
    named: set[str] = field(default_factory=set)

    @property
    def local(self) -> dict[str, str]:  # builder variable -> local name
        return self.loc.local

    def renames(self) -> dict[str, str]:
        return {**self.attr_expr, **{t: f"self.{n}" for t, n in self.own_tensors.items()}}


def signature(lines: list[list]) -> list[str]:
    """The code with its literals blanked: instances with equal signatures share a class."""
    out = []
    for line in lines:
        for p in line:
            if isinstance(p, Opt):
                out.append(f", {p.key}=" + "".join("#" if isinstance(q, Lit) else q for q in p.value))
            elif isinstance(p, Lit):
                out.append("#")
            elif isinstance(p, ChildRef):  # the class and the child's own code (with or without its optional child)
                out += [f"<{p.scope.group.name}>", *p.scope.body.signature]
            else:
                out.append(p)
    return out


class Bodies:
    """Writes ``Scope.body`` for every class scope, children first, and groups them into classes."""

    def __init__(
        self,
        scopes: Scopes,
        add_class: Callable[[Scope], None],
        roles: dict[str, dict] | None = None,
        arg_names: dict[Scope, list[str | None]] | None = None,
    ):
        self.sc = scopes
        self.b = scopes.b
        self.add_class = add_class  # groups a rendered class scope with the instances that share its code
        self.roles = roles or {}  # PyTorch class -> the names its forward gives (torch2ms.export.roles)
        self.arg_names = arg_names or {}  # instance -> its arguments' names (codegen.arguments)
        self.renamed: list[dict] = []
        self.args_of: dict[Scope, list[str]] = {}  # instance -> its arguments as rendered
        self.sites: dict[Scope, tuple[Scope, list[Source]]] = {}  # called instance -> caller, inputs' sources
        self.readers: dict[Scope, dict[int, set[str]]] = {}  # instance -> argument -> children reading it alone
        self.returns_of: dict[Scope, list[str | None]] = {}  # instance -> the forward's names of its results

    def render_tree(self, c: Scope) -> None:
        if c.kind == "class":
            self.render(c)
            self.add_class(c)
        else:
            for k in c.children.values():
                self.render_tree(k)

    def render(self, s: Scope) -> None:
        """``s.body``: the instance's ``__init__`` and ``construct``, local names throughout."""
        for c in s.children.values():
            self.render_tree(c)
        cls = self.b.class_name if s.parent is None else self.sc.classes.get(s.module)
        d = _Draft(
            s,
            Namer(CELL_NAMES),
            Locals(Namer({"batch"} if self.sc.batch else set()), self.roles.get(cls), set()),
            snake(s.module.replace(".", "_")) + "_" if s.module else "",
            f"{s.raw}." if s.raw else "",
        )
        taken = set(d.attrs.taken)
        args, outs, head = self._inputs(d)
        d.loc.keep.update(outs if s.parent is not None else self.b.returns)
        units = self._units(d)
        done = self.sc.order(units)
        assert len(done) == len(units), f"no order for {s.module!r}"  # settle() made one possible
        for k in done:
            self._will_read(d, *units[k][0])
        for k in done:
            self._unit(d, *units[k][0])
        returned = self._returns(d, outs)
        self.returns_of[s] = [r if r in d.named else None for r in returned]
        d.lines.append([f"return {', '.join(returned)}"])
        construct = [[f"def construct(self, {', '.join(args)}):"], *head, *d.lines]
        s.body = Body(d.init, construct, signature(d.init + construct), d.entries, d.params, d.attrs.taken - taken)

    def _inputs(self, d: _Draft) -> tuple[list[str], list[str], list[list]]:
        """``construct``'s arguments, the variables it returns, and its first lines (the batch size)."""
        b, s = self.b, d.scope
        root = s.parent is None
        if root:
            ins, outs = [b.var_of[n] for n in b.graph.inputs], []
            for v in ins:  # the recipe's input names (``input``, as PyTorch's forward calls it)
                d.loc.argument(v, d.loc.names.keep(v) if v in SHADOWABLE else d.loc.names(v))
        else:
            ins, outs = self.sc.interface(s.members)
            given = self.arg_names.get(s, [])
            for k, v in enumerate(ins):
                name = given[k] if k < len(given) else None
                d.loc.argument(v, d.loc.names(name or ("x" if k == 0 else f"x{k}")))
        d.ins = {v: k for k, v in enumerate(ins)}
        args = [d.local[v] for v in ins]
        self.args_of[s] = list(args)
        head: list[list] = []
        if self.sc.uses_batch(s):
            if root:
                head.append([f"batch = {d.local[b.var_of[b.batch.source]]}.shape[0]"])
            else:
                src = self.sc.batch_input(ins)
                if src is None:
                    args.append("batch")
                else:
                    head.append([f"batch = {d.local[src]}.shape[0]"])
            d.loc.argument(self.sc.batch, "batch")  # an argument, or the head's first line
        return args, outs, head

    def _will_read(self, d: _Draft, u, access: str | None) -> None:
        """Count what one unit of ``construct`` reads, before any is written (``Locals.bind``)."""
        if isinstance(u, int) or u.kind == "inline":
            for i in [u] if isinstance(u, int) else u.stmts:
                d.loc.will_read(self.sc.reads[i])
        elif u.kind == "layer":
            d.loc.will_read(self.sc.reads[u.stmts[0]])
        else:
            d.loc.will_read(self.sc.interface(u.members)[0])

    def _units(self, d: _Draft) -> list[tuple[tuple, set[int]]]:
        """What ``construct`` is made of: own statements, inline leaves, child cells (created in
        ``__init__`` here, one attribute per module however often it is called)."""
        s = d.scope
        units: list[tuple[tuple, set[int]]] = [((i, None), {i}) for i in s.stmts]
        made: dict[str, tuple[str, list, dict]] = {}  # module attr -> (attribute, ctor, params)
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
                attr = d.attrs(name)
                if attr != name:
                    self.renamed.append({"module": c.module, "why": "a second, different call", "attr": attr})
                d.init.append([f"self.{attr} = ", *owned(ctor, attr)])
                made.setdefault(key, (attr, ctor, self.params_of(c, attr)))
                d.params.update(self.params_of(c, attr))
            for unit, access in self.sc.expand(c, f"self.{attr}"):
                units.append(((unit, access), unit.members))
        return units

    def _unit(self, d: _Draft, u, access: str | None) -> None:
        """The lines of one unit of ``construct``."""
        if isinstance(u, int):
            self._statement(d, u, None, d.loc.op_role(self.b.statements[u].node.op_type))
        elif u.kind == "inline":
            for i in u.stmts:
                self._statement(d, i, u.attr, d.loc.children.get(u.attr))
        elif u.kind == "layer":
            self._reads_argument(d, u.attr, self.sc.reads[u.stmts[0]])
            d.attr_expr[self.sc.layer_of(u)] = access
            self._statement(d, u.stmts[0], re.sub(r"\W+", "_", access[5:]).strip("_"), d.loc.children.get(u.attr))
        else:
            self._call(d, u, access)

    def _call(self, d: _Draft, u: Scope, access: str) -> None:
        """``out = self.child(x, ...)``: the call of a child cell."""
        cin, cout = self.sc.interface(u.members)
        call_args = [d.local[v] for v in cin] + (["batch"] if self.sc.batch_arg(u) else [])
        if u.kind == "class":
            self.sites[u] = (d.scope, [self._source(d, v) for v in cin])
        self._reads_argument(d, u.attr, cin)
        d.loc.reading(cin)
        hint = re.sub(r"\W+", "_", access[5:]).strip("_")
        for v, src in self.sc.passthroughs(u.members):  # the child's input under its own name: ours,
            d.loc.alias(v, d.local[src])  # held before the call's results take a name
        role = d.loc.children.get(u.attr) if len(cout) == 1 else None
        # several results: each under the name the child's forward gives it (cos, sin), else numbered
        theirs = self.returns_of.get(u, []) if len(cout) > 1 else []
        bases = [theirs[j] if j < len(theirs) and theirs[j] else f"{hint}_{j}" for j in range(len(cout))]
        targets = [
            d.loc.bind(v, role, role=True) if role else d.loc.bind(v, hint if len(cout) == 1 else bases[j])
            for j, v in enumerate(cout)
        ]
        d.named.update(targets if role else [t for j, t in enumerate(targets) if j < len(theirs) and theirs[j]])
        assigned = dict(zip(targets, d.loc.assign(targets)))
        last = u.children[max(u.children, key=lambda k: u.children[k].first)] if u.children else None
        if u.kind == "container" and last is not None and last.kind == "layer":
            for v in cout:  # a SequentialCell runs its layers itself: its output is the last one's
                p = self.sc.producer[v]
                names = [d.local[v] if t == v else "_" for t in self.b.statements[p].targets]
                d.entries.append((p, names, [assigned.get(n, -1) for n in names]))
        d.lines.append([f"{', '.join(targets)} = {access}({', '.join(call_args)})"])

    def _reads_argument(self, d: _Draft, attr: str, inputs: list[str]) -> None:
        """Child ``attr`` reads ``inputs``: if one of them is an argument, it reads that argument."""
        args = {d.ins[v] for v in inputs if v in d.ins}
        if len(args) == 1:
            self.readers.setdefault(d.scope, {}).setdefault(args.pop(), set()).add(attr)

    def _source(self, d: _Draft, v: str) -> Source:
        """Where a call's input ``v`` comes from, for ``codegen.arguments``."""
        u = v
        while u not in d.ins and u in self.sc.alias_of:  # ``y = x`` of an argument: the argument
            u = self.sc.alias_of[u]
        if u in d.ins:
            return ("arg", d.ins[u])
        name = d.local[v]
        return ("local", name) if name in d.named else None

    def _returns(self, d: _Draft, outs: list[str]) -> list[str]:
        if d.scope.parent is not None:
            return [d.local[v] for v in outs]
        for r in self.b.returns:  # an output the loader folded into a stored constant
            if r.startswith("self.") and r[5:] in self.sc.tensor_names and r[5:] not in d.own_tensors:
                self._tensor(d, r[5:])
        return [rename(r, d.local, d.renames()) for r in self.b.returns]

    # --- children ---
    def ctor(self, c: Scope) -> list:
        """Pieces of the expression that creates ``c``'s cell."""
        if c.kind == "layer":
            return call_pieces(self.sc.layer_calls[self.sc.layer_of(c)])
        if c.kind == "class":
            return [ChildRef(c)]
        if not all(k.attr.isdigit() for k in c.children.values()):  # named: the keys are the attribute names
            out = ["nn.SequentialCell(OrderedDict(["]
            for k in c.children.values():
                out += [f'("{k.attr}", ', *self.ctor(k), "), "]
            out[-1] = ")]))"
            return out
        kids = {int(k.attr): k for k in c.children.values()}
        if self.sc.chain(c) and len(kids) <= max(kids):  # numbers fused away: keys keep PyTorch's indices
            out = ["nn.SequentialCell(OrderedDict(["]
            for n, k in sorted(kids.items()):
                out += [f'("{n}", ', *self.ctor(k), "), "]
            out[-1] = ")]))"
            return out
        out = ["nn.SequentialCell([" if self.sc.chain(c) else "nn.CellList(["]
        for n in range(max(kids) + 1):
            out += (self.ctor(kids[n]) if n in kids else ["nn.Identity()"]) + [", "]
        out[-1] = "])"
        return out

    def params_of(self, c: Scope, path: str) -> dict[str, str]:
        if c.kind == "layer":
            flat = self.sc.layer_of(c)
            return {f"{path}.{p}": f"{flat}.{p}" for p in self.b.layer_params[flat]}
        if c.kind == "class":
            return {f"{path}.{k}": v for k, v in c.body.params.items()}
        out = {}
        for k in c.children.values():
            out.update(self.params_of(k, f"{path}.{k.attr}"))
        return out

    def _same_params(self, known: dict[str, str], c: Scope) -> bool:
        # only the cell's arrays decide (two calls of one module read the same weights)
        ours = list(self.params_of(c, "_").values())
        theirs = list(known.values())
        return len(ours) == len(theirs) and all(
            np.array_equal(self.b.params[a], self.b.params[t]) for a, t in zip(ours, theirs)
        )

    # --- statements ---
    def _tensor(self, d: _Draft, flat: str) -> None:
        """A stored constant the instance reads, as a non-trainable ``Parameter`` of its own."""
        hint = re.sub(r"_\d+$", "", flat)
        if d.prefix and hint.startswith(d.prefix):  # encoder_pos_embedding in encoder: pos_embedding
            hint = hint[len(d.prefix) :]
        hint = hint.rsplit("_", 1)[-1] if len(hint) > 24 else hint
        name = d.attrs(hint or "const")
        d.own_tensors[flat] = name
        v = dict(self.b.tensors)[flat]
        dtype = MS_DTYPES.get(str(v.dtype), "ms.float32")
        d.init.append(
            pieces(
                f'self.{name} = Parameter(initializer("zeros", {literal(tuple(v.shape))}, {dtype}), '
                f'name="{name}", requires_grad=False)'
            )
        )
        d.params[name] = flat

    def _layer_name(self, d: _Draft, node) -> str | None:
        """A layer's PyTorch name, when the weights it reads are named after it inside this module
        (``out_proj.weight`` -> ``out_proj``, ``in_proj_bias`` -> ``in_proj``): MultiheadAttention's
        projections, which PyTorch calls functionally, so that no ONNX scope names them."""
        for name in node.inputs:
            if d.raw_prefix and name.startswith(d.raw_prefix):
                head = re.sub(r"_(weight|bias)$", "", name[len(d.raw_prefix) :].split(".")[0])
                if head.isidentifier() and head not in ("weight", "bias"):
                    return snake(head)
        return None

    def _references(self, d: _Draft, i: int) -> None:
        """Create in ``__init__`` the layers and tensors statement ``i`` uses that are not yet there."""
        st = self.b.statements[i]
        for r in self.sc.refs[i]:
            if r in self.sc.layer_names and r not in d.attr_expr:
                attr = d.attrs(self._layer_name(d, st.node) or snake(self.sc.layer_calls[r].callee.split(".")[-1]))
                d.attr_expr[r] = f"self.{attr}"
                d.init.append([f"self.{attr} = ", *owned(call_pieces(self.sc.layer_calls[r]), attr)])
                d.params.update({f"{attr}.{p}": f"{r}.{p}" for p in self.b.layer_params[r]})
            elif r in self.sc.tensor_names and r not in d.own_tensors:
                self._tensor(d, r)

    def _primitives(self, d: _Draft, expr: str) -> str:
        """``expr`` with each primitive it creates (``ops.ResizeBilinearV2(...)(x, size)``) made once,
        in ``__init__``, as an attribute (one per primitive and arguments in the class)."""

        def hoist(m: re.Match) -> str:
            made = m[0][:-1]
            if made not in d.primitives:
                d.primitives[made] = attr = d.attrs(snake(m[1]).split("_")[0])  # ResizeBilinearV2: resize
                d.init.append(pieces(f"self.{attr} = {made}"))
            return f"self.{d.primitives[made]}("

        return PRIMITIVE.sub(hoist, expr)

    def _parts_of(self, d: _Draft, node) -> str | None:
        """The local name an Unstack's parts are named after: its input's (``keys_0``, ``keys_1``)."""
        if node.op_type != "Unstack" or node.domain != "torch2ms":
            return None
        var = self.b.var(node.inputs[0])
        return d.local.get(var, var)

    def _statement(self, d: _Draft, i: int, hint: str | None, role: str | None = None) -> None:
        """``targets = expr`` for statement ``i``, named after ``role`` (the PyTorch forward's name),
        else ``hint`` (the module), else its op."""
        st = self.b.statements[i]
        d.loc.reading(self.sc.reads[i])
        self._references(d, i)
        expr = self._primitives(d, rename(st.expr, d.local, d.renames()))
        live = [t for t in st.targets if t != "_"]
        toks = tokens(expr)
        if len(live) == 1 and len(st.targets) == 1 and len(toks) == 1 and toks[0].type == tokenize.NAME:
            if toks[0].string in d.local.values():  # `y = x`: no statement, y is x
                d.loc.alias(live[0], toks[0].string)
                d.entries.append((i, [toks[0].string], [d.loc.current(toks[0].string)]))
                return
        parts = None if hint else self._parts_of(d, st.node)
        base = hint or parts or snake(st.node.op_type)
        one = len(st.targets) == 1
        targets = [
            "_"
            if t == "_"
            else d.loc.bind(t, role, role=True)
            if role and one
            else d.loc.bind(t, base if one else f"{base}_{j}")
            for j, t in enumerate(st.targets)
        ]
        if (role and one) or parts:
            d.named.update(t for t in targets if t != "_")
        d.entries.append((i, targets, d.loc.assign(targets)))
        line = pieces(f"{', '.join(targets)} = {expr}")
        if st.node.op_type in ("Div", "Mul"):  # a number an operand is divided or multiplied by
            line = [Lit(p.text, "scale") if isinstance(p, Lit) and p.hint == "value" else p for p in line]
        d.lines.append(line)
