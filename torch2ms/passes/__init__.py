"""Graph rewrites on the IR, each a ``Pass`` with ``match`` / ``check`` / ``rewrite``.

The order the pipeline applies them is one list per stage (see ``rebuild_passes`` /
``fold_passes``); ``apply`` returns how many times each fired. Written-out activations and
normalizations become one node first, so that the Conv and Dense fusions see them.
"""

from torch2ms.passes.activations import (
    FormulaPattern,
    FuseGelu,
    FuseHardSigmoid,
    FuseHardSwish,
    FuseMish,
    FuseSilu,
    activation_passes,
)
from torch2ms.passes.ascend_rewrites import (
    ExpandGroupNorm,
    ExpandHardActivations,
    MaxPoolPadToPad,
    MirrorPadToConcat,
    PowToMul,
    ascend_passes,
)
from torch2ms.passes.base import Pass, run_passes
from torch2ms.passes.coverage import fusion_counts
from torch2ms.passes.eliminate import EliminateIdentity
from torch2ms.passes.fold_affine import FoldConvAffine
from torch2ms.passes.fold_bn import FoldBatchNorm, fold_bn_weights
from torch2ms.passes.fuse_conv_bn_act import FuseConvBnAct
from torch2ms.passes.fuse_dense import FuseDenseBnAct
from torch2ms.passes.matmul_linear import MatMulToLinear
from torch2ms.passes.module_copies import CopyReshapesIntoModules
from torch2ms.passes.norms import FuseGroupNorm, FuseLayerNorm, FuseRMSNorm, norm_passes
from torch2ms.passes.stacking import GathersToUnstack, UnsqueezesToStack


def rebuild_passes(fuse_conv_bn_act: bool = True, *, fold: bool = False) -> list[Pass]:
    """Clean-up, formulas to single nodes, then (``fuse_conv_bn_act``) the Conv and Dense fusions.

    With ``fold``, a constant per-channel ``Mul`` / ``Add`` / ``Sub`` after a Conv goes into its
    weights once the formulas are single nodes (a written-out HardSigmoid's ``x * a + b`` stays one)
    and before the fusions (so that they see ``Conv -> activation``), and BatchNorm folds last."""
    formulas = activation_passes()
    fusions = [FuseConvBnAct(formulas), FuseDenseBnAct(formulas)] if fuse_conv_bn_act else []
    affine = [FoldConvAffine()] if fold else []
    folds = [FoldBatchNorm()] if fold else []
    cleanup = [
        EliminateIdentity(),
        CopyReshapesIntoModules(),
        GathersToUnstack(),
        UnsqueezesToStack(),
        MatMulToLinear(),
    ]
    return [*cleanup, *formulas, *norm_passes(), *affine, *fusions, *folds]


def fold_passes(fuse_conv_bn_act: bool = True) -> list[Pass]:
    return rebuild_passes(fuse_conv_bn_act, fold=True)


__all__ = [
    "Pass",
    "FormulaPattern",
    "run_passes",
    "EliminateIdentity",
    "CopyReshapesIntoModules",
    "GathersToUnstack",
    "UnsqueezesToStack",
    "FuseHardSigmoid",
    "FuseHardSwish",
    "FuseSilu",
    "FuseGelu",
    "FuseMish",
    "FuseLayerNorm",
    "FuseGroupNorm",
    "FuseRMSNorm",
    "FuseConvBnAct",
    "FuseDenseBnAct",
    "MatMulToLinear",
    "FoldBatchNorm",
    "FoldConvAffine",
    "fold_bn_weights",
    "fusion_counts",
    "activation_passes",
    "norm_passes",
    "rebuild_passes",
    "fold_passes",
    "ascend_passes",
    "PowToMul",
    "MaxPoolPadToPad",
    "ExpandHardActivations",
    "ExpandGroupNorm",
    "MirrorPadToConcat",
]
