"""The Atlas tuning rules, measured on a placed network: channel padding, Resize alignment, UB fusion.

* **Channels.** The cube unit computes in blocks of C0 channels (the NC1HWC0 layout: C0 = 16 for
  fp16, 32 for int8); a convolution's input and output channels are padded up to a multiple of
  C0, per group. An input convolution with at most 4 channels uses the C04 layout instead
  (``NC1HWC0_C04`` / ``FRACTAL_Z_C04`` among the TransData formats of the op-info file): padded to
  4. The waste is the MACs computed on padding::

      macs(c_in, c_out) = N * H_out * W_out * k_h * k_w * c_out * c_in / groups
      waste = macs(pad(c_in), pad(c_out)) - macs(c_in, c_out)

* **Resize alignment.** A bilinear/nearest resize from ``src`` to ``dst`` pixels along an axis
  is fast when ``(dst - 1) / (src - 1)`` is an integer (the Atlas article: 175 -> 350 took 20 ms,
  176 -> 351 took 1.6 ms). For each resize that misses it: the nearest input size that meets it
  for the same output, and, when ``dst = k * src``, the aligned pair ``(src + 1, k * src + 1)``.
  Both change the model's input size or the resize's output: advice, never a rewrite.
* **UB fusion.** ATC fuses in the unified buffer a convolution with up to 3 element-wise ops
  after it, element-wise chains of up to 5 ops, and a reduction with up to 4 element-wise ops.
  A chain continues while the value has one consumer and the next op is element-wise; where it
  stops, the reason is said (a second consumer, a non-element-wise op, the length limit).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torch2ms.ascend.placement import NodeInfo
from torch2ms.graph.ir import Graph, Node
from torch2ms.graph.names import module_path

CONV_OPS = {"Conv", "ConvBnAct"}
RESIZE_CANN = {"ResizeBilinearV2D", "ResizeNearestNeighborV2D"}
CUBE = {"Conv2D", "DepthwiseConv2D", "Conv2DTransposeD", "Conv3D"}
REDUCE = {"ReduceSumD", "ReduceMeanD", "ReduceMaxD", "ReduceMinD", "ReduceProdD"}
ELEMENTWISE = {
    "Add", "Sub", "Mul", "RealDiv", "Div", "Adds", "Muls", "Maximum", "Minimum", "ClipByValue",
    "Relu", "Relu6", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Gelu", "Mish", "Elu", "Selu",
    "Abs", "Neg", "Exp", "Log", "Sqrt", "Rsqrt", "Square", "Reciprocal", "Pow", "Cast", "Erf",
    "Softplus", "SquaredDifference", "Floor", "Ceil", "Round", "Sign", "BiasAdd", "BNInfer",
}  # fmt: skip
LIMITS = {"conv": 3, "elementwise": 5, "reduce": 4}


def _pad(c: int, c0: int) -> int:
    return -(-c // c0) * c0


@dataclass
class ConvWaste:
    module: str
    node: str
    c_in: int
    c_out: int
    groups: int
    c0: int
    macs: int
    waste: int


def channel_waste(graph: Graph, precision: str = "fp16") -> list[ConvWaste]:
    """Every 2-D convolution with its MACs and the MACs lost to channel padding."""
    c0 = 32 if precision == "int8" else 16
    out = []
    for n in graph.nodes:
        if n.op_type not in CONV_OPS or len(n.inputs) < 2:
            continue
        w = graph.values[n.inputs[1]]
        y = graph.values[n.outputs[0]]
        if w.shape is None or y.shape is None or len(w.shape) != 4 or len(y.shape) != 4:
            continue
        groups = int(n.attrs.get("group", 1))
        c_out, cin_g, kh, kw = (int(d) for d in w.shape)
        c_in = cin_g * groups
        spatial = int(y.shape[0]) * int(y.shape[2]) * int(y.shape[3]) * kh * kw
        macs = spatial * c_out * cin_g
        block_in = 4 if c_in <= 4 and groups == 1 else c0
        if groups == c_in and groups > 1:  # depthwise: one channel per group, C1 blocks of C0 channels
            padded = spatial * _pad(c_out, c0) * cin_g
        else:
            padded = spatial * groups * _pad(c_out // groups, c0) * _pad(cin_g, block_in)
        out.append(
            ConvWaste(".".join(module_path(n.name)) or n.name, n.name, c_in, c_out, groups, c0, macs, padded - macs)
        )
    return out


@dataclass
class ResizeAdvice:
    module: str
    node: str
    src: tuple[int, int]
    dst: tuple[int, int]
    aligned: bool
    nearest_src: tuple[int, int] | None  # nearest input size meeting the rule for this output, if near
    pair: tuple[tuple[int, int], tuple[int, int]] | None  # (src + 1, k * src + 1) when dst = k * src


def _nearest_aligned(src: int, dst: int) -> int:
    if dst <= 1:
        return src
    cands = [d + 1 for d in range(1, dst) if (dst - 1) % d == 0]
    return min(cands, key=lambda s: (abs(s - src), -s))


def _aligned(src: int, dst: int) -> bool:
    # from one pixel a resize is a broadcast: nothing to interpolate
    return src in (1, dst) or (src > 1 and (dst - 1) % (src - 1) == 0)


def resize_alignment(graph: Graph, infos: list[NodeInfo]) -> list[ResizeAdvice]:
    out = []
    for info in infos:
        if not any(o.cann in RESIZE_CANN for o in info.ops):
            continue
        n = info.node
        x, y = graph.values[n.inputs[0]].shape, graph.values[n.outputs[0]].shape
        if x is None or y is None or len(x) != 4:
            continue
        src, dst = (int(x[2]), int(x[3])), (int(y[2]), int(y[3]))
        ok = all(_aligned(s, d) for s, d in zip(src, dst))
        near = [s if _aligned(s, d) else _nearest_aligned(s, d) for s, d in zip(src, dst)]
        # an aligned size far from the model's (32 -> 2 for an output of 128) is no advice
        nearest = tuple(near) if all(abs(n - s) <= max(2, s // 4) for n, s in zip(near, src)) else None
        pair = None
        if all(d % s == 0 for s, d in zip(src, dst)) and not ok:
            pair = (tuple(s + 1 for s in src), tuple(d + 1 for d in dst))
        out.append(ResizeAdvice(".".join(module_path(n.name)) or n.name, n.name, src, dst, ok, nearest, pair))
    return out


def _consumers(graph: Graph) -> dict[str, list[Node]]:
    uses: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                uses.setdefault(i, []).append(n)
    return uses


def ub_fusion(graph: Graph, infos: list[NodeInfo]) -> dict:
    """Fusion chains from each convolution / reduction / element-wise head, and where they break."""
    by_node = {id(i.node): i for i in infos}
    uses = _consumers(graph)
    outputs = set(graph.outputs)

    def ops_of(n: Node) -> list[str]:
        info = by_node.get(id(n))
        return [o.cann for o in info.ops if o.where.placement != "none"] if info else []

    def kind(ops: list[str]) -> str | None:
        if ops and ops[0] in CUBE:
            return "conv"
        if ops and ops[0] in REDUCE:
            return "reduce"
        if ops and all(o in ELEMENTWISE for o in ops):
            return "elementwise"
        return None

    in_chain: set[int] = set()
    chains, breaks = Counter(), Counter()
    examples: dict[str, str] = {}
    for n in graph.nodes:
        ops = ops_of(n)
        k = kind(ops)
        if k is None or id(n) in in_chain:
            continue
        limit = LIMITS[k]
        tail = len(ops) - (0 if k == "elementwise" else 1)
        cur, reason = n, ""
        while True:
            out = cur.outputs[0] if cur.outputs else ""
            nxt = uses.get(out, [])
            if out in outputs or not nxt:
                reason = "network output" if out in outputs else ""
                break
            if len(nxt) > 1:
                reason = f"value used {len(nxt)} times"
                break
            nops = ops_of(nxt[0])
            if not nops or not all(o in ELEMENTWISE for o in nops):
                reason = f"followed by {nops[0] if nops else nxt[0].op_type}, not element-wise"
                break
            if tail + len(nops) > limit:
                reason = f"more than {limit} element-wise ops"
                break
            tail += len(nops)
            cur = nxt[0]
            in_chain.add(id(cur))
        chains[(k, min(tail, limit))] += 1
        if reason:
            key = f"{k}: {reason}"
            breaks[key] += 1
            examples.setdefault(key, ".".join(module_path(cur.name)) or cur.name)
    return {
        "chains": {
            (f"{t} element-wise" if k == "elementwise" else f"{k} + {t} element-wise"): c
            for (k, t), c in sorted(chains.items())
        },
        "breaks": [{"reason": r, "count": c, "first": examples[r]} for r, c in breaks.most_common()],
    }


def waste_totals(convs: list[ConvWaste]) -> dict:
    macs = sum(c.macs for c in convs)
    waste = sum(c.waste for c in convs)
    return {"conv_macs": macs, "waste_macs": waste, "waste_pct": round(100 * waste / macs, 2) if macs else 0.0}
