"""The prefill and decode graphs of a transformers causal LM, with static shapes.

Prompts are **left-padded**: a batch's prompts end at the same column ``P - 1``, so the prefill's
next-token logits are its last position's for every row, and every decode step writes one cache
slot for the whole batch (``cache_position``, shared), as transformers' own ``StaticCache`` does in
``generate``. Each row's *position* (rotary angle, learned embedding) still counts its real tokens
only: ``cumsum(mask) - 1``, pads at 0, the rule of transformers' ``generate``.

**Prefill** ``(input_ids [B, P], attention_mask [B, P])`` -> ``(logits [B, 1, V], keys, values)``:
the last position's logits and the cache [layers, B, kv_heads, cache_length, head_dim], the
prompt in slots ``0 .. P-1`` (pads included, masked later), zeros after.

**Decode** ``(input_ids [B, 1], position [B], cache_position [1], attention_mask [B, cache_length],
keys, values)`` -> ``(logits [B, 1, V], keys, values)``: one token per row at ``position``, written
at slot ``cache_position``; ``attention_mask`` is 1 on the slots the row attends to (its prompt,
the tokens generated so far and this one), 0 on pads and unwritten slots.

Every integer input is int32, token ids included: the Ascend 310's AI Core kernels of Equal, Sub,
Cast and CumSum take int32 and not int64 (``torch2ms check --target ascend310`` places the int64 ones
on the AI CPU, an int64 CumSum nowhere).

Both call the model's own ``forward`` with a ``GraphCache``, explicit ``position_ids`` and a 4-D
additive mask (0 where allowed, float32's minimum elsewhere, the mask transformers builds for
eager attention), which transformers takes as given.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch2ms.generation.cache import GraphCache, update_blend
from torch2ms.generation.geometry import Geometry
from torch2ms.generation.loop import DECODE_INPUTS, OUTPUTS, PREFILL_INPUTS

__all__ = ["DECODE_INPUTS", "OUTPUTS", "PREFILL_INPUTS", "Decode", "Geometry", "Prefill"]


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """0 where ``allowed``, float32's minimum elsewhere (transformers' eager mask)."""
    return torch.where(allowed, torch.zeros((), dtype=torch.float32), torch.finfo(torch.float32).min)


class Prefill(torch.nn.Module):
    """The prompt pass (see the module docstring); ``model`` is a transformers causal LM."""

    def __init__(self, model: torch.nn.Module, layers: int, cache_length: int):
        super().__init__()
        self.model, self.layers, self.cache_length = model, layers, cache_length

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        real = attention_mask.bool()
        positions = (attention_mask.cumsum(-1, dtype=torch.int32) - 1).masked_fill(~real, 0)
        length = input_ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        mask = _additive(causal[None, None] & real[:, None, None, :])
        cache = GraphCache(self.layers, self.cache_length)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        keys, values = cache.stacked()
        return out.logits, keys, values


class Decode(torch.nn.Module):
    """One step for every row (see the module docstring); ``write`` is the cache write
    (``cache.UPDATES``)."""

    def __init__(self, model: torch.nn.Module, layers: int, cache_length: int, write: Callable = update_blend):
        super().__init__()
        self.model, self.layers, self.cache_length, self.write = model, layers, cache_length, write

    def forward(self, input_ids, position, cache_position, attention_mask, keys, values):
        mask = _additive(attention_mask.bool()[:, None, None, :])
        cache = GraphCache(self.layers, self.cache_length, keys, values, slot=cache_position, write=self.write)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        keys, values = cache.stacked()
        return out.logits, keys, values
