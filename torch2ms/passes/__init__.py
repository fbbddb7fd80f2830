"""Graph rewrites on the IR, each a ``Pass`` with ``match`` / ``check`` / ``rewrite``.

The order the pipeline applies them is one list per stage (see ``rebuild_passes`` /
``fold_passes``); ``apply`` returns how many times each fired.
"""

from torch2ms.passes.base import Pass, run_passes
from torch2ms.passes.eliminate import EliminateIdentity
from torch2ms.passes.fold_bn import FoldBatchNorm, fold_bn_weights
from torch2ms.passes.fuse_conv_bn_act import FuseConvBnAct
from torch2ms.passes.matmul_linear import MatMulToLinear


def rebuild_passes(fuse_conv_bn_act: bool = True) -> list[Pass]:
    return [EliminateIdentity(), MatMulToLinear()] + ([FuseConvBnAct()] if fuse_conv_bn_act else [])


def fold_passes(fuse_conv_bn_act: bool = True) -> list[Pass]:
    return rebuild_passes(fuse_conv_bn_act) + [FoldBatchNorm()]


__all__ = [
    "Pass",
    "run_passes",
    "EliminateIdentity",
    "FuseConvBnAct",
    "MatMulToLinear",
    "FoldBatchNorm",
    "fold_bn_weights",
    "rebuild_passes",
    "fold_passes",
]
