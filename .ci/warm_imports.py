"""Import every torch2ms module and the frameworks the suite uses, once, in one process.

`make venv` installs without uv's ``--compile-bytecode`` (which compiles all of a 9 GB environment)
and runs this instead, so the ``.pyc`` files of what the suite and ``make convert`` import are
written before pytest's workers start: two workers importing torch and MindSpore at the same moment
would otherwise both compile them. Timing: benchmarks/results/make_test.md.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

FRAMEWORKS = ("mindspore", "torch", "torchvision", "onnx", "onnxruntime", "transformers", "pytest", "xdist")


def main() -> int:
    start = time.perf_counter()
    import torch2ms

    failed = []
    for info in pkgutil.walk_packages(torch2ms.__path__, "torch2ms."):
        # the bundle template runs on the board, __main__ runs the CLI
        if ".templates" in info.name or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # an optional extra missing is not the set-up's business
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
    for name in FRAMEWORKS:
        importlib.import_module(name)
    print(f"warm imports: {len(sys.modules)} modules in {time.perf_counter() - start:.1f} s")
    for line in failed:
        print(f"  not imported: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
