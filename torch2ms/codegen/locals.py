"""The local names of one ``construct``: unique names after ops and children, and the PyTorch
``forward``'s own names where it gives them (``torch2ms.export.roles``).

A PyTorch name is written as PyTorch writes it, rebound as its ``forward`` rebinds it:
``out = self.conv1(x)``, ``out = self.conv2(out)``, ``out = out + identity``. A value takes over a
name only when nothing reads the value the name holds any more, so every value is still the one
its name holds where it is read; a name takes a suffix (``out_1``) where two of its values are
live at once. Each top-level assignment of a name is counted (an argument is the first), so
``tensor_map.json`` can say which assignment of ``out`` computes a tensor
(``torch2ms.codegen.linemap``, ``torch2ms.divergence.probe``).
"""

from __future__ import annotations

import ast
import re
from collections import Counter

from torch2ms.graph.names import Namer


class Locals:
    """Names for one instance's variables (builder variable -> local name)."""

    def __init__(self, namer: Namer, roles: dict | None, keep: set[str]):
        self.names = namer
        self.children: dict[str, str] = (roles or {}).get("children", {})
        self.ops: list[list[str]] = (roles or {}).get("ops", [])
        self.ops_at = 0  # own statements take the forward's op names in source order
        self.keep = keep  # variables the instance returns: their names are never given up
        self.local: dict[str, str] = {}
        self.holder: dict[str, set[str]] = {}  # local name -> the variables it holds now
        self.pending: Counter = Counter()  # variable -> statements and calls still to read it
        self.assigned: Counter = Counter()  # local name -> its top-level assignments so far

    def will_read(self, variables) -> None:
        """One statement or call of the instance, in the order they are written, reads these."""
        for v in set(variables):
            self.pending[v] += 1

    def reading(self, variables) -> None:
        """The statement or call being written reads ``variables``: they are read once less."""
        for v in set(variables):
            self.pending[v] -= 1

    def argument(self, v: str, name: str) -> str:
        self.local[v] = name
        self.holder[name] = {v}
        self.assigned[name] += 1
        return name

    def op_role(self, op_type: str) -> str | None:
        """The forward's name for the next own statement of ``op_type`` (matched in source order)."""
        for k in range(self.ops_at, len(self.ops)):
            if self.ops[k][0] == op_type:
                self.ops_at = k + 1
                return self.ops[k][1]
        return None

    def bind(self, v: str, base: str, role: bool = False) -> str:
        """A name for ``v``: a role name (``role``) rebinds one of its own family (``out``,
        ``out_1``) whose values nothing reads any more."""
        name = None
        if role:
            family = re.compile(rf"{re.escape(base)}(_\d+)?")
            free = (n for n, held in self.holder.items() if family.fullmatch(n) and all(map(self._done, held)))
            name = next(free, None)
        name = name or self.names(base)
        self.local[v] = name
        self.holder[name] = {v}
        return name

    def _done(self, v: str) -> bool:
        """Nothing reads ``v`` any more."""
        return self.pending[v] <= 0 and v not in self.keep

    def alias(self, v: str, name: str) -> None:
        """``v = name``: no statement, ``v`` is the value ``name`` holds."""
        self.local[v] = name
        self.holder.setdefault(name, set()).add(v)

    def assign(self, targets: list[str]) -> list[int]:
        """A top-level line assigns ``targets``: the index of each one's assignment (0 = first)."""
        out = []
        for t in targets:
            if t != "_":
                self.assigned[t] += 1
            out.append(self.assigned[t] - 1 if t != "_" else -1)
        return out

    def current(self, name: str) -> int:
        """The index of the assignment ``name`` holds now."""
        return max(self.assigned[name] - 1, 0)


def assignments(fn: ast.FunctionDef) -> list[tuple[str, ast.stmt | None]]:
    """(name, statement) for each assignment of a name in ``construct``, in order: its arguments
    first (statement None), then its top-level assignments. The k-th of one name is the k-th
    assignment ``tensor_map.json``'s ``assign`` counts (``Locals``, above), which the line map
    (``codegen.linemap``) and divergence's probe (``divergence.probe._hook_assignments``) follow."""
    out: list[tuple[str, ast.stmt | None]] = [(a.arg, None) for a in fn.args.args[1:]]
    for st in fn.body:
        if isinstance(st, ast.Assign):
            out += [(n.id, st) for t in st.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return out
