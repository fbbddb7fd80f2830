"""What each MindSpore call in generated code becomes on an Ascend chip: the CANN op(s) it lowers to.

Keys are spelled as generated code spells them: ``ops.<function>`` / ``ops.<Primitive>``,
``nn.<Cell>`` (a layer's class), or a Python operator (``+``, ``x[...]`` is ``getitem``). A value
is a tuple of CANN op types, or a function of the call's literal keyword arguments and the node's
shapes/dtypes (``Site``) returning one. ``torch2ms.ascend.table`` then says where each CANN op
runs. A call missing here is reported as ``unknown`` (and ``tests/ascend/test_ascend.py`` fails when a
converter can emit one).

Sources of the lowerings: MindSpore's primitive names (``mindspore.ops.operations``) and CANN's op
types, which for the ops below have the same name or the static-shape ``...D`` variant TBE
registers (``ConcatD``, ``TransposeD``, ...); layer cells by what their ``construct`` calls in
MindSpore 2.10 (``nn.MaxPool2d`` with ``pad_mode='pad'`` builds ``MaxPool3DWithArgmax``,
``nn.AvgPool2d`` with it ``AvgPool3D``, ``nn.GroupNorm`` calls ``ops.group_norm``;
``nn.Dense`` is ``MatMul`` + ``BiasAdd``; ``nn.Conv1d`` is a ``Conv2D`` over an expanded axis);
composites by MindSpore's own expansions (``SiLU`` = ``Sigmoid`` * x, its graph-kernel expander).
Shape-only ops (``Reshape``, ``ExpandDims``, ``Squeeze``) are listed: GE executes them as
metadata changes, they are placed ``none`` (no kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SHAPE_ONLY = frozenset({"Reshape", "ExpandDims", "Squeeze", "Flatten", "Identity"})


@dataclass
class Site:
    """The node a call was emitted for: its input shapes and dtypes, and the call's literal kwargs."""

    kwargs: dict = field(default_factory=dict)
    args: tuple = ()
    in_shapes: tuple = ()
    in_dtypes: tuple = ()

    def rank(self, i: int = 0) -> int:
        return len(self.in_shapes[i]) if i < len(self.in_shapes) and self.in_shapes[i] is not None else 0

    @property
    def boolean(self) -> bool:
        return bool(self.in_dtypes) and self.in_dtypes[0] == np.dtype(bool)


Lowering = tuple[str, ...] | Callable[[Site], tuple[str, ...]]

ACTIVATIONS = {
    "relu": ("Relu",),
    "relu6": ("Relu6",),
    "sigmoid": ("Sigmoid",),
    "silu": ("Sigmoid", "Mul"),
    "gelu": ("Gelu",),
    "mish": ("Mish",),
    "hsigmoid": ("HardSigmoid",),
    "hswish": ("HardSwish",),
    "elu": ("Elu",),
    "tanh": ("Tanh",),
    "leakyrelu": ("LeakyRelu",),
    "prelu": ("PRelu",),
}


def _activation(kw: dict) -> tuple[str, ...]:
    act = kw.get("activation")
    if act is None:
        return ()
    if isinstance(act, str):
        return ACTIVATIONS.get(act.lower(), (f"<activation {act}>",))
    return ()  # a layer passed as code (nn.GELU(...), nn.PReLU(C)): lowered where its source is parsed


def _conv2d(s: Site) -> tuple[str, ...]:
    group = int(s.kwargs.get("group", 1))
    cin = s.args[0] if s.args else None
    conv = "DepthwiseConv2D" if group > 1 and cin == group else "Conv2D"
    return (conv,)


def _get_activation(s: Site) -> tuple[str, ...]:
    # nn.get_activation(name) builds the activation cell: with a literal name, that activation's ops;
    # Conv3dBnAct passes its constructor argument, which is one of ACTIVATIONS (all AI Core) or None
    name = s.args[0] if s.args and isinstance(s.args[0], str) else None
    return _activation({"activation": name}) if name else ()


def _conv_bn_act(s: Site) -> tuple[str, ...]:
    bn = ("BNInfer",) if s.kwargs.get("has_bn") else ()
    return _conv2d(s) + bn + _activation(s.kwargs)


def _dense(s: Site) -> tuple[str, ...]:
    bias = ("BiasAdd",) if s.kwargs.get("has_bias", True) else ()
    bn = ("BNInfer",) if s.kwargs.get("has_bn") else ()
    # nn.Dense flattens the leading axes itself: one 2-D MatMul whatever the input's rank
    return ("MatMulV2", *bias, *bn, *_activation(s.kwargs))


