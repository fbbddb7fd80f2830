"""The reference: transformers' own ``generate`` with its static cache, greedy.

The prompts go in left-padded (``loop.left_pad``), the padding side ``generate`` expects of a
decoder-only model, with the graphs' cache length as ``max_cache_len``. Generation never stops early:
no end-of-sequence token (``eos_token_id=None``), so every row makes ``max_new_tokens`` tokens, as
the graphs do. ``output_logits`` gives the raw logits of every step, before any logits processor
(greedy decoding with no processor configured chooses the argmax of these).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torch2ms.generation.loop import Generated, gear_for, left_pad


def transformers_generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    cache_length: int,
    batch: int,
    gears: Sequence[int] | None = None,
) -> Generated:
    """``model.generate(do_sample=False, cache_implementation="static")`` on ``prompts`` in batches of
    ``batch``, each left-padded as the graphs pad it (``loop.gear_for``): the tokens and the logits
    of every step."""
    gears = gears or (max(len(p) for p in prompts),)
    parts = [
        _generate(model, prompts[i : i + batch], gear_for(gears, prompts[i : i + batch]), max_new_tokens, cache_length)
        for i in range(0, len(prompts), batch)
    ]
    return Generated(np.concatenate([p.tokens for p in parts]), np.concatenate([p.logits for p in parts]))


def generation_config(max_new_tokens: int, cache_length: int):
    """The ``GenerationConfig`` of the reference (see the module docstring)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        cache_implementation="static",
        max_cache_len=cache_length,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )


def _generate(model, prompts, length: int, max_new_tokens: int, cache_length: int) -> Generated:
    import torch

    ids, mask = left_pad(prompts, length)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            generation_config=generation_config(max_new_tokens, cache_length),
        )
    tokens = out.sequences[:, ids.shape[1] :].numpy()
    logits = torch.stack(out.logits, dim=1).float().numpy()
    return Generated(tokens, logits)
