"""RNN, GRU and LSTM (converters/recurrent.py) against onnxruntime, and PyTorch's nn.RNN/GRU/LSTM
exported with the TorchScript exporter against PyTorch itself."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from converters.helpers import (
    assert_close,
    check_model,
    check_op,
    check_unsupported,
    const,
    convert_and_run,
    load,
    make_model,
    rand,
    run_ort,
    x,
)

from torch2ms.graph.load import graph_from_model

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
N_OUT = {"RNN": 2, "GRU": 2, "LSTM": 3}


def _inputs(op, steps, batch, size, hidden, *, n_dir=1, bias=True, lens=None, h0=False, c0=False, layout=0, seed=0):
    """X and the node's optional inputs: ``lens`` a list, ``h0``/``c0`` True for constant initial states, or
    "input" for graph inputs."""
    g = GATES[op]
    xs = (batch, steps, size) if layout else (steps, batch, size)
    state = (batch, n_dir, hidden) if layout else (n_dir, batch, hidden)
    inputs = [
        x(*xs, seed=seed),
        const(rand(n_dir, g * hidden, size, seed=seed + 1, low=-1, high=1)),
        const(rand(n_dir, g * hidden, hidden, seed=seed + 2, low=-1, high=1)),
        const(rand(n_dir, 2 * g * hidden, seed=seed + 3, low=-1, high=1)) if bias else None,
        const(np.array(lens, np.int32)) if lens is not None else None,
    ]
    states = [h0] + ([c0] if op == "LSTM" else [])
    for k, s in enumerate(states):
        if s == "input":
            inputs.append(x(*state, seed=seed + 4 + k))
        elif s:
            inputs.append(const(rand(*state, seed=seed + 4 + k)))
        else:
            inputs.append(None)
    while inputs[-1] is None:
        inputs.pop()
    return inputs


CASES = {
    # name: (steps, batch, input size, hidden, direction, options)
    "forward": (5, 2, 3, 4, "forward", {}),
    "one_step_no_bias": (1, 3, 2, 5, "forward", {"bias": False}),
    "reverse_initial_state": (4, 2, 3, 6, "reverse", {"h0": True, "c0": True}),
    "bidirectional_initial_state": (7, 3, 4, 5, "bidirectional", {"h0": True, "c0": True}),
    "bidirectional_state_inputs": (3, 2, 5, 3, "bidirectional", {"h0": "input", "c0": "input"}),
    "only_initial_c": (4, 2, 3, 4, "forward", {"c0": True}),
    "long_odd": (17, 1, 8, 9, "bidirectional", {}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_recurrent(op, case, tmp_path):
    steps, batch, size, hidden, direction, opts = CASES[case]
    n_dir = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op, steps, batch, size, hidden, n_dir=n_dir, **opts)
    check_op(op, inputs, {"hidden_size": hidden, "direction": direction}, tmp_path, opset=11, n_outputs=N_OUT[op])


def _check_batch_first(op, inputs, attrs, tmp_path):
    """layout=1 (batch first), which onnxruntime refuses: the loader's onnxruntime run is replaced by ONNX
    shape inference, and the oracle is onnxruntime on the layout=0 node with X and the states transposed."""
    model, feeds = make_model(op, inputs, attrs | {"layout": 1}, opset=14, n_outputs=N_OUT[op])
    graph = graph_from_model(model, 14, {k: v.shape for k, v in feeds.items()}, fold=False)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for vi in inferred.graph.output:
        value = graph.values[vi.name]
        value.shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        value.dtype = np.dtype(np.float32)
    swapped = [inputs[0].__class__(inputs[0].data.transpose(1, 0, 2))] + inputs[1:5]
    swapped += [s if s is None else s.__class__(s.data.transpose(1, 0, 2)) for s in inputs[5:]]
    ref_model, ref_feeds = make_model(op, swapped, attrs, opset=14, n_outputs=N_OUT[op])
    y, *states = run_ort(ref_model, ref_feeds)
    expected = [y.transpose(2, 0, 1, 3)] + [s.transpose(1, 0, 2) for s in states]
    results, _ = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, actual in results.items():
        for j, (a, r) in enumerate(zip(actual, expected)):
            assert_close(a, r, 1e-5, f"{op} layout=1 output {j} ({mode} mode)")


@pytest.mark.parametrize(
    "direction, states, lens",
    [("forward", True, None), ("bidirectional", "input", None), ("reverse", False, [2, 5, 1])],
    ids=["forward", "bidirectional", "reverse_sequence_lens"],
)
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_batch_first(op, direction, states, lens, tmp_path):
    n_dir = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op, 5, 3, 2, 4, n_dir=n_dir, h0=states, c0=states, lens=lens, layout=1)
    _check_batch_first(op, inputs, {"hidden_size": 4, "direction": direction}, tmp_path)


@pytest.mark.parametrize(
    "direction, lens, h0",
    [
        ("forward", [5, 2, 3], False),
        ("reverse", [1, 5, 4], True),
        ("bidirectional", [3, 5, 2], True),
        ("bidirectional", [0, 4, 5], True),
    ],
    ids=["forward", "reverse", "bidirectional", "zero_length"],
)
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_sequence_lens(op, direction, lens, h0, tmp_path):
    n_dir = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op, 5, 3, 4, 3, n_dir=n_dir, lens=lens, h0=h0, c0=h0)
    check_op(op, inputs, {"hidden_size": 3, "direction": direction}, tmp_path, n_outputs=N_OUT[op])


def test_full_sequence_lens_are_dropped(tmp_path):
    """Lengths that all equal the sequence length change nothing: no masking is generated."""
    src = check_op("GRU", _inputs("GRU", 4, 2, 3, 3, lens=[4, 4]), {"hidden_size": 3}, tmp_path, n_outputs=2)
    assert "sequence_lens" not in src.split("class Network")[1]


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("clip", [0.5, 2.0])
def test_clip(op, clip, tmp_path):
    inputs = _inputs(op, 4, 2, 3, 4, n_dir=2, h0=True, c0=True)
    check_op(op, inputs, {"hidden_size": 4, "direction": "bidirectional", "clip": clip}, tmp_path, n_outputs=N_OUT[op])


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_linear_before_reset(lbr, direction, tmp_path):
    n_dir = 2 if direction == "bidirectional" else 1
    inputs = _inputs("GRU", 5, 2, 3, 4, n_dir=n_dir, h0=True)
    attrs = {"hidden_size": 4, "direction": direction, "linear_before_reset": lbr}
    check_op("GRU", inputs, attrs, tmp_path, n_outputs=2)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_input_forget(direction, tmp_path):
    n_dir = 2 if direction == "bidirectional" else 1
    inputs = _inputs("LSTM", 5, 2, 3, 4, n_dir=n_dir, h0=True, c0=True)
    check_op("LSTM", inputs, {"hidden_size": 4, "direction": direction, "input_forget": 1}, tmp_path, n_outputs=3)


@pytest.mark.parametrize("lens", [None, [3, 1]])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes(direction, lens, tmp_path):
    n_dir = 2 if direction == "bidirectional" else 1
    inputs = _inputs("LSTM", 3, 2, 3, 4, n_dir=n_dir, h0=True, c0=True, lens=lens)
    inputs.append(const(rand(n_dir, 12, seed=9, low=-1, high=1)))
    check_op("LSTM", inputs, {"hidden_size": 4, "direction": direction}, tmp_path, n_outputs=3)


ACTIVATIONS = {
    # op: [(activations, alpha, beta)]
    "RNN": [
        (["Relu"], None, None),
        (["Sigmoid", "LeakyRelu"], [0.2], None),
        (["Softsign", "Softplus"], None, None),
        (["ScaledTanh", "HardSigmoid"], [0.8, 0.3], [1.5, 0.4]),
        (["Affine", "ThresholdedRelu"], [0.7, 0.1], [0.2]),
    ],
    "GRU": [
        (["HardSigmoid", "LeakyRelu", "Sigmoid", "Elu"], None, None),
        (["hardsigmoid", "tanh", "Relu", "Tanh"], [0.25], [0.4]),
        (["Sigmoid", "ScaledTanh", "HardSigmoid", "Elu"], [0.9, 0.1, 0.7], [1.1, 0.45]),
    ],
    "LSTM": [
        (["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "Relu", "Tanh"], [0.3], [0.6]),
        (["Sigmoid", "Elu", "LeakyRelu", "Sigmoid", "Tanh", "Tanh"], [0.5, 0.02], None),
    ],
}


@pytest.mark.parametrize(
    "op, k", [(op, k) for op, cases in ACTIVATIONS.items() for k in range(len(cases))], ids=lambda v: str(v)
)
def test_activations(op, k, tmp_path):
    names, alpha, beta = ACTIVATIONS[op][k]
    n_dir = len(names) // {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
    direction = "bidirectional" if n_dir == 2 else "forward"
    inputs = _inputs(op, 4, 2, 3, 4, n_dir=n_dir, h0=True, c0=True)
    attrs = {"hidden_size": 4, "direction": direction, "activations": names}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    check_op(op, inputs, attrs, tmp_path, n_outputs=N_OUT[op])


@pytest.mark.parametrize("outputs", [["Y"], ["", "Y_h"], ["", "", "Y_c"], ["Y", "", "Y_c"], ["", "Y_h", "Y_c"]])
def test_lstm_some_outputs(outputs, tmp_path):
    """Outputs the node leaves out (empty names or fewer outputs) are not returned."""
    model, feeds = make_model("LSTM", _inputs("LSTM", 4, 2, 3, 5, h0=True), {"hidden_size": 5}, n_outputs=3)
    node = model.graph.node[0]
    node.output[:] = outputs
    del model.graph.output[:]
    model.graph.output.extend(onnx.ValueInfoProto(name=o) for o in outputs if o)
    check_model(model, feeds, tmp_path, expect_nodes=["LSTM"])


def test_gru_only_y_h(tmp_path):
    model, feeds = make_model(
        "GRU", _inputs("GRU", 6, 2, 3, 4, n_dir=2), {"hidden_size": 4, "direction": "bidirectional"}, n_outputs=2
    )
    model.graph.node[0].output[:] = ["", "Y_h"]
    del model.graph.output[:]
    model.graph.output.append(onnx.ValueInfoProto(name="Y_h"))
    check_model(model, feeds, tmp_path, expect_nodes=["GRU"])


def test_runtime_weights_refused():
    inputs = _inputs("LSTM", 3, 2, 3, 4)
    inputs[2] = x(1, 16, 4)
    check_unsupported("LSTM", inputs, {"hidden_size": 4}, "R (input 2) must be a constant", n_outputs=3)


def test_runtime_sequence_lens_refused():
    inputs = _inputs("GRU", 3, 2, 3, 4, lens=[3, 2])
    inputs[4] = x(data=np.array([3, 2], np.int32))
    check_unsupported("GRU", inputs, {"hidden_size": 4}, "sequence_lens (input 4) must be a constant", n_outputs=2)


@pytest.mark.parametrize("name", ["Affine", "ScaledTanh", "ThresholdedRelu"])
def test_activation_without_its_alpha_refused(name):
    """onnxruntime's defaults for these (0) are not the ONNX operators' (1): refused rather than guessed."""
    attrs = {"hidden_size": 4, "activations": [name]}
    check_unsupported("RNN", _inputs("RNN", 3, 2, 3, 4), attrs, f"{name} needs activation_alpha", n_outputs=2)


# --- PyTorch models through torch.onnx.export (TorchScript) --------------------------------------


class _Returning(torch.nn.Module):
    """A torch recurrent layer called with explicit states (if given), returning flat tensors."""

    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, *state):
        if isinstance(self.rnn, torch.nn.LSTM) and state:
            state = (tuple(state),)
        out, hidden = self.rnn(x, *state)
        return (out, *hidden) if isinstance(hidden, tuple) else (out, hidden)


TORCH = {
    # name: (layer, X shape, with initial states)
    "lstm_2layer_bidirectional": (lambda: torch.nn.LSTM(6, 5, num_layers=2, bidirectional=True), (7, 3, 6), True),
    "lstm_batch_first": (lambda: torch.nn.LSTM(4, 8, batch_first=True), (2, 9, 4), False),
    "lstm_no_bias": (lambda: torch.nn.LSTM(3, 4, bias=False), (5, 1, 3), False),
    "gru_bidirectional": (lambda: torch.nn.GRU(6, 7, bidirectional=True), (5, 2, 6), True),
    "gru_2layer_batch_first": (lambda: torch.nn.GRU(3, 5, num_layers=2, batch_first=True), (2, 4, 3), False),
    "rnn_relu_2layer": (lambda: torch.nn.RNN(4, 6, nonlinearity="relu", num_layers=2), (6, 2, 4), True),
    "rnn_tanh_bidirectional": (lambda: torch.nn.RNN(4, 3, bidirectional=True, batch_first=True), (3, 5, 4), False),
}


@pytest.mark.parametrize("name", list(TORCH))
def test_torch_export(name, tmp_path):
    """torch.onnx.export (TorchScript) of a torch layer, converted, against PyTorch's own outputs."""
    make, shape, with_state = TORCH[name]
    torch.manual_seed(0)
    rnn = make().eval()
    module = _Returning(rnn).eval()
    args, names = [torch.from_numpy(rand(*shape, seed=1))], ["x"]
    if with_state:
        batch = shape[0] if rnn.batch_first else shape[1]
        h0 = torch.from_numpy(rand(rnn.num_layers * (1 + rnn.bidirectional), batch, rnn.hidden_size, seed=2))
        args.append(h0)
        names.append("h0")
        if isinstance(rnn, torch.nn.LSTM):
            args.append(h0.flip(-1))
            names.append("c0")
    buf = io.BytesIO()
    torch.onnx.export(module, tuple(args), buf, dynamo=False, opset_version=17, input_names=names)
    model = onnx.load_from_string(buf.getvalue())
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    with torch.no_grad():
        expected = [t.numpy() for t in module(*args)]
    graph, _ = load(model, feeds)
    assert {"LSTM", "GRU", "RNN"} & {n.op_type for n in graph.nodes}
    results, _ = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, actual in results.items():
        assert len(actual) == len(expected)
        for j, (a, r) in enumerate(zip(actual, expected)):
            assert_close(a, r, 1e-5, f"{name} output {j} ({mode} mode) against PyTorch")


