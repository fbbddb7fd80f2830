"""Spectral ops: DFT and STFT as a product with a constant DFT matrix; the window generators.

MindSpore's FFT ops are not all registered on CPU, but a DFT of static length is a linear map,
so it is one ``ops.matmul`` with a constant real matrix that runs everywhere. Complex values
are ONNX's trailing axis of 2 (real, imaginary); with the signal axis moved next to it and the
two flattened, ``[..., n, c] -> [..., n * c]``, the transform is ``y = x @ M`` with

    forward   y[k] = sum_n x[n] e^(-2 pi i k n / N)        M[(n, re), (k, re)] = cos, ...
    inverse   x[n] = 1/N sum_k y[k] e^(+2 pi i k n / N)

computed in float64 from ``(k * n) mod N`` (exact angles) and stored in float32. ``onesided``
keeps bins ``0 .. N // 2`` (RFFT) or, with ``inverse``, rebuilds the other half by conjugate
symmetry and returns the real part (IRFFT). ``dft_length`` zero-pads (rows of M that would
multiply the padding are left out) or truncates (a slice) the signal. STFT gathers the frames
with a constant index and folds the window into M.

HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix have a constant output for a
constant size, so the loader folds them (onnxruntime computes them); a size known only at run
time would make the output's shape depend on data, which a static graph cannot have.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, refuse

refuse(
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
    "MelWeightMatrix",
    reason="the output's shape is an input's value; with constant inputs the loader folds the node to a constant",
)


def _angles(n: int, k: int) -> np.ndarray:
    """2 pi (i j mod N) / N for i < n, j < k (N = the DFT length, given as ``n``), in float64."""
    return 2 * np.pi * (np.outer(np.arange(n), np.arange(k)) % n) / n


def _dft_matrix(
    length: int, rows: int, complex_in: bool, inverse: bool, onesided: bool, window=None
) -> np.ndarray:  # fmt: skip
    """The real matrix M with ``y.reshape(..., K * 2) = x.reshape(..., rows * c) @ M`` for a DFT of
    ``length`` points of which the first ``rows`` inputs are given (the rest are zero padding)."""
    if inverse and onesided:  # IRFFT: `rows` one-sided bins in, `length` real values out
        theta = 2 * np.pi * (np.outer(np.arange(rows), np.arange(length)) % length) / length
        k = np.arange(rows).reshape(-1, 1)
        # bin k is used as itself and, when N - k is not given, as the conjugate of bin N - k
        weight = (1 + ((k >= 1) & (k <= length - rows))) / length
        real = np.stack([np.cos(theta) * weight, -np.sin(theta) * weight], axis=1)  # (rows, 2, N)
        return real.reshape(rows * 2, length).astype(np.float32)
    bins = length // 2 + 1 if onesided else length
    theta = _angles(length, bins)[:rows]
    cos, sin = np.cos(theta), np.sin(theta)
    if inverse:
        cos, sin = cos / length, -sin / length
    if window is not None:
        cos, sin = cos * window.reshape(-1, 1), sin * window.reshape(-1, 1)
    # (re + i im)(cos - i sin) = (re cos + im sin) + i (im cos - re sin)
    m = np.zeros((rows, 2, bins, 2))
    m[:, 0, :, 0], m[:, 0, :, 1] = cos, -sin
    m[:, 1, :, 0], m[:, 1, :, 1] = sin, cos
    if not complex_in:
        m = m[:, :1]
    return m.reshape(rows * (2 if complex_in else 1), bins * 2).astype(np.float32)


def _dft(em, axis: int, length, inverse: int, onesided: int) -> str:
    shape = em.shape(0)
    rank = len(shape)
    if em.dtype(0) != np.float32:
        raise Unsupported(f"input dtype {em.dtype(0).name} not supported (float32 only)")
    if not -rank <= axis <= rank - 2 or axis % rank == rank - 1:
        raise Unsupported(f"axis={axis} (the last axis holds real and imaginary parts)")
    axis %= rank
    complex_in = shape[-1] == 2
    if onesided and not inverse and complex_in:
        raise Unsupported("onesided=1 with complex input (RFFT takes a real signal)")
    if onesided and inverse and not complex_in:
        raise Unsupported("onesided=1, inverse=1 with real input (IRFFT takes a one-sided complex spectrum)")
    n = shape[axis]
    if length is None:
        length = 2 * (n - 1) if onesided and inverse else n
    length = int(length)
    if length < 1:
        raise Unsupported(f"dft_length={length}")
    rows = min(n, length)
    matrix = _dft_matrix(length, rows, complex_in, bool(inverse), bool(onesided))
    x = em.x(0)
    if rows < n:  # only the first dft_length values are the signal
        x = f"{x}[{', '.join([':'] * axis + [f':{rows}'])}]"
    moved = axis != rank - 2
    if moved:  # the signal axis next to the real/imaginary one
        perm = [a for a in range(rank - 1) if a != axis] + [axis, rank - 1]
        x = f"ops.transpose({x}, {tuple(perm)})"
        inner = [shape[a] for a in perm[:-2]]
    else:
        inner = list(shape[: rank - 2])
    out_c = 1 if onesided and inverse else 2
    bins = matrix.shape[1] // out_c
    flat = f"ops.reshape({x}, {em.shape_code(tuple(inner) + (matrix.shape[0],))})"
    y = f"ops.reshape(ops.matmul({flat}, {em.tensor(matrix, em.name_hint('dft') + '_matrix')}), "
    y += f"{em.shape_code(tuple(inner) + (bins, out_c))})"
    if moved:
        back = list(range(rank - 2))
        back.insert(axis, rank - 2)
        y = f"ops.transpose({y}, {tuple(back) + (rank - 1,)})"
    return y


@converter("DFT", since=17)
def dft_17(em, *, axis=1, inverse=0, onesided=0):
    """DFT(input, dft_length?) -> output   attrs: axis, inverse, onesided (as a matmul with a constant DFT matrix)"""
    length = em.require_const(1, "dft_length").item() if em.has_input(1) else None
    return _dft(em, int(axis), length, inverse, onesided)


@converter("DFT", since=20)
def dft(em, *, inverse=0, onesided=0):
    """DFT(input, dft_length?, axis?) -> output   attrs: inverse, onesided (as a matmul with a constant DFT matrix)"""
    length = em.require_const(1, "dft_length").item() if em.has_input(1) else None
    axis = int(em.require_const(2, "axis").item()) if em.has_input(2) else -2
    return _dft(em, axis, length, inverse, onesided)


@converter("STFT", since=17)
def stft(em, *, onesided=1):
    """STFT(signal, frame_step, window?, frame_length?) -> output   (gathered frames @ windowed DFT matrix)"""
    shape = em.shape(0)
    if em.dtype(0) != np.float32 or len(shape) != 3:
        raise Unsupported(f"signal of dtype {em.dtype(0).name}, shape {list(shape)} (float32 [batch, length, 1 or 2])")
    batch, signal_length, c = shape
    step = int(em.require_const(1, "frame_step").item())
    window = em.require_const(2, "window").astype(np.float64) if em.has_input(2) else None
    if em.has_input(3):
        length = int(em.require_const(3, "frame_length").item())
    else:
        length = len(window) if window is not None else signal_length
    if window is not None and len(window) != length:
        raise Unsupported(f"window of length {len(window)} for frame_length={length}")
    if c == 2 and onesided:
        raise Unsupported("onesided=1 with a complex signal")
    frames = (signal_length - length) // step + 1
    matrix = _dft_matrix(length, length, c == 2, False, bool(onesided), window)
    index = (np.arange(frames).reshape(-1, 1) * step + np.arange(length)).astype(np.int32)
    gathered = f"ops.gather({em.x(0)}, {em.tensor(index, em.name_hint('stft') + '_frames')}, 1)"
    flat = f"ops.reshape({gathered}, {em.shape_code((batch, frames, length * c))})"
    y = f"ops.matmul({flat}, {em.tensor(matrix, em.name_hint('stft') + '_matrix')})"
    return f"ops.reshape({y}, {em.out_shape_code()})"
