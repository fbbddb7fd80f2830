"""facenet-pytorch's trained MTCNN (recipes/mtcnn_rnet.yaml, mtcnn_onet.yaml) converted and put back into
facenet's own pipeline (``MTCNN.detect``: P-Net's pyramid, crops, NMS, box regression): the face boxes
found on skimage's astronaut with the converted R- and O-Net match PyTorch's by IoU. P-Net stays
PyTorch: it runs on an image pyramid, and the converted network takes one size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO

from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner


class Converted(torch.nn.Module):
    """A converted network in facenet's pipeline: the crops one at a time (converted at batch 1)."""

    def __init__(self, net, outputs: int):
        super().__init__()
        self.net, self.names = net, [f"out{k}" for k in range(outputs)]

    def forward(self, x):
        from torch2ms.runtime import msutil

        outs = [msutil.run_cell(self.net, [{"image": c[None].numpy()}], self.names)[0] for c in x]
        return tuple(torch.from_numpy(np.concatenate([o[n] for o in outs])) for n in self.names)


def converted(tmp_path, key: str):
    from torch2ms.runtime import msutil

    data = yaml.safe_load((REPO / "recipes" / f"mtcnn_{key}.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    path = tmp_path / f"mtcnn_{key}.yaml"
    path.write_text(yaml.safe_dump(data))
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert [s.status for s in result.stages] == ["passed"] * 5, [(s.stage, s.reason) for s in result.stages]
    return msutil.build_network(result.root / "fold", f"mtcnn_{key}")


def iou(a, b) -> float:
    x0, y0, x1, y1 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.slow
def test_face_boxes_match_facenets_pipeline(tmp_path):
    import skimage.data
    from facenet_pytorch import MTCNN
    from PIL import Image

    rnet, onet = converted(tmp_path, "rnet"), converted(tmp_path, "onet")
    mtcnn = MTCNN(device="cpu", keep_all=True)
    img = Image.fromarray(skimage.data.astronaut())
    theirs, _ = mtcnn.detect(img)
    mtcnn.rnet, mtcnn.onet = Converted(rnet, 2), Converted(onet, 3)
    ours, _ = mtcnn.detect(img)
    assert theirs is not None and ours is not None and len(ours) == len(theirs)
    assert min(max(iou(a, b) for b in ours) for a in theirs) > 0.99
