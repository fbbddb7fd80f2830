"""Rewrites that move work to the Ascend AI Core (the Atlas tuning article's "replace ops").

**Pow with a constant exponent** becomes element-wise ops the vector unit runs and UB fusion
chains (the article: ``Pow`` on AI CPU, replaced by ``Mul``, ran "much faster"). For a scalar
exponent ``e``::

    e = n (integer, 2 <= n <= 16)   square-and-multiply: x*x, (x*x)*x, (x*x)*(x*x), ...
    e = 1                           x
    e = 0.5                         Sqrt(x)
    e = -1                          Reciprocal(x)
    e = -0.5                        Reciprocal(Sqrt(x))
    e = n + 0.5 (n >= 1)            x^n * Sqrt(x)
    e = -n (integer, n >= 2)        Reciprocal(x^n)

These are exact in real arithmetic; in floating point ``x*x`` is the correctly rounded square
(``pow`` is at best that), and a chain of n multiplications rounds at most ``ceil(log2 n) + 1``
times. It does not fire on a non-constant exponent, an exponent that differs per element, one
with no such form (``x ** 0.3``) or an integer base with a fractional exponent.

**MaxPool with padding** (``nn.MaxPool2d(pad_mode='pad')`` in MindSpore 2.10 builds
``MaxPool3DWithArgmax``, which the 310 runs on AI CPU only) becomes an explicit ``Pad`` with
``-inf`` followed by an unpadded ``MaxPool`` (``MaxPool`` and ``PadV3D`` have AI Core kernels):
a max over a window that includes ``-inf`` padding is the max over its real taps, so the result
is identical. ``ceil_mode`` (which MindSpore also builds on ``MaxPool3DWithArgmax``, padded or
not) becomes end padding: along an axis of length ``n`` with begin pad ``b``, kernel ``k``, stride
``s`` and ``out`` windows (the graph's output shape, PyTorch's rule: a last window starting in the
end padding is dropped), the end pad is ``max((out - 1) * s + k - b - n, 0)``, after which a
floor-mode pool makes exactly ``out`` windows, each holding at least one real tap. It does not
fire with dilations, the ``Indices`` output, ``auto_pad`` or an unknown output shape.

**Reflect / edge Pad** (``ops.pad(mode="reflect"|"replicate")``: CANN's ``MirrorPad`` and
``PadV3``, AI CPU only on the 310; timm's anti-aliased TResNet pads its BlurPool so) becomes the
data movement it is: per padded axis of length ``n``, a ``Concat`` of one-wide ``Slice`` s of the
input around it (``StridedSliceD``, ``ConcatD``: AI Core), exact::

    reflect, pads (b, e):  x[b], x[b-1], ..., x[1],  x,  x[n-2], ..., x[n-1-e]
    edge:                  x[0] (b times),           x,  x[n-1] (e times)

It does not fire on a pad wider than ``MAX_MIRROR`` (the concat would grow past the op it
replaces), negative pads (crops), pads that are not constants, or below opset 10 (``Slice``
without inputs).

**HardSwish / HardSigmoid** have no kernel in the 310's op list (AI Core or MindSpore AI CPU), as
an op or as the activation a fused ``Conv2dBnAct`` / ``Dense`` applies. They become their
formulas, every op of which has an AI Core kernel (``Muls``/``Adds`` are ``Mul``/``Add`` by a
scalar, ``ClipByValue``)::

    HardSigmoid(x; alpha, beta) = Clip(x * alpha + beta, 0, 1)
    HardSwish(x)                = x * HardSigmoid(x; 1/6, 1/2)

A fused cell keeps its convolution/matmul (and BatchNorm) and loses only the activation.

**GroupNorm** (``nn.GroupNorm``, which MindSpore 2.10 builds on ``ops.group_norm``; also how
InstanceNormalization is written) has no kernel in the 310's op list either. For ``x`` of shape
``(N, C, *S)`` in ``G`` groups it becomes::

    r = Reshape(x, (N, G, -1));  d = r - ReduceMean(r, 2)
    y = Reshape(d / Sqrt(ReduceMean(d * d, 2) + eps), x.shape) * gamma + beta   (gamma, beta per channel)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torch2ms.graph.ir import Graph, Node, Value
from torch2ms.passes.base import Pass, replace_node

MAX_POWER = 16
MAX_MIRROR = 8  # widest reflect/edge pad rewritten into slices


@dataclass
class PowMatch:
    node: Node
    exponent: float | None


def pow_plan(e: float) -> tuple[int, bool, bool] | None:
    """``(n, sqrt, reciprocal)`` with ``x^e = [1/](x^n [* sqrt(x)])``, or None when there is no such form."""
    neg = e < 0
    a = abs(e)
    n, half = int(np.floor(a)), a - np.floor(a)
    if half not in (0.0, 0.5) or n > MAX_POWER or a == 0:
        return None
    return n, half == 0.5, neg


class PowToMul(Pass):
    name = "ascend_pow_to_mul"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Pow" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            return None
        c = graph.const(node.inputs[1])
        if c is None:
            return PowMatch(node, None)
        flat = np.asarray(c, dtype=np.float64).reshape(-1)
        return PowMatch(node, float(flat[0]) if flat.size and (flat == flat[0]).all() else float("nan"))

    def check(self, graph: Graph, m: PowMatch) -> str | None:
        if m.exponent is None:
            return "the exponent is not a constant"
        if np.isnan(m.exponent):
            return "the exponent differs per element"
        plan = pow_plan(m.exponent)
        if plan is None:
            return f"exponent {m.exponent:g} has no Mul/Sqrt/Reciprocal form"
        x = graph.values[m.node.inputs[0]]
        if (plan[1] or plan[2]) and x.dtype is not None and np.dtype(x.dtype).kind != "f":
            return f"exponent {m.exponent:g} on an integer base"
        out = graph.values[m.node.outputs[0]]
        if x.shape is not None and out.shape is not None and tuple(x.shape) != tuple(out.shape):
            return "the exponent broadcasts the base to a larger shape"
        return None

    def rewrite(self, graph: Graph, m: PowMatch) -> None:
        node, x = m.node, m.node.inputs[0]
        n, sqrt, recip = pow_plan(m.exponent)
        base = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        like = graph.values[x]
        new: list[Node] = []

        def emit(op: str, inputs: list[str]) -> str:
            out = f"{node.outputs[0]}__pow{len(new)}"
            graph.values[out] = Value(out, like.shape, like.dtype)
            new.append(Node(f"{base}/{op}_pow{len(new)}", op, inputs, [out], origin=list(node.origin)))
            return out

        # square-and-multiply for x^n
        acc, sq, k = None, x, n
        while k:
            if k & 1:
                acc = sq if acc is None else emit("Mul", [acc, sq])
            k >>= 1
            if k:
                sq = emit("Mul", [sq, sq])
        if sqrt:
            r = emit("Sqrt", [x])
            acc = r if acc is None else emit("Mul", [acc, r])
        if recip:
            acc = emit("Reciprocal", [acc])
        result = node.outputs[0]
        if new:
            new[-1].outputs = [result]
            del graph.values[f"{result}__pow{len(new) - 1}"]
            graph.values[result] = Value(
                result, graph.values[result].shape if result in graph.values else like.shape, like.dtype
            )
            i = next(i for i, nd in enumerate(graph.nodes) if nd is node)
            graph.nodes[i : i + 1] = new
        else:  # x^1
            replace_node(graph, node, Node(f"{base}/Identity_pow", "Identity", [x], [result], origin=list(node.origin)))


@dataclass
class PoolMatch:
    node: Node
    pads: list[int]


class MaxPoolPadToPad(Pass):
    name = "ascend_maxpool_explicit_pad"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx"):
            return None
        pads = [int(p) for p in node.attrs.get("pads", [])]
        return PoolMatch(node, pads) if any(pads) or node.attrs.get("ceil_mode", 0) else None

    def check(self, graph: Graph, m: PoolMatch) -> str | None:
        a = m.node.attrs
        if any(d != 1 for d in a.get("dilations", [1])):
            return "dilated window"
        if len([o for o in m.node.outputs if o]) > 1:
            return "the Indices output is used"
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            return "auto_pad"
        x = graph.values[m.node.inputs[0]]
        if x.dtype is None or np.dtype(x.dtype).kind != "f":
            return "integer input (no -inf to pad with)"
        out = graph.values.get(m.node.outputs[0])
        if x.shape is None or out is None or out.shape is None:
            return "input or output shape unknown"
        return None

    @staticmethod
    def explicit_pads(graph: Graph, m: PoolMatch) -> tuple[list[int], list[int]]:
        """Begin and end pads after which a floor-mode, unpadded pool makes the graph's output windows."""
        a = m.node.attrs
        sizes = [int(d) for d in graph.values[m.node.inputs[0]].shape[2:]]
        outs = [int(d) for d in graph.values[m.node.outputs[0]].shape[2:]]
        kernel = [int(k) for k in a["kernel_shape"]]
        strides = [int(s) for s in a.get("strides", [1] * len(kernel))]
        begins = m.pads[: len(kernel)] if m.pads else [0] * len(kernel)
        ends = [max((o - 1) * s + k - b - n, 0) for o, s, k, b, n in zip(outs, strides, kernel, begins, sizes)]
        return begins, ends

    def rewrite(self, graph: Graph, m: PoolMatch) -> None:
        node = m.node
        x = graph.values[node.inputs[0]]
        begins, ends = self.explicit_pads(graph, m)
        attrs = {k2: v for k2, v in node.attrs.items() if k2 not in ("pads", "ceil_mode")}
        pool = Node(node.name, "MaxPool", [node.inputs[0]], list(node.outputs), attrs, origin=list(node.origin))
        i = next(i for i, nd in enumerate(graph.nodes) if nd is node)
        if not any(begins + ends):  # ceil_mode without an overhang: nothing to pad
            graph.nodes[i] = pool
            return
        onnx_pads = [0, 0] + begins + [0, 0] + ends  # ONNX Pad: all begins, then all ends
        padded_shape = (*x.shape[:2], *(int(d) + b + e for d, b, e in zip(x.shape[2:], begins, ends)))
        base = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        pads_v = graph.add_const(f"{node.name}__pads", np.array(onnx_pads, np.int64))
        value_v = graph.add_const(f"{node.name}__neg_inf", np.array(-np.inf, np.dtype(x.dtype)))
        out = f"{node.inputs[0]}__padded_{len(graph.values)}"
        graph.values[out] = Value(out, padded_shape, x.dtype)
        pad = Node(
            f"{base}/Pad_pool",
            "Pad",
            [node.inputs[0], pads_v, value_v],
            [out],
            {"mode": "constant"},
            origin=list(node.origin),
        )
        pool.inputs = [out]
        graph.nodes[i : i + 1] = [pad, pool]


