"""The bundle lint: every flag and config key the bundle's board-tool files write, checked
against ``vendor_flags`` (what the documentation allows, and where it says so).

Which file is which tool's: ``targets/<board>/atc.sh`` (the ``atc`` command line),
``converter_lite.sh`` (the converter's), ``converter_lite*.cfg`` (INI sections and keys),
``amct_quant.cfg`` (AMCT's text protobuf), ``aipp*.cfg`` (``aipp_op`` fields). Shell values that
come from the environment (``"$SOC"``, ``"${AIPP_CFG:-...}"``) are paths or names the user
chooses and pass as such; a flag with listed values must be written literally.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from torch2ms.bundle import vendor_flags as vf
from torch2ms.errors import CheckFailed

TOOLS = {"atc.sh": ("atc", vf.ATC), "converter_lite.sh": ('"$CONVERTER"', vf.CONVERTER_LITE)}


def _check(where: str, name: str, value: str, allowed: vf.Allowed | None) -> list[str]:
    if allowed is None:
        return [f"{where}: {name} is not in the table of documented flags and keys (bundle/vendor_flags.py)"]
    ok = (
        value in allowed.values
        if allowed.values is not None
        else re.fullmatch(allowed.pattern, value) is not None
        if allowed.pattern
        else bool(value)
    )
    return [] if ok else [f"{where}: {name}={value!r}: the documentation allows {allowed.describe()} ({allowed.page})"]


def _command(text: str, command: str) -> list[str]:
    """The tokens after ``command`` on its (continued) line of a shell script."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        if line.strip().startswith(command + " "):
            return shlex.split(line.strip()[len(command) :])
    return []


def lint_script(where: str, text: str, command: str, table: dict) -> list[str]:
    problems = []
    tokens = _command(text, command)
    if not tokens:
        return [f"{where}: no `{command}` command line found"]
    for token in tokens:
        name, _, value = token.partition("=")
        if name in table and table[name].values is None and value.startswith("$"):
            continue  # a path the environment may override
        problems += _check(where, name, value, table.get(name))
    return problems


def lint_ini(where: str, text: str) -> list[str]:
    problems, section = [], None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            if section not in vf.CONVERTER_LITE_CFG:
                problems.append(f"{where}:{n}: section {section!r} is not in the table (bundle/vendor_flags.py)")
            continue
        key, _, value = line.partition("=")
        keys = vf.CONVERTER_LITE_CFG.get(section or "", {})
        problems += _check(f"{where}:{n}, section {section}", key, value, keys.get(key))
    return problems


def lint_proto(where: str, text: str, table: dict, block: str | None = None) -> list[str]:
    """Text protobuf (``key: value`` fields, ``name {`` ... ``}`` messages): fields by their path
    (``common_config.arq_quantize.channel_wise``); inside ``block`` (AIPP's ``aipp_op``) only."""
    problems, path = [], []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.endswith("{"):
            path.append(line[:-1].strip())
            continue
        if line == "}":
            path.pop()
            continue
        key, _, value = (s.strip() for s in line.partition(":"))
        inner = path[1:] if block is not None and path[:1] == [block] else path
        problems += _check(f"{where}:{n}", ".".join([*inner, key]), value, table.get(".".join([*inner, key])))
    return problems


def board_file(name: str) -> bool:
    """Whether the bundle path ``name`` is a board-tool file: under ``targets/``, or a graph's
    ``<graph>/targets/`` in a generation bundle."""
    return "targets" in PurePosixPath(name).parts[:2]


def lint_files(files: dict[str, bytes | str]) -> list[str]:
    """Every problem in the bundle's board-tool files (``files``: bundle path -> content)."""
    problems = []
    for name, content in sorted(files.items()):
        path = PurePosixPath(name)
        if not board_file(name):
            continue
        text = content.decode() if isinstance(content, bytes) else content
        if path.name in TOOLS:
            problems += lint_script(name, text, *TOOLS[path.name])
        elif path.name.startswith("converter_lite") and path.suffix == ".cfg":
            problems += lint_ini(name, text)
        elif path.name == "amct_quant.cfg":
            problems += lint_proto(name, text, vf.AMCT)
        elif path.name.startswith("aipp") and path.suffix == ".cfg":
            problems += lint_proto(name, text, vf.AIPP, block="aipp_op")
    return problems


def raise_for(problems: list[str], what: str) -> None:
    if problems:
        raise CheckFailed(
            f"{what}: {len(problems)} board-tool setting(s) the documentation does not allow:\n  "
            + "\n  ".join(problems),
            hint="a torch2ms bug: add the flag with its documented values to bundle/vendor_flags.py, or fix the writer",
        )
