"""torch2ms: PyTorch -> ONNX -> MindSpore, checked against PyTorch at every stage.

The public API for converter plugins (docs/custom_ops.md), imported on first use so that
``import torch2ms`` stays cheap: ``converter`` (the decorator), ``Emitter`` (a node's inputs,
shapes and constants; its ONNX attributes arrive as the converter's keyword arguments),
``Unsupported``, ``literal``, and ``AotKernel`` / ``AscendKernel`` (a C++ kernel as
``ops.Custom(func_type="aot")``). A converter returns the Python expression of the node's output.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "converter": "torch2ms.converters.api",
    "Emitter": "torch2ms.converters.api",
    "Unsupported": "torch2ms.converters.api",
    "literal": "torch2ms.converters.api",
    "AotKernel": "torch2ms.custom.aot",
    "AscendKernel": "torch2ms.custom.aot",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'torch2ms' has no attribute {name!r}")
