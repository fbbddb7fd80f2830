"""The cache geometry of a causal LM: what the prefill and decode graphs' static shapes need from it
(``plan.cache_geometry`` finds it; ``graphs`` and ``plan`` use it; no torch here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """What the graphs' shapes need from the model: its cache per layer, vocabulary and positions
    (``positions``: ``max_position_embeddings``, the longest sequence it is built for)."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    positions: int

    def cache_shape(self, batch: int, cache_length: int) -> tuple[int, ...]:
        return (self.layers, batch, self.kv_heads, cache_length, self.head_dim)
