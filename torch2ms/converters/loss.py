"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, as ``ops.nll_loss`` and
``ops.cross_entropy``.

Both ONNX ops were defined after PyTorch's, and MindSpore's functions compute the same (measured
against onnxruntime over reductions, class weights, ignore_index and extra spatial axes):

    loss[n, d...] = -weight[t] * input[n, t, d...]   with t = target[n, d...]; 0 where t == ignore_index
    mean = sum(loss) / sum(weight[t] over the targets not ignored)

SoftmaxCrossEntropyLoss applies it to ``log_softmax(scores, axis=1)``, its optional second output.
ONNX's ``ignore_index`` has no default (nothing ignored); MindSpore's is -100, which no valid class
index equals, so it stands for "none".
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported, converter

_REDUCTIONS = ("none", "sum", "mean")


def _args(em, ignore_index, reduction) -> str:
    if reduction not in _REDUCTIONS:
        raise Unsupported(f"reduction={reduction!r} not supported (none, sum or mean)")
    args = [em.x(0), em.x(1)]
    if em.has_input(2):
        args.append(f"weight={em.x(2)}")
    if ignore_index is not None:
        args.append(f"ignore_index={int(ignore_index)}")
    if reduction != "mean":
        args.append(f"reduction={reduction!r}")
    return ", ".join(args)


@converter("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(em, *, ignore_index=None, reduction="mean"):
    """NegativeLogLikelihoodLoss(input, target, weight?) -> loss   attrs: ignore_index, reduction"""
    return f"ops.nll_loss({_args(em, ignore_index, reduction)})"


@converter("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(em, *, ignore_index=None, reduction="mean"):
    """SoftmaxCrossEntropyLoss(scores, labels, weights?) -> output, log_prob?   attrs: ignore_index, reduction"""
    loss = f"ops.cross_entropy({_args(em, ignore_index, reduction)})"
    if len(em.node.outputs) > 1 and em.node.outputs[1]:
        return f"{loss}, ops.log_softmax({em.x(0)}, 1)"
    return loss