@dataclass
class MirrorMatch:
    node: Node
    mode: str  # reflect | edge
    begins: list[int] | None  # per axis (None: the pads are not constants)
    ends: list[int] | None


class MirrorPadToConcat(Pass):
    name = "ascend_mirror_pad_to_concat"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Pad" or node.domain not in ("", "ai.onnx"):
            return None
        mode = node.attrs.get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode not in ("reflect", "edge"):
            return None
        x = graph.values[node.inputs[0]]
        rank = len(x.shape) if x.shape is not None else 0
        given = node.attrs.get("pads") if graph.opset < 11 else graph.const(node.inputs[1])
        axes = list(range(rank))
        if graph.opset >= 18 and len(node.inputs) > 3 and node.inputs[3]:
            a = graph.const(node.inputs[3])
            axes = None if a is None else [int(v) % rank for v in np.asarray(a).reshape(-1)]
        if given is None or axes is None or not rank:
            return MirrorMatch(node, mode, None, None)
        given = [int(p) for p in np.asarray(given).reshape(-1)]
        begins, ends = [0] * rank, [0] * rank
        for k, ax in enumerate(axes):
            begins[ax], ends[ax] = given[k], given[len(axes) + k]
        return MirrorMatch(node, mode, begins, ends)

    def check(self, graph: Graph, m: MirrorMatch) -> str | None:
        if m.begins is None:
            return "pads (or axes) not constant, or the input shape unknown"
        if graph.opset < 10:
            return f"opset {graph.opset}: Slice takes its bounds as inputs from opset 10"
        pads = m.begins + m.ends
        if not any(pads):
            return "nothing padded"
        if any(p < 0 for p in pads):
            return "negative pads (a crop)"
        if max(pads) > MAX_MIRROR:
            return f"pad {max(pads)} wider than {MAX_MIRROR}"
        shape = graph.values[m.node.inputs[0]].shape
        if m.mode == "reflect" and any(max(b, e) >= int(n) for b, e, n in zip(m.begins, m.ends, shape) if b or e):
            return "reflect pad not shorter than its axis"
        return None

    def rewrite(self, graph: Graph, m: MirrorMatch) -> None:
        node = m.node
        x = graph.values[node.inputs[0]]
        shape = [int(d) for d in x.shape]
        base = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        padded = [ax for ax in range(len(shape)) if m.begins[ax] or m.ends[ax]]
        new: list[Node] = []

        def emit(op: str, inputs: list[str], out_shape, attrs=None, out: str | None = None) -> str:
            out = out or f"{node.outputs[0]}__mirror{len(new)}"
            graph.values[out] = Value(out, tuple(out_shape), x.dtype)
            new.append(Node(f"{base}/{op}_mirror{len(new)}", op, inputs, [out], attrs or {}, origin=list(node.origin)))
            return out

        def const(tag: str, v: int) -> str:
            return graph.add_const(f"{node.outputs[0]}__{tag}", np.array([v], np.int64))

        cur = node.inputs[0]
        for k, ax in enumerate(padded):
            n, b, e = shape[ax], m.begins[ax], m.ends[ax]
            if m.mode == "reflect":
                before, after = list(range(b, 0, -1)), list(range(n - 2, n - 2 - e, -1))
            else:
                before, after = [0] * b, [n - 1] * e
            one = [*shape[:ax], 1, *shape[ax + 1 :]]
            axis = const("axis", ax)
            parts = [emit("Slice", [cur, const("start", i), const("end", i + 1), axis], one) for i in before]
            parts += [cur]
            parts += [emit("Slice", [cur, const("start", i), const("end", i + 1), axis], one) for i in after]
            shape[ax] = n + b + e
            last = k == len(padded) - 1
            cur = emit("Concat", parts, shape, {"axis": ax}, out=node.outputs[0] if last else None)
        i = next(i for i, nd in enumerate(graph.nodes) if nd is node)
        graph.nodes[i : i + 1] = new


