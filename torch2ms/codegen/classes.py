"""Class de-duplication: the instances of one PyTorch class whose code differs only in numbers
or strings (channels, strides, shapes) are one generated class, the values that differ its
constructor arguments (``Bottleneck(256, 64, 1)``)."""

from __future__ import annotations

import ast
from collections import Counter

import torch2ms.codegen.optional as optional
from torch2ms.codegen.pieces import CELL_NAMES, ORDER, ChildRef, Lit, Opt, named
from torch2ms.codegen.scopes import Group, Scope
from torch2ms.graph.names import Namer, snake


class Classes:
    """The generated classes, in the order their first instance was rendered (children first)."""

    def __init__(self, classes: dict[str, str], taken: set[str]):
        self.classes = classes  # module path -> PyTorch class
        self.groups: list[Group] = []
        self.group_of: dict[tuple, Group] = {}
        self.names = set(taken) | {"ms", "nn", "ops", "Parameter", "initializer"}

    def base_name(self, s: Scope) -> str:
        """The PyTorch class of ``s``, else a name made from its attribute."""
        base = (
            (self.classes.get(s.module) or "").lstrip("_")
            or "".join(p[:1].upper() + p[1:] for p in snake(s.attr).split("_"))
            or "Block"
        )
        return base if base.isidentifier() and base[0].isalpha() else f"Block{base}"

    def add(self, s: Scope) -> None:
        """Put the rendered instance ``s`` in the class of its code, a new one if none has it."""
        base = stem = self.base_name(s)
        if any(isinstance(p, str) and f"nn.{base}(" in p for line in s.body.init for p in line):
            stem += "Block"  # a class around MindSpore's layer of the same name (a padded MaxPool2d)
        key = (base, tuple(s.body.signature))
        g = self.group_of.get(key) or self._optional(base, s)
        if g is None:
            n = sum(1 for x in self.groups if x.base == base)
            name = stem if n == 0 else f"{stem}{n + 1}"
            while name in self.names:
                name += "_"
            self.names.add(name)
            g = Group(name, base, [], key)
            self.group_of[key] = g
            self.groups.append(g)
        self.group_of[key] = g
        g.instances.append(s)
        s.group = g
        if g.optional and g.optional in optional.children(s.body):
            s.optional = optional.ctor(s, g.optional)

    def _optional(self, base: str, s: Scope) -> Group | None:
        """The class ``s`` joins as an instance with or without its optional child, if one."""
        for g in self.groups:
            if g.base != base:
                continue
            found = optional.match(g.rep, s, g.optional)
            if found is None:
                continue
            attr, _ = found
            if g.optional is None:  # the child becomes optional: the instances that have it pass it
                g.optional = attr
                for t in g.instances:
                    if attr in optional.children(t.body):
                        t.optional = optional.ctor(t, attr)
            return g
        return None

    # --- constructor arguments ---
    @staticmethod
    def literals(s: Scope) -> list[Lit]:
        """The numbers and strings of ``s``'s code in order (its optional child's are the caller's)."""
        skip = f"self.{s.group.optional} = " if s.group and s.group.optional else None
        return line_literals([line for line in s.body.init if line[0] != skip] + s.body.construct)

    def finish(self, g: Group) -> None:
        """Name ``g``'s constructor arguments, give each instance its values, write its code."""
        vectors = [self.literals(s) for s in g.instances]
        n = len(vectors[0])
        varying = [k for k in range(n) if len({v[k].text for v in vectors}) > 1]
        # one namespace per class: a constructor argument is stored as ``self.<name>`` when
        # construct reads it, so it takes no name of the class's own attributes or a Cell's
        namer = Namer({"self", *CELL_NAMES, *g.rep.body.attributes})
        by_values: dict[tuple, list[tuple[str, str]]] = {}  # values -> [(kind, parameter)]
        for k in varying:
            hint = vectors[0][k].hint
            values = tuple(v[k].text for v in vectors)
            kind = "channels" if "channels" in hint else hint
            # one argument for equal values of one kind (conv1's out_channels, conv2's in_channels); a
            # size in construct (a reshape target) takes a layer's argument of equal values
            known = by_values.setdefault(values, [])
            same = [p for kd, p in known if kd == kind or not (named(kd) and named(kind))]
            if same:
                g.param_of[k] = same[0]
                continue
            owner = vectors[0][k].owner
            # a second out_channels is conv3_out_channels, not out_channels_1
            name = namer(f"{owner}_{hint}" if owner and snake(hint) in namer.taken else hint)
            g.params.append(name)
            g.param_of[k] = name
            known.append((kind, name))
        first = {}
        for k in varying:
            first.setdefault(g.param_of[k], k)
        for s, vec in zip(g.instances, vectors):
            s.args = [vec[first[p]].text for p in g.params]
        hints = {g.param_of[k]: vectors[0][k].hint for k in varying}
        for j, p in enumerate(g.params):  # a layer keyword most instances give one value: its default (stride=1)
            value, n = Counter(s.args[j] for s in g.instances).most_common(1)[0]
            if hints[p] in ORDER and 2 * n > len(g.instances):
                g.defaults[p] = value
        g.lines = class_lines(g.rep, g)


