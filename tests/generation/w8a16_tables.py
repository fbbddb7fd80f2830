"""Cells for the int8 tables' test (``test_w8a16``), in a module of their own: the W8A16 rewrite reads
a cell's class source and resolves its names in the class's module, as for a generated network."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops


class Embedding(nn.Cell):
    """As the modules layout writes a token embedding: a cell whose body is the ONNX Gather."""

    def __init__(self):
        super().__init__()
        self.weight = Parameter(ms.Tensor(np.zeros((50, 8), np.float32)), name="weight")

    def construct(self, x):
        gather = ops.gather(self.weight, x % 50, 0)
        return gather


class Flat(nn.Cell):
    """A table gathered inline among other ops (as the flat layout writes one), an Embedding cell, and
    a 2-D Parameter that is gathered and also multiplied (not a table)."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = Embedding()
        self.model_wpe_weight = Parameter(ms.Tensor(np.zeros((12, 8), np.float32)), name="wpe")
        self.proj = Parameter(ms.Tensor(np.zeros((8, 8), np.float32)), name="proj")

    def construct(self, x, position):
        wpe = ops.gather(
            self.model_wpe_weight, ops.cast(position, ms.int32) % 12, 0
        )  # split over lines, as the formatter writes a long call
        h = self.embed_tokens(x) + wpe
        return ops.matmul(h, self.proj) + ops.gather(self.proj, position % 8, 0)
