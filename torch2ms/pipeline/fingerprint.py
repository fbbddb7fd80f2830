"""What a stage's fingerprint covers besides the recipe and its inputs: the tool and framework
versions, and a hash of torch2ms's own conversion code, so a fixed converter re-converts even at
the same version number.

The code hashed is an allowlist, ``CONVERSION_CODE``: the packages and modules whose bytes can
change what a stage writes or how it is judged. Everything else (the CLI, commands, zoo, bench,
packaging and tools such as the operator table and load-weights) is left out by
construction, so editing it does not re-convert a cached run. A new module at the package root is
outside the hash until it is added here; ``tests/pipeline/test_pipeline.py`` checks that every module the
stages import is inside.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from torch2ms import __version__

# onnxscript: the dynamo export path needs it ("absent" where it is not installed); ruff formats network.py
FRAMEWORKS = ("torch", "onnx", "onnxruntime", "onnxscript", "mindspore", "numpy", "ruff")

# Relative to the torch2ms package: a folder covers every file in it.
CONVERSION_CODE = (
    "__init__.py",  # the version
    "ascend",  # the fold stage's AI Core rewrites
    "bounds.py",
    "codegen",
    "compare.py",
    "custom",  # converter plugins and their AOT kernels
    "converters",
    "divergence",  # diff's replay and the evidence, which judge a stage
    "errors.py",
    "export",  # the exporter chain, the float32 noise floor, an ONNX file as the source
    "graph",
    "model_loader.py",
    "models",
    "passes",
    "pipeline",  # the runner and the check (diff's replay can accept accumulated rounding)
    "postprocess",  # the detection task's check
    "recipe",
    "runtime",  # building, running and timing the generated networks; the MindIR layout
    "samples.py",
    "stages",
    "tasks",
)
_HASHED_SUFFIXES = (".py", ".json")
_source_hash: str | None = None


def package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def conversion_files(root: Path) -> list[Path]:
    """The files of ``CONVERSION_CODE`` under the package ``root``, sorted."""
    files = []
    for entry in CONVERSION_CODE:
        path = root / entry
        found = path.rglob("*") if path.is_dir() else [path]
        files += [f for f in found if f.suffix in _HASHED_SUFFIXES and "__pycache__" not in f.parts and f.is_file()]
    return sorted(files)


def source_hash() -> str:
    """sha256 (16 hex digits) of torch2ms's conversion code (``CONVERSION_CODE``), by relative
    path and bytes; computed once per process."""
    global _source_hash
    if _source_hash is None:
        root = package_root()
        h = hashlib.sha256()
        for path in conversion_files(root):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        _source_hash = h.hexdigest()[:16]
    return _source_hash


def framework_versions() -> dict[str, str]:
    out = {"torch2ms": __version__, "torch2ms_source": source_hash()}
    for pkg in FRAMEWORKS:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def fingerprint(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
