"""``torch2ms package`` on a generation recipe: the bundle verifies, its ``infer.py`` generates
transformers' tokens on its own, and a bundle whose recorded tokens or decode graph changed (the
manifest re-hashed, so that only the generation can tell) fails ``verify`` at the first differing
step and row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.generation.tiny import REPO, recipe_file
from torch2ms.bundle.archive import write_archive
from torch2ms.bundle.verify import verify_bundle
from torch2ms.errors import CheckFailed
from torch2ms.generation.plan import read_plan


@pytest.fixture(scope="module")
def bundle(converted_llama, tmp_path_factory):
    """The converted tiny Llama packaged (fp32: no fp16 plan to make), and transformers' tokens."""
    from torch2ms.generation.bundle import build_generation_bundle

    recipe, results = converted_llama
    out = tmp_path_factory.mktemp("dist")
    done = build_generation_bundle(results, recipe, out, "atlas-200i-dk-a2", None, "fp32", lambda m: None)
    generation = results["prefill"].root.parent / "generation"
    reference = np.load(generation / "reference.npz")["tokens"]
    return done, reference, [list(p) for p in read_plan(generation.parent).prompts]


def _infer(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The bundle's infer.py as the board runs it: no torch2ms on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "infer.py", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def _unpacked(path: Path, folder: Path) -> Path:
    with tarfile.open(path) as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.mark.slow  # package, verify and a board-script run (~45 s): make test converts the recipe end to end
def test_the_bundle_verifies_and_its_infer_py_generates_transformers_tokens(bundle, tmp_path):
    done, reference, prompts = bundle
    gen = done.manifest["generation"]
    assert gen["prompt_gears"] == [4, 8] and gen["cache"]["shape"] == [2, 1, 2, 14, 16]
    # ATC compiles one prefill OM for both gears: -1 placeholders, ND, one profile per gear
    folder = _unpacked(done.path, tmp_path / "bundle")
    atc = (folder / "prefill" / "targets" / "atlas-200i-dk-a2" / "atc.sh").read_text()
    assert '--input_shape="input_ids:1,-1;attention_mask:1,-1"' in atc and '--dynamic_dims="4,4;8,8"' in atc
    assert (
        "--input_format=ND" in atc
        and "--dynamic_dims" not in (folder / "decode/targets/atlas-200i-dk-a2/atc.sh").read_text()
    )
    verified = verify_bundle(done.path, log=lambda m: None)
    assert verified.generation == {"prompts": 2, "tokens": reference.size, "gears": [4, 8]}
    # the 3-token prompt (at gear 4), from the command line, outside torch2ms
    ids = prompts[1]
    assert len(ids) == 3
    run = _infer(folder, "--prompt-ids", " ".join(map(str, ids)), "--max-new-tokens", str(reference.shape[1]))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(t) for t in reference[1]]


def _repacked(path: Path, folder: Path, name: str, content: bytes) -> Path:
    """The bundle with ``name`` replaced by ``content`` and manifest.json's hash of it updated."""
    _unpacked(path, folder)
    (folder / name).write_bytes(content)
    manifest = json.loads((folder / "manifest.json").read_text())
    from torch2ms.pipeline.workspace import sha256_file

    manifest["files"][name] = sha256_file(folder / name)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    files = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    write_archive(folder.parent / "tampered.tar.gz", files)
    return folder.parent / "tampered.tar.gz"


@pytest.mark.slow  # another verify run (~8 s here): the quick test's verify and infer.py stay in make test
def test_a_bundle_whose_recorded_tokens_changed_fails_verify_at_that_step(bundle, tmp_path):
    from torch2ms.pipeline.workspace import load_npz, save_npz

    done, _, _ = bundle
    samples = load_npz(_unpacked(done.path, tmp_path / "orig") / "samples" / "generation.npz")
    samples["tokens"][1, 2] = (samples["tokens"][1, 2] + 1) % 1000
    save_npz(tmp_path / "generation.npz", samples)
    tampered = _repacked(
        done.path, tmp_path / "x", "samples/generation.npz", (tmp_path / "generation.npz").read_bytes()
    )
    with pytest.raises(CheckFailed, match=r"step 2, row 1: token \d+ instead of transformers' \d+ .*1 of 12 tokens"):
        verify_bundle(tampered, log=lambda m: None)


