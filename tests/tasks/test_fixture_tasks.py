"""The trained fixtures' task checks (torch2ms/tasks/ocr.py, face.py) against the packages' own pipelines:
the text boxes rapidocr's DB post-processing finds, the text its CTC decoder reads, the face boxes
facenet's MTCNN generates and regresses; and each agreement falling when one box or one character
changes."""

from __future__ import annotations

import numpy as np
import pytest

from torch2ms.tasks.face import FACE, FaceDetection, candidates
from torch2ms.tasks.ocr import TextDetection, TextRecognition, ctc_greedy, text_boxes

pytest.importorskip("rapidocr_onnxruntime")


@pytest.fixture(scope="module")
def engine():
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR()


def page_det_map(engine) -> np.ndarray:
    """rapidocr's detector on skimage's page at 192x448 (DetPreProcess: BGR, (x/255 - 0.5) / 0.5)."""
    import cv2
    import skimage.data

    img = cv2.resize(cv2.cvtColor(skimage.data.page(), cv2.COLOR_GRAY2BGR), (448, 192))
    x = ((img.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)[None]
    return engine.text_det.infer(x)[0]


def test_text_boxes_are_the_ones_rapidocr_finds(engine):
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

    prob = page_det_map(engine)
    post = DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6, use_dilation=True)
    theirs, _ = post(prob, (192, 448))  # rapidocr's config.yaml settings
    ours = text_boxes(prob[0, 0])
    assert len(theirs) >= 5 and len(ours) == len(theirs)
    for quad in theirs:  # each rapidocr box's centre lies in exactly one of ours
        cx, cy = np.asarray(quad).mean(axis=0)
        assert sum(b[0] <= cx <= b[2] and b[1] <= cy <= b[3] for b in ours) == 1


def test_text_detection_agreement_counts_a_lost_box(engine):
    prob = page_det_map(engine)
    same = TextDetection().measure(None, [{"map": prob}], [{"map": prob}])
    assert same.agreement == 1.0 and same.figures["min_iou"] == 1.0
    n = same.figures["reference_boxes"]
    x0, y0, x1, y1 = text_boxes(prob[0, 0])[0].astype(int)
    lost = prob.copy()
    lost[0, 0, y0:y1, x0:x1] = 0.0
    r = TextDetection().measure(None, [{"map": lost}], [{"map": prob}])
    assert r.figures["missed"] == 1 and r.agreement == pytest.approx((n - 1) / n)


def test_recognised_text_is_rapidocrs_and_one_character_changes_it(engine):
    import cv2
    import skimage.data

    img = cv2.cvtColor(skimage.data.page(), cv2.COLOR_GRAY2BGR)
    boxes, _ = engine.text_det(img)
    crop = engine.get_crop_img_list(img, engine.sorted_boxes(boxes))[0]
    probs = engine.text_rec.session(engine.text_rec.resize_norm_img(crop, 320 / 48)[None])[0]
    decode = engine.text_rec.postprocess_op
    text = decode(probs)[0][0]
    assert text and "".join(decode.character[c] for c in ctc_greedy(probs[0])) == text
    assert TextRecognition().measure(None, [{"p": probs}], [{"p": probs}]).agreement == 1.0
    wrong = probs.copy()
    step = int(np.flatnonzero(probs[0].argmax(-1))[0])  # a step reading a character
    wrong[0, step] = 0.0
    wrong[0, step, 5] = 1.0
    r = TextRecognition().measure(None, [{"p": wrong}], [{"p": probs}])
    assert r.agreement == 0.0 and r.notes


def test_pnet_candidates_are_facenets_boxes():
    pytest.importorskip("facenet_pytorch")
    import skimage.data
    import torch
    from facenet_pytorch.models.mtcnn import PNet
    from facenet_pytorch.models.utils.detect_face import bbreg, generateBoundingBox

    img = torch.from_numpy(skimage.data.astronaut()[:256, 96:352].copy()).permute(2, 0, 1)[None].float()
    with torch.no_grad():
        reg, probs = PNet()((img - 127.5) / 128)
    boxes, _ = generateBoundingBox(reg, probs[:, 1], 1.0, FACE)
    theirs = bbreg(boxes, boxes[:, 5:9])[:, :4].numpy()
    score, ours = candidates(probs.numpy(), reg.numpy())
    assert len(theirs) > 0
    np.testing.assert_allclose(np.sort(ours[score >= FACE], axis=0), np.sort(theirs, axis=0), atol=1e-3)
    heads = {"reg": reg.numpy(), "prob": probs.numpy()}
    assert FaceDetection().measure(None, [heads], [heads]).agreement == 1.0
    moved = {"reg": reg.numpy() + 0.5, "prob": probs.numpy()}  # every box half a window off
    assert FaceDetection().measure(None, [moved], [heads]).agreement < 0.5
