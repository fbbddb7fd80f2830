"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (converters/loss.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, load, make_model, rand, x

from torch2ms.converters.registry import analyse

LOSSES = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]


def _inputs(shape, *, weights: bool, ignore: int | None, label_dtype=np.int64, dtype=np.float32):
    n, c = shape[:2]
    rng = np.random.default_rng(len(shape))
    labels = rng.integers(0, c, (n,) + shape[2:])
    if ignore is not None:
        labels.flat[::3] = ignore  # every third target ignored
    inputs = [x(data=rand(*shape, seed=1).astype(dtype)), x(data=labels.astype(label_dtype))]
    if weights:
        inputs.append(x(data=rand(c, seed=2, low=0.5, high=2.0).astype(dtype)))
    return inputs


@pytest.mark.parametrize("weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("ignore_index", [None, 2, -1])
@pytest.mark.parametrize("reduction", [None, "none", "sum"])
@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3), (2, 5, 3, 2)], ids=["NC", "NCd", "NCdd"])
@pytest.mark.parametrize("op", LOSSES)
def test_loss(op, shape, reduction, ignore_index, weights, tmp_path):
    """reduction None: the default, mean (over the weights of the targets not ignored)."""
    attrs = {k: v for k, v in (("reduction", reduction), ("ignore_index", ignore_index)) if v is not None}
    opset = 13 if op == "SoftmaxCrossEntropyLoss" else 22
    check_op(op, _inputs(shape, weights=weights, ignore=ignore_index), attrs, tmp_path, opset=opset)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_softmax_cross_entropy_log_prob_output(reduction, tmp_path):
    inputs = _inputs((3, 4, 2), weights=True, ignore=1)
    attrs = {"reduction": reduction, "ignore_index": 1}
    check_op("SoftmaxCrossEntropyLoss", inputs, attrs, tmp_path, opset=13, n_outputs=2)


@pytest.mark.parametrize("op", LOSSES)
def test_loss_int32_labels(op, tmp_path):
    inputs = _inputs((4, 5, 3), weights=True, ignore=0, label_dtype=np.int32)
    check_op(op, inputs, {"ignore_index": 0}, tmp_path, opset=13)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("op", LOSSES)
def test_loss_float_dtypes(op, dtype, tmp_path):
    inputs = _inputs((4, 5), weights=True, ignore=None, dtype=dtype)
    tol = 3e-3 if dtype == "float16" else 1e-6
    check_op(op, inputs, {"reduction": "sum"}, tmp_path, opset=13, rel_tol=tol)


def test_loss_bad_reduction_refused():
    """onnxruntime rejects an unknown reduction itself, so it is set after loading."""
    model, feeds = make_model("NegativeLogLikelihoodLoss", _inputs((3, 4), weights=False, ignore=None), {}, opset=13)
    graph, _ = load(model, feeds)
    graph.nodes[0].attrs["reduction"] = "max"
    assert [p.reason for p in analyse(graph)] == ["reduction='max' not supported (none, sum or mean)"]
