"""Deployment bundles: package -> verify on the tiny models, byte-identical repackaging,
tampered or unsafe archives rejected with the culprit named, and the bundle's own infer.py
(run alone, torch and torch2ms blocked) giving PyTorch's prediction on a real image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, run_bundle_infer, run_cli, unpack_bundle, write_recipe

from torch2ms.bundle.build import build_bundle, image_geometry
from torch2ms.bundle.targets import aipp_cfg
from torch2ms.errors import RecipeError
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

PREPROCESS = {"resize": [32, 32], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "color": "rgb"}
CLASSES = ["cat", "dog", "owl", "fox", "elk"]


def _package(recipe_path: Path, out: Path) -> Path:
    recipe = load_recipe(recipe_path)
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    return build_bundle(result, out, log=lambda m: None).path


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("pkg")
    recipe = write_recipe(d / "tiny.yaml", preprocess=PREPROCESS, class_names=CLASSES)
    return recipe, _package(recipe, d / "dist")


@pytest.fixture(scope="module")
def seg_bundle(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("seg")
    recipe = write_recipe(
        d / "seg.yaml",
        name="tinyseg",
        task="segmentation",
        model={"factory": "tiny_models:tiny_seg", "kwargs": {"classes": 3}, "seed": 0},
        preprocess={**PREPROCESS, "color": "bgr"},
    )
    return recipe, _package(recipe, d / "dist")


# --- package + verify ---


def test_package_then_verify_ok(tiny_bundle, capsys):
    _, bundle = tiny_bundle
    assert bundle.name.startswith("tiny-0.1.0-") and bundle.name.endswith(".tar.gz")
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
    expected = {
        "model/network.mindir",
        "model/model.onnx",
        "model/model_opset11.onnx",  # for ATC and AMCT (board_onnx): the export's model.onnx is opset 17
        "manifest.json",
        "infer.py",
        "README.md",
        "samples/reference.npz",
        "compatibility.md",
        "compatibility.json",
        "precision.md",  # the fp16 plan (--precision fp16, the default): nothing kept fp32 for this net
        "precision.json",
    }
    expected |= {
        f"targets/atlas-200i-dk-a2/{f}"
        for f in ("converter_lite.sh", "converter_lite.cfg", "atc.sh", "aipp.cfg", "aipp_yuv420sp.cfg")
    }
    assert set(names) == expected and names == sorted(names)
    assert set(manifest["files"]) == expected - {"manifest.json"}
    assert manifest["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32", "layout": "NCHW"}]
    assert manifest["outputs"][0]["shape"] == [1, 5]
    assert manifest["postprocess"]["class_names"] == CLASSES and manifest["postprocess"]["top_k"] == 5
    assert [s["stage"] for s in manifest["stages"]] == ["export", "rebuild", "fold", "compile", "mindir"]
    assert all(s["status"] == "passed" and s["worst"]["rel_error"] <= 1e-4 for s in manifest["stages"])
    assert manifest["target"]["soc_version"] == "Ascend310B4" and manifest["recipe"]["name"] == "tiny"
    assert {"torch", "mindspore", "onnx", "torch2ms"} <= set(manifest["versions"])
    with tarfile.open(bundle) as tar:
        atc = tar.extractfile("targets/atlas-200i-dk-a2/atc.sh").read().decode()
        board = onnx.load_from_string(tar.extractfile("model/model_opset11.onnx").read())
    assert '--model="$BUNDLE/model/model_opset11.onnx"' in atc
    assert [o.version for o in board.opset_import if o.domain in ("", "ai.onnx")] == [11]
    assert run_cli("verify", str(bundle)) == 0
    out = capsys.readouterr().out
    assert "15 files match manifest.json" in out and "OK tiny" in out
    assert "task: top-1 agreement 1.0000, top-5 overlap 1.0000" in out


def test_packaging_twice_is_byte_identical(tiny_bundle, tmp_path):
    recipe, first = tiny_bundle
    assert run_cli("package", "--recipe", str(recipe), "--out", str(tmp_path)) == 0
    second = tmp_path / first.name
    assert second.read_bytes() == first.read_bytes()
    with tarfile.open(second) as tar:
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in tar} == {(0, 0, 0, "", "")}
        assert {m.name: oct(m.mode) for m in tar if m.mode == 0o755} == {
            "infer.py": "0o755",
            "targets/atlas-200i-dk-a2/atc.sh": "0o755",
            "targets/atlas-200i-dk-a2/converter_lite.sh": "0o755",
        }
    assert second.read_bytes()[4:8] == b"\0\0\0\0"  # gzip mtime 0
    assert not list(tmp_path.glob(".*.tmp"))


def test_package_refuses_a_failed_run(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path / "t.yaml",
        check={"samples": 1, "rel_error": 1e-12, "cosine": 0.99999, "noise_factor": 0},
        preprocess=PREPROCESS,
    )
    assert run_cli("package", "--recipe", str(recipe), "--out", str(tmp_path / "dist")) == 1
    assert "out of tolerance" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


def test_unknown_target_is_a_usage_error(tiny_bundle, capsys):
    recipe, _ = tiny_bundle
    assert run_cli("package", "--recipe", str(recipe), "--target", "atlas-9000") == 2
    assert "atlas-200i-dk-a2" in capsys.readouterr().err


# --- tampering ---


def _rewrite(src: Path, dst: Path, mutate) -> Path:
    """Copy a bundle member by member; ``mutate(members)`` edits the list of (TarInfo, bytes)."""
    with tarfile.open(src) as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar]
    members = mutate(members)
    with gzip.open(dst, "wb") as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as out:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            out.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return dst


def _flip_byte(members):
    out = []
    for info, data in members:
        if info.name == "model/network.mindir":
            data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        out.append((info, data))
    return out


def _add(name: str, kind=tarfile.REGTYPE, link: str = ""):
    def mutate(members):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        return members + [(info, b"evil\n" if kind == tarfile.REGTYPE else b"")]

    return mutate


@pytest.mark.parametrize(
    "mutate, code, words",
    [
        (_flip_byte, 1, ["model/network.mindir", "sha256", "file changed"]),
        (_add("notes.txt"), 1, ["notes.txt", "extra file"]),
        (lambda ms: [(i, d) for i, d in ms if i.name != "infer.py"], 1, ["infer.py", "missing"]),
        (_add("../evil"), 1, ["'../evil'", "path traversal"]),
        (_add("/tmp/torch2ms-evil"), 1, ["'/tmp/torch2ms-evil'", "absolute path"]),
        (_add("model/link", tarfile.SYMTYPE, "../../../etc/passwd"), 1, ["'model/link'", "symlink", "outside"]),
        (_add("model/hard", tarfile.LNKTYPE, "/etc/passwd"), 1, ["'model/hard'", "hardlink", "outside"]),
        (_add("model/dev", tarfile.CHRTYPE), 1, ["'model/dev'", "not a regular file"]),
    ],
    ids=["changed-byte", "extra-file", "missing-file", "traversal", "absolute", "symlink", "hardlink", "device"],
)
def test_tampered_bundle_is_rejected(tiny_bundle, tmp_path, capsys, mutate, code, words):
    _, bundle = tiny_bundle
    bad = _rewrite(bundle, tmp_path / "bad.tar.gz", mutate)
    assert run_cli("verify", str(bad)) == code
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    assert not (tmp_path.parent / "evil").exists() and not Path("/tmp/torch2ms-evil").exists()


def test_unreadable_input_exits_2(tmp_path, capsys):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball at all")
    assert run_cli("verify", str(junk)) == 2
    assert "not a readable .tar.gz" in capsys.readouterr().err
    assert run_cli("verify", str(tmp_path / "absent.tar.gz")) == 2


# --- generated target files ---


def test_aipp_folds_mean_std_and_scale():
    cfg = aipp_cfg(
        {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "color": "bgr"}, 30, 40
    )
    values = dict(line.strip().split(": ") for line in cfg.splitlines() if ": " in line and not line.startswith("#"))
    assert values["src_image_size_w"] == "40" and values["src_image_size_h"] == "30"
    assert (
        values["input_format"] == "RGB888_U8"
        and values["rbuv_swap_switch"] == "true"
        and values["csc_switch"] == "false"
    )
    assert float(values["min_chn_0"]) == pytest.approx(0.485 * 255, abs=1e-5) and values["mean_chn_0"] == "0"
    assert float(values["var_reci_chn_2"]) == pytest.approx(1 / (0.225 * 255), rel=1e-8)
    # AIPP's formula reproduces the recipe's normalisation for every pixel value
    pixel = np.arange(256.0)
    aipp = (pixel - float(values["mean_chn_1"]) - float(values["min_chn_1"])) * float(values["var_reci_chn_1"])
    np.testing.assert_allclose(aipp, (pixel / 255 - 0.456) / 0.224, atol=1e-5)


def test_target_table_sets_the_soc_version():
    from torch2ms.bundle.targets import atc_sh, converter_lite_sh, get_target

    inputs = [{"name": "input", "shape": [1, 3, 224, 224]}]
    assert '--soc_version="$SOC"' in atc_sh(get_target("atlas-300i-pro"), "m", inputs, "fp16", True)
    assert "SOC=${SOC_VERSION:-Ascend310P3}" in atc_sh(get_target("atlas-300i-pro"), "m", inputs, "fp16", True)
    script = converter_lite_sh(get_target("atlas-200i-dk-a2"), "m", inputs, "fp32")
    for flag in ("--fmk=MINDIR", "--optimize=ascend_oriented", '--inputShape="input:1,3,224,224"', "--saveType=MINDIR"):
        assert flag in script
    assert "UNVERIFIED" in script and "not documented" in script  # Lite's docs list the 310 and 310P, not the 310B
    assert "UNVERIFIED" not in converter_lite_sh(get_target("atlas-300i-pro"), "m", inputs, "fp32")
    assert "--precision_mode=must_keep_origin_dtype" in atc_sh(get_target("atlas-300i-pro"), "m", inputs, "fp32", True)
    assert "--precision_mode=allow_fp32_to_fp16" in atc_sh(get_target("atlas-300i-pro"), "m", inputs, "cube-fp16", True)


def test_resize_must_match_the_fixed_input(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", preprocess={"resize": [64, 48]}))
    with pytest.raises(RecipeError, match=r"preprocess.resize is \[64, 48\].*\[1, 3, 32, 32\]"):
        image_geometry(recipe)


# --- the bundle's infer.py, run alone ---


def _test_image(path: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:30, 0:40]
    rgb = np.stack([x * 6, y * 8, (x + y) * 3], axis=-1) + rng.integers(0, 40, (30, 40, 3))
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(path)
    return path


def _torch_logits(recipe_path: Path, image: Path) -> np.ndarray:
    """The recipe's preprocessing done on the torch side: same Pillow resize, torch normalisation."""
    import torch
    from PIL import Image

    from torch2ms.model_loader import build_model

    recipe = load_recipe(recipe_path)
    pre = recipe.preprocess
    img = Image.open(image).convert("RGB").resize((pre.resize[1], pre.resize[0]), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float()
    if pre.color == "bgr":
        x = x.flip(0)
    x = (x * pre.scale - torch.tensor(pre.mean).view(3, 1, 1)) / torch.tensor(pre.std).view(3, 1, 1)
    with torch.no_grad():
        out = build_model(recipe)(x[None])
    return (out["out"] if isinstance(out, dict) else out).numpy()


@pytest.mark.parametrize("which", ["classification", "segmentation"])
def test_infer_py_alone_matches_torch_on_an_image(which, tiny_bundle, seg_bundle, tmp_path):
    recipe, bundle = tiny_bundle if which == "classification" else seg_bundle
    root = unpack_bundle(bundle, tmp_path / "bundle")
    image = _test_image(tmp_path / "photo.png")
    res = run_bundle_infer(root, str(image), "--out", str(tmp_path / "pred"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "GraphCell" in res.stderr  # no MindSpore Lite here: the documented fallback ran
    got = np.load(tmp_path / "pred.npy")
    want = _torch_logits(recipe, image)
    assert got.shape == want.shape
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    result = json.loads((tmp_path / "pred.json").read_text())
    if which == "classification":
        assert (
            result["top_k"][0]["index"] == int(want.argmax())
            and result["top_k"][0]["name"] == CLASSES[int(want.argmax())]
        )
        assert len(result["top_k"]) == 5
    else:
        from PIL import Image

        mask = np.asarray(Image.open(tmp_path / "pred.png"))
        np.testing.assert_array_equal(mask, want[0].argmax(axis=0))
        assert sum(c["pixels"] for c in result["classes_present"]) == 32 * 32


def test_infer_py_self_check_passes(tiny_bundle, tmp_path):
    _, bundle = tiny_bundle
    root = unpack_bundle(bundle, tmp_path / "bundle")
    res = run_bundle_infer(root, "--self-check")
    assert res.returncode == 0, res.stderr[-2000:] + res.stdout
    assert "ok   output 'output'" in res.stdout and "[2 samples]" in res.stdout
    assert run_bundle_infer(root, "--self-check", "--rtol", "1e-12").returncode == 1  # a check that can fail
    with np.load(root / "samples" / "reference.npz") as z:
        np.save(tmp_path / "x.npy", z["input.input"][1])
        want = z["output.output"][1]
    assert run_bundle_infer(root, str(tmp_path / "x.npy"), "--out", str(tmp_path / "y")).returncode == 0
    got = np.load(tmp_path / "y.npy")
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.slow  # a conversion of its own (~22 s); verify's bound from the record: test_package_then_verify_ok
def test_a_network_passed_at_its_noise_floor_verifies_at_that_bound(tmp_path, capsys):
    """A recipe bound below what float32 can give (1e-12) passes its stages only through the
    noise-floor rule; the bundle carries the bound the MindIR stage passed under, so verify agrees
    with convert, and that bound still fails the self-check's own 1e-12."""
    recipe = write_recipe(tmp_path / "tight.yaml", check={"samples": 2, "rel_error": 1e-12, "cosine": 0.99999})
    bundle = _package(recipe, tmp_path / "dist")
    root = unpack_bundle(bundle, tmp_path / "bundle")
    manifest = json.loads((root / "manifest.json").read_text())
    tol = manifest["tolerance"]
    assert tol["rel_error"] > 1e-12 and tol["by"].startswith("10x onnxruntime's distance"), tol
    mindir = next(s for s in manifest["stages"] if s["stage"] == "mindir")
    assert 1e-12 < mindir["worst"]["rel_error"] <= tol["rel_error"]  # the recipe's own bound would refuse it
    assert run_cli("verify", str(bundle)) == 0
    assert "10x onnxruntime's distance from PyTorch" in " ".join(capsys.readouterr().out.split())
    assert run_bundle_infer(root, "--self-check").returncode == 0
    assert run_bundle_infer(root, "--self-check", "--rtol", "1e-12").returncode == 1


# --- the real models (minutes each) ---


@pytest.mark.slow
@pytest.mark.parametrize("recipe_name", ["resnet50", "deeplabv3plus"])
def test_package_and_verify_zoo_model(recipe_name, tmp_path, capsys):
    recipe = REPO / "recipes" / f"{recipe_name}.yaml"
    args = ["package", "--recipe", str(recipe), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "dist")]
    assert run_cli(*args) == 0
    (bundle,) = (tmp_path / "dist").glob(f"{recipe_name}-*.tar.gz")
    assert run_cli("verify", str(bundle)) == 0
    assert f"OK {recipe_name}" in capsys.readouterr().out


# --- the bundle lint: every board-tool flag and key as documented ---


def test_the_lint_names_a_flag_the_table_lacks(tiny_bundle, tmp_path, monkeypatch, capsys, wide_console):
    """A writer that adds an undocumented flag fails ``package`` (exit 1, the file and the flag
    named, nothing written); ``verify`` names it in a bundle that carries it."""
    from torch2ms.bundle import lint, targets

    recipe, bundle = tiny_bundle
    assert lint.lint_files(_members(bundle)) == []
    real = targets.atc_sh
    monkeypatch.setattr(
        targets,
        "atc_sh",
        lambda *a, **k: real(*a, **k).replace(" \\\n  --soc_version", " \\\n  --bogus_flag=1 \\\n  --soc_version"),
    )
    assert run_cli("package", "--recipe", str(recipe), "--out", str(tmp_path / "dist")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "targets/atlas-200i-dk-a2/atc.sh: --bogus_flag is not in the table" in err, err
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())
    monkeypatch.setattr(
        targets, "atc_sh", lambda *a, **k: real(*a, **k).replace("--input_format=NCHW", "--input_format=NCWH")
    )
    with pytest.raises(Exception, match=r"--input_format='NCWH': the documentation allows one of NCHW, NHWC, ND"):
        _package(recipe, tmp_path / "dist")


def test_verify_runs_the_lint(tiny_bundle, tmp_path, capsys, wide_console):
    from torch2ms.bundle.archive import write_archive
    from torch2ms.bundle.verify import check_files

    _, bundle = tiny_bundle
    files = _members(bundle)
    cfg = "targets/atlas-200i-dk-a2/converter_lite.cfg"
    files[cfg] = files[cfg].replace(b"precision_mode=enforce_fp16", b"precision_mode=enforce_fp8")
    manifest = json.loads(files["manifest.json"])
    manifest["files"][cfg] = hashlib.sha256(files[cfg]).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    assert check_files({k: hashlib.sha256(v).hexdigest() for k, v in files.items()}, manifest) == []
    write_archive(tmp_path / "b.tar.gz", files)
    assert run_cli("verify", str(tmp_path / "b.tar.gz")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "converter_lite.cfg:3, section ascend_context: precision_mode='enforce_fp8': the documentation allows one of"
        in err
    )


def _members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_the_opset_11_onnx_is_checked_against_pytorch(tiny_bundle, tmp_path):
    """board_onnx.check holds the file ATC and AMCT read to the MindIR's bound against PyTorch: the
    shipped one passes, the same graph with one weight changed fails naming the output."""
    from onnx import numpy_helper

    from torch2ms.bundle import board_onnx
    from torch2ms.errors import CheckFailed

    _, bundle = tiny_bundle
    root = unpack_bundle(bundle, tmp_path / "b")
    tol = json.loads((root / "manifest.json").read_text())["tolerance"]
    path, ref = root / "model" / board_onnx.NAME, root / "samples" / "reference.npz"
    figures = board_onnx.check(path, ref, tol)
    assert figures and all(f["rel_error"] <= tol["rel_error"] for f in figures.values())
    model = onnx.load(str(path))
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.01, w.name))
    onnx.save(model, str(tmp_path / "wrong.onnx"))
    with pytest.raises(CheckFailed, match=r"does not match PyTorch: samples, output 'output': relative error"):
        board_onnx.check(tmp_path / "wrong.onnx", ref, tol)
