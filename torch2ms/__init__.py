"""torch2ms: PyTorch -> ONNX -> MindSpore, checked against PyTorch at every stage."""

__version__ = "0.1.0"
