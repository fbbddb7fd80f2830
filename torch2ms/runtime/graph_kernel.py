"""Graph-kernel fusion settings and failures: the one place the flags string is built, and what a
failed build says about the fused kernel that broke it.

MindSpore 2.10 reads its graph-kernel flags from ``MS_DEV_GRAPH_KERNEL_FLAGS`` when it compiles a
graph (``set_context(graph_kernel_flags=...)`` is deprecated for it, mindspore/context.py). The flags
are ``--name=value`` tokens; a list takes comma-separated op types. The recipe gives them as
``compile.graph_kernel_flags`` (a string, as written) and as ``compile.fusion``'s typed fields; both
render into one string here, and the compile stage's retry rule adds its op types to
``--disable_cluster_ops``. Their grammar (``parse_flags``, ``typed_flags``) is the recipe's, which
checks a recipe's flags when it loads (``recipe.stages``). Flag names: the MindSpore graph-kernel fusion tutorial
(https://mindspore.cn/tutorials/experts/en/r2.1/optimize/graph_fusion_engine.html) and the flags
parser of 2.10 (``enable_cluster_ops``, ``disable_cluster_ops``, ``disable_expand_ops``,
``disable_fusion_pattern``, ``opt_level`` in libmindspore_hardware_abstract.so).

AKG compiles each fused kernel in a build server and its worker processes, which log the error on
their stdout; MindSpore's exception says only ``Response is empty``. So a build's output (file
descriptors 1 and 2, which the server inherits) is captured (``captured_output``) and a failure is
read from both (``describe_failure``): the fused kernel (``Fused_Gather_split_123``), its op types
(the kernel description's ops, else the names in the kernel's name), the scope of its first op
(``Default/bert-BertModel/.../Select-op12``) and so the PyTorch module path (network.py mirrors the
module tree: ``bert.encoder``), and the first line of the error. A failure in MindSpore's own pass,
before any kernel is named, gives the pass's source line (``raised_in``) and, where its text is one
of ``UNNAMED_FAILURES``, the op types that cause it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile

from torch2ms.recipe.stages import LIST_FLAGS, parse_flags, typed_flags

_FUSED = re.compile(r"\b(Fused_[A-Za-z0-9_]*?_fusion(?:_\d+)?)\b|\b(Fused_[A-Za-z0-9_]+)\b")
_SCOPE = re.compile(r"\b(Default(?:/[\w.-]+)+)")
_ARGS = "Compile error, args: "
_ERROR_LINE = re.compile(r"error|exception|failed|not support", re.IGNORECASE)
_CC_FRAME = re.compile(r"(mindspore/ccsrc/[\w/.-]+\.cc:\d+ \w+)")

# Failures of MindSpore's own graph-kernel passes that name no fused kernel, by the error's text, with
# the op types whose clusters raise them (each found by keeping op types out of the clusters one by one
# on MindSpore 2.10's CPU; tests/stages/test_fusion_failure.py builds one):
# - graph_fusion/convert_data_type.cc CastTensor, "Not supported convert Int32 to Int64": a cluster
#   holding an Equal whose bool result is cast to int32 and on to int64 (RoBERTa's position ids).
UNNAMED_FAILURES = {"Not supported convert Int32 to Int64": ("Equal",)}


def flags(spec, rule: dict | None = None) -> str:
    """MS_DEV_GRAPH_KERNEL_FLAGS for a compile spec: ``graph_kernel_flags``, then ``fusion``'s fields,
    then a retry ``rule`` (``{"disable_cluster_ops": [...]}``) merged into the lists it extends."""
    merged = {**parse_flags(spec.graph_kernel_flags), **typed_flags(spec.fusion)}
    for name, ops in (rule or {}).items():
        have = [o for o in merged.get(name, "").split(",") if o]
        merged[name] = ",".join(dict.fromkeys([*have, *ops]))
    return " ".join(f"--{k}={v}" for k, v in merged.items())


def rules(spec, rule: dict | None = None) -> dict:
    """The fusion rules in force as lists and numbers: what compile.json records and the bundle's
    board switch file is written from."""
    parsed = parse_flags(flags(spec, rule))
    out: dict = {name: parsed[name].split(",") for name in LIST_FLAGS if parsed.get(name)}
    if "opt_level" in parsed:
        out["opt_level"] = int(parsed["opt_level"])
    return out


_CAPTURE: dict = {}  # a file per descriptor for the process: AKG's build server keeps the descriptors it got


@contextlib.contextmanager
def captured_output():
    """Yields a list that holds, after the block, what was written to file descriptors 1 and 2 during
    it by this process and the AKG processes it starts (AKG's build server logs its errors to its
    stdout); each text goes on to where it was going. One file per descriptor serves every capture:
    MindSpore starts its AKG build server at the first graph-kernel build, and that server keeps
    writing to the descriptors it inherited."""
    box: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved, starts = {}, {}
    for fd in (1, 2):
        if fd not in _CAPTURE:
            _CAPTURE[fd] = tempfile.TemporaryFile(mode="w+b")
        saved[fd] = os.dup(fd)
        starts[fd] = os.lseek(_CAPTURE[fd].fileno(), 0, os.SEEK_END)
        os.dup2(_CAPTURE[fd].fileno(), fd)
    try:
        yield box
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
            src = _CAPTURE[fd].fileno()
            end = os.fstat(src).st_size
            data = os.pread(src, end - starts[fd], starts[fd]) if end > starts[fd] else b""
            os.write(fd, data)
            box.append(data.decode(errors="replace"))


def fused_op_types(fused_op: str) -> list[str]:
    """``Fused_Select_Add_fusion_123`` -> ``["Select", "Add"]``: the op types a fused kernel's name lists."""
    core = re.sub(r"_fusion(?:_\d+)?$", "", fused_op.removeprefix("Fused_"))
    return [p for p in core.split("_") if re.fullmatch(r"[A-Z][A-Za-z0-9]*", p)]


