"""Integer and boolean inputs: the recipe's ``inputs[].dtype`` / ``range`` / ``lengths``, the sample
data made from them, exact comparison of integer outputs, the text task metrics, and a small
token-id model (embeddings, CumSum positions, an additive attention mask, an int64 argmax output)
through all five stages."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write_recipe
from pipeline.test_bad_input import cli, flat

from torch2ms.compare import Tolerance, compare_outputs, worst
from torch2ms.errors import RecipeError
from torch2ms.recipe import load_recipe, parse_recipe
from torch2ms.samples import batch_samples, sample_inputs
from torch2ms.tasks import task_for

BASE = {"name": "m", "model": {"factory": "tiny_models:tiny_text"}, "check": {"samples": 2}}
IDS = {"name": "input_ids", "shape": [2, 8], "dtype": "int64", "range": [0, 50]}
MASK = {"name": "attention_mask", "shape": [2, 8], "dtype": "int64", "lengths": [8, 5]}


def recipe(*inputs, tmp_path, **top):
    return parse_recipe({**BASE, "inputs": list(inputs), **top}, "r.yaml", tmp_path)


# --- the recipe ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expect",
    [
        ({**IDS, "dtype": "float32"}, "range is for integer inputs (dtype int64 or int32), dtype is 'float32'"),
        ({**IDS, "range": [5, 5]}, "range [5, 5) is empty"),
        ({**IDS, "dtype": "int32", "range": [0, 2**31 + 1]}, "does not fit int32"),
        ({**IDS, "lengths": [3]}, "range and lengths both given"),
        ({**MASK, "lengths": [8, 5, 2]}, "lengths has 3 values"),
        ({**MASK, "lengths": [9]}, "lengths [9] outside 0..8"),
        ({**MASK, "shape": [2, 8, 1]}, "is not 2-D"),
        ({**IDS, "range": None, "data": "photo.png"}, "a int64 input takes .npy files"),
        ({**IDS, "dtype": "int8"}, "inputs.0.dtype"),
    ],
    ids=["range_float", "empty", "int32_overflow", "both", "lengths_rows", "lengths_long", "mask_3d", "image", "int8"],
)
def test_bad_integer_specs_are_named(spec, expect, tmp_path):
    with pytest.raises(RecipeError) as err:
        recipe(spec, tmp_path=tmp_path)
    assert expect in str(err.value) and "inputs.0" in str(err.value), str(err.value)


def test_integer_input_without_values_says_what_to_give(tmp_path):
    with pytest.raises(RecipeError) as err:
        recipe({**IDS, "range": None, "data": ["a.npy"]}, tmp_path=tmp_path)
    text = str(err.value)
    assert "inputs.0 (input_ids): an int64 input needs its values" in text
    assert "range: [low, high)" in text and "for all 2 samples (it has 1)" in text


def test_bad_integer_spec_exits_2_from_the_cli(tmp_path):
    path = tmp_path / "r.yaml"
    write_recipe(path, inputs=[{**IDS, "range": [7, 3]}])
    done = cli("convert", "--recipe", str(path), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "range [7, 3) is empty" in flat(done.stdout + done.stderr)
    assert not (tmp_path / "runs").exists()


# --- sample data --------------------------------------------------------------------------------


def test_samples_follow_range_lengths_and_dtype(tmp_path):
    bits = {"name": "flags", "shape": [2, 8], "dtype": "bool"}
    half = {"name": "features", "shape": [2, 4], "dtype": "float16"}
    r = recipe(IDS, {**MASK, "dtype": "bool"}, bits, half, tmp_path=tmp_path, check={"samples": 3, "seed": 4})
    samples = sample_inputs(r)
    again = sample_inputs(r)  # seeded: the same samples every time
    assert len(samples) == 3 and all(np.array_equal(a[k], b[k]) for a, b in zip(samples, again) for k in a)
    ids = np.stack([s["input_ids"] for s in samples])
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) > 20
    for s in samples:
        mask = s["attention_mask"]
        assert mask.dtype == np.bool_ and mask.sum(axis=1).tolist() == [8, 5]
        assert mask[1, :5].all() and not mask[1, 5:].any()  # the valid tokens first
        assert s["flags"].dtype == np.bool_ and s["features"].dtype == np.float16
    assert 0 < np.mean([s["flags"].mean() for s in samples]) < 1


def test_other_batch_sizes_cycle_the_lengths(tmp_path):
    r = recipe({**IDS, "batch": [2, 3]}, {**MASK, "batch": [2, 3]}, tmp_path=tmp_path)
    (extra,) = batch_samples(r).values()
    assert extra["input_ids"].shape == (3, 8) and extra["input_ids"].dtype == np.int64
    assert extra["attention_mask"].sum(axis=1).tolist() == [8, 5, 8]


@pytest.mark.parametrize(
    "values, expect",
    [
        (np.arange(16, dtype=np.float64).reshape(2, 8), None),  # whole numbers in a float file are fine
        (np.full((2, 8), 0.5), "fractional values"),
        (np.full((2, 8), 2**40, np.int64), "outside int32"),
        (np.array([["a"] * 8] * 2), "holds <U1 values"),
    ],
    ids=["whole_floats", "fractions", "overflow", "strings"],
)
def test_integer_data_files_must_hold_exact_values(values, expect, tmp_path):
    np.save(tmp_path / "ids.npy", values)
    r = recipe({**IDS, "dtype": "int32", "range": None, "data": ["ids.npy", "ids.npy"]}, tmp_path=tmp_path)
    if expect is None:
        assert np.array_equal(sample_inputs(r)[0]["input_ids"], values.astype(np.int32))
        assert sample_inputs(r)[0]["input_ids"].dtype == np.int32
        return
    with pytest.raises(RecipeError) as err:
        sample_inputs(r)
    assert "inputs.input_ids.data" in str(err.value) and expect in str(err.value)


# --- exact comparison of integer and boolean outputs ----------------------------------------------


def test_integer_outputs_are_compared_exactly():
    ref = [{"logits": np.ones((4, 3), np.float32), "label": np.array([0, 1, 2, 1], np.int64)}]
    same = [{"logits": ref[0]["logits"] + 1e-7, "label": ref[0]["label"].astype(np.int32)}]
    off = [{"logits": ref[0]["logits"], "label": np.array([0, 1, 2, 2], np.int32)}]
    tol = Tolerance(rel_error=1.0, cosine=0.5)  # bounds so loose that only exactness can fail
    ok = compare_outputs(same, ref)
    assert [m.mismatched for m in ok] == [None, 0] and not any(tol.violations(m) for m in ok)
    bad = compare_outputs(off, ref)
    assert bad[1].mismatched == 1 and worst(bad).name == "label"
    assert tol.violations(bad[1]) == ["1 elements differ (an integer or bool output is compared exactly)"]
    masks = compare_outputs([{"m": np.array([True, False])}], [{"m": np.array([True, True])}])
    assert masks[0].mismatched == 1


# --- the text task metrics ------------------------------------------------------------------------


def _task(name, tmp_path):
    return task_for(recipe(IDS, tmp_path=tmp_path, task=name))


def test_language_model_agreement_per_position(tmp_path):
    rng = np.random.default_rng(0)
    ref = [{"logits": rng.standard_normal((2, 5, 11))} for _ in range(2)]
    got = [{"logits": r["logits"].copy()} for r in ref]
    row = got[1]["logits"][0, 3]
    row[(row.argmax() + 1) % 11] = row.max() + 1  # sample 1, row 0, position 3 now predicts another token
    result = _task("language_model", tmp_path).measure(None, got, ref)
    assert result.metric == "top-1 agreement per position"
    assert result.agreement == pytest.approx(19 / 20)
    assert result.figures["worst_position"] == 3 and result.figures["worst_position_agreement"] == 0.75
    want = ref[1]["logits"][0, 3].argmax()
    assert result.notes == [f"row 2 position 3: PyTorch token {want}, stage token {row.argmax()}"]


def test_sequence_classification_and_embedding_metrics(tmp_path):
    ref = [{"logits": np.array([[1.0, 2.0, 0.0], [3.0, 0.0, 1.0]])}]
    got = [{"logits": np.array([[1.0, 2.0, 0.0], [0.0, 3.0, 1.0]])}]
    result = _task("sequence_classification", tmp_path).measure(None, got, ref)
    assert result.agreement == 0.5 and result.notes == ["row 1: PyTorch label 0, stage label 1"]
    vectors = [{"e": np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])}]
    moved = [{"e": np.array([[1.0, 1.0], [0.0, 5.0], [0.0, 0.0]])}]
    emb = _task("embedding", tmp_path).measure(None, moved, vectors)
    assert emb.agreement == pytest.approx(np.sqrt(0.5)) and emb.figures["worst_vector"] == 0
    assert emb.figures["mean_cosine"] == pytest.approx((np.sqrt(0.5) + 2) / 3)


# --- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """tiny_text converted once: int64 token ids, a bool padding mask, an int64 label output."""
    from torch2ms.stages import pipeline_runner

    path = write_recipe(
        tmp_path_factory.mktemp("text") / "text.yaml",
        name="tinytext",
        task="sequence_classification",
        model={"factory": "tiny_models:tiny_text", "seed": 0},
        inputs=[{**IDS, "shape": [3, 12]}, {**MASK, "shape": [3, 12], "dtype": "bool", "lengths": [12, 7, 3]}],
    )
    return path, pipeline_runner(load_recipe(path), log=lambda m: None).run()


def test_token_ids_and_mask_through_every_stage(text_run):
    _, result = text_run
    assert result.passed, [(s.stage, s.status) for s in result.stages]
    for stage in ("export", "rebuild", "fold", "compile", "mindir"):
        record = json.loads((result.root / stage / "stage.json").read_text())
        by_name = {m["name"]: m for m in record["metrics"]}
        assert by_name["label"]["mismatched"] == 0 and by_name["logits"]["mismatched"] is None, stage
        assert record["task"]["metric"] == "argmax agreement" and record["task"]["agreement"] == 1.0, stage
    reference = np.load(result.root / "export" / "reference.npz")
    dtypes = {k: reference[k].dtype for k in reference.files}
    assert np.int64 in dtypes.values() and np.bool_ in dtypes.values(), dtypes


@pytest.mark.slow
def test_token_bundle_verifies_and_its_infer_py_takes_token_ids(text_run, tmp_path):
    """The bundle: no AIPP (not an image), verify passes, infer.py --tokens and .npy inputs give
    PyTorch's logits, and a fractional .npy for the token ids is refused with exit 2."""
    import torch
    from conftest import run_bundle_infer, unpack_bundle

    from torch2ms.bundle.build import build_bundle
    from torch2ms.cli import main
    from torch2ms.model_loader import build_model

    path, result = text_run
    bundle = build_bundle(result, tmp_path / "dist", log=lambda m: None).path
    main(["verify", str(bundle)])  # raises (exit 1) when the MindIR no longer matches
    root = unpack_bundle(bundle, tmp_path / "bundle")
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["preprocess"]["image_input"] is False and not list(root.rglob("aipp*.cfg"))
    assert [i["dtype"] for i in manifest["inputs"]] == ["int64", "bool"]

    ids = np.zeros((3, 12), np.int64)
    ids[:, :4] = [5, 7, 9, 11]
    mask = np.zeros((3, 12), bool)
    mask[:, :4] = True
    with torch.no_grad():
        want = build_model(load_recipe(path))(torch.from_numpy(ids), torch.from_numpy(mask))["logits"].numpy()
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", mask.astype(np.int64))  # a 0/1 integer file for the bool mask
    for args, stem in (
        (["--tokens", "5 7 9 11"], "tok"),
        ([str(tmp_path / "ids.npy"), str(tmp_path / "mask.npy")], "npy"),
    ):
        res = run_bundle_infer(root, *args, "--out", str(tmp_path / stem))
        assert res.returncode == 0, res.stderr[-2000:]
        got = np.load(tmp_path / f"{stem}.npy")
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), stem
        assert json.loads((tmp_path / f"{stem}.json").read_text())["argmax"] == want.argmax(-1).tolist()
    np.save(tmp_path / "half.npy", ids + 0.5)
    res = run_bundle_infer(root, str(tmp_path / "half.npy"), str(tmp_path / "mask.npy"))
    assert res.returncode == 2 and "takes whole numbers (int64)" in res.stderr, res.stderr[-2000:]


