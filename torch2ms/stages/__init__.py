"""The five stages, in pipeline order."""

from torch2ms.stages.compile import CompileStage
from torch2ms.stages.export import ExportStage
from torch2ms.stages.fold import FoldStage
from torch2ms.stages.mindir import MindirStage
from torch2ms.stages.rebuild import RebuildStage

STAGE_CLASSES = [ExportStage, RebuildStage, FoldStage, CompileStage, MindirStage]

__all__ = ["STAGE_CLASSES", "ExportStage", "RebuildStage", "FoldStage", "CompileStage", "MindirStage"]
