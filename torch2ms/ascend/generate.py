"""Regenerate ``ascend310.json``, the derived op-placement facts, from their two public sources.

* **AI Core**: CANN's op-info file for the chip,
  ``op_impl/built-in/ai_core/tbe/config/ascend310/aic-ascend310-ops-info.json`` (in a CANN
  install under ``.../opp/``, or in a public copy such as the repository gekowa/ascend-opp). Per
  op, the data types its ``input0`` accepts; an op whose inputs carry no dtype list
  (``dynamicFormat``) chooses its dtypes and formats at compile time: recorded as
  ``"select_format"``. Formats are not kept: ATC inserts the layout transfers (TransData) itself.
* **AI CPU**: the AI CPU kernels MindSpore registers for Ascend, ``mindspore/ops/_op_impl/aicpu``
  in the installed wheel (``AiCPURegOp("Name")`` and its ``dtype_format`` rows), read as text.

Only facts are written, never the files::

    python -m torch2ms.ascend.generate --ops-info aic-ascend310-ops-info.json \\
        --ops-info-source "gekowa/ascend-opp@5c28a2f"

Without ``--ops-info`` the AI Core section already in the table is kept and only the AI CPU
section (and the MindSpore version) is refreshed from the installed wheel.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

TABLE = Path(__file__).with_name("ascend310.json")
DTYPE_NAMES = {"float": "float32", "double": "float64"}
# MindSpore's DataType.<X>_<Format> prefixes
MS_DTYPES = {
    "BOOL": "bool",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "BF16": "bfloat16",
    "C64": "complex64",
    "C128": "complex128",
}


def _dtypes(text: str) -> list[str]:
    seen: list[str] = []
    for d in text.split(","):
        d = DTYPE_NAMES.get(d.strip(), d.strip())
        if d and d not in seen:
            seen.append(d)
    return seen


def ai_core_ops(ops_info: dict) -> dict[str, list[str] | str]:
    """Op -> dtypes of its first input, or "select_format" (chosen at compile time)."""
    out: dict[str, list[str] | str] = {}
    for op, spec in sorted(ops_info.items()):
        first = spec.get("input0") or spec.get("output0") or {}
        out[op] = _dtypes(first["dtype"]) if "dtype" in first else "select_format"
    return out


_REG = re.compile(r'AiCPURegOp\(\s*"(\w+)"\s*\)')
_ROW = re.compile(r"\.dtype_format\(\s*DataType\.([A-Z0-9]+)_")


def ai_cpu_ops(aicpu_dir: Path) -> dict[str, list[str]]:
    """Op -> dtypes of the first input of MindSpore's AI CPU registrations in ``aicpu_dir``."""
    out: dict[str, list[str]] = {}
    for f in sorted(aicpu_dir.glob("*.py")):
        text = f.read_text()
        for m in _REG.finditer(text):
            rows = _ROW.findall(text[m.end() :].split("op_info_register", 1)[0])
            dts = out.setdefault(m.group(1), [])
            for r in rows:
                d = MS_DTYPES.get(r, r.lower())
                if d not in dts:
                    dts.append(d)
    return dict(sorted(out.items()))


def dump(table: dict) -> str:
    """The table as JSON with one line per op (reviewable diffs when a source changes)."""
    parts = []
    for key in sorted(table):
        value = table[key]
        if key in ("ai_core", "ai_cpu"):
            rows = [f"  {json.dumps(op)}: {json.dumps(v)}" for op, v in sorted(value.items())]
            parts.append(f"{json.dumps(key)}: {{\n" + ",\n".join(rows) + "\n }")
        else:
            parts.append(f"{json.dumps(key)}: " + json.dumps(value, indent=2, sort_keys=True).replace("\n", "\n "))
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def main(argv: list[str] | None = None) -> None:
    import mindspore

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops-info", type=Path, help="CANN aic-ascend310-ops-info.json")
    p.add_argument("--ops-info-source", default="", help="where that file came from (repository@commit, CANN version)")
    p.add_argument("--out", type=Path, default=TABLE)
    a = p.parse_args(argv)
    table = json.loads(a.out.read_text()) if a.out.exists() else {"provenance": {}}
    if a.ops_info:
        table["ai_core"] = ai_core_ops(json.loads(a.ops_info.read_text()))
        table["provenance"]["ai_core"] = {"file": a.ops_info.name, "source": a.ops_info_source, "subset": False}
    aicpu = Path(mindspore.__file__).parent / "ops" / "_op_impl" / "aicpu"
    table["ai_cpu"] = ai_cpu_ops(aicpu)
    table["provenance"]["ai_cpu"] = {
        "source": f"mindspore {mindspore.__version__} wheel, mindspore/ops/_op_impl/aicpu",
        "ops": len(table["ai_cpu"]),
    }
    a.out.write_text(dump(table))
    print(f"wrote {a.out}: {len(table.get('ai_core', {}))} AI Core ops, {len(table['ai_cpu'])} AI CPU ops")


if __name__ == "__main__":
    main()
