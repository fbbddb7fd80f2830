"""Model factories for zoo files where torchvision's random initialisation would make the checks
vacuous.

torchvision's ``VisionTransformer`` zero-initialises its classifier (``heads.head``), so with
random weights every output is exactly 0 and every stage "matches" PyTorch whatever the
conversion did (measured: max relative error 0.0, cosine 1.0). These wrappers give the head a
seeded normal init (std 0.02, like the rest of the transformer) so that the outputs depend on
every layer. The runner seeds torch before calling a factory, so the weights are reproducible.
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
