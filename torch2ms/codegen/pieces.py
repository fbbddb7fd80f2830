"""Code as pieces: a generated line split into fixed text and the literals in it (``Lit``), so that
instances of one class can be compared and their differing numbers turned into constructor
arguments; and ``rename``, which rewrites the variables and ``self.<attr>`` references of a flat
statement into a class's local names.

The tables name the arguments of the layers converters declare (a literal's hint: what its
constructor argument is called) and MindSpore's defaults of their keywords (a keyword at its
default in every instance is left out).
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch2ms.converters.api import literal
from torch2ms.graph.names import snake

if TYPE_CHECKING:
    from torch2ms.codegen.scopes import Scope

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


def tokens_safe(text: str) -> list:
    try:
        return tokens(text)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


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


def named(hint: str) -> bool:
    """A hint that names what the value is (a layer argument), not only where it is used."""
    return hint == "channels" or hint in NAMED


@dataclass
class Lit:
    """A number or string in a class's code: a constructor argument where instances differ."""

    text: str
    hint: str
    # the attribute of the layer it is an argument of (conv3), to tell two hints apart
    owner: str = field(default="", compare=False)


def owned(line: list, owner: str) -> list:
    """``line`` with its literals (those of its keywords too) marked as arguments of ``owner``."""
    for p in line:
        for q in p.value if isinstance(p, Opt) else [p]:
            if isinstance(q, Lit):
                q.owner = owner
    return line


@dataclass
class ChildRef:
    """The construction of a child's class (``Bottleneck(...)``), its arguments known after grouping."""

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


def _hint(stack: list) -> str:
    """The name of the argument a literal is, from the innermost call around it that says."""
    for callee, idx, kw in reversed(stack):
        if kw:
            return kw
        if callee:
            names = POSITIONAL.get(callee, ())
            return names[idx] if idx < len(names) else snake(callee.split(".")[-1]) or "value"
    return "value"


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
        elif t.string == ")" and stack:
            stack.pop()
        elif t.string == "," and stack:
            stack[-1][1] += 1
            stack[-1][2] = None
        elif t.type == tokenize.NAME and k + 1 < len(toks) and toks[k + 1].string == "=" and stack:
            stack[-1][2] = t.string
        if t.type in (tokenize.NUMBER, tokenize.STRING):
            out += [line[pos:begin], Lit(t.string, _hint(stack))]
            pos = end
    out.append(line[pos:])
    return [p for p in out if p != ""]