def _other_decode_graph(run: Path, out: Path) -> bytes:
    """The decode graph of the run with its LM head's weight rows rolled by one: another model's."""
    from torch2ms.runtime import mindir_layout, msutil

    ms = msutil.mindspore()
    cell = msutil.build_network(run / "decode" / "fold", "other_decode")
    head = next(p for name, p in cell.parameters_and_names() if "lm_head" in name)
    head.set_data(ms.Tensor(np.roll(head.asnumpy(), 1, axis=0)))
    inputs = np.load(run / "decode" / "export" / "reference.npz")
    names = ("input_ids", "position", "cache_position", "attention_mask", "keys", "values")
    msutil.set_graph_mode(ms)
    mindir_layout.export(ms, cell, *(ms.Tensor(inputs[f"input.{n}"][0]) for n in names), folder=out)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return (out / mindir_layout.GRAPH).read_bytes()


@pytest.mark.slow
def test_a_bundle_with_another_decode_graph_fails_verify(bundle, converted_llama, tmp_path):
    done, _, _ = bundle
    other = _other_decode_graph(converted_llama[1]["prefill"].root.parent, tmp_path / "other")
    tampered = _repacked(done.path, tmp_path / "x", "decode/model/network.mindir", other)
    with pytest.raises(CheckFailed, match=r"not transformers' on samples/generation.npz: step 1, row 0"):
        verify_bundle(tampered, log=lambda m: None)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2_tiny_generate", "gpt2_tiny_generate"])