def module_path(scope: str) -> str:
    """``Default/bert-BertModel/encoder-BertEncoder/Select-op12`` -> ``bert.encoder``: the attribute
    names of the cells above the op (MindSpore writes ``<attribute>-<Class>`` per cell)."""
    parts = scope.split("/")[1:-1]
    return ".".join(p.split("-", 1)[0] for p in parts if "-" in p)


def _kernel_json(text: str) -> dict | None:
    """The kernel description AKG's ``Compile error, args: {...}`` carries, when it is whole."""
    at = text.find(_ARGS)
    if at < 0:
        return None
    try:
        desc, _ = json.JSONDecoder().raw_decode(text, at + len(_ARGS))
    except ValueError:
        return None
    return desc if isinstance(desc, dict) else None


def describe_failure(error: BaseException, log: str) -> dict:
    """What a failed graph-kernel build says: the fused kernel, its op types, the scope of its first
    op and the module path, the first error line (AKG's log, else the exception's first line)."""
    text = f"{log}\n{error}"
    desc = _kernel_json(text) or {}
    fused = desc.get("op") or next((m.group(1) or m.group(2) for m in _FUSED.finditer(text)), None)
    ops = [o.get("name") for o in desc.get("op_desc", []) if isinstance(o, dict) and o.get("name")]
    scopes = [o.get("ptr_address") for o in desc.get("op_desc", []) if isinstance(o, dict)]
    scope = next((sc for sc in scopes if isinstance(sc, str) and sc.startswith("Default")), None)
    if scope is None:
        found = _SCOPE.search(text, text.find(fused) if fused else 0) or _SCOPE.search(text)
        scope = found.group(1) if found else None
    said = str(error).strip().splitlines()
    said = said[0] if said else type(error).__name__
    first = next((ln.strip() for ln in log.splitlines() if _ERROR_LINE.search(ln)), said)
    frame = _CC_FRAME.search(text)
    op_types = list(dict.fromkeys(ops)) or (fused_op_types(fused) if fused else [])
    if not fused:
        op_types = next((list(o) for known, o in UNNAMED_FAILURES.items() if known in text), op_types)
    return {
        "fused_op": fused,
        "fused_from": desc.get("node_name"),
        "op_types": op_types,
        "scope": scope,
        "module": module_path(scope) if scope else None,
        "raised_in": frame.group(1) if frame else None,
        "akg_error": first[:500],
        "exception": f"{type(error).__name__}: {said}"[:500],
    }
