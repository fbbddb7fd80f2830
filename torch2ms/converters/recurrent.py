"""Recurrent layers: RNN, GRU and LSTM.

An LSTM that PyTorch could have written (default activations, forward or bidirectional, no clip,
peepholes, input_forget or sequence_lens, layout 0) is MindSpore's ``nn.LSTM``: on CPU it is
oneDNN's fused LSTM (accurate to 1e-7, and about 20x faster than an unrolled loop in GRAPH_MODE).
Its gates are PyTorch's (i, f, g, o), ONNX's are (i, o, f, c), so the weight rows are reordered;
``onnx_lstm_outputs`` turns its (T, B, directions * H) output into ONNX's (T, directions, B, H).

Everything else is a small helper cell written above the network class (``OnnxRNN``,
``OnnxGRU``, ``OnnxLSTM`` over a shared time loop ``OnnxRecurrent``), holding W, R, B (and P)
in ONNX's layout. MindSpore's own ``nn.GRU``/``nn.RNN`` (and ``nn.LSTM`` with sequence lengths)
are Python-unrolled cells on CPU too, but built on its CPU tanh, which is 1e-4 off near |x| = 5;
they also know only PyTorch's variants (GRU with linear_before_reset=1, tanh/relu RNN, no clip,
no reverse-only direction). The sequence length is static, so the loop over time is a Python
loop that GRAPH_MODE unrolls. Per step, for direction d (ONNX's equations, ``*`` elementwise)::

    RNN   H = f(Xt W^T + H R^T + Wb + Rb)
    GRU   z = f(Xt Wz^T + H Rz^T + Wbz + Rbz);  r = f(... Wr, Rr ...)
          h = g(Xt Wh^T + (r * H) Rh^T + Rbh + Wbh)          linear_before_reset=0
          h = g(Xt Wh^T + r * (H Rh^T + Rbh) + Wbh)          linear_before_reset=1
          H = (1 - z) * h + z * H
    LSTM  i = f(Xt Wi^T + H Ri^T + Pi * C + Wbi + Rbi);  f likewise with Pf (1 - i if input_forget)
          C = f * C + i * g(Xt Wc^T + H Rc^T + Wbc + Rbc);  o = f(... + Po * C_new);  H = o * h(C)

``clip`` clamps every gate's pre-activation. The reverse direction runs from the last step back.
With ``sequence_lens`` (a constant), a step at or past a batch entry's length keeps its state and
outputs zeros, so the reverse direction starts at each entry's own last step, as in onnxruntime;
an entry of length 0 ends with zero states. ``layout=1`` is batch-first X, Y, initial and final
states. Activation alpha/beta are consumed in order by the activations that take them, with the
ONNX operators' defaults (onnxruntime's convention); Affine, ScaledTanh and ThresholdedRelu must
be given theirs, since onnxruntime's defaults (0) differ from the spec's. tanh is sinh / cosh.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter

_ACTIVATION = '''
def onnx_tanh(x):
    """tanh as sinh / cosh: MindSpore's CPU tanh is an approximation (1e-4 off near 5), its sinh and cosh
    are exact. Beyond +-10, tanh is +-1 in float32 and sinh would overflow."""
    x = ops.clamp(x, -10.0, 10.0)
    return ops.sinh(x) / ops.cosh(x)


def onnx_activation(x, name, alpha, beta):
    """An ONNX recurrent activation by name; alpha and beta as in activation_alpha/activation_beta."""
    if name == "Sigmoid":
        return ops.sigmoid(x)
    if name == "Tanh":
        return onnx_tanh(x)
    if name == "Relu":
        return ops.relu(x)
    if name == "LeakyRelu":
        return ops.where(x >= 0, x, alpha * x)
    if name == "ThresholdedRelu":
        return ops.where(x > alpha, x, ops.zeros_like(x))
    if name == "HardSigmoid":
        return ops.clamp(alpha * x + beta, 0.0, 1.0)
    if name == "Elu":
        return ops.where(x >= 0, x, alpha * (ops.exp(x) - 1))
    if name == "Softsign":
        return x / (1 + ops.abs(x))
    if name == "Softplus":
        return ops.softplus(x)
    if name == "ScaledTanh":
        return alpha * onnx_tanh(beta * x)
    return alpha * x + beta  # Affine
'''

_BASE = '''
class OnnxRecurrent(nn.Cell):
    """The time loop of OnnxRNN, OnnxGRU and OnnxLSTM (their `step` is one time step).

    ONNX layout: x (T, B, input), outputs (T, directions, B, H) and states (directions, B, H);
    layout=1 is batch first. w (directions, gates * H, input), r (directions, gates * H, H) and
    b (directions, 2 * gates * H) = [Wb, Rb] hold ONNX's W, R and B. The reverse direction runs from
    the last step back. With sequence_lens, a step at or past an entry's length keeps its state and
    outputs zeros (so the reverse direction starts at the entry's own last step).
    """

    gates = 1

    def __init__(self, input_size, hidden_size, direction="forward", activations=None, clip=None,
                 sequence_lens=None, layout=0):
        super().__init__()
        self.reverse = (False, True) if direction == "bidirectional" else (direction == "reverse",)
        size = (len(self.reverse), self.gates * hidden_size)
        self.w = Parameter(ops.zeros(size + (input_size,), ms.float32), name="w", requires_grad=False)
        self.r = Parameter(ops.zeros(size + (hidden_size,), ms.float32), name="r", requires_grad=False)
        self.b = Parameter(ops.zeros((size[0], 2 * size[1]), ms.float32), name="b", requires_grad=False)
        self.hidden_size = hidden_size
        # per direction: ((name, alpha, beta), ...) for f, g (and h)
        self.activations = activations or (self.default_activations,) * len(self.reverse)
        self.clip = clip
        self.lengths = None if sequence_lens is None else ms.Tensor(sequence_lens, ms.int32).reshape(-1, 1)
        self.layout = layout

    def act(self, d, k, x):
        """Activation k (f, g, h) of direction d."""
        name, alpha, beta = self.activations[d][k]
        return onnx_activation(x, name, alpha, beta)

    def gate(self, d, k, x):
        """Activation k of a gate's pre-activation x, clipped first when clip is set."""
        if self.clip is not None:
            x = ops.clamp(x, -self.clip, self.clip)
        return self.act(d, k, x)

    def weights(self, d):
        """W^T, R^T and the bias added to X W^T (Wb + Rb) of direction d."""
        size = self.gates * self.hidden_size
        return ops.transpose(self.w[d], (1, 0)), ops.transpose(self.r[d], (1, 0)), self.b[d][:size] + self.b[d][size:]

    def construct(self, x, h0=None, c0=None):
        if self.layout == 1:
            x = ops.transpose(x, (1, 0, 2))
            if h0 is not None:
                h0 = ops.transpose(h0, (1, 0, 2))
            if c0 is not None:
                c0 = ops.transpose(c0, (1, 0, 2))
        steps, batch = x.shape[0], x.shape[1]
        zeros = ops.zeros((batch, self.hidden_size), x.dtype)
        ys, hs, cs = [], [], []
        for d in range(len(self.reverse)):
            w, r, bias = self.weights(d)
            xw = ops.unstack(ops.matmul(x, w) + bias)
            h = zeros if h0 is None else h0[d]
            c = zeros if c0 is None else c0[d]
            outputs = []
            for k in range(steps):
                t = steps - 1 - k if self.reverse[d] else k
                h_new, c_new = self.step(d, xw[t], h, c, r)
                if self.lengths is None:
                    h, c = h_new, c_new
                    outputs.append(h)
                else:
                    valid = self.lengths > t
                    h, c = ops.where(valid, h_new, h), ops.where(valid, c_new, c)
                    outputs.append(ops.where(valid, h_new, zeros))
            if self.reverse[d]:
                outputs = outputs[::-1]
            if self.lengths is not None:  # length 0: zero final states
                h, c = ops.where(self.lengths > 0, h, zeros), ops.where(self.lengths > 0, c, zeros)
            ys.append(ops.stack(outputs))
            hs.append(h)
            cs.append(c)
        y, h, c = ops.stack(ys, axis=1), ops.stack(hs), ops.stack(cs)
        if self.layout == 1:
            y, h, c = ops.transpose(y, (2, 0, 1, 3)), ops.transpose(h, (1, 0, 2)), ops.transpose(c, (1, 0, 2))
        if self.gates == 4:
            return y, h, c
        return y, h
'''

_RNN = '''
class OnnxRNN(OnnxRecurrent):
    """ONNX RNN: H = f(Xt W^T + H R^T + Wb + Rb)."""

    default_activations = (("Tanh", 0.0, 0.0),)

    def step(self, d, xw, h, c, r):
        return self.gate(d, 0, xw + ops.matmul(h, r)), c
'''

_GRU = '''
class OnnxGRU(OnnxRecurrent):
    """ONNX GRU, gates z, r, h: z = f(Xt Wz^T + H Rz^T + Wbz + Rbz), r likewise, H = (1 - z) * h + z * H with
    h = g(Xt Wh^T + (r * H) Rh^T + Rbh + Wbh), or g(Xt Wh^T + r * (H Rh^T + Rbh) + Wbh) if linear_before_reset."""

    gates = 3
    default_activations = (("Sigmoid", 0.0, 0.0), ("Tanh", 0.0, 0.0))

    def __init__(self, input_size, hidden_size, linear_before_reset=0, **kwargs):
        super().__init__(input_size, hidden_size, **kwargs)
        self.linear_before_reset = linear_before_reset

    def weights(self, d):
        """W^T, (Rzr^T, Rh^T, Rbh) and the bias added to X W^T: all of Wb + Rb but Rbh if linear_before_reset."""
        size, b = self.hidden_size, self.b[d]
        r = ops.transpose(self.r[d], (1, 0))
        if self.linear_before_reset:
            bias = ops.concat((b[: 2 * size] + b[3 * size : 5 * size], b[2 * size : 3 * size]))
        else:
            bias = b[: 3 * size] + b[3 * size :]
        return ops.transpose(self.w[d], (1, 0)), (r[:, : 2 * size], r[:, 2 * size :], b[5 * size :]), bias

    def step(self, d, xw, h, c, r):
        r_zr, r_h, rb_h = r
        x_zr, x_h = ops.split(xw, (2 * self.hidden_size, self.hidden_size), axis=1)
        z, reset = ops.split(self.gate(d, 0, x_zr + ops.matmul(h, r_zr)), self.hidden_size, axis=1)
        if self.linear_before_reset:
            candidate = self.gate(d, 1, x_h + reset * (ops.matmul(h, r_h) + rb_h))
        else:
            candidate = self.gate(d, 1, x_h + ops.matmul(reset * h, r_h))
        return (1 - z) * candidate + z * h, c
'''

_LSTM = '''
class OnnxLSTM(OnnxRecurrent):
    """ONNX LSTM, gates in ONNX's order i, o, f, c (PyTorch's is i, f, g, o); p (directions, 3 * H) holds the
    peepholes P (i, o, f). input_forget couples the gates: f = 1 - i."""

    gates = 4
    default_activations = (("Sigmoid", 0.0, 0.0), ("Tanh", 0.0, 0.0), ("Tanh", 0.0, 0.0))

    def __init__(self, input_size, hidden_size, peepholes=False, input_forget=0, **kwargs):
        super().__init__(input_size, hidden_size, **kwargs)
        self.p = None
        if peepholes:
            size = (len(self.reverse), 3 * hidden_size)
            self.p = Parameter(ops.zeros(size, ms.float32), name="p", requires_grad=False)
        self.input_forget = input_forget

    def step(self, d, xw, h, c, r):
        i, o, f, g = ops.split(xw + ops.matmul(h, r), self.hidden_size, axis=1)
        if self.p is not None:
            pi, po, pf = ops.split(self.p[d], self.hidden_size)
            i, f = i + pi * c, f + pf * c
        i = self.gate(d, 0, i)
        f = 1 - i if self.input_forget else self.gate(d, 0, f)
        c = f * c + i * self.gate(d, 1, g)
        if self.p is not None:
            o = o + po * c
        return self.gate(d, 0, o) * self.act(d, 2, c), c
'''


_CELLS = {"RNN": ("OnnxRNN", _RNN), "GRU": ("OnnxGRU", _GRU), "LSTM": ("OnnxLSTM", _LSTM)}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_DIRECTIONS = ("forward", "reverse", "bidirectional")
# activation (matched case-insensitively, as onnxruntime does) -> (takes alpha, takes beta, default alpha,
# default beta); None: no default here, because onnxruntime's (0) differs from the ONNX operator's.
_ACTIVATIONS = {
    "Relu": (False, False, 0.0, 0.0),
    "Tanh": (False, False, 0.0, 0.0),
    "Sigmoid": (False, False, 0.0, 0.0),
    "Softsign": (False, False, 0.0, 0.0),
    "Softplus": (False, False, 0.0, 0.0),
    "LeakyRelu": (True, False, 0.01, 0.0),
    "Elu": (True, False, 1.0, 0.0),
    "HardSigmoid": (True, True, 0.2, 0.5),
    "ThresholdedRelu": (True, False, None, 0.0),
    "ScaledTanh": (True, True, None, None),
    "Affine": (True, True, None, None),
}


def _activations(op: str, n_dir: int, names, alphas, betas) -> tuple | None:
    """Per direction ((name, alpha, beta), ...) for the cell; None when they are the defaults."""
    defaults = _DEFAULT_ACTIVATIONS[op] * n_dir
    names = list(names) if names is not None else list(defaults)
    if len(names) != len(defaults):
        raise Unsupported(f"activations={names} (expected {len(defaults)} names)")
    canonical = {k.lower(): k for k in _ACTIVATIONS}
    alphas, betas = list(alphas or []), list(betas or [])
    resolved = []
    for name in names:
        key = canonical.get(str(name).lower())
        if key is None:
            raise Unsupported(f"activations: {name!r} is not an ONNX recurrent activation")
        takes_alpha, takes_beta, alpha, beta = _ACTIVATIONS[key]
        if takes_alpha and alphas:
            alpha = alphas.pop(0)
        if takes_beta and betas:
            beta = betas.pop(0)
        if alpha is None or beta is None:
            raise Unsupported(
                f"activations: {key} needs activation_alpha/activation_beta (onnxruntime's defaults are not ONNX's)"
            )
        resolved.append((key, float(alpha), float(beta)))
    if [r[0] for r in resolved] == list(defaults):
        return None
    per = len(_DEFAULT_ACTIVATIONS[op])
    return tuple(tuple(resolved[k : k + per]) for k in range(0, len(resolved), per))


_LSTM_OUTPUTS = '''
def onnx_lstm_outputs(outputs):
    """nn.LSTM's y (T, B, directions * H), (h, c) as ONNX's Y (T, directions, B, H), Y_h, Y_c."""
    y, (h, c) = outputs
    y = ops.reshape(y, (y.shape[0], y.shape[1], h.shape[0], h.shape[2]))
    return ops.transpose(y, (0, 2, 1, 3)), h, c
'''

# ONNX LSTM gate blocks (i, o, f, c) in nn.LSTM's (PyTorch's) order (i, f, g=c, o)
_TORCH_GATES = (0, 2, 3, 1)


def _nn_lstm(em, w, r, b, n_dir: int, h0: int | None, c0: int | None) -> str:
    """MindSpore's nn.LSTM (oneDNN's fused LSTM on CPU) for an LSTM PyTorch could have written."""
    hidden = int(r.shape[-1])

    def torch_order(m: np.ndarray) -> np.ndarray:
        return np.concatenate([m[g * hidden : (g + 1) * hidden] for g in _TORCH_GATES])

    params = {}
    for d, suffix in enumerate(("", "_reverse")[:n_dir]):
        params[f"weight_ih_l0{suffix}"] = torch_order(w[d])
        params[f"weight_hh_l0{suffix}"] = torch_order(r[d])
        if b is not None:
            params[f"bias_ih_l0{suffix}"] = torch_order(b[d][: 4 * hidden])
            params[f"bias_hh_l0{suffix}"] = torch_order(b[d][4 * hidden :])
    kwargs = {"has_bias": False} if b is None else {}
    if n_dir == 2:
        kwargs["bidirectional"] = True
    layer = em.layer("nn.LSTM", int(w.shape[-1]), hidden, params=params, **kwargs)
    args = [em.x(0)]
    if h0 is not None or c0 is not None:
        h = em.x(h0) if h0 is not None else f"ops.zeros_like({em.x(c0)})"
        c = em.x(c0) if c0 is not None else f"ops.zeros_like({em.x(h0)})"
        args.append(f"({h}, {c})")
    return f"{em.define('onnx_lstm_outputs', _LSTM_OUTPUTS)}({layer}({', '.join(args)}))"


def _zero(value) -> bool:
    return value is not None and not value.any()


def _recurrent(em, op: str, direction, activations, activation_alpha, activation_beta, clip, layout, **extra):
    """Define the op's cell above the network, declare it with W, R, B (and P) and return the call."""
    if direction not in _DIRECTIONS:
        raise Unsupported(f"direction={direction!r} not supported")
    for i, what in ((0, "X"), (1, "W"), (2, "R")):
        if em.dtype(i) != np.float32:
            raise Unsupported(f"{what} dtype {em.dtype(i).name} not supported (float32 only)")
    w, r = em.require_const(1, "W"), em.require_const(2, "R")
    n_dir, hidden = int(r.shape[0]), int(r.shape[-1])
    if n_dir != (2 if direction == "bidirectional" else 1):
        raise Unsupported(f"direction={direction!r} with W for {n_dir} directions")
    params = {"w": w, "r": r}
    if em.has_input(3):
        params["b"] = em.require_const(3, "B")
    else:
        params["b"] = np.zeros((n_dir, 2 * _GATES[op] * hidden), np.float32)
    kwargs = {}
    if direction != "forward":
        kwargs["direction"] = direction
    acts = _activations(op, n_dir, activations, activation_alpha, activation_beta)
    if acts is not None:
        kwargs["activations"] = acts
    if clip is not None:
        kwargs["clip"] = float(clip)
    steps = em.shape(0)[1 if layout else 0]
    if em.has_input(4):
        lengths = em.require_const(4, "sequence_lens").astype(np.int64).reshape(-1)
        if lengths.min() < 0 or lengths.max() > steps:
            raise Unsupported(f"sequence_lens={lengths.tolist()} outside 0..{steps}")
        if (lengths != steps).any():
            kwargs["sequence_lens"] = tuple(int(v) for v in lengths)
    if layout:
        kwargs["layout"] = int(layout)
    peepholes = extra.pop("peepholes", None)
    if peepholes is not None:
        params["p"] = peepholes
        kwargs["peepholes"] = True
    kwargs.update({k: v for k, v in extra.items() if v})
    # initial states: all-zero constants (what torch exports without them) are the default
    h0, c0 = (i if em.has_input(i) and not _zero(em.const(i)) else None for i in (5, 6))
    if op == "LSTM" and set(kwargs) <= {"direction"} and direction != "reverse":
        call = _nn_lstm(em, w, r, params["b"] if em.has_input(3) else None, n_dir, h0, c0)
    else:
        em.define("onnx_activation", _ACTIVATION)
        em.define("OnnxRecurrent", _BASE)
        name, source = _CELLS[op]
        layer = em.layer(em.define(name, source), int(w.shape[-1]), hidden, params=params, **kwargs)
        args = [em.x(0)]
        if h0 is not None:
            args.append(em.x(h0))
        if op == "LSTM" and c0 is not None:
            args.append(em.x(c0) if h0 is not None else f"c0={em.x(c0)}")
        call = f"{layer}({', '.join(args)})"
    n, full = len(em.node.outputs), 3 if op == "LSTM" else 2
    if n == full:
        return call
    return f"{call}[0]" if n == 1 else f"{call}[:{n}]"


@converter("RNN", since=7)
def rnn(
    em,
    *,
    hidden_size=None,
    direction="forward",
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
    layout=0,
):
    """RNN(X, W, R, B?, sequence_lens?, initial_h?) -> Y?, Y_h?   (constant W, R, B, sequence_lens)"""
    return _recurrent(em, "RNN", direction, activations, activation_alpha, activation_beta, clip, layout)


@converter("GRU", since=7)
def gru(
    em,
    *,
    hidden_size=None,
    direction="forward",
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
    linear_before_reset=0,
    layout=0,
):
    """GRU(X, W, R, B?, sequence_lens?, initial_h?) -> Y?, Y_h?   (gates z, r, h; constant W, R, B, sequence_lens)"""
    return _recurrent(
        em,
        "GRU",
        direction,
        activations,
        activation_alpha,
        activation_beta,
        clip,
        layout,
        linear_before_reset=int(linear_before_reset),
    )


@converter("LSTM", since=7)
def lstm(
    em,
    *,
    hidden_size=None,
    direction="forward",
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
    input_forget=0,
    layout=0,
):
    """LSTM(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?) -> Y?, Y_h?, Y_c?   (gates i, o, f, c)"""
    return _recurrent(
        em,
        "LSTM",
        direction,
        activations,
        activation_alpha,
        activation_beta,
        clip,
        layout,
        input_forget=int(input_forget),
        peepholes=em.require_const(7, "P") if em.has_input(7) else None,
    )
