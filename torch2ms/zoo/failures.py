"""Why a zoo model failed, as data: a category and the blockers behind it, so that a summary can
say what to build next ("GridSample blocks 7 models") instead of listing long error strings.

Categories:

* ``unsupported-op``: a node has no converter, or an attribute value or opset the converter refuses;
  one blocker per op type and reason (``Resize: mode='cubic' not supported``);
* ``export``: the model could not be built, run or exported to ONNX (the export stage raised); the
  blocker is the kind of error (``torch.onnx.export: SymbolicValueError: Unsupported: ONNX export of
  operator adaptive_avg_pool2d``);
* ``numeric``: a stage ran but its outputs left the tolerance against PyTorch; the blocker is the
  first diverging op that ``diff`` named (``first diverging op: Resize``), or the stage when there is
  no generated code to localise in (export: onnxruntime against PyTorch);
* ``not-checkable``: a stage's outputs lie beyond ``check.ceiling`` within a widened bound and no
  evidence says every node is right (``pipeline.evidence``); the blocker is the stage;
* ``crash``: a stage after export raised, or the worker process died; the blocker is the stage and
  the exception type or signal;
* ``timeout`` / ``oom``: the launcher killed the worker, or a stage ran out of memory (``MemoryError``,
  MindSpore refusing a checkpoint larger than the memory available); the blocker is the stage.

The worker classifies what it caught (``from_exception``, ``from_check``); the launcher classifies
how the process ended (``from_exit``). ``blocker_table`` groups the blockers of a zoo's rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from torch2ms.zoo.files import read_json

CATEGORIES = ("unsupported-op", "export", "numeric", "not-checkable", "crash", "timeout", "oom")


@dataclass
class Failure:
    category: str
    blockers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"category": self.category, "blockers": self.blockers}


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


# ModelError messages of the export stage and the model loader, by what went wrong (the first match wins)
_EXPORT_KINDS: list[tuple[re.Pattern, str]] = [
    # the exporter's own words up to the first comma or period: "Unsupported: ONNX export of operator X"
    (re.compile(r"torch\.onnx\.export failed for \S+: (\w+): ([^,.\n]{0,90})"), "torch.onnx.export: {0}: {1}"),
    (re.compile(r"torch\.onnx\.export failed for \S+: (\w+)"), "torch.onnx.export: {0}"),
    (re.compile(r"the model raised on the recipe's inputs \([^)]*\): (\w+)"), "the model raised {0} on its inputs"),
    (re.compile(r"model\.factory: cannot import module '([\w.]+)'"), "factory module {0} cannot be imported"),
    (re.compile(r"model\.factory: .* raised (\w+)"), "the factory raised {0}"),
    (re.compile(r"the model returned"), "the model returns no tensors"),
    (re.compile(r"model\.checkpoint"), "the checkpoint cannot be loaded"),
]


def export_kind(message: str) -> str:
    """The kind of an export error, e.g. ``torch.onnx.export: SymbolicValueError: Unsupported: ONNX export of
    operator adaptive_avg_pool2d``."""
    for pattern, kind in _EXPORT_KINDS:
        m = pattern.search(message)
        if m:
            return kind.format(*(g.strip() for g in m.groups()))
    return _first_line(message)[:80]


def from_exception(err: BaseException, stage: str | None) -> Failure:
    """A stage (``stage``: the one running, None before the first) raised ``err``."""
    from torch2ms.errors import UnsupportedOpsError

    if isinstance(err, UnsupportedOpsError):
        seen: dict[str, None] = {}
        for p in err.problems:
            seen.setdefault(f"{p.op_type}: {p.reason}", None)
        return Failure("unsupported-op", list(seen) or [_first_line(err.message)])
    if stage in (None, "export"):
        return Failure("export", [export_kind(getattr(err, "message", None) or f"{type(err).__name__}: {err}")])
    cause = err.__cause__ if err.__cause__ is not None else err  # StageFailed wraps the real exception
    if isinstance(cause, MemoryError) or _OUT_OF_MEMORY.search(str(cause)):
        return Failure("oom", [f"oom in {stage}: {type(cause).__name__}"])
    return Failure("crash", [f"{stage}: {type(cause).__name__}"])


# Out of memory without the launcher's kill: MindSpore checks the memory available before it reads a
# checkpoint ("... exceeds current available memory 216551424 bytes"), e.g. alexnet's 244 MB while
# other jobs held the machine's memory.
_OUT_OF_MEMORY = re.compile(r"exceeds current available memory|out of memory|std::bad_alloc", re.I)


def from_check(stage: str, record: dict | None, stage_dir: Path) -> Failure:
    """A stage's outputs left the tolerance: its first diverging op from diff.json, when localised."""
    diff = read_json(stage_dir / "diff.json")
    first = (diff or {}).get("first") or {}
    wrong = (diff or {}).get("wrong") or {}
    if wrong.get("op"):  # the replay: wrong on onnxruntime's own inputs
        return Failure("numeric", [f"wrong node: {wrong['op']}"])
    if (diff or {}).get("accumulated"):
        return Failure("numeric", [f"{stage}: accumulated rounding past noise_factor x the bound, no node wrong"])
    if first.get("op"):
        return Failure("numeric", [f"first diverging op: {first['op']}"])
    violations = " ".join((record or {}).get("violations") or [])
    if "not finite" in violations or "reference output has" in violations:
        return Failure("numeric", ["PyTorch's own output is not finite"])
    if stage == "export":
        return Failure("numeric", ["export: onnxruntime differs from PyTorch"])
    if diff is not None:
        return Failure("numeric", [f"{stage}: out of tolerance, every tensor within tolerance of onnxruntime"])
    return Failure("numeric", [f"{stage}: out of tolerance (not localised)"])


def not_checkable(stage: str) -> Failure:
    """A stage passed only on a bound past check.ceiling, without per-node evidence."""
    return Failure("not-checkable", [f"{stage}: beyond check.ceiling, no per-node evidence"])


def from_exit(status: str, stage: str | None, how: str = "") -> Failure:
    """The launcher ended the worker (timeout, oom) or saw it die (crash: ``how`` it died)."""
    if status in ("timeout", "oom"):
        return Failure(status, [f"{status} in {stage}" if stage else f"{status} before the first stage"])
    where = stage or "before the first stage"
    return Failure("crash", [f"{where}: worker {how}" if how else f"{where}: worker died"])


def blocker_table(rows) -> list[dict]:
    """Each blocker with its category and the models it blocks, most models first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.passed or not r.category:
            continue
        for b in r.blockers or []:
            groups.setdefault((r.category, b), []).append(r.name)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    items = sorted(groups.items(), key=lambda kv: (-len(kv[1]), order.get(kv[0][0], 99), kv[0][1]))
    return [{"category": c, "blocker": b, "count": len(names), "models": names} for (c, b), names in items]


def category_counts(rows) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        if not r.passed:
            c = r.category or "unknown"
            out[c] = out.get(c, 0) + 1
    return out
