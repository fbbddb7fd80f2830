"""The graph torch2ms works on: ONNX loaded with static shapes and shape arithmetic folded."""

from torch2ms.graph.ir import Graph, Node, Value
from torch2ms.graph.load import load_onnx
from torch2ms.graph.validate import SUPPORTED_OPSETS

__all__ = ["Graph", "Node", "Value", "load_onnx", "SUPPORTED_OPSETS"]
