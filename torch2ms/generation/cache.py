"""A static KV cache held in graph tensors, for transformers' own attention layers.

transformers' ``StaticCache`` keeps its keys and values in buffers it mutates in place
(``index_copy_`` at a ``cumulative_length`` counter it advances), which an exported graph cannot
hold across calls. ``GraphCache`` is a ``transformers.Cache`` whose layers instead *take* the cache
as a tensor and *return* the updated one, so that the cache is an input and an output of the graph:

* in the **prefill** graph a layer stores the prompt's keys and values zero-padded to the cache
  length (``place_prompt``), and attention reads the prompt's own keys (``P`` of them, not the whole cache);
* in the **decode** graph a layer writes the one new key and value at the cache slot ``slot``
  (one for the whole batch: prompts are left-padded, so every row writes the same slot) and
  attention reads the whole updated cache under the caller's mask.

The write is arithmetic, ``cache * (1 - hit) + new * hit`` with ``hit`` the one-hot row of
``slot`` (``update_blend``): Mul, Sub and Add, which every backend converts and the Ascend 310 runs
on its AI Core, exact for finite values. ``UPDATES`` holds the alternatives measured against it
(``benchmarks/results/generation_groundwork.md``): a select ``where(hit, new, cache)`` (the decode
graph with it leaves PyTorch's numbers under MindSpore's graph-kernel fusion), transformers' own
``index_copy`` and ``scatter`` (ScatterElements, which the 310 has no kernel for).

The model's attention, rotary or learned positions and projections are transformers' own code:
``GraphCache`` only answers ``update(key_states, value_states, layer_idx)``, the call every
decoder attention of transformers 5 makes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


def update_where(cache: torch.Tensor, new: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """``cache`` [B, H, L, D] with ``new`` [B, H, 1, D] at position ``slot`` ([1], int32) along L,
    as a select against a one-hot row (Cast + Equal + Where in ONNX)."""
    # compared in float32 (exact below 2**24): the TorchScript exporter turns an int32 Equal against
    # a constant Range into an int64 one, which the Ascend 310 runs on its AI CPU
    positions = torch.arange(cache.shape[2], dtype=torch.float32, device=cache.device)
    hit = (positions == slot.to(torch.float32)).view(1, 1, -1, 1)
    return torch.where(hit, new, cache)


def update_blend(cache: torch.Tensor, new: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The same write as ``update_where`` by arithmetic, ``cache * (1 - hit) + new * hit`` with a
    float32 one-hot ``hit`` (Mul and Add in ONNX, no Select): exact for finite values, as ``x * 1``
    is ``x`` and ``x * 0 + y`` is ``y``."""
    positions = torch.arange(cache.shape[2], dtype=torch.float32, device=cache.device)
    hit = (positions == slot.to(torch.float32)).to(cache.dtype).view(1, 1, -1, 1)
    return cache * (1 - hit) + new * hit


def update_index_copy(cache: torch.Tensor, new: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The same write as ``update_where`` by an out-of-place ``index_copy`` (StaticLayer's own op)."""
    return cache.index_copy(2, slot.long(), new)


def update_scatter(cache: torch.Tensor, new: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The same write as ``update_where`` by ``scatter`` along L (ScatterElements in ONNX)."""
    index = slot.long().view(1, 1, 1, 1).expand(new.shape)
    return cache.scatter(2, index, new)


def place_prompt(states: torch.Tensor, length: int) -> torch.Tensor:
    """The prefill's cache: ``states`` [B, H, P, D] in slots ``0 .. P-1`` of ``length`` slots, zeros
    after, as a one-hot [length, P] MatMul (exact for finite values, as ``update_blend``). A Pad by
    ``length - P`` would do the same, but with the prompt gears P is dynamic in the exported graph and
    MindSpore's PadV3 takes no padding it cannot infer when the MindIR is exported."""
    slots = torch.arange(length, dtype=torch.float32, device=states.device)
    prompt = torch.arange(states.shape[2], dtype=torch.float32, device=states.device)
    return torch.matmul((slots[:, None] == prompt[None, :]).to(states.dtype), states)


# the write the decode graph uses first; the others are measured against it
UPDATES: dict[str, Callable] = {
    "blend": update_blend,
    "where": update_where,
    "index_copy": update_index_copy,
    "scatter": update_scatter,
}


class _GraphLayer(CacheLayerMixin):
    """One attention layer's cache: ``keys`` / ``values`` [B, H, L, D] tensors of the graph.

    ``slot`` None: the prefill (store the prompt's states padded to ``length``, attend to them);
    else the decode (write the new states at ``slot`` with ``write``, attend to the whole cache)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys, values, length: int, slot, write: Callable):
        super().__init__()
        self.keys, self.values = keys, values
        self.length, self.slot, self.write = length, slot, write
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # the tensors are given
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.slot is None:
            self.keys, self.values = place_prompt(key_states, self.length), place_prompt(value_states, self.length)
            return key_states, value_states
        self.keys = self.write(self.keys, key_states, self.slot)
        self.values = self.write(self.values, value_states, self.slot)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length, 0

    def get_seq_length(self) -> int:
        raise NotImplementedError("GraphCache has no running length: the wrappers pass position_ids and a 4-D mask")

    def get_max_length(self) -> int:
        return self.length


class GraphCache(Cache):
    """A cache of ``layers`` attention layers over graph tensors (see the module docstring).

    ``keys`` / ``values``: [layers, B, H, L, D] for the decode, None for the prefill; ``slot``: the
    decode's write position ([1], int32); ``write``: one of ``UPDATES``."""

    def __init__(self, layers: int, length: int, keys=None, values=None, slot=None, write: Callable | None = None):
        per_layer = [
            _GraphLayer(None if keys is None else keys[i], None if values is None else values[i], length, slot, write)
            for i in range(layers)
        ]
        super().__init__(layers=per_layer)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's keys and values, stacked: [layers, B, H, L, D] each; RuntimeError when a
        layer's attention did not write its cache (the model does not use ``past_key_values``)."""
        unwritten = [i for i, layer in enumerate(self.layers) if layer.keys is None or layer.values is None]
        if unwritten:
            raise RuntimeError(f"layers {unwritten} were never given their keys and values")
        return torch.stack([layer.keys for layer in self.layers]), torch.stack([layer.values for layer in self.layers])