HARD_ACTS = ("HardSwish", "HardSigmoid")


@dataclass
class HardMatch:
    node: Node
    kind: str  # HardSwish | HardSigmoid
    fused: bool  # the activation of a fused cell (attrs["activation"]) rather than a node of its own


class ExpandHardActivations(Pass):
    name = "ascend_expand_hard_activations"

    def match(self, graph: Graph, node: Node):
        if node.attrs.get("activation") in HARD_ACTS:
            return HardMatch(node, node.attrs["activation"], True)
        if node.op_type in HARD_ACTS and node.domain in ("", "ai.onnx", "torch2ms"):
            return HardMatch(node, node.op_type, False)
        return None

    def check(self, graph: Graph, m: HardMatch) -> str | None:
        if m.kind == "HardSigmoid" and not m.fused:
            alpha, beta = float(m.node.attrs.get("alpha", 0.2)), float(m.node.attrs.get("beta", 0.5))
            if abs(alpha - 1 / 6) > 1e-7 or abs(beta - 0.5) > 1e-7:
                return f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) is written as its formula already"
        x = graph.values[m.node.outputs[0] if m.fused else m.node.inputs[0]]
        if x.dtype is None or np.dtype(x.dtype).kind != "f":
            return "not a float tensor"
        return None

    def rewrite(self, graph: Graph, m: HardMatch) -> None:
        node, result = m.node, m.node.outputs[0]
        base = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        like = graph.values[result]
        if m.fused:  # the cell keeps its conv/matmul: its output becomes the formula's input
            x = f"{result}__pre_{m.kind.lower()}"
            graph.values[x] = Value(x, like.shape, like.dtype)
            node.attrs = {k: v for k, v in node.attrs.items() if k not in ("activation", "alpha", "beta")}
            node.attrs["activation"] = ""
            node.outputs = [x, *node.outputs[1:]]
            head = [node]
        else:
            x = node.inputs[0]
            head = []
        alpha, beta = 1 / 6, 0.5  # nn.HSigmoid's, the only ones a kernel-less HardSigmoid has (check)
        dt = np.dtype(like.dtype)
        consts = {k: graph.add_const(f"{result}__{k}", np.array(v, dt)) for k, v in
                  (("alpha", alpha), ("beta", beta), ("zero", 0.0), ("one", 1.0))}  # fmt: skip
        new: list[Node] = []

        def emit(op: str, inputs: list[str], out: str | None = None) -> str:
            out = out or f"{result}__{m.kind.lower()}{len(new)}"
            graph.values.setdefault(out, Value(out, like.shape, like.dtype))
            new.append(Node(f"{base}/{op}_{m.kind.lower()}{len(new)}", op, inputs, [out], origin=list(node.origin)))
            return out

        scaled = emit("Mul", [x, consts["alpha"]])
        shifted = emit("Add", [scaled, consts["beta"]])
        if m.kind == "HardSigmoid":
            emit("Clip", [shifted, consts["zero"], consts["one"]], result)
        else:
            gate = emit("Clip", [shifted, consts["zero"], consts["one"]])
            emit("Mul", [x, gate], result)
        i = next(i for i, nd in enumerate(graph.nodes) if nd is node)
        graph.nodes[i : i + 1] = head + new


