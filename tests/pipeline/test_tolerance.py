"""The tolerance rule: the recipe's bound, widened to ``noise_factor`` times onnxruntime's own
distance from PyTorch only where that is looser; and calibrated BatchNorm statistics keep deep
random networks in a trained-like range where randomized ones explode."""

from __future__ import annotations

import torch

from torch2ms.bounds import ceiling, widen, widen_agreement
from torch2ms.compare import OutputMetrics, Tolerance
from torch2ms.export.hooks import activation_range
from torch2ms.model_loader import calibrate_norm, randomize_norm


def metrics(rel: float, cos: float = 1.0, name: str = "out") -> OutputMetrics:
    return OutputMetrics(name, rel, rel, rel, cos, None)


def test_a_well_conditioned_network_is_judged_by_the_recipe():
    tol = Tolerance(1e-4, 0.99999, noise_factor=10, floor={"out": (2e-7, 1.0)})
    assert tol.bound("out") == {"rel_error": 1e-4, "cosine": 0.99999, "by": "recipe"}
    assert tol.violations(metrics(3e-4)) == ["relative error 0.0003 > 0.0001"]


def test_a_sensitive_network_is_judged_against_its_noise_floor():
    tol = Tolerance(1e-4, 0.99999, noise_factor=10, floor={"out": (2e-3, 0.999999)})
    bound = tol.bound("out")
    assert bound["rel_error"] == 2e-2 and abs(bound["cosine"] - 0.99999) < 1e-9 and "onnxruntime" in bound["by"]
    assert tol.violations(metrics(1.2e-2)) == []
    assert tol.violations(metrics(3e-2))[0].startswith("relative error 0.03 > 0.02 (10x onnxruntime's")
    # another output keeps the recipe's bound; noise_factor 0 turns the rule off
    assert tol.bound("other")["by"] == "recipe"
    assert Tolerance(1e-4, 0.99999, noise_factor=0, floor={"out": (2e-3, 0.9)}).bound("out")["by"] == "recipe"


def test_widening_multiplies_the_distance_from_exact_agreement():
    rel, cos = widen(2e-4, 0.99998, 10)
    assert abs(rel - 2e-3) < 1e-15 and abs(cos - 0.9998) < 1e-12
    assert widen(1e-4, 0.99999, 0.1)[0] == 1e-5  # diff's local bound: a tenth of the tolerance
    assert abs(widen_agreement(0.998, 10) - 0.98) < 1e-12 and widen_agreement(0.5, 10) == 0.0


def test_the_ceiling_is_check_ceiling_and_never_below_the_recipes_bound():
    from torch2ms.recipe import CheckSpec

    rel, cos = ceiling(CheckSpec())
    assert rel == 1e-3 and abs(cos - 0.9999) < 1e-12  # the cosine widened by the same factor (10)
    assert ceiling(CheckSpec(rel_error=1e-2, cosine=0.999)) == (1e-2, 0.999)  # a loose recipe bound stays


def test_beyond_the_ceiling_is_asked_for_only_where_the_widened_bound_admitted_it():
    tol = Tolerance(1e-4, 0.99999, noise_factor=10, floor={"out": (5e-2, 0.9999)}, ceiling=(1e-3, 0.9999))
    assert tol.violations(metrics(2e-2)) == []  # the widened bound (0.5) alone would pass a 2% error
    assert tol.beyond_ceiling(metrics(2e-2)) == ["relative error 0.02 > check.ceiling 0.001"]
    assert tol.beyond_ceiling(metrics(5e-4)) == []  # within the ceiling: no evidence needed
    assert tol.beyond_ceiling(metrics(0.9)) == []  # out of the bound: failed, not a question of evidence
    assert Tolerance(1e-4, 0.99999, noise_factor=10, floor={"out": (5e-2, 0.9999)}).beyond_ceiling(metrics(2e-2)) == []


def _reached(model) -> float:
    model.eval()
    with torch.no_grad(), activation_range(model) as got:
        model(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(5)))
    return got["max_abs_activation"]


def test_calibrated_statistics_keep_a_deep_net_in_range():
    """torchvision's ResNet-50 with random weights: random BatchNorm statistics let activations grow
    to thousands (measured: ~3e3 at 64x64, ~7e3 at 224x224); calibrated ones keep them trained-like."""
    import torchvision

    torch.manual_seed(0)
    randomized = torchvision.models.resnet50()
    randomize_norm(randomized, 0)
    torch.manual_seed(0)
    calibrated = torchvision.models.resnet50()
    assert calibrate_norm(calibrated, [(1, 3, 64, 64)], 0) == 53
    assert _reached(calibrated) < 100
    assert _reached(randomized) > 20 * _reached(calibrated)
    bn = calibrated.bn1
    assert bn.momentum == 0.1 and not bn.training  # restored after the train-mode passes
    assert not torch.allclose(bn.running_var, torch.ones(64)) and not torch.allclose(bn.weight, torch.ones(64))
