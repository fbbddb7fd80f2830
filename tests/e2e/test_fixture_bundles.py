"""The trained fixtures packaged as INT8 bundles and verified: facenet's MTCNN O- and P-Net
(recipes/mtcnn_onet.yaml, mtcnn_pnet.yaml) through all five stages, ``package --precision int8``
with the recipe's skimage calibration photos and ``verify``. The plan's face agreement with PyTorch
(tasks/face.py) meets ``precision.int8_task_agreement``, and the bundle lint passes (verify runs it)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO

from torch2ms.bundle.build import build_bundle
from torch2ms.bundle.verify import verify_bundle
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

pytest.importorskip("facenet_pytorch")


@pytest.mark.slow
@pytest.mark.parametrize("net", ["onet", "pnet"])
def test_mtcnn_int8_bundle_keeps_the_faces(net, tmp_path):
    data = yaml.safe_load((REPO / "recipes" / f"mtcnn_{net}.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    data["quantize"]["calibration"] = [f"skimage:{p}" for p in ("astronaut", "coffee", "chelsea", "camera")]
    path = tmp_path / f"mtcnn_{net}.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.reason) for s in result.stages]
    bundle = build_bundle(result, tmp_path / "dist", precision="int8", log=lambda m: None)
    plan = json.loads((result.root / "precision" / "int8_plan.json").read_text())
    assert plan["after"]["ok"] and plan["after"]["task"]["metric"].startswith("faces agreeing")
    assert plan["after"]["task"]["agreement"] >= recipe.precision.int8_task_agreement
    logs: list[str] = []
    verified = verify_bundle(bundle.path, log=logs.append)
    assert verified.samples == 2 and any("every flag and key as documented" in line for line in logs), logs