@pytest.mark.parametrize(
    "direction, call", [("forward", "(ops.zeros_like(self.c6), self.c6)"), ("reverse", "(in0, c0=self.c6)")]
)
def test_zero_initial_states_are_left_out(direction, call, tmp_path):
    """All-zero constant initial states (torch's export without states) are the layer's own default."""
    inputs = _inputs("LSTM", 3, 2, 3, 4, h0=True, c0=True)
    inputs[5], inputs[6] = const(np.zeros((1, 2, 4), np.float32)), const(rand(1, 2, 4, seed=7))
    src = check_op("LSTM", inputs, {"hidden_size": 4, "direction": direction}, tmp_path, n_outputs=3)
    assert call in src


@pytest.mark.parametrize("opset", [7, 14, 22])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_opsets(op, opset, tmp_path):
    """One converter serves every version of the op (7, 14 adds layout, 22 adds bfloat16)."""
    inputs = _inputs(op, 3, 2, 3, 4, n_dir=2, h0=True, c0=True, lens=[3, 2])
    check_op(op, inputs, {"hidden_size": 4, "direction": "bidirectional"}, tmp_path, opset=opset, n_outputs=N_OUT[op])


@pytest.mark.parametrize(
    "attrs, lens, layer",
    [
        ({"direction": "bidirectional"}, None, "nn.LSTM"),
        ({}, [3, 3], "nn.LSTM"),
        ({"direction": "reverse"}, None, "OnnxLSTM"),
        ({"clip": 3.0}, None, "OnnxLSTM"),
        ({"input_forget": 1}, None, "OnnxLSTM"),
        ({"activations": ["Sigmoid", "Tanh", "Relu"]}, None, "OnnxLSTM"),
        ({}, [3, 1], "OnnxLSTM"),
    ],
    ids=["bidirectional", "full_lengths", "reverse", "clip", "input_forget", "activations", "sequence_lens"],
)
def test_lstm_layer_choice(attrs, lens, layer, tmp_path):
    """PyTorch's kind of LSTM is MindSpore's nn.LSTM (fused on CPU); the other variants are the ONNX cell."""
    n_dir = 2 if attrs.get("direction") == "bidirectional" else 1
    inputs = _inputs("LSTM", 3, 2, 3, 4, n_dir=n_dir, h0=True, lens=lens)
    src = check_op("LSTM", inputs, {"hidden_size": 4} | attrs, tmp_path, n_outputs=3)
    assert f"= {layer}(" in src
