"""Greedy generation with a prefill and a decode graph, whatever runs them.

A *runner* is two functions on numpy arrays, in the graphs' input order (``graphs``):
``prefill(input_ids, attention_mask) -> (logits, keys, values)`` and
``decode(input_ids, position, cache_position, attention_mask, keys, values) -> (logits, keys, values)``.
``torch_runner`` runs the PyTorch wrappers; ``export.onnx_runner`` runs the exported files in
onnxruntime; later stages give theirs.

``greedy`` prefills once (``prefill``), then decodes (``decode``) until ``max_new_tokens`` tokens
per prompt are chosen (the prefill's logits choose the first, each decode step the next). With ``teacher`` tokens it
feeds those instead of its own choices (teacher forcing), so that one differing token does not
make every later step differ; it still records the token it would have chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# the graphs' inputs and outputs, in order (``graphs``; here, where nothing imports torch)
PREFILL_INPUTS = ("input_ids", "attention_mask")
DECODE_INPUTS = ("input_ids", "position", "cache_position", "attention_mask", "keys", "values")
OUTPUTS = ("logits", "keys_out", "values_out")


@dataclass(frozen=True)
class Runner:
    prefill: Callable
    decode: Callable


@dataclass
class Generated:
    """Per prompt and step: the token chosen ``tokens`` [N, steps] and the logits it was chosen
    from ``logits`` [N, steps, V] (float32)."""

    tokens: np.ndarray
    logits: np.ndarray


def left_pad(
    prompts: Sequence[Sequence[int]], length: int | None = None, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)`` [len(prompts), length] int32 (default length: the longest
    prompt), each prompt right-aligned."""
    longest = max([len(p) for p in prompts] + [length or 0])
    ids = np.full((len(prompts), longest), pad_id, dtype=np.int32)
    mask = np.zeros((len(prompts), longest), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            ids[row, longest - len(prompt) :] = prompt
            mask[row, longest - len(prompt) :] = 1
    return ids, mask


@dataclass(frozen=True)
class Prefilled:
    """One batch after its prefill: the left-padded prompts, the prefill graph's logits of the last
    position [B, V] and the cache it filled."""

    mask: np.ndarray
    last_logits: np.ndarray
    keys: np.ndarray
    values: np.ndarray


def prefill(
    run: Callable,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    cache_length: int,
    prompt_length: int | None = None,
) -> Prefilled:
    """The prefill graph (``run``) on one batch of ``prompts`` left-padded to ``prompt_length`` (the
    prefill graph's; default the longest prompt)."""
    ids, mask = left_pad(prompts, prompt_length)
    if ids.shape[1] + max_new_tokens - 1 > cache_length:
        raise ValueError(
            f"{ids.shape[1]} prompt positions + {max_new_tokens} new tokens do not fit cache_length {cache_length}"
        )
    logits, keys, values = run(ids, mask)
    return Prefilled(mask, np.asarray(logits)[:, -1], keys, values)


def decode(
    run: Callable, start: Prefilled, max_new_tokens: int, cache_length: int, teacher: np.ndarray | None = None
) -> Generated:
    """Greedy decoding with the decode graph (``run``) from a batch's prefill, see the module docstring."""
    length = start.mask.shape[1]
    steps, keys, values = [start.last_logits], start.keys, start.values
    cache_mask = np.zeros((start.mask.shape[0], cache_length), dtype=np.int32)
    cache_mask[:, :length] = start.mask
    real = start.mask.sum(axis=1)
    for step in range(1, max_new_tokens):
        fed = steps[-1].argmax(axis=-1) if teacher is None else teacher[:, step - 1]
        slot = length + step - 1
        cache_mask[:, slot] = 1
        logits, keys, values = run(
            fed[:, None].astype(np.int32),
            (real + step - 1).astype(np.int32),
            np.array([slot], dtype=np.int32),
            cache_mask.copy(),
            keys,
            values,
        )
        steps.append(np.asarray(logits)[:, -1])
    stacked = np.stack(steps, axis=1).astype(np.float32)
    return Generated(stacked.argmax(axis=-1), stacked)


def greedy(
    runner: Runner,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    cache_length: int,
    teacher: np.ndarray | None = None,
    prompt_length: int | None = None,
) -> Generated:
    """Greedy decoding of one batch of ``prompts`` (the graphs' batch) left-padded to
    ``prompt_length``: ``prefill``, then ``decode``."""
    start = prefill(runner.prefill, prompts, max_new_tokens, cache_length, prompt_length)
    return decode(runner.decode, start, max_new_tokens, cache_length, teacher)


def gear_for(gears: Sequence[int], prompts: Sequence[Sequence[int]]) -> int:
    """The prefill length a batch of ``prompts`` runs at: the smallest of ``gears`` (the prefill
    graph's prompt lengths) that holds its longest prompt; ValueError when none does."""
    longest = max(len(p) for p in prompts)
    fits = [g for g in gears if g >= longest]
    if not fits:
        raise ValueError(f"a {longest}-token prompt is longer than the largest prompt gear ({max(gears)})")
    return min(fits)


def prefill_batches(
    run: Callable,
    prompts: Sequence[Sequence[int]],
    batch: int,
    max_new_tokens: int,
    cache_length: int,
    gears: Sequence[int] | None = None,
) -> list[Prefilled]:
    """``prefill`` of ``prompts`` in consecutive batches of ``batch`` (their count a multiple of it),
    each left-padded to its gear (``gear_for``; default one gear, the longest of all prompts)."""
    if len(prompts) % batch:
        raise ValueError(f"{len(prompts)} prompts do not make batches of {batch}")
    gears = gears or (max(len(p) for p in prompts),)
    return [
        prefill(run, prompts[i : i + batch], max_new_tokens, cache_length, gear_for(gears, prompts[i : i + batch]))
        for i in range(0, len(prompts), batch)
    ]


def decode_batches(
    run: Callable, starts: list[Prefilled], max_new_tokens: int, cache_length: int, teacher: np.ndarray | None = None
) -> Generated:
    """``decode`` from each batch's prefill (``prefill_batches``), the rows in the prompts' order."""
    parts, row = [], 0
    for start in starts:
        rows = start.mask.shape[0]
        forced = None if teacher is None else teacher[row : row + rows]
        parts.append(decode(run, start, max_new_tokens, cache_length, forced))
        row += rows
    return Generated(np.concatenate([p.tokens for p in parts]), np.concatenate([p.logits for p in parts]))


def greedy_batches(
    runner: Runner,
    prompts: Sequence[Sequence[int]],
    batch: int,
    max_new_tokens: int,
    cache_length: int,
    teacher: np.ndarray | None = None,
    gears: Sequence[int] | None = None,
) -> Generated:
    """``greedy`` over ``prompts`` in consecutive batches of ``batch``, each at its gear: every
    batch's prefill first (``prefill_batches``), then their decoding (``decode_batches``)."""
    starts = prefill_batches(runner.prefill, prompts, batch, max_new_tokens, cache_length, gears)
    return decode_batches(runner.decode, starts, max_new_tokens, cache_length, teacher)


def torch_runner(prefill, decode) -> Runner:
    """A runner of the PyTorch ``graphs.Prefill`` / ``graphs.Decode`` modules."""
    import torch

    def run(module):
        def call(*arrays):
            with torch.no_grad():
                out = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
            return tuple(t.numpy() for t in out)

        return call

    return Runner(run(prefill.eval()), run(decode.eval()))
