"""ONNX -> MindSpore converters, one module per op family; see ``registry``."""