GROUP_NORMS = {("", "InstanceNormalization"), ("", "GroupNormalization"), ("torch2ms", "GroupNormalization")}


class ExpandGroupNorm(Pass):
    name = "ascend_expand_group_norm"

    def match(self, graph: Graph, node: Node):
        return node if (node.domain if node.domain != "ai.onnx" else "", node.op_type) in GROUP_NORMS else None

    def check(self, graph: Graph, node: Node) -> str | None:
        x = graph.values[node.inputs[0]]
        if x.shape is None or len(x.shape) < 3:
            return "input rank below 3"
        if x.dtype is None or np.dtype(x.dtype).kind != "f":
            return "not a float tensor"
        if len(node.inputs) < 3 or graph.const(node.inputs[1]) is None or graph.const(node.inputs[2]) is None:
            return "scale or bias is not a constant"
        return None

    def rewrite(self, graph: Graph, node: Node) -> None:
        x = graph.values[node.inputs[0]]
        shape, dt = tuple(int(d) for d in x.shape), np.dtype(x.dtype)
        n, c = shape[0], shape[1]
        groups = c if node.op_type == "InstanceNormalization" else int(node.attrs.get("num_groups", 1))
        gamma, beta = (np.asarray(graph.const(i), dt).reshape(-1) for i in node.inputs[1:3])
        if gamma.size == groups != c:  # opset 18-20 GroupNormalization: one per group
            gamma, beta = np.repeat(gamma, c // groups), np.repeat(beta, c // groups)
        per_channel = (1, c) + (1,) * (len(shape) - 2)
        eps = float(node.attrs.get("epsilon", 1e-5))
        result = node.outputs[0]
        base = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        grouped = (n, groups, int(np.prod(shape)) // (n * groups))
        stat = (n, groups, 1)
        new: list[Node] = []

        def const(tag: str, value) -> str:
            return graph.add_const(f"{result}__{tag}", np.asarray(value))

        def emit(op: str, inputs: list[str], out_shape, attrs=None, out: str | None = None) -> str:
            out = out or f"{result}__gn{len(new)}"
            graph.values[out] = Value(out, tuple(out_shape), dt)
            new.append(Node(f"{base}/{op}_gn{len(new)}", op, inputs, [out], attrs or {}, origin=list(node.origin)))
            return out

        def mean(v: str) -> str:
            if graph.opset >= 18:
                return emit("ReduceMean", [v, const("axes", np.array([2], np.int64))], stat, {"keepdims": 1})
            return emit("ReduceMean", [v], stat, {"axes": [2], "keepdims": 1})

        r = emit("Reshape", [node.inputs[0], const("grouped", np.array(grouped, np.int64))], grouped)
        d = emit("Sub", [r, mean(r)], grouped)
        var = mean(emit("Mul", [d, d], grouped))
        std = emit("Sqrt", [emit("Add", [var, const("eps", np.array(eps, dt))], stat)], stat)
        normed = emit("Reshape", [emit("Div", [d, std], grouped), const("shape", np.array(shape, np.int64))], shape)
        scaled = emit("Mul", [normed, const("gamma", gamma.reshape(per_channel))], shape)
        emit("Add", [scaled, const("beta", beta.reshape(per_channel))], shape, out=result)
        i = next(i for i, nd in enumerate(graph.nodes) if nd is node)
        graph.nodes[i : i + 1] = new


def ascend_passes() -> list[Pass]:
    """The rewrites for Ascend targets, after the fold stage's passes."""
    return [PowToMul(), MaxPoolPadToPad(), MirrorPadToConcat(), ExpandHardActivations(), ExpandGroupNorm()]