def test_package_verify_and_infer_py_through_the_commands(tmp_path, name):
    """A shipped recipe through `torch2ms package` and `torch2ms verify`, then its infer.py --self-check."""
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO))
    path = recipe_file(tmp_path, name)

    def command(*args):
        done = subprocess.run(
            [sys.executable, "-m", "torch2ms", *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    command("package", "--recipe", str(path), "--out", str(tmp_path / "dist"))
    (archive,) = (tmp_path / "dist").glob("*.tar.gz")
    assert "the bundle's infer.py generates transformers'" in command("verify", str(archive))
    run = _infer(_unpacked(archive, tmp_path / "bundle"), "--self-check")
    assert run.returncode == 0 and "every token is transformers'" in run.stdout, run.stdout + run.stderr


def _board_script():
    """bundle/templates/generate.py as a module (it imports numpy only at load)."""
    import importlib.util

    from torch2ms.bundle.readme import TEMPLATES

    spec = importlib.util.spec_from_file_location("board_generate", TEMPLATES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_board_script_encodes_a_text_prompt_with_a_tokenizer_json(tmp_path, monkeypatch):
    """--prompt with --tokenizer: the tokenizers package's encoding; without the package, a clear error."""
    from argparse import Namespace

    from tokenizers import Tokenizer, models, pre_tokenizers

    board = _board_script()
    vocab = {"[UNK]": 0, "hello": 5, "board": 17}
    made = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    made.save(str(tmp_path / "tokenizer.json"))
    tokenizer = board._tokenizer(str(tmp_path / "tokenizer.json"))
    assert board._prompt(Namespace(prompt="hello board", prompt_ids=None), tokenizer) == [5, 17]
    assert tokenizer.decode([5, 17]) == "hello board"
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(SystemExit, match="--tokenizer needs the tokenizers package: pip install tokenizers"):
        board._tokenizer(str(tmp_path / "tokenizer.json"))


@pytest.mark.slow  # the W8A16 plan (~1 min here), a bundle, verify and infer.py --self-check
def test_a_w8a16_bundle_carries_int8_mindirs_that_verify_and_generate(converted_llama, tmp_path):
    """``--precision w8a16`` on the converted tiny Llama: the bundle's MindIRs are the plan's, their
    int8 layers INT8 tensors (every Linear the plan quantized and the token embedding), smaller than
    the fp32 bundle's; the manifest and README say what is int8; verify and infer.py pass."""
    from tests.generation.test_w8a16 import _parameters
    from torch2ms.generation.bundle import build_generation_bundle

    recipe, results = converted_llama
    done = build_generation_bundle(results, recipe, tmp_path / "dist", "atlas-200i-dk-a2", None, "w8a16", print)
    section = done.manifest["w8a16"]
    equal, total = section["tokens_equal"].split("/")
    assert done.version.endswith("-w8a16") and equal == total
    assert section["embedding"] == {"model.embed_tokens.weight": "int8"} and "lm_head" in " ".join(section["int8"])
    folder = _unpacked(done.path, tmp_path / "bundle")
    plan = json.loads((folder / "precision" / "w8a16_plan.json").read_text())
    assert plan["int8"] == section["int8"] and (folder / "precision" / "w8a16_plan.md").is_file()
    assert "## W8A16" in (folder / "README.md").read_text()
    for graph in ("prefill", "decode"):
        params = _parameters(folder / graph / "model" / "network.mindir")
        int8 = {n for n, (t, _) in params.items() if t == "INT8"}
        assert len(int8) == len(section["int8"]) == plan["layers"] - len(plan["keep_float"]), (graph, int8)
        assert any(n.replace(".", "_").endswith("embed_tokens_weight") for n in int8), int8
        # the ONNX models ATC compiles hold the same int8 weights, and generate transformers' tokens
        for onnx_file in (folder / graph / "model").glob("*.onnx"):
            inits = onnx.load(str(onnx_file)).graph.initializer
            assert sum(t.data_type == onnx.TensorProto.INT8 for t in inits) == len(section["int8"]), onnx_file
    for kind, checked in section["onnx"]["generation"].items():
        assert checked["tokens_equal"] == section["tokens_equal"], kind
    fp32 = build_generation_bundle(results, recipe, tmp_path / "fp32", "atlas-200i-dk-a2", None, "fp32", print)
    for suffix in (".mindir", ".onnx"):
        w8, full = (sum(v for k, v in b.sizes.items() if k.endswith(suffix)) for b in (done, fp32))
        assert w8 < 0.75 * full, suffix
    assert done.path.stat().st_size < 0.75 * fp32.path.stat().st_size
    verified = verify_bundle(done.path, log=lambda m: None)
    assert (
        verified.generation["tokens"]
        == np.load(results["prefill"].root.parent / "generation" / "reference.npz")["tokens"].size
    )
    run = _infer(folder, "--self-check")
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_w8a16_plan_whose_tokens_differ_is_refused_and_nothing_is_written(converted_llama, tmp_path, monkeypatch):
    """A plan whose reloaded MindIRs generate other tokens (here its record says so) refuses the
    bundle before anything is packaged."""
    from torch2ms.bundle import w8a16
    from torch2ms.generation import bundle

    def differing(recipe, run_dir, out_dir, log=print, lm_head=True):
        generation = {"tokens_equal": "11/12", "first_difference": "step 3, row 1: token 5 instead of 7"}
        (tmp_path / "plan.json").write_text(json.dumps({"generation": generation, "violations": []}))
        return {"plan": tmp_path / "plan.json"}

    monkeypatch.setattr(w8a16, "w8a16_mindirs", differing)
    recipe, results = converted_llama
    out = tmp_path / "dist"
    with pytest.raises(CheckFailed, match=r"W8A16 plan's MindIRs .* 11/12 equal free-running, first difference step 3"):
        bundle.build_generation_bundle(results, recipe, out, "atlas-200i-dk-a2", None, "w8a16", lambda m: None)
    assert not out.exists() or not any(out.iterdir())
