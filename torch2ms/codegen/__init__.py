"""Generate readable MindSpore source (one statement per node) and its weights from the IR."""

from torch2ms.codegen.builder import CodeBuilder, GeneratedNetwork

__all__ = ["CodeBuilder", "GeneratedNetwork"]
