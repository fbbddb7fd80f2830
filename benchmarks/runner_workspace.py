"""How often the runner and the workspace hand control to each other while ``torch2ms convert``
converts one recipe: a trace of the calls between ``pipeline/runner.py`` and
``pipeline/workspace.py`` (and the run context, ``pipeline/context.py``, which asks the workspace
for stage folders), in one process (``--one-process``).

Usage: ``.venv/bin/python benchmarks/runner_workspace.py RECIPE [--out DIR]``

A "hand-over" is a call from a frame of one file into a function of the other. The trace also
counts calls back from the workspace into the runner, which the layering forbids (none expected),
and lists, in order, which workspace function the runner (or the context) called for which stage.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = {"runner": "pipeline/runner.py", "context": "pipeline/context.py", "workspace": "pipeline/workspace.py"}


def _which(filename: str) -> str | None:
    for role, tail in FILES.items():
        if filename.endswith(tail):
            return role
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="output root (default: a temporary folder)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "tests"))  # a test recipe's tiny_models
    from torch2ms.cli import main as cli

    calls: Counter = Counter()
    order: list[str] = []

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee, caller = _which(frame.f_code.co_filename), frame.f_back and _which(frame.f_back.f_code.co_filename)
        if callee and caller and callee != caller:
            calls[(caller, callee)] += 1
            if callee == "workspace":
                order.append(f"{caller} -> {frame.f_code.co_name}")

    out = args.out or Path(tempfile.mkdtemp(prefix="runner-workspace-"))
    sys.setprofile(profile)
    try:
        cli(["convert", "--recipe", str(args.recipe), "--out", str(out), "--one-process"])
    except SystemExit as e:
        code = e.code or 0
    else:
        code = 0
    finally:
        sys.setprofile(None)
    for (caller, callee), n in sorted(calls.items()):
        print(f"{caller} -> {callee}: {n} calls")
    print(f"workspace -> runner: {calls[('workspace', 'runner')]} calls")
    print("runner/context -> workspace, in order (consecutive repeats folded):")
    folded: list[list] = []
    for o in order:
        if folded and folded[-1][0] == o:
            folded[-1][1] += 1
        else:
            folded.append([o, 1])
    for o, n in folded:
        print(f"  {o}" + (f" x{n}" if n > 1 else ""))
    return code


if __name__ == "__main__":
    sys.exit(main())
