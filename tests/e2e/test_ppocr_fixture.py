"""rapidocr's trained PP-OCRv4 detector (recipes/ppocr_det.yaml) converted and compared with
rapidocr's own pipeline: the same input tensor through onnxruntime and through the converted
network, each map through rapidocr's DB post-processing, the text boxes matched by IoU."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import REPO

from torch2ms.errors import RecipeError
from torch2ms.recipe import load_recipe, parse_recipe
from torch2ms.stages import pipeline_runner


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
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
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


def page_lines():
    """The text lines rapidocr's own pipeline cuts from skimage's scanned page, as its recogniser's
    input tensors [1, 3, 48, 320] (``TextRecognizer.resize_norm_img``), top to bottom."""
    import cv2
    import skimage.data
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()
    img = cv2.cvtColor(skimage.data.page(), cv2.COLOR_GRAY2BGR)
    boxes, _ = engine.text_det(img)
    crops = engine.get_crop_img_list(img, engine.sorted_boxes(boxes))
    return engine, [engine.text_rec.resize_norm_img(c, 320 / 48)[None] for c in crops]


@pytest.mark.slow
def test_recognised_text_is_rapidocrs(tmp_path):
    from torch2ms.runtime import msutil

    engine, lines = page_lines()
    assert len(lines) >= 5
    data = yaml.safe_load((REPO / "recipes" / "ppocr_rec.yaml").read_text())
    files = []
    for k, x in enumerate(lines[:2]):
        files.append(str(tmp_path / f"line{k}.npy"))
        np.save(files[-1], x)
    data.update(output=str(tmp_path / "runs"))
    data["inputs"][0]["data"] = files
    path = tmp_path / "ppocr_rec.yaml"
    path.write_text(yaml.safe_dump(data))
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert [s.status for s in result.stages] == ["passed"] * 5, [(s.stage, s.reason) for s in result.stages]
    net = msutil.build_network(result.root / "fold", "ppocr_rec_fixture")
    decode = engine.text_rec.postprocess_op  # CTCLabelDecode with the model's own character list
    for x in lines:
        theirs = decode(engine.text_rec.session(x)[0])[0][0]
        ours = decode(msutil.run_cell(net, [{"x": x}], ["probs"])[0]["probs"])[0][0]
        assert ours == theirs and theirs
