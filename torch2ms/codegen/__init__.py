"""Generate readable MindSpore source (one statement per node) and its weights from the IR."""

from torch2ms.codegen.builder import CodeBuilder, GeneratedNetwork, generate

__all__ = ["CodeBuilder", "GeneratedNetwork", "generate"]
