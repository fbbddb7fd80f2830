"""rapidocr's trained PP-OCRv4 detector (recipes/ppocr_det.yaml) converted and compared with
rapidocr's own pipeline: the same input tensor through onnxruntime and through the converted
network, each map through rapidocr's DB post-processing, the text boxes matched by IoU."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import REPO

from torch2ms.errors import RecipeError
from torch2ms.pipeline.runner import Runner
from torch2ms.recipe import load_recipe, parse_recipe


def iou(a, b) -> float:
    from shapely.geometry import Polygon

    pa, pb = Polygon(a), Polygon(b)
    return pa.intersection(pb).area / pa.union(pb).area


def test_a_package_path_names_the_missing_package(tmp_path):
    from torch2ms.export.onnx_file import source_path

    recipe = parse_recipe(
        {"name": "x", "model": {"onnx": "package:no_such_package_here/m.onnx"}, "inputs": [{"shape": [1, 3, 8, 8]}]}
    )
    with pytest.raises(RecipeError, match="no installed package 'no_such_package_here'"):
        source_path(recipe)


@pytest.mark.slow
def test_detected_text_boxes_match_rapidocrs_pipeline(tmp_path):
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

    from torch2ms.runtime import msutil

    data = yaml.safe_load((REPO / "recipes" / "ppocr_det.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    path = tmp_path / "ppocr_det.yaml"
    path.write_text(yaml.safe_dump(data))
    result = Runner(load_recipe(path), log=lambda m: None).run()
    assert [s.status for s in result.stages] == ["passed"] * 5, [(s.stage, s.reason) for s in result.stages]
    ref = np.load(result.root / "export" / "reference.npz")
    x, ort_map = ref["input.x"][0], ref[[k for k in ref.files if k.startswith("output.")][0]][0]
    net = msutil.build_network(result.root / "fold", "ppocr_fixture")
    ms_map = msutil.run_cell(net, [{"x": x}], ["map"])[0]["map"]
    post = DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6, use_dilation=True)
    ort_boxes, _ = post(ort_map, (192, 448))
    ms_boxes, _ = post(ms_map, (192, 448))
    assert len(ort_boxes) >= 5 and len(ms_boxes) == len(ort_boxes)
    assert min(max(iou(a, b) for b in ms_boxes) for a in ort_boxes) > 0.95