def _matmul(s: Site) -> tuple[str, ...]:
    return ("BatchMatMul",) if max(s.rank(0), s.rank(1)) > 2 else ("MatMulV2",)


def _max_pool(s: Site) -> tuple[str, ...]:
    # MindSpore 2.10 nn.MaxPool{1,2}d: pad_mode='pad' (padding, ceil_mode, dilation, return_indices)
    # is built on MaxPool3DWithArgmax; 'valid'/'same' on MaxPool.
    return ("MaxPool3DWithArgmax",) if s.kwargs.get("pad_mode") == "pad" else ("MaxPool",)


def _avg_pool(s: Site) -> tuple[str, ...]:
    # nn.AvgPool{1,2}d with pad_mode='pad' is built on AvgPool3D over an added axis
    return ("AvgPool3D",) if s.kwargs.get("pad_mode") == "pad" else ("AvgPool",)


def _max_pool3d(s: Site) -> tuple[str, ...]:
    # nn.MaxPool3d: MaxPool3DWithArgmax for dilation / return_indices, MaxPool3D otherwise
    dilated = s.kwargs.get("dilation", 1) not in (1, (1, 1, 1))
    return ("MaxPool3DWithArgmax",) if dilated or s.kwargs.get("return_indices") else ("MaxPool3D",)


def _pad(s: Site) -> tuple[str, ...]:
    mode = s.kwargs.get("mode", "constant")
    if mode != "constant":
        return ("MirrorPad",) if mode in ("reflect", "symmetric") else ("PadV3",)
    return ("PadV3D",) if s.kwargs.get("value", 0) not in (0, None) else ("PadD",)


def _interpolate(s: Site) -> tuple[str, ...]:
    mode = s.kwargs.get("mode", "nearest")
    return {
        "bilinear": ("ResizeBilinearV2D",),
        "nearest": ("ResizeNearestNeighborV2D",),
        "nearest-exact": ("ResizeNearestNeighborV2D",),
        "bicubic": ("ResizeBicubic",),
        "linear": ("ResizeBilinearV2D",),
        "trilinear": ("UpsampleTrilinear3D",),
        "area": ("ResizeArea",),
    }.get(mode, (f"<interpolate {mode}>",))


def _logical(logical: str, bitwise: str) -> Callable[[Site], tuple[str, ...]]:
    return lambda s: (logical,) if s.boolean else (bitwise,)


def _where(s: Site) -> tuple[str, ...]:
    return ("Select",)


def _getitem(s: Site) -> tuple[str, ...]:
    return ("StridedSliceD",)


