"""Pooling over 1, 2 or 3 spatial axes: MaxPool, AveragePool, LpPool, their Global forms,
MaxUnpool, RoiAlign and Col2Im (MaxRoiPool is refused, at the end).

Along one axis with input length ``n``, kernel ``k``, stride ``s``, dilation ``d``, pads
``(b, e)``, output window ``o`` covers taps ``o * s - b + j * d`` (``j < k``). The output length
comes from onnxruntime's run of the model (``em.out_shape()``): in ``ceil_mode`` a last window
that would start in the end padding is dropped, as in PyTorch; ONNX's own shape inference keeps
it, so the value is not recomputed here.

A MindSpore pooling layer pads both ends alike and by at most half the kernel, so a pooling is
written as the layer itself (``pad_mode='pad'``, ``padding``, ``ceil_mode``, ``count_include_pad``)
only when its pads are equal, within half the kernel, and its own output length matches.
Otherwise the padding is an explicit ``ops.pad`` (``-inf`` before a max pool, zeros before an
average) whose end pad also covers ceil mode's overhang exactly: ``(out - 1) * s + (k - 1) * d + 1
- b - n`` (or none), so a plain ``pad_mode='valid'`` layer makes exactly the ``out`` windows. Such
an average pool divides by the whole window, so it is multiplied by a constant ``window / divisor``
tensor, where the divisor is what ONNX divides by: the taps inside the padded input
(``count_include_pad=1``) or inside the input itself (``count_include_pad=0``).

MindSpore's average pools take no dilation: a dilated AveragePool (opset 19) is a depthwise
``nn.Conv{1,2,3}d`` whose weights are ``1 / window``, over the same explicit padding and with the
same divisor correction. LpPool is ``(sum over the window of |x|^p)^(1/p)``: the window sum is
the average pool above (padding counted) times the window size.

RoiAlign is ``ops.ROIAlign`` with ``roi_end_mode=0``, which samples exactly as ONNX's
``output_half_pixel`` (PyTorch's ``aligned=False``) for a fixed ``sampling_ratio``; its RoIs are
``(batch index, x1, y1, x2, y2)`` rows, so ``batch_indices`` is concatenated in front. Col2Im of a 2-D
image is ``ops.fold``, onto the padded image and then cropped when the pads differ at the two
ends; of a 1-D or 3-D image, a scatter-add (``ops.scatter_nd``) with constant pixel indices.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, literal, ms_dtype, refuse, squash
from torch2ms.converters.padding import explicit_pads

_POOL = {"max": "nn.MaxPool{}d", "avg": "nn.AvgPool{}d", "conv": "nn.Conv{}d"}


class Window:
    """The geometry of one pooling node, per spatial axis."""

    def __init__(self, em, kernel_shape, strides, pads, dilations, auto_pad):
        rank = em.rank(0)
        if rank not in (3, 4, 5):
            raise Unsupported(f"input rank {rank} not supported (1-D, 2-D or 3-D pooling)")
        n = rank - 2
        self.sizes = [int(v) for v in em.shape(0)[2:]]
        self.outs = [int(v) for v in em.out_shape()[2:]]
        self.kernel = [int(k) for k in kernel_shape]
        self.strides = [int(s) for s in (strides or [1] * n)]
        self.dilations = [int(d) for d in (dilations or [1] * n)]
        self.begins, self.ends = explicit_pads(self.sizes, self.kernel, self.strides, self.dilations, pads, auto_pad)
        self.n = n
        if not all(self.outs):
            raise Unsupported(f"kernel_shape={self.kernel} larger than the padded input {self.sizes} (empty output)")

    @property
    def spans(self) -> list[int]:
        return [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations)]

    def native(self, ceil_mode: int) -> bool:
        """Whether a MindSpore pooling layer with symmetric ``padding`` and ``ceil_mode`` makes
        exactly these windows (PyTorch's rule, which MindSpore follows)."""
        if self.begins != self.ends or any(2 * p > k for p, k in zip(self.begins, self.kernel)):
            return False
        for size, p, span, s, out in zip(self.sizes, self.begins, self.spans, self.strides, self.outs):
            count = (size + 2 * p - span + (s - 1 if ceil_mode else 0)) // s + 1
            if ceil_mode and (count - 1) * s >= size + p:
                count -= 1
            if count != out:
                return False
        return True

    def explicit_ends(self) -> list[int]:
        """End pads for a valid-mode layer to make exactly ``out`` windows (ceil overhang included)."""
        return [
            max((out - 1) * s + span - b - size, 0)
            for out, s, span, b, size in zip(self.outs, self.strides, self.spans, self.begins, self.sizes)
        ]

    def pad(self, x: str, value: str = "") -> str:
        """``ops.pad`` of ``x`` to the explicit padding (``ops.pad`` lists the last axis first)."""
        flat = [v for b, e in reversed(list(zip(self.begins, self.explicit_ends()))) for v in (b, e)]
        return f"ops.pad({x}, {tuple(flat)!r}{value})" if any(flat) else x

    def divisor(self, count_include_pad: int) -> np.ndarray:
        """What ONNX's average divides each output by: taps inside the padded input, or inside the input."""
        factors = []
        for size, out, k, s, d, b, e in zip(
            self.sizes, self.outs, self.kernel, self.strides, self.dilations, self.begins, self.ends
        ):
            taps = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d  # in padded coordinates
            inside = (taps < b + size + e) if count_include_pad else ((taps >= b) & (taps < b + size))
            factors.append(inside.sum(axis=1))
        total = factors[0]
        for f in factors[1:]:
            total = np.multiply.outer(total, f)
        return total.astype(np.float64)


def _layer_kwargs(win: Window, pads=True, ceil_mode=0) -> dict:
    kw: dict = {"kernel_size": squash(win.kernel)}
    if any(s != 1 for s in win.strides):
        kw["stride"] = squash(win.strides)
    if pads and (any(win.begins) or ceil_mode):
        kw["pad_mode"] = "pad"  # MindSpore refuses ceil_mode with the default pad_mode='valid'
        if any(win.begins):
            kw["padding"] = squash(win.begins)
        if ceil_mode:
            kw["ceil_mode"] = True
    return kw


@converter("MaxPool", since=1)
def max_pool(
    em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0, strides=None
):
    """MaxPool(X) -> Y, Indices?   attrs: kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, storage_order"""
    win = Window(em, kernel_shape, strides, pads, dilations, auto_pad)
    native = win.native(ceil_mode)
    indices = em.n_outputs() > 1
    if indices and not native:
        raise Unsupported(
            "the Indices output with pads a MindSpore pooling layer cannot take (unequal, over half a kernel)"
        )
    if indices and storage_order:
        raise Unsupported("storage_order=1 (column-major Indices) not supported")
    kw = _layer_kwargs(win, pads=native, ceil_mode=ceil_mode)
    if any(d != 1 for d in win.dilations) or indices:
        kw["pad_mode"] = "pad"  # MindSpore takes dilation and return_indices with pad_mode='pad' only
    if any(d != 1 for d in win.dilations):
        kw["dilation"] = squash(win.dilations)
    if indices:
        kw["return_indices"] = True
    layer = em.layer(_POOL["max"].format(win.n), **kw)
    x = em.x(0)
    integer = em.dtype(0).kind in "iu"
    if integer:  # MindSpore's CPU max pools take floats only; 8-bit integers are exact in float32
        x = f"ops.cast({x}, ms.float32)"
    if not native:
        x = win.pad(x, ', value=float("-inf")')
    y = f"{layer}({x})"
    if not indices:
        return f"ops.cast({y}, {ms_dtype(em.dtype(0))})" if integer else y
    values = f"ops.cast({y}[0], {ms_dtype(em.dtype(0))})" if integer else f"{y}[0]"
    return f"{values}, {_flat_indices(em, f'{y}[1]')}"


def _flat_indices(em, plane_index: str) -> str:
    """ONNX's Indices count through the whole tensor; MindSpore's (like PyTorch's) inside each
    (n, c) plane: add each plane's offset."""
    n, c, *spatial = (int(d) for d in em.shape(0))
    plane = int(np.prod(spatial))
    offsets = (np.arange(n * c, dtype=np.int64) * plane).reshape(n, c, *[1] * len(spatial))
    if n * c == 1:
        return plane_index
    return f"{plane_index} + {em.tensor(offsets, (em.layer_name or 'pool') + '_index_offset')}"


def _window_mean(em, win: Window, x: str, channels: int) -> str:
    """Mean over every (dilated) window of the explicitly padded ``x``: a valid-mode average pool,
    or with dilations a depthwise convolution whose weights are 1 / window."""
    if all(d == 1 for d in win.dilations):
        return f"{em.layer(_POOL['avg'].format(win.n), **_layer_kwargs(win, pads=False))}({win.pad(x)})"
    window = int(np.prod(win.kernel))
    shape = (channels, 1, *([1] if win.n == 1 else []), *win.kernel)  # nn.Conv1d's weight is (C, 1, 1, k)
    weight = np.full(shape, 1.0 / window, np.float32)
    kw = _layer_kwargs(win, pads=False) | {"pad_mode": "valid", "dilation": squash(win.dilations), "group": channels}
    kernel = kw.pop("kernel_size")
    layer = em.layer(_POOL["conv"].format(win.n), channels, channels, kernel, params={"weight": weight}, **kw)
    if em.dtype(0) == np.float32:
        return f"{layer}({win.pad(x)})"
    return f"ops.cast({layer}(ops.cast({win.pad(x)}, ms.float32)), {ms_dtype(em.dtype(0))})"  # a float32 layer


@converter("AveragePool", since=1)
def average_pool(
    em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, pads=None, strides=None, dilations=None
):
    """AveragePool(X) -> Y   attrs: kernel_shape, strides, pads, auto_pad, ceil_mode, count_include_pad, dilations"""
    win = Window(em, kernel_shape, strides, pads, dilations, auto_pad)
    if all(d == 1 for d in win.dilations) and win.native(ceil_mode):
        kw = _layer_kwargs(win, ceil_mode=ceil_mode)
        if any(win.begins) and not count_include_pad:
            kw["count_include_pad"] = False
        return f"{em.layer(_POOL['avg'].format(win.n), **kw)}({em.x(0)})"
    expr = _window_mean(em, win, em.x(0), int(em.shape(0)[1]))
    factor = np.prod(win.kernel) / win.divisor(count_include_pad)
    if not np.all(factor == 1):
        factor = factor.astype(em.dtype(0)).reshape((1, 1, *win.outs))
        expr = f"{expr} * {em.tensor(factor, (em.layer_name or 'pool') + '_divisor')}"
    return expr


def _abs_pow(x: str, p: int) -> str:
    return f"ops.square({x})" if p == 2 else f"ops.abs({x})" if p == 1 else f"ops.pow(ops.abs({x}), {p})"


def _root(x: str, p: int) -> str:
    return f"ops.sqrt({x})" if p == 2 else x if p == 1 else f"ops.pow({x}, {literal(1.0 / p)})"


@converter("LpPool", since=1)
def lp_pool(em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, p=2, pads=None, strides=None):
    """LpPool(X) -> Y   attrs: kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, p; (sum |x|^p)^(1/p)"""
    win = Window(em, kernel_shape, strides, pads, dilations, auto_pad)
    mean = _window_mean(em, win, _abs_pow(em.x(0), int(p)), int(em.shape(0)[1]))
    return _root(f"{mean} * {int(np.prod(win.kernel))}", int(p))


@converter("GlobalAveragePool", since=1)
def global_average_pool(em):
    """GlobalAveragePool(X) -> Y   (mean over all spatial axes, kept)"""
    axes = tuple(range(2, em.rank(0)))
    return f"ops.mean({em.x(0)}, axis={axes!r}, keep_dims=True)"


@converter("GlobalMaxPool", since=1)
def global_max_pool(em):
    """GlobalMaxPool(X) -> Y   (max over all spatial axes, kept)"""
    axes = tuple(range(2, em.rank(0)))
    return f"ops.amax({em.x(0)}, axis={axes!r}, keepdims=True)"


@converter("GlobalLpPool", since=2)
def global_lp_pool(em, *, p=2):
    """GlobalLpPool(X) -> Y   attrs: p; (sum over all spatial axes of |x|^p)^(1/p), kept"""
    axes = tuple(range(2, em.rank(0)))
    return _root(f"ops.sum({_abs_pow(em.x(0), int(p))}, dim={axes!r}, keepdim=True)", int(p))


@converter("MaxUnpool", since=9)
def max_unpool(em, *, kernel_shape, pads=None, strides=None):
    """MaxUnpool(X, I, output_shape?) -> output   attrs: kernel_shape, pads, strides

    ``I`` holds MaxPool's flat indices into the whole output tensor (batch and channel included),
    so the unpooling is one scatter into a flat zero tensor of the output's size.
    """
    total = int(np.prod(em.out_shape()))
    flat = f"ops.zeros(({total},), {ms_dtype(em.dtype(0))})"
    scatter = f"ops.tensor_scatter_elements({flat}, ops.reshape({em.x(1)}, (-1,)), ops.reshape({em.x(0)}, (-1,)))"
    return f"ops.reshape({scatter}, {em.out_shape_code()})"


def _roi_align(em, mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel: bool) -> str:
    if mode != "avg":
        raise Unsupported(f"mode={mode!r} not supported (ops.ROIAlign averages its samples)")
    if sampling_ratio <= 0:
        raise Unsupported(
            f"sampling_ratio={sampling_ratio} not supported (adaptive: the sample count depends on the RoI)"
        )
    if em.rank(0) != 4:
        raise Unsupported(f"input rank {em.rank(0)} not supported (N, C, H, W)")
    scale = float(np.float32(spatial_scale))
    dtype = ms_dtype(em.dtype(1))
    rois = em.x(1)
    if half_pixel:  # ops.ROIAlign samples RoIs as output_half_pixel does; shift them by half a feature cell
        rois = f"{rois} - {literal(0.5 / scale)}"
    rois5 = (
        f"ops.concat((ops.expand_dims(ops.cast({em.x(2)}, {dtype}), 1), {rois}), 1)"  # (batch index, x1, y1, x2, y2)
    )
    layer = em.layer(
        "ops.ROIAlign", int(output_height), int(output_width), scale, sample_num=int(sampling_ratio), roi_end_mode=0
    )
    return f"{layer}({em.x(0)}, {rois5})"


@converter("RoiAlign", since=10)
def roi_align_10(em, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """RoiAlign(X, rois, batch_indices) -> Y   attrs: mode, output_height/_width, sampling_ratio, spatial_scale"""
    return _roi_align(em, mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel=False)


@converter("RoiAlign", since=16)
def roi_align(
    em,
    *,
    coordinate_transformation_mode="half_pixel",
    mode="avg",
    output_height=1,
    output_width=1,
    sampling_ratio=0,
    spatial_scale=1.0,
):
    """RoiAlign(X, rois, batch_indices) -> Y   attrs: as opset 10, coordinate_transformation_mode

    ``half_pixel`` (PyTorch's ``aligned=True``) is ``output_half_pixel`` over RoIs shifted by half a
    cell, except that ``ops.ROIAlign`` widens a RoI narrower than one feature cell to one cell.
    """
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise Unsupported(f"coordinate_transformation_mode={coordinate_transformation_mode!r} not supported")
    half_pixel = coordinate_transformation_mode == "half_pixel"
    return _roi_align(em, mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel)


@converter("Col2Im", since=18)
def col2im(em, *, dilations=None, pads=None, strides=None):
    """Col2Im(input, image_shape, block_shape) -> output   attrs: dilations, pads, strides; 2-D as ops.fold"""
    image = [int(v) for v in em.require_const(1, "image_shape")]
    block = [int(v) for v in em.require_const(2, "block_shape")]
    n = len(image)
    dilations = [int(d) for d in (dilations or [1] * n)]
    strides = [int(s) for s in (strides or [1] * n)]
    pads = [int(p) for p in (pads or [0] * (2 * n))]
    begins, ends = pads[:n], pads[n:]
    if n != 2:
        return _col2im_scatter(em, image, block, dilations, strides, begins, ends)
    kw = {}
    if any(d != 1 for d in dilations):
        kw["dilation"] = squash(dilations)
    if begins == ends:
        if any(begins):
            kw["padding"] = squash(begins)
        size = image
    else:  # ops.fold pads both ends alike: fold onto the padded image, then cut the pads off
        size = [i + b + e for i, b, e in zip(image, begins, ends)]
    if any(s != 1 for s in strides):
        kw["stride"] = squash(strides)
    args = "".join(f", {k}={literal(v)}" for k, v in kw.items())
    expr = f"ops.fold({em.x(0)}, ms.Tensor({tuple(size)!r}, ms.int32), {squash(block)!r}{args})"
    return expr if begins == ends else expr + _crop(begins, image)


def _crop(begins, image) -> str:
    return "[:, :, " + ", ".join(f"{b}:{b + i}" for b, i in zip(begins, image)) + "]"


def _col2im_scatter(em, image, block, dilations, strides, begins, ends) -> str:
    """Col2Im of a 1-D or 3-D image (no ops.fold for those): one scatter-add of every column entry
    to its pixel of the padded image (``ops.scatter_nd`` sums repeated indices), then the crop."""
    padded = [i + b + e for i, b, e in zip(image, begins, ends)]
    counts = [(p - (k - 1) * d - 1) // s + 1 for p, k, d, s in zip(padded, block, dilations, strides)]
    # padded-image coordinate of (block offset k, block position l), per axis, as a flat index
    coords = np.zeros((int(np.prod(block)), int(np.prod(counts))), np.int64)
    for k_idx, k in enumerate(np.ndindex(*block)):
        for l_idx, pos in enumerate(np.ndindex(*counts)):
            point = [p * s + o * d for p, s, o, d in zip(pos, strides, k, dilations)]
            coords[k_idx, l_idx] = np.ravel_multi_index(point, padded)
    batch, channels = int(em.shape(0)[0]), int(em.out_shape()[1])
    rows = batch * channels
    index = em.tensor(coords.reshape(-1, 1).astype(np.int32), em.name_hint("col2im") + "_pixel")
    columns = f"ops.transpose(ops.reshape({em.x(0)}, {em.shape_code((rows, coords.size))}), (1, 0))"
    image_rows = f"ops.scatter_nd({index}, {columns}, {em.shape_code((int(np.prod(padded)), rows))})"
    expr = f"ops.reshape(ops.transpose({image_rows}, (1, 0)), {em.shape_code((batch, channels, *padded))})"
    return expr + _crop(begins, image) if any(begins + ends) else expr


refuse(
    "MaxRoiPool",
    reason="MindSpore 2.10 has no RoI max pooling (no ops.ROIPooling); open-coded, every bin would mask the whole map",
)
