"""The stages, in pipeline order: the one list a new stage is added to."""

from __future__ import annotations

from torch2ms.pipeline import stage
from torch2ms.pipeline.runner import Runner
from torch2ms.pipeline.stage import Stage
from torch2ms.stages.checks import PipelineChecks
from torch2ms.stages.compile import CompileStage
from torch2ms.stages.export import ExportStage
from torch2ms.stages.fold import FoldStage
from torch2ms.stages.mindir import MindirStage
from torch2ms.stages.rebuild import RebuildStage

PIPELINE: list[type[Stage]] = [ExportStage, RebuildStage, FoldStage, CompileStage, MindirStage]


def stage_names(pipeline: list[type[Stage]] | None = None) -> tuple[str, ...]:
    return tuple(cls.name for cls in (PIPELINE if pipeline is None else pipeline))


def localized_stages() -> tuple[str, ...]:
    """The stages whose network.py ``torch2ms diff`` compares with onnxruntime."""
    return tuple(cls.name for cls in PIPELINE if cls.localize)


def pipeline_stages() -> list[Stage]:
    """A fresh Stage object for each class of ``PIPELINE``, in order."""
    return [cls() for cls in PIPELINE]


def pipeline_runner(recipe, out_root=None, **options) -> Runner:
    """A ``Runner`` over a fresh ``PIPELINE`` and its checks (``PipelineChecks``): how a recipe is
    converted (the commands, the zoo, the bench, the tests). ``options`` are the runner's (``log``,
    ``on_stage``, ``own_processes``); the pipeline layer never picks its stages or checks itself."""
    return Runner(recipe, out_root, stages=pipeline_stages(), checks=PipelineChecks(), **options)


def writer_of(artifact: str, recipe, stages: list[Stage] | None = None, first: bool = False) -> str:
    """``pipeline.stage.writer_of`` over ``stages`` (default: ``PIPELINE``'s)."""
    return stage.writer_of(artifact, recipe, pipeline_stages() if stages is None else stages, first)


__all__ = [
    "PIPELINE",
    "PipelineChecks",
    "stage_names",
    "localized_stages",
    "pipeline_stages",
    "pipeline_runner",
    "writer_of",
]
