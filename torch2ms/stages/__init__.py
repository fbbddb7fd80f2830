"""The stages, in pipeline order: the one list a new stage is added to."""

from torch2ms.pipeline.stage import Stage
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


def writer_of(artifact: str, recipe, stages: list[Stage] | None = None, first: bool = False) -> str:
    """The stage whose folder holds ``artifact`` for ``recipe`` (model.onnx -> export): the last
    enabled stage of ``stages`` (default: ``PIPELINE``) that writes it, or with ``first`` the first
    one (network.py: the plain rebuild, before any folding). The one answer to "which stage writes
    X": the runner, the run context, the commands and the package use it."""
    stages = [cls() for cls in PIPELINE] if stages is None else stages
    writers = [st.name for st in stages if artifact in st.writes and st.enabled(recipe)]
    if not writers:
        raise KeyError(f"no enabled stage writes {artifact!r}")
    return writers[0] if first else writers[-1]


__all__ = ["PIPELINE", "stage_names", "localized_stages", "writer_of"]