def line_literals(lines: list[list]) -> list[Lit]:
    out = []
    for line in lines:
        for p in line:
            if isinstance(p, Lit):
                out.append(p)
            elif isinstance(p, Opt):
                out += [q for q in p.value if isinstance(q, Lit)]
            elif isinstance(p, ChildRef):
                out += [Lit(a, h, p.scope.attr) for a, h in zip(p.scope.args, p.scope.group.params)]
                if p.scope.optional is not None:
                    out += line_literals([p.scope.optional])
    return out


def class_lines(s: Scope, g: Group | None) -> list[str]:
    """The class's source (logical lines, indented), literals that vary replaced by parameters."""
    k = 0
    attrs_needed = []

    def text(line: list, in_init: bool) -> str:
        nonlocal k
        out = ""
        for p in line:
            if isinstance(p, Opt):
                is_arg = any(g and g.param_of.get(k + j) for j in range(sum(isinstance(q, Lit) for q in p.value)))
                value = text(p.value, in_init)
                if is_arg or value != p.default:
                    out += f", {p.key}={value}"
            elif isinstance(p, Lit):
                name = g.param_of.get(k) if g else None
                if name and not in_init and name not in attrs_needed:
                    attrs_needed.append(name)
                out += p.text if name is None else (name if in_init else f"self.{name}")
                k += 1
            elif isinstance(p, ChildRef):  # by keyword: Bottleneck(in_channels=256, out_channels=64)
                args = []
                for key, a in zip(p.scope.group.params, p.scope.args):
                    name = g.param_of.get(k) if g else None
                    if name is not None or p.scope.group.defaults.get(key) != a:
                        args.append(f"{key}={a if name is None else name}")
                    k += 1
                if p.scope.optional is not None:
                    args.append(f"{p.scope.group.optional}={text(p.scope.optional, in_init)}")
                out += f"{p.scope.group.name}({', '.join(args)})"
            else:
                out += p
        return repeated_cells(out.replace("(, ", "("))

    opt = g.optional if g else None
    init = [f"self.{opt} = {opt}" if line[0] == f"self.{opt} = " else text(line, True) for line in s.body.init]
    construct = [text(line, False) for line in s.body.construct]
    params = [p for p in g.params if p not in g.defaults] if g else []
    params += [f"{p}={g.defaults[p]}" for p in g.params if p in g.defaults] if g else []
    params += [f"{opt}=None"] if opt else []
    if opt:
        construct = optional_call(construct, optional.without(s.body, opt))
    out = [f"    def __init__(self{''.join(', ' + p for p in params)}):", "        super().__init__()"]
    out += [f"        self.{a} = {a}" for a in attrs_needed]
    out += [f"        {line}" for line in init]
    out += ["", f"    {construct[0]}"] + [f"        {line}" for line in construct[1:]]
    return out


CELL_LISTS = ("nn.CellList", "nn.SequentialCell")


def repeated_cells(line: str) -> str:
    """``nn.CellList([Layer(), Layer(), Layer()])`` as mindcv writes it: ``nn.CellList([Layer() for _ in
    range(3)])``, where three or more items are written the same (24 decoder layers, a stage of
    equal blocks); outer lists first, then what is left inside them."""
    while any(f"{cells}([" in line for cells in CELL_LISTS):
        try:
            tree = ast.parse(line)
        except SyntaxError:  # not a whole statement (a ``def`` line)
            return line
        lists = [
            n.args[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and ast.unparse(n.func) in CELL_LISTS
            and len(n.args) == 1
            and isinstance(n.args[0], ast.List)
            and len(n.args[0].elts) >= 3
            and len({ast.dump(e) for e in n.args[0].elts}) == 1
        ]
        if not lists:
            return line
        items = lists[0]
        start, end = (
            _offset(line, items.lineno, items.col_offset),
            _offset(line, items.end_lineno, items.end_col_offset),
        )
        first = ast.get_source_segment(line, items.elts[0])
        line = f"{line[:start]}[{first} for _ in range({len(items.elts)})]{line[end:]}"
    return line


def _offset(text: str, lineno: int, col: int) -> int:
    """The character index of ``ast``'s (line, UTF-8 byte column) position in ``text``."""
    lines = text.splitlines(keepends=True)
    head = "".join(lines[: lineno - 1])
    return len(head) + len(lines[lineno - 1].encode()[:col].decode())


def optional_call(construct: list[str], w: optional.Without) -> list[str]:
    """``construct`` with the optional child called only when it is there."""
    lines = [f"{w.out} = {w.x}", f"if self.{w.attr} is not None:", f"    {w.out} = self.{w.attr}({w.x})"]
    return construct[: w.call_line] + lines + construct[w.call_line + 1 :]
