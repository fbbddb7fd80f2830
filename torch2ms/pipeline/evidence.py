"""Evidence that every node is right, for a stage whose outputs lie beyond ``check.ceiling``.

A widened bound (``check.noise_factor`` times a float32 noise floor, ``bounds``) says how far two
correct float32 implementations drift apart on an ill-conditioned network; it cannot tell that
drift from a bug. An output within its widened bound but beyond the ceiling passes only with
positive evidence that every node is right, recorded in ``stage.json`` ``evidence`` (the verdict's
vocabulary is here; what finds the evidence lives with what it runs, and the runner asks it through
its ``pipeline.checks.Checks``):

- rebuild, fold (stages that ``localize``): ``diff``'s replay. Every statement of network.py,
  recomputed from onnxruntime's own inputs, stays within ``LOCAL_SHARE`` of the tolerance (1e-5):
  ``by: replay`` with the worst local error and its node. A node beyond that fails the stage.
- compile, mindir (``divergence.evidence.for_compiled``): they run the network.py of an earlier
  stage in another mode. Evidence is that code's replay plus the stage's outputs within the
  recipe's bound of the same code in PyNative.
- export (``export.verdict.for_export``): ``by: float64``. Its check is onnxruntime against
  PyTorch: there is no generated code to replay, and an ONNX node has no PyTorch statement to
  recompute. Instead ``model.onnx`` widened to
  float64 runs on onnx's reference evaluator (``export.float64``; onnxruntime's CPU Conv has no
  float64 kernel) against the PyTorch model in float64, which the float32 floor already ran. In
  float64 the arithmetic's drift shrinks by ~1e9 and a wrong node does not; the graph's float32
  attributes and scalars take back the numbers they were rounded from (``export.float64.exact``).
  So every output, at the samples and the extra batch sizes, must agree within ``LOCAL_SHARE`` of
  the tolerance (1e-5), as a replayed statement must; beyond it the exported graph computes
  something else (``by: wrong``: failed).
  Later stages' replay proves the converter's nodes against onnxruntime, not the graph against
  PyTorch, so they cannot vouch for it.

Without evidence (``by: none``) the stage is ``not checkable`` at these inputs: the run goes on
(its artifacts are sound, only the check cannot decide) but does not pass. A float64 run of the
generated network against float64 PyTorch is not tried: MindSpore 2.x's CPU Conv2D refuses
float64 (it takes float16/32, bfloat16 and integers), so no convolutional network runs in float64.
"""

from __future__ import annotations

NOT_CHECKABLE = "not checkable"

WHAT_TO_DO = (
    "give real samples in inputs[].data (or trained weights in model.checkpoint), on which float32 "
    "decides the outputs, or accept the risk explicitly with a wider check.ceiling"
)


def proves(diff) -> bool:
    """The replay ran, compared something, and found no node wrong."""
    return diff is not None and diff.replayed and diff.wrong is None and diff.worst_local is not None


def from_replay(diff, stage: str, needed: list[str]) -> dict:
    worst = diff.worst_local
    return {
        "by": "replay",
        "needed": needed,
        "stage": stage,
        "local_bound": diff.local_bound,
        "max_local_error": worst.local.rel_error,
        "node": worst.node,
        "op": worst.op,
        "compared": len(diff.tensors),
    }


def none(needed: list[str], why: str) -> dict:
    return {"by": "none", "needed": needed, "why": why}


def for_localized(diff, stage: str, needed: list[str]) -> dict:
    """A rebuild/fold stage: its own replay decides (``by: wrong`` when it finds a node wrong)."""
    if proves(diff):
        return from_replay(diff, stage, needed)
    if diff is not None and diff.wrong is not None:
        return {"by": "wrong", "needed": needed, "stage": stage, "node": diff.wrong.node, "op": diff.wrong.op}
    return none(needed, "diff's replay of network.py could not run (see the log)")


def reason(evidence: dict) -> str:
    """Why a stage without evidence is not checkable, and what the user can do."""
    return (
        f"{'; '.join(evidence['needed'])}: beyond the ceiling only evidence that every node is right passes, "
        f"and there is none ({evidence['why']}); {WHAT_TO_DO}"
    )
