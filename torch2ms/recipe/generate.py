"""Generation recipes: the prompts, new tokens and static cache size a text-generation model is checked with."""

from __future__ import annotations

from pydantic import Field, model_validator

from torch2ms.recipe.base import _Strict


class GenerateSpec(_Strict):
    """Greedy generation (task: text_generation) with a prefill and a decode graph of static shapes
    (``torch2ms.generation``). The checks that need the model (its positions, its vocabulary, its
    cache interface) are ``torch2ms.generation.plan``'s."""

    prompts: tuple[tuple[int, ...], ...] | None = Field(
        default=None, description="the prompts as token-id lists, e.g. [[1, 15, 27], [1, 9]]"
    )
    prompt_lengths: tuple[int, ...] | None = Field(
        default=None,
        description="instead of prompts: one length per prompt, the token ids drawn with seed from range",
    )
    range: tuple[int, int] | None = Field(
        default=None, description="prompt_lengths: token ids drawn from [low, high) (default: the whole vocabulary)"
    )
    seed: int = Field(default=0, description="prompt_lengths: the seed the token ids are drawn with")
    max_new_tokens: int = Field(ge=1, description="tokens generated per prompt")
    cache_length: int = Field(
        ge=1, description="the static KV-cache size: at least the longest prompt plus max_new_tokens"
    )
    batch: int | None = Field(
        default=None, ge=1, description="the graphs' batch: prompts run in batches of it (default: all in one)"
    )
    prompt_gears: tuple[int, ...] | None = Field(
        default=None,
        description="the prefill graph's static prompt lengths (ATC --dynamic_dims gears), increasing, e.g. "
        "[16, 32, 64]: a batch is left-padded to the smallest gear that holds its longest prompt (default: one "
        "gear, the longest prompt)",
    )

    @model_validator(mode="after")
    def _consistent(self):
        if (self.prompts is None) == (self.prompt_lengths is None):
            raise ValueError("give prompts (token-id lists) or prompt_lengths (drawn from seed), one of them")
        if self.prompts is not None:
            if not self.prompts or any(not p for p in self.prompts):
                raise ValueError("prompts: every prompt needs at least one token id")
            if any(t < 0 for p in self.prompts for t in p):
                raise ValueError("prompts: token ids are non-negative integers")
            if self.range is not None:
                raise ValueError("range is for prompt_lengths (drawn token ids); prompts give theirs")
        elif not self.prompt_lengths or any(n < 1 for n in self.prompt_lengths):
            raise ValueError("prompt_lengths: give one positive length per prompt")
        if self.range is not None and not 0 <= self.range[0] < self.range[1]:
            raise ValueError(f"range [{self.range[0]}, {self.range[1]}) is not [low, high) with 0 <= low < high")
        if len(self.lengths()) % self.batch_size():
            raise ValueError(f"batch {self.batch}: {len(self.lengths())} prompts do not make batches of {self.batch}")
        gears = self.prompt_gears
        if gears is not None and (not gears or gears[0] < 1 or list(gears) != sorted(set(gears))):
            raise ValueError(f"prompt_gears {list(gears)}: give increasing positive lengths, e.g. [16, 32, 64]")
        if gears is not None and gears[-1] < max(self.lengths()):
            raise ValueError(
                f"prompt_gears {list(gears)}: the largest gear is below the longest prompt ({max(self.lengths())})"
            )
        longest = max(self.gears())
        need = longest + self.max_new_tokens
        if self.cache_length < need:
            what = "the largest prompt gear" if gears is not None else "the longest prompt"
            raise ValueError(
                f"cache_length {self.cache_length} is below {what} ({longest}) plus "
                f"max_new_tokens ({self.max_new_tokens}): give cache_length >= {need}"
            )
        return self

    def gears(self) -> tuple[int, ...]:
        """The prefill graph's prompt lengths: ``prompt_gears``, or the longest prompt alone."""
        return self.prompt_gears or (max(self.lengths()),)

    def lengths(self) -> tuple[int, ...]:
        """Every prompt's length, in order."""
        return tuple(len(p) for p in self.prompts) if self.prompts is not None else tuple(self.prompt_lengths)

    def batch_size(self) -> int:
        return self.batch or len(self.lengths())