def test_infer_py_tokens_fill_the_mask_and_segment_zero():
    """infer.py --tokens: ids padded with --pad-id, attention_mask 1 at the tokens, token_type_ids 0
    (segment A: it is not a mask), and an input of another shape refused by name."""
    import importlib.util

    from torch2ms.bundle.build import TEMPLATES

    spec = importlib.util.spec_from_file_location("bundle_infer", TEMPLATES / "infer.py")
    infer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(infer)
    specs = [
        {"name": "input_ids", "shape": [2, 6], "dtype": "int64"},
        {"name": "attention_mask", "shape": [2, 6], "dtype": "bool"},
        {"name": "token_type_ids", "shape": [2, 6], "dtype": "int32"},
    ]
    ids, mask, segments = infer.token_inputs("101, 7 102", 3, specs)
    assert ids.tolist() == [[101, 7, 102, 3, 3, 3]] * 2 and ids.dtype == np.int64
    assert mask.tolist() == [[True] * 3 + [False] * 3] * 2
    assert segments.dtype == np.int32 and not segments.any()
    with pytest.raises(infer.InputError, match="input 'pixels' is not a mask"):
        infer.token_inputs("1 2", 0, [specs[0], {"name": "pixels", "shape": [2, 3, 4], "dtype": "float32"}])
