"""A stage's record (``stage.json``) as a typed structure, and the floors one stage's record hands
the checks of the stages after it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class StageRecord:
    """What ``stage.json`` holds after a stage ran: its verdict, what it was fingerprinted on, the
    hashes of the artifacts it wrote, its cost and the check's measurements."""

    stage: str
    status: str  # passed | failed | not checkable
    fingerprint: str
    fingerprint_of: dict  # the fingerprint's payload: config, previous stage, inputs, versions
    artifacts: dict[str, str]  # file name -> sha256
    seconds: float  # the stage's run
    seconds_total: float  # run + check + localization
    memory: dict  # the memory while they ran (runtime memory.StageMemory)
    cpu_seconds: float  # of all the process's threads: what the stage cost on a machine shared with others
    metrics: list[dict] = field(default_factory=list)  # per output against PyTorch
    worst: dict | None = None
    bounds: dict = field(default_factory=dict)  # per output: the bound it was held to, and why
    batches: dict | None = None  # at each extra batch size: the worst output
    lengths: dict | None = None  # at each extra sequence length (inputs[].sequence): the worst output
    task: dict | None = None  # the recipe task's agreement with PyTorch
    violations: list[str] = field(default_factory=list)
    diff: str | None = None  # the localization's summary
    accumulated: dict | None = None  # bounds widened for accumulated rounding (diff replay)
    evidence: dict | None = None  # whether every node is right, for outputs past check.ceiling
    counts: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    cpu: dict | None = None  # the oneDNN ISA choice MindSpore ran under

    _OPTIONAL = ("batches", "lengths", "accumulated", "evidence")

    def to_dict(self) -> dict:
        """The JSON object, in field order; the optional fields only where set."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name in self._OPTIONAL and not value:
                continue
            out[name] = value
        return out


@dataclass(frozen=True)
class Floors:
    """What earlier stages' records hand a stage's check.

    - ``tensor``: per output, onnxruntime's (rel_error, cosine) against PyTorch, from the
      noise-floor stage (export): later stages' bounds may widen to ``check.noise_factor`` times it;
    - ``task``: onnxruntime's task agreement with PyTorch (e.g. detection), from the same stage;
    - ``replay``: per output, the error of a stage passed as accumulated rounding (diff replay), for
      the stages after it that run the same code without a replay of their own (compile, mindir),
      and ``replay_source`` naming it.
    """

    tensor: dict[str, tuple[float, float]] | None = None
    task: float | None = None
    replay: dict[str, tuple[float, float]] | None = None
    replay_source: str = ""

    def after(self, stage, record: dict | None) -> Floors:
        """The floors for the stages after ``stage``, whose record (run or up to date) is ``record``."""
        floors = self
        if stage.noise_floor and record:
            tensor = {m["name"]: (float(m["rel_error"]), float(m["cosine"])) for m in record.get("metrics", [])}
            floors = replace(floors, tensor=tensor, task=(record.get("task") or {}).get("agreement"))
        accepted = (record or {}).get("accumulated")
        if accepted:
            replay = {k: tuple(v) for k, v in accepted["floor"].items()}
            source = f"the {stage.name} stage's accumulated float32 error (diff replay)"
            floors = replace(floors, replay=replay, replay_source=source)
        return floors
