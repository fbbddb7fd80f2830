"""Tests of the ONNX graph loader and the onnxruntime reference (``torch2ms.graph``); a package, so
that its modules' names do not shadow the other tests'."""
