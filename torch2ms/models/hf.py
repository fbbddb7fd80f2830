"""HuggingFace ``transformers`` models built from their config classes: random weights, no
download. A recipe names the model and config classes and the config's keywords::

    model:
      factory: torch2ms.models.hf:from_config
      kwargs: {model: BertForSequenceClassification, config: BertConfig, hidden_size: 64, ...}

The model's ``forward`` takes the recipe's inputs in order (e.g. ``input_ids``, ``attention_mask``)
and returns a ``ModelOutput`` (a dict): its tensors are the outputs (``logits``, ...). Attention is
the plain ("eager") implementation unless ``attn_implementation`` says otherwise: it exports as
MatMul / Softmax with the additive mask, where SDPA's export depends on the torch version.

A model whose ``forward`` does not take the inputs first and in that order (GPT-2's second parameter
is ``past_key_values``) is given them by keyword: ``keywords: [input_ids, attention_mask]`` names
them in the recipe's input order.

A class transformers does not export at its top level (a model's encoder alone, such as Whisper's)
is named by its dotted path under ``transformers``: ``models.whisper.modeling_whisper.WhisperEncoder``.
"""

from __future__ import annotations

import importlib

import torch

from torch2ms.errors import RecipeError


def _transformers_class(transformers, name: str):
    """``transformers.<name>``, or for a dotted name the class in that module under ``transformers``."""
    if "." not in name:
        return getattr(transformers, name, None)
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(f"transformers.{module}"), attr, None)
    except ImportError:
        return None


class KeywordInputs(torch.nn.Module):
    """Calls ``model`` with its positional inputs passed by keyword, under ``names`` in order."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = list(names)

    def forward(self, *inputs):
        if len(inputs) != len(self.names):
            raise TypeError(f"expected {len(self.names)} inputs ({', '.join(self.names)}), got {len(inputs)}")
        return self.model(**dict(zip(self.names, inputs)))


def from_config(
    model: str, config: str, attn_implementation: str = "eager", keywords: list[str] | None = None, **config_kwargs
):
    try:
        import transformers
    except ImportError:
        raise RecipeError("model.factory: transformers is not installed", hint="pip install transformers") from None
    classes = []
    for field, name in (("model", model), ("config", config)):
        cls = _transformers_class(transformers, name)
        if cls is None:
            raise RecipeError(f"model.kwargs.{field}: transformers {transformers.__version__} has no {name!r}")
        classes.append(cls)
    model_cls, config_cls = classes
    try:
        cfg = config_cls(**config_kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"model.kwargs: {config}({config_kwargs}) failed: {err}") from None
    cfg._attn_implementation = attn_implementation
    built = model_cls(cfg).eval()
    return KeywordInputs(built, keywords).eval() if keywords else built
