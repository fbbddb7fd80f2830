"""HuggingFace ``transformers`` models built from their config classes: random weights, no
download. A recipe names the model and config classes and the config's keywords::

    model:
      factory: torch2ms.models.hf:from_config
      kwargs: {model: BertForSequenceClassification, config: BertConfig, hidden_size: 64, ...}

The model's ``forward`` takes the recipe's inputs in order (e.g. ``input_ids``, ``attention_mask``)
and returns a ``ModelOutput`` (a dict): its tensors are the outputs (``logits``, ...). Attention is
the plain ("eager") implementation unless ``attn_implementation`` says otherwise: it exports as
MatMul / Softmax with the additive mask, where SDPA's export depends on the torch version.
"""

from __future__ import annotations

from torch2ms.errors import RecipeError


def from_config(model: str, config: str, attn_implementation: str = "eager", **config_kwargs):
    try:
        import transformers
    except ImportError:
        raise RecipeError("model.factory: transformers is not installed", hint="pip install transformers") from None
    classes = []
    for field, name in (("model", model), ("config", config)):
        cls = getattr(transformers, name, None)
        if cls is None:
            raise RecipeError(f"model.kwargs.{field}: transformers {transformers.__version__} has no {name!r}")
        classes.append(cls)
    model_cls, config_cls = classes
    try:
        cfg = config_cls(**config_kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"model.kwargs: {config}({config_kwargs}) failed: {err}") from None
    cfg._attn_implementation = attn_implementation
    return model_cls(cfg).eval()