LOWERING: dict[str, Lowering] = {
    # --- layers (cells) ---
    "nn.Conv1d": _conv2d,
    "nn.Conv2d": _conv2d,
    "nn.Conv3d": ("Conv3D",),
    "nn.Conv2dBnAct": _conv_bn_act,
    "nn.Conv1dTranspose": ("Conv2DTransposeD",),
    "nn.Conv2dTranspose": ("Conv2DTransposeD",),
    "nn.Conv3dTranspose": ("Conv3DTransposeD",),
    "nn.Dense": _dense,
    "nn.DenseBnAct": _dense,
    "nn.Linear": _dense,
    "nn.MaxPool1d": _max_pool,
    "nn.MaxPool2d": _max_pool,
    "nn.MaxPool3d": _max_pool3d,
    "nn.AvgPool1d": _avg_pool,
    "nn.AvgPool2d": _avg_pool,
    "nn.AvgPool3d": ("AvgPool3D",),
    "nn.BatchNorm1d": ("BNInfer",),
    "nn.BatchNorm2d": ("BNInfer",),
    # MindSpore 2.10 nn.BatchNorm3d reshapes (N, C, D, H, W) to (N, C, D*H, W) around an inner BatchNorm2d
    "nn.BatchNorm3d": ("BNInfer",),
    "nn.LayerNorm": ("LayerNorm",),
    "nn.GroupNorm": ("GroupNorm",),  # MindSpore 2.10 nn.GroupNorm.construct calls ops.group_norm
    "nn.InstanceNorm2d": ("INInferV2",),
    "nn.LRN": ("LRN",),
    "nn.PReLU": ("PRelu",),
    "nn.LeakyReLU": ("LeakyRelu",),
    "nn.get_activation": _get_activation,
    "nn.GELU": ("Gelu",),
    "nn.HSigmoid": ("HardSigmoid",),
    "nn.Hardsigmoid": ("HardSigmoid",),
    "nn.LSTM": ("DynamicRNN",),
    "nn.GRU": ("DynamicGRUV2",),
    "nn.RNN": ("MatMulV2", "BiasAdd", "Add", "Tanh"),
    # --- element-wise functions ---
    "ops.abs": ("Abs",),
    "ops.neg": ("Neg",),
    "ops.sqrt": ("Sqrt",),
    "ops.rsqrt": ("Rsqrt",),
    "ops.square": ("Square",),
    "ops.reciprocal": ("Reciprocal",),
    "ops.exp": ("Exp",),
    "ops.expm1": ("Expm1",),
    "ops.log": ("Log",),
    "ops.pow": ("Pow",),
    "ops.floor": ("Floor",),
    "ops.ceil": ("Ceil",),
    "ops.round": ("Round",),
    "ops.sign": ("Sign",),
    "ops.sin": ("Sin",),
    "ops.cos": ("Cos",),
    "ops.tan": ("Tan",),
    "ops.asin": ("Asin",),
    "ops.acos": ("Acos",),
    "ops.atan": ("Atan",),
    "ops.sinh": ("Sinh",),
    "ops.cosh": ("Cosh",),
    "ops.asinh": ("Asinh",),
    "ops.acosh": ("Acosh",),
    "ops.atanh": ("Atanh",),
    "ops.erf": ("Erf",),
    "ops.relu": ("Relu",),
    "ops.relu6": ("Relu6",),
    "ops.sigmoid": ("Sigmoid",),
    "ops.tanh": ("Tanh",),
    "ops.silu": ("Sigmoid", "Mul"),
    "ops.gelu": ("Gelu",),
    "ops.mish": ("Mish",),
    "ops.elu": ("Elu",),
    "ops.celu": ("CeLU",),
    "ops.selu": ("Selu",),
    "ops.softplus": ("Softplus",),
    "ops.softsign": ("Softsign",),
    "ops.hardswish": ("HardSwish",),
    "ops.hardsigmoid": ("HardSigmoid",),
    "ops.hardshrink": ("HShrink",),
    "ops.softshrink": ("SoftShrink",),
    "ops.leaky_relu": ("LeakyRelu",),
    "ops.prelu": ("PRelu",),
    "ops.threshold": ("ThresholdV2D",),
    "ops.clamp": ("ClipByValue",),
    "ops.maximum": ("Maximum",),
    "ops.minimum": ("Minimum",),
    "ops.div": ("RealDiv",),
    "ops.truncate_div": ("TruncateDiv",),
    "ops.remainder": ("FloorMod",),
    "ops.fmod": ("TruncateMod",),
    "ops.isnan": ("IsNan",),
    "ops.isinf": ("IsInf",),
    "ops.isfinite": ("IsFinite",),
    "ops.equal": ("Equal",),
    "ops.greater": ("Greater",),
    "ops.greater_equal": ("GreaterEqual",),
    "ops.less": ("Less",),
    "ops.less_equal": ("LessEqual",),
    "ops.logical_and": ("LogicalAnd",),
    "ops.logical_or": ("LogicalOr",),
    "ops.logical_xor": ("NotEqual",),
    "ops.logical_not": ("LogicalNot",),
    "ops.bitwise_and": ("BitwiseAnd",),
    "ops.bitwise_or": ("BitwiseOr",),
    "ops.bitwise_xor": ("BitwiseXor",),
    "ops.bitwise_left_shift": ("LeftShift",),
    "ops.bitwise_right_shift": ("RightShift",),
    "ops.invert": ("Invert",),
    "ops.where": _where,
    "ops.cast": ("Cast",),
    # --- reductions, normalizations ---
    "ops.sum": ("ReduceSumD",),
    "ops.mean": ("ReduceMeanD",),
    "ops.amax": ("ReduceMaxD",),
    "ops.amin": ("ReduceMinD",),
    "ops.prod": ("ReduceProdD",),
    "ops.any": ("ReduceAnyD",),
    "ops.all": ("ReduceAllD",),
    "ops.var": ("ReduceMeanD", "SquaredDifference", "ReduceMeanD"),
    "ops.norm": ("LpNorm",),
    "ops.logsumexp": ("ReduceMaxD", "Sub", "Exp", "ReduceSumD", "Log", "Add"),
    "ops.softmax": ("SoftmaxV2",),
    "ops.log_softmax": ("LogSoftmaxV2",),
    "ops.argmax": ("ArgMaxD",),
    "ops.argmin": ("ArgMinD",),
    "ops.cumsum": ("CumsumD",),
    "ops.CumSum": ("CumsumD",),
    "ops.cumprod": ("CumprodD",),
    "ops.CumProd": ("CumprodD",),
    "ops.topk": ("TopKD",),
    "ops.sort": ("Sort",),
    # --- data movement ---
    "ops.reshape": ("Reshape",),
    "ops.expand_dims": ("ExpandDims",),
    "ops.squeeze": ("Squeeze",),
    "ops.transpose": ("TransposeD",),
    "ops.concat": ("ConcatD",),
    "ops.stack": ("Pack",),
    "ops.unstack": ("Unpack",),
    "ops.split": ("SplitVD",),
    "ops.tile": ("TileD",),
    "ops.broadcast_to": ("BroadcastToD",),
    "ops.flip": ("ReverseV2D",),
    "ops.reverse_sequence": ("ReverseSequence",),
    "ops.pad": _pad,
    "ops.gather": ("GatherV2D",),
    "ops.gather_elements": ("GatherD",),
    "ops.gather_nd": ("GatherNd",),
    "ops.scatter_nd": ("ScatterNdD",),
    "ops.tensor_scatter_update": ("TensorScatterUpdate",),
    "ops.tensor_scatter_add": ("TensorScatterAdd",),
    "ops.tensor_scatter_mul": ("TensorScatterMul",),
    "ops.tensor_scatter_max": ("TensorScatterMax",),
    "ops.tensor_scatter_min": ("TensorScatterMin",),
    "ops.tensor_scatter_elements": ("ScatterElements",),
    "ops.one_hot": ("OneHotD",),
    "ops.diagonal": ("MatrixDiagPartD",),
    "ops.triu": ("Triu",),
    "ops.tril": ("Tril",),
    # --- creation (constant-folded by ATC when their inputs are constant) ---
    "ops.zeros": ("Fill",),
    "ops.ones": ("Fill",),
    "ops.full": ("Fill",),
    "ops.zeros_like": ("ZerosLike",),
    "ops.ones_like": ("OnesLike",),
    "ops.arange": ("RangeD",),
    "ops.eye": ("Eye",),
    "ops.tuple_to_array": (),
    # --- module containers the module-class layout writes: no device op of their own ---
    "nn.SequentialCell": (),
    "nn.CellList": (),
    "nn.Identity": (),
    # --- matrix, image, detection ---
    "ops.matmul": _matmul,
    "ops.einsum": ("Einsum",),
    "ops.det": ("MatrixDeterminant",),
    "ops.interpolate": _interpolate,
    "ops.ResizeBilinearV2": ("ResizeBilinearV2D",),
    "ops.ResizeNearestNeighborV2": ("ResizeNearestNeighborV2D",),
    "ops.grid_sample": ("GridSampler2D",),
    "ops.affine_grid": ("AffineGrid",),
    "ops.ROIAlign": ("ROIAlign",),
    "ops.ROIPooling": ("ROIPooling",),
    "ops.deformable_conv2d": ("DeformableOffsets", "Conv2D"),
    "ops.fold": ("Col2Im",),
    "ops.nll_loss": ("NLLLoss",),
    "ops.cross_entropy": ("LogSoftmaxV2", "NLLLoss"),
    # --- Python operators in generated code ---
    "+": ("Add",),
    "-": ("Sub",),
    "*": ("Mul",),
    "/": ("RealDiv",),
    "//": ("FloorDiv",),
    "%": ("FloorMod",),
    "**": ("Pow",),
    "@": _matmul,
    "&": _logical("LogicalAnd", "BitwiseAnd"),
    "|": _logical("LogicalOr", "BitwiseOr"),
    "^": _logical("NotEqual", "BitwiseXor"),
    "~": _logical("LogicalNot", "Invert"),
    "neg": ("Neg",),
    "==": ("Equal",),
    "!=": ("NotEqual",),
    "<": ("Less",),
    "<=": ("LessEqual",),
    ">": ("Greater",),
    ">=": ("GreaterEqual",),
    "getitem": _getitem,
}

# Names in converter sources that are not calls emitted into a network.
NOT_EMITTED = frozenset({"nn.Cell", "nn.functional"})
# Calls placed by what the converter plugin gives, not by this table: a user's kernel runs on the AI Core
# when the plugin gives its Ascend implementation, and nowhere otherwise (ascend/placement.py).
PLACED_BY_PLUGIN = frozenset({"ops.Custom"})


def lower(name: str, site: Site) -> tuple[str, ...] | None:
    """The CANN ops of call ``name`` at ``site``, or None when the table does not know the call."""
    low = LOWERING.get(name)
    if low is None:
        return None
    return low(site) if callable(low) else low
