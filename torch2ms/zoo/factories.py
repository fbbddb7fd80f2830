"""Model factories for the zoo files: timm and segmentation_models_pytorch models by name, and
torchvision models whose random initialisation would make the checks vacuous.

Every factory imports its library when called, never when this module is imported: timm and
segmentation_models_pytorch are optional (``pip install 'torch2ms[zoo]'``). Ultralytics (AGPL-3.0)
is not imported by torch2ms at all; the YOLO zoo uses ``recipes/models/ultralytics_yolo.py``. The
runner seeds torch before calling a factory, so the random weights are reproducible; none of them
downloads weights.

torchvision's ``VisionTransformer`` zero-initialises its classifier (``heads.head``), so with
random weights every output is exactly 0 and every stage "matches" PyTorch whatever the
conversion did (measured: max relative error 0.0, cosine 1.0). ``vit_b_16`` gives the head a
seeded normal init (std 0.02, like the rest of the transformer) so that the outputs depend on
every layer; so does ``vision_transformer``. ``timm_model`` gives every all-zero ``Linear`` weight
(a zero-initialised head or residual branch) the same seeded init, for the same reason.
"""

from __future__ import annotations


def _random_head(model):
    import torch

    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    torch.nn.init.normal_(model.heads.head.bias, std=0.02)
    return model


def vit_b_16(**kwargs):
    import torchvision

    return _random_head(torchvision.models.vit_b_16(**kwargs))


def vision_transformer(**kwargs):
    """torchvision's ``VisionTransformer`` class at any size (``image_size``, ``num_layers``,
    ``hidden_dim`` ...): ViT-B/16's own modules at a size CI can afford."""
    import torchvision

    return _random_head(torchvision.models.VisionTransformer(**kwargs))


def convnext(channels=(96, 192, 384, 768), depths=(3, 3, 9, 3), **kwargs):
    """torchvision's ``ConvNeXt`` class with ``channels[i]`` and ``depths[i]`` per stage (default:
    ConvNeXt-T's); other keywords (``layer_scale``, ``num_classes``) go to the class."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    last = len(channels) - 1
    settings = [
        CNBlockConfig(c, channels[i + 1] if i < last else None, d) for i, (c, d) in enumerate(zip(channels, depths))
    ]
    return ConvNeXt(settings, **kwargs)


def timm_model(name: str, **kwargs):
    """``timm.create_model(name, pretrained=False, **kwargs)`` in eval mode; all-zero Linear weights re-initialised."""
    import timm

    return _no_zero_linears(timm.create_model(name, pretrained=False, **kwargs))


def timm_class(cls: str, **kwargs):
    """A timm model class by ``module:Class`` (e.g. ``timm.models.mlp_mixer:MlpMixer``), built from
    ``kwargs``: for sizes a registered name fixes (``mixer_s16_224`` sets ``num_blocks`` itself).
    Eval mode; all-zero Linear weights re-initialised."""
    import importlib

    module, _, name = cls.partition(":")
    if not module.startswith("timm.") or not name:
        raise ValueError(f"timm_class: {cls!r} is not a 'timm.<module>:<Class>' path")
    return _no_zero_linears(getattr(importlib.import_module(module), name)(**kwargs))


def _no_zero_linears(model):
    """``model`` in eval mode, every all-zero Linear weight given a seeded normal init (std 0.02):
    a zero-initialised head or residual branch makes every output 0 (see the module docstring)."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.weight.numel() and not m.weight.any():
                torch.nn.init.normal_(m.weight, std=0.02)
    return model.eval()


def smp_model(arch: str, encoder: str, classes: int = 21, **kwargs):
    """``segmentation_models_pytorch.create_model(arch, encoder, encoder_weights=None)`` in eval mode."""
    import segmentation_models_pytorch as smp

    return smp.create_model(arch, encoder_name=encoder, encoder_weights=None, classes=classes, **kwargs).eval()
