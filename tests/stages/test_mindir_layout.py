"""MindIRs over 1 GB of weights: MindSpore writes the graph and the weights apart (``TOTAL_SAVE`` in
``mindspore/train/serialization.py``), and the mindir stage, the stage record, the bundle, ``verify``
and ``infer.py`` must carry both.

The fast tests lower MindSpore's own threshold (``serialization.TOTAL_SAVE``, in KB, read by
``_save_together`` at every export) so that a tiny network takes the over-1-GB path; the slow one
exports a network just over the real threshold.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import run_bundle_infer, run_cli, unpack_bundle, write_recipe

from torch2ms.bundle.build import build_bundle
from torch2ms.recipe import load_recipe
from torch2ms.runtime import mindir_layout, msutil
from torch2ms.stages import pipeline_runner

WEIGHTS = f"{mindir_layout.VARIABLES}/data_0"


@pytest.fixture
def weights_apart(monkeypatch):
    """Every export takes MindSpore's over-1-GB path: weights in network_variables/."""
    msutil.mindspore()
    from mindspore.train import serialization

    monkeypatch.setattr(serialization, "TOTAL_SAVE", 0)


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    """A tiny network converted and packaged with its MindIR's weights apart."""
    mp = pytest.MonkeyPatch()
    msutil.mindspore()
    from mindspore.train import serialization

    mp.setattr(serialization, "TOTAL_SAVE", 0)
    try:
        d = tmp_path_factory.mktemp("split")
        recipe_path = write_recipe(d / "tiny.yaml", preprocess={"resize": [32, 32]})
        recipe = load_recipe(recipe_path)
        result = pipeline_runner(recipe, log=lambda m: None).run()
        assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
        bundle = build_bundle(result, d / "dist", precision="fp32", log=lambda m: None).path
    finally:
        mp.undo()
    return recipe_path, result.root, bundle


def test_mindir_stage_keeps_the_weights_beside_the_graph(split_run):
    _, root, _ = split_run
    folder = root / "mindir"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "network.mindir",
        WEIGHTS,
        "stage.json",
    ]
    record = json.loads((folder / "stage.json").read_text())
    # passed: the MindIR reloaded from network.mindir + network_variables/ matched PyTorch
    assert record["status"] == "passed"
    assert set(record["artifacts"]) == {"network.mindir", WEIGHTS}
    weights = (folder / WEIGHTS).stat().st_size
    assert record["counts"]["mindir_bytes"] == (folder / "network.mindir").stat().st_size + weights
    assert record["counts"]["mindir_files"] == 2
    _assert_weights_apart(folder / "network.mindir")


def _assert_weights_apart(graph: Path) -> None:
    """Every parameter of the graph points into network_variables/ and carries no bytes itself."""
    from mindspore.train import mind_ir_pb2

    m = mind_ir_pb2.ModelProto()
    m.ParseFromString(graph.read_bytes())
    assert len(m.graph.parameter) > 0
    assert {p.external_data.location for p in m.graph.parameter} == {WEIGHTS}
    assert not any(p.raw_data for p in m.graph.parameter)


def test_edited_weights_file_reruns_the_mindir_stage(split_run, weights_apart):
    recipe_path, root, _ = split_run
    recipe = load_recipe(recipe_path)
    runner = pipeline_runner(recipe, log=lambda m: None)
    assert [s.status for s in runner.run().stages] == ["up to date"] * 5
    data = root / "mindir" / WEIGHTS
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    again = pipeline_runner(recipe, log=lambda m: None).run()
    assert [s.status for s in again.stages][-1] == "passed" and again.passed
    assert [s.status for s in again.stages][:4] == ["up to date"] * 4
    assert (root / "mindir" / WEIGHTS).read_bytes() != bytes(raw)


def test_bundle_carries_and_verifies_the_weights(split_run, tmp_path, capsys):
    _, _, bundle = split_run
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
        readme = tar.extractfile("README.md").read().decode()
    assert {"model/network.mindir", f"model/{WEIGHTS}"} <= set(names)
    assert f"model/{WEIGHTS}" in manifest["files"]
    assert f"`model/{mindir_layout.VARIABLES}/`" in readme
    assert run_cli("verify", str(bundle)) == 0
    assert "OK tiny" in capsys.readouterr().out

    # a bundle without its weights file is refused by name
    stripped = tmp_path / "stripped.tar.gz"
    with tarfile.open(bundle) as src, tarfile.open(stripped, "w:gz") as dst:
        for m in src:
            if m.name != f"model/{WEIGHTS}":
                dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    assert run_cli("verify", str(stripped)) == 1
    assert f"model/{WEIGHTS}: missing" in capsys.readouterr().err


def test_infer_py_runs_the_split_mindir(split_run, tmp_path):
    _, _, bundle = split_run
    d = unpack_bundle(bundle, tmp_path / "b")
    done = run_bundle_infer(d, "--self-check")
    assert done.returncode == 0, done.stderr
    (d / "model" / WEIGHTS).unlink()
    done = run_bundle_infer(d, "--self-check")
    assert done.returncode == 2 and f"model/{WEIGHTS}" in done.stderr


@pytest.mark.slow
def test_export_just_over_one_gigabyte(tmp_path):
    """MindSpore's real threshold: 1.07 GB of Dense weights come back from network.mindir + network_variables/."""
    ms = msutil.mindspore()
    from mindspore.train import serialization

    assert serialization.TOTAL_SAVE == 1024 * 1024  # KB: the threshold this layout exists for
    ms.set_context(mode=ms.GRAPH_MODE)
    width = 8192
    layers = 4  # 4 x 8192 x 8192 float32 = 1.07 GB (> 1 GiB)
    ms.set_seed(0)
    net = ms.nn.SequentialCell([ms.nn.Dense(width, width, weight_init="normal") for _ in range(layers)])
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, width), dtype=np.float32))
    expected = net(x).asnumpy()
    written = mindir_layout.export(ms, net, x, folder=tmp_path)
    del net
    assert [p.relative_to(tmp_path).as_posix() for p in written][:2] == ["network.mindir", WEIGHTS]
    assert sum(p.stat().st_size for p in written[1:]) >= layers * width * width * 4
    _assert_weights_apart(written[0])
    got = ms.nn.GraphCell(ms.load(str(tmp_path / "network.mindir")))(x).asnumpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
