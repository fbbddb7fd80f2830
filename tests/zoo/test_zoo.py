"""``torch2ms zoo``: a 2-model zoo of tiny models converts in worker processes and writes three
summaries that agree; a passed model's intermediate weights go (``--keep all`` keeps them) and a
re-run still skips; a factory that raises, hangs, exits or is SIGKILLed, a model with an op no
converter takes and one whose ONNX disagrees with PyTorch are that model's failure with its
reason and category, and the summaries say what blocks the most models; --only; --compare;
zoo-file errors name the field; the Ray executor gives the same statuses as the local one."""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import REPO, TESTS

from torch2ms.cli import main
from torch2ms.errors import RecipeError
from torch2ms.runtime.threads import share
from torch2ms.stages import stage_names
from torch2ms.zoo import ZooOptions, load_zoo, parse_zoo, run_batch
from torch2ms.zoo.disk import du_mb

# the CI zoo: ~3 min of 12 models in 2 worker processes; started first under pytest-xdist (conftest.py)
pytestmark = pytest.mark.heavy

DEFAULTS = {
    "task": "classification",
    "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
    "check": {"samples": 1},
    "compile": {"graph_kernel": "off", "warmup": 1, "runs": 3},
}
TINY = [
    {"name": "tiny_net", "model": {"factory": "tiny_models:tiny_net", "kwargs": {"num_classes": 5}}},
    {"name": "tiny_seg", "task": "segmentation", "model": {"factory": "tiny_models:tiny_seg"}},
]
FAULTS = """
import os, signal, time

def raises():
    raise RuntimeError("factory exploded on purpose")

def hangs():
    time.sleep(600)

def exits():
    os._exit(3)

def killed():  # what the kernel's out-of-memory killer does
    os.kill(os.getpid(), signal.SIGKILL)

def hog():
    data = b"x" * (1500 * 2**20)  # written, so resident
    time.sleep(600)

import torch

class NonZero(torch.nn.Module):  # NonZero: refused by the converters (its output shape depends on the data)
    def forward(self, x):
        flat = torch.flatten(x)
        return flat[torch.nonzero(flat > -1e30)[:, 0]]

def nonzero():
    return NonZero()

class Noisy(torch.nn.Module):  # exports as RandomUniformLike: onnxruntime draws other numbers than PyTorch
    def forward(self, x):
        return x + torch.rand_like(x)

def noisy():
    return Noisy()
"""


def write_zoo(folder: Path, models: list[dict], defaults: dict = DEFAULTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "zoo.yaml"
    path.write_text(yaml.safe_dump({"defaults": defaults, "models": models}, sort_keys=False))
    return path


def zoo_cli(*args) -> int:
    try:
        main(["zoo", *map(str, args)])
    except SystemExit as e:
        return e.code or 0
    return 0


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module", autouse=True)
def tests_on_pythonpath():
    """Workers are fresh processes: they find tiny_models through PYTHONPATH, like a user's code."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(TESTS))
        yield


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo")
    path = write_zoo(folder, TINY)
    out = folder / "runs"
    t0 = time.perf_counter()
    code = zoo_cli(path, "--jobs", 2, "--out", out)
    return path, out, code, time.perf_counter() - t0, summary(out)


def test_two_models_pass_and_the_three_summaries_agree(tiny_zoo):
    path, out, code, _, _ = tiny_zoo
    data = summary(out)
    assert code == 0, data
    assert data["headline"] == "2/2 models passed (100.0%)"
    rows = {r["name"]: r for r in data["models"]}
    assert list(rows) == ["tiny_net", "tiny_seg"]
    for r in rows.values():
        assert r["status"] == "passed" and r["stages"] == dict.fromkeys(stage_names(), "passed") and not r["cached"]
        assert r["worst_rel_error"] <= 1e-4 and r["min_cosine"] >= 0.99999
        assert r["latency_ms"] > 0 and r["peak_rss_mb"] > 100 and r["convert_s"] > 0
        assert (out / r["name"] / "report.json").is_file()  # the ordinary run folder
        assert r["category"] is None and r["blockers"] == []
        assert r["disk_mb"] == pytest.approx(du_mb(out / r["name"]), abs=0.1) and r["disk_mb"] > 0
        # each of the two workers ran on its share of the cores (runtime.threads), and says so
        assert json.loads((out / r["name"] / "compile" / "stage.json").read_text())["cpu"]["threads"] == share(2)
    assert data["disk_mb"] == pytest.approx(sum(r["disk_mb"] for r in rows.values()), abs=0.2)
    assert data["categories"] == {} and data["blockers"] == []
    assert (
        rows["tiny_net"]["onnx_nodes"],
        rows["tiny_net"]["conv2d_bn_act"],
        rows["tiny_net"]["batchnorm_folded"],
    ) == (18, 3, 3)
    # tiny_seg: Conv-BN-Hardswish, and the aux head's Conv -> Sigmoid (a Conv2dBnAct without BatchNorm)
    assert (rows["tiny_seg"]["conv2d_bn_act"], rows["tiny_seg"]["batchnorm_folded"]) == (2, 1)
    assert (rows["tiny_net"]["fusion_coverage"], rows["tiny_seg"]["fusion_coverage"]) == ("2/2", "2/2")
    assert rows["tiny_net"]["task_agreement"] == rows["tiny_seg"]["task_agreement"] == 1.0
    assert rows["tiny_net"]["task"] == "top-1 agreement 1.0000, top-5 overlap 1.0000"
    assert rows["tiny_seg"]["task"] == "pixel agreement 1.0000, mIoU 1.0000"

    md = (out / "summary.md").read_text()
    assert "**2/2 models passed (100.0%)**" in md
    md_rows = {
        c[0]: c
        for c in (
            [x.strip() for x in ln.strip().strip("|").split("|")] for ln in md.splitlines() if ln.startswith("| tiny_")
        )
    }
    page = (out / "summary.html").read_text()
    assert "2/2 models passed (100.0%)" in page
    html_rows = {
        c[0]: c
        for c in (
            [html.unescape(x) for x in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", page)
        )
        if c
    }
    for name, r in rows.items():
        expect = [r["status"], *(r["stages"][s] for s in stage_names())]
        assert md_rows[name][1 : 2 + len(stage_names())] == expect
        assert html_rows[name][1 : 2 + len(stage_names())] == expect
        assert r["task"] in md_rows[name] and r["task"] in html_rows[name]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_the_summaries_carry_each_models_module_share_and_the_zoo_total(tiny_zoo):
    """Per model, the rebuild's ONNX nodes inside a module class over all its nodes (its stage.json
    counts.layout); zoo-wide, the same over every model, and the models that fell back to flat."""
    _, out, _, _, data = tiny_zoo
    rows = {r["name"]: r for r in data["models"]}
    inside = nodes = 0
    for name, r in rows.items():
        layout = json.loads((out / name / "rebuild" / "stage.json").read_text())["counts"]["layout"]
        assert layout["layout"] == "modules" and "modules_failed" not in layout
        assert 0 < layout["nodes_in_modules"] <= layout["nodes"]
        assert (r["nodes_in_modules"], r["layout_nodes"], r["flat_reason"]) == (
            layout["nodes_in_modules"],
            layout["nodes"],
            None,
        )
        assert r["module_share"] == pytest.approx(layout["nodes_in_modules"] / layout["nodes"], abs=1e-4)
        inside, nodes = inside + layout["nodes_in_modules"], nodes + layout["nodes"]
    total = data["layout"]
    assert (total["nodes_in_modules"], total["layout_nodes"], total["flat_fallbacks"]) == (inside, nodes, {})
    assert total["module_share"] == pytest.approx(inside / nodes, abs=1e-4)
    share = f"{100 * inside / nodes:.1f}% of {nodes} ONNX nodes inside a module class"
    md, page = (out / "summary.md").read_text(), html.unescape((out / "summary.html").read_text())
    assert f"Module layout: {share}; 0 model(s) fell back to the flat layout." in md and share in page
    for name, r in rows.items():
        cell = f"{100 * r['module_share']:.1f}%"
        assert re.search(rf"^\| {name} \|.*\| {re.escape(cell)} \|", md, re.M), (name, cell)
        assert f"<td>{cell}</td>" in (out / "summary.html").read_text()


def test_a_flat_fallback_is_shown_with_its_reason_and_counted():
    """A rebuild whose module classes failed writes counts.layout {layout: flat, modules_failed: why}
    (codegen.builder): the row says "flat: why", it adds no nodes to the share, and the zoo counts it."""
    from torch2ms.zoo.row import ModelRow, layout_fields, layout_totals

    why = "KeyError: '/blocks/Add_3'"
    flat = ModelRow("a", "passed", **layout_fields({"layout": "flat", "modules_failed": why}))
    mods = ModelRow("b", "passed", **layout_fields({"layout": "modules", "nodes_in_modules": 45, "nodes": 50}))
    own = ModelRow("c", "passed", **layout_fields({"layout": "flat"}))  # a recipe's rebuild.layout: flat
    assert (flat.layout_cell, mods.layout_cell, own.layout_cell) == (f"flat: {why}", "90.0%", None)
    assert layout_totals([flat, mods, own]) == {
        "module_share": 0.9,
        "nodes_in_modules": 45,
        "layout_nodes": 50,
        "flat_fallbacks": {"a": why},
    }


def test_a_passed_model_keeps_what_its_user_needs(tiny_zoo):
    """The rebuild's weights (the fold's supersede them) go; network.py, the fold's weights, the MindIR,
    the ONNX and the references stay; the record keeps the deleted file's hash under ``pruned``."""
    _, out, _, _, _ = tiny_zoo
    run = out / "tiny_net"
    assert not (run / "rebuild" / "network.ckpt").exists()
    for kept in (
        "export/model.onnx",
        "export/reference.npz",
        "fold/network.py",
        "fold/network.ckpt",
        "rebuild/network.py",
    ):
        assert (run / kept).is_file(), kept
    assert list(run.glob("mindir/*.mindir")) and (run / "report.md").is_file()
    record = json.loads((run / "rebuild" / "stage.json").read_text())
    assert "network.ckpt" in record["pruned"] and "network.ckpt" not in record["artifacts"]
    assert record["status"] == "passed"


def test_diff_defaults_to_the_stage_that_kept_its_weights(tiny_zoo):
    from torch2ms.commands.diff import _default_stage
    from torch2ms.pipeline.workspace import RunDir

    _, out, _, _, _ = tiny_zoo
    assert _default_stage(RunDir(out / "tiny_net")) == "fold"


@pytest.mark.slow
def test_keep_all_keeps_every_weight_copy(tiny_zoo, tmp_path):
    path, out, _, _, _ = tiny_zoo
    assert zoo_cli(path, "--only", "tiny_seg", "--keep", "all", "--out", tmp_path / "all") == 0
    run = tmp_path / "all" / "tiny_seg"
    assert (run / "rebuild" / "network.ckpt").is_file() and "pruned" not in json.loads(
        (run / "rebuild" / "stage.json").read_text()
    )
    data = summary(tmp_path / "all")
    pruned = next(r for r in summary(out)["models"] if r["name"] == "tiny_seg")
    assert data["keep"] == "all" and data["models"][0]["disk_mb"] >= pruned["disk_mb"]  # tiny: same 0.1 MB


def test_rerun_skips_finished_models(tiny_zoo):
    path, out, _, first_s, _ = tiny_zoo
    before = {r["name"]: r for r in summary(out)["models"]}
    t0 = time.perf_counter()
    assert zoo_cli(path, "--jobs", 2, "--out", out) == 0
    again = time.perf_counter() - t0
    data = summary(out)
    for r in data["models"]:
        assert r["status"] == "passed" and r["cached"], r
        assert r["stages"] == dict.fromkeys(stage_names(), "up to date")
        # figures of the run that did the work are kept
        assert r["convert_s"] == before[r["name"]]["convert_s"] and r["peak_rss_mb"] == before[r["name"]]["peak_rss_mb"]
    assert again < first_s


def test_only_runs_the_named_models(tiny_zoo, tmp_path):
    path, out, _, _, _ = tiny_zoo
    assert zoo_cli(path, "--only", "tiny_seg", "--out", out) == 0
    assert [r["name"] for r in summary(out)["models"]] == ["tiny_seg"]
    assert summary(out)["headline"] == "1/1 models passed (100.0%)"


def test_only_with_an_unknown_name_is_an_error(tiny_zoo, capsys):
    path, out, _, _, _ = tiny_zoo
    assert zoo_cli(path, "--only", "tiny_seg,resnet9", "--out", out) == 2
    err = capsys.readouterr().err
    assert "resnet9" in err and "tiny_net" in err  # names the culprit and the choices


@pytest.fixture(scope="module")
def faulty_zoo(tiny_zoo, tmp_path_factory):
    """tiny_net (already converted: a skip) next to factories that raise, hang, exit, are killed."""
    _, tiny_out, _, _, _ = tiny_zoo
    folder = tmp_path_factory.mktemp("faulty")
    (folder / "faults.py").write_text(FAULTS)  # importable: the zoo file's folder is searched
    out = folder / "runs"
    shutil.copytree(tiny_out / "tiny_net", out / "tiny_net")
    models = [TINY[0]] + [
        {"name": n, "model": {"factory": f"faults:{n}"}}
        for n in ("raises", "hangs", "exits", "killed", "hog", "nonzero", "noisy")
    ]
    models[5]["max_memory_mb"] = 1000
    # random outputs make the float64 noise floor random too: without noise_factor 0 it would widen the bound
    models[7]["check"] = {"samples": 1, "noise_factor": 0}
    models[2]["timeout"] = 12  # its own; the others keep --timeout, so a slow start cannot turn them into timeouts
    path = write_zoo(folder, models)
    t0 = time.perf_counter()
    code = zoo_cli(path, "--jobs", 3, "--out", out, "--timeout", 300)
    rows = {r["name"]: r for r in summary(out)["models"]}
    return out, code, rows, time.perf_counter() - t0


def test_failures_are_recorded_and_do_not_stop_the_batch(faulty_zoo):
    out, code, rows, _ = faulty_zoo
    assert code == 1
    assert rows["tiny_net"]["status"] == "passed"
    assert summary(out)["headline"] == "1/8 models passed (12.5%)"
    assert [r["name"] for r in summary(out)["models"]] == [
        "tiny_net",
        "raises",
        "hangs",
        "exits",
        "killed",
        "hog",
        "nonzero",
        "noisy",
    ]


def test_every_failure_has_a_category_and_its_blockers(faulty_zoo):
    out, _, rows, _ = faulty_zoo
    got = {n: (r["category"], r["blockers"]) for n, r in rows.items() if n != "tiny_net"}
    assert got["raises"] == ("export", ["the factory raised RuntimeError"])
    assert got["exits"] == ("crash", ["export: worker exited with code 3"])
    assert got["killed"] == ("crash", ["export: worker killed by SIGKILL"])
    assert got["hog"] == ("oom", ["oom in export"])
    assert got["hangs"][0] == "timeout"
    assert got["nonzero"][0] == "unsupported-op" and got["nonzero"][1][0].startswith("NonZero: ")
    assert got["noisy"] == ("numeric", ["export: onnxruntime differs from PyTorch"])
    assert rows["nonzero"]["stages"]["export"] == "passed" and rows["nonzero"]["stages"]["rebuild"] == "failed"


def test_the_summaries_say_what_blocks_the_most_models(faulty_zoo):
    out, _, rows, _ = faulty_zoo
    data = summary(out)
    assert data["categories"] == {"export": 1, "crash": 2, "oom": 1, "timeout": 1, "unsupported-op": 1, "numeric": 1}
    table = {(b["category"], b["blocker"]): b["models"] for b in data["blockers"]}
    assert table[("export", "the factory raised RuntimeError")] == ["raises"]
    assert table[("numeric", "export: onnxruntime differs from PyTorch")] == ["noisy"]
    assert [m for (c, _), m in table.items() if c == "unsupported-op"] == [["nonzero"]]
    md = (out / "summary.md").read_text()
    page = (out / "summary.html").read_text()
    assert "## What blocks the most models" in md and "What blocks the most models</h2>" in page
    for b in data["blockers"]:
        assert f"| {b['count']} | {b['category']} | {b['blocker']} |" in md
        assert html.escape(b["blocker"]) in page


def test_a_factory_that_raises_is_a_failed_model_with_its_reason(faulty_zoo):
    r = faulty_zoo[2]["raises"]
    assert r["status"] == "failed" and r["stages"]["export"] == "failed" and r["stages"]["rebuild"] == "not run"
    assert "faults:raises" in r["reason"] and "factory exploded on purpose" in r["reason"]


def test_a_hanging_worker_is_killed_at_the_timeout(faulty_zoo):
    out, _, rows, _ = faulty_zoo
    r = rows["hangs"]
    assert r["status"] == "timeout" and "timeout of 12 s" in r["reason"]
    status = json.loads((out / "hangs" / "zoo-status.json").read_text())
    if status.get("pid"):  # the worker got as far as starting: its process is gone
        assert not psutil.pid_exists(status["pid"]) or psutil.Process(status["pid"]).status() == psutil.STATUS_ZOMBIE
        assert r["stages"]["export"] == "timeout" and "during stage 'export'" in r["reason"]


def test_a_worker_that_exits_or_is_killed_is_a_crashed_model(faulty_zoo):
    rows = faulty_zoo[2]
    assert (
        rows["exits"]["status"] == "crashed" and "exited with code 3 during stage 'export'" in rows["exits"]["reason"]
    )
    assert rows["exits"]["stages"]["export"] == "crashed"
    killed = rows["killed"]
    assert killed["status"] == "crashed" and "SIGKILL" in killed["reason"] and "out-of-memory" in killed["reason"]


def test_a_worker_over_its_memory_limit_is_killed_as_out_of_memory(faulty_zoo):
    r = faulty_zoo[2]["hog"]
    assert r["status"] == "oom" and r["stages"]["export"] == "oom", r
    assert "over the limit of 1000 MB during stage 'export'" in r["reason"] and r["peak_rss_mb"] > 1000


@pytest.mark.parametrize(
    "zoo, where",
    [
        ({"models": [TINY[0]], "defautls": {}}, "defautls: unknown key"),
        (
            {"defaults": {"compile": {"graph_kernal": "off"}}, "models": [TINY[0]]},
            "defaults.compile.graph_kernal: unknown key",
        ),
        ({"models": [TINY[0], {"name": "b", "model": {"factroy": "x:y"}}]}, "models[1] (b).model.factroy: unknown key"),
        ({"models": [TINY[0], {"model": {"factory": "x:y"}}]}, "models[1] (unnamed).name: required field is missing"),
        ({"models": [TINY[0], TINY[0]]}, "models[1].name: 'tiny_net' is already used by models[0]"),
        ({"models": [{"recipe": "missing.yaml"}]}, "models[0].recipe:"),
        ({"models": []}, "models: List should have at least 1 item"),
        ({"models": [{**TINY[0], "timeout": -1}]}, "models[0].timeout: expected a positive number of seconds"),
    ],
)
def test_a_bad_zoo_file_names_the_field(tmp_path, zoo, where):
    with pytest.raises(RecipeError) as err:
        parse_zoo({"defaults": DEFAULTS, **zoo}, "zoo.yaml", tmp_path)
    assert where in str(err.value), str(err.value)


def test_recipe_entries_merge_defaults_file_and_overrides(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "net.yaml").write_text(
        yaml.safe_dump({**TINY[0], "inputs": [{"shape": [1, 3, 16, 16]}], "compile": {"runs": 7}})
    )
    zoo = {"defaults": DEFAULTS, "models": [{"recipe": "r/net.yaml", "name": "net2", "compile": {"warmup": 0}}]}
    (m,) = parse_zoo(zoo, "zoo.yaml", tmp_path)
    assert m.name == "net2" and m.recipe.inputs[0].shape == (1, 3, 16, 16)
    assert (m.recipe.compile.runs, m.recipe.compile.warmup, m.recipe.compile.graph_kernel) == (7, 0, "off")
    assert m.recipe.check.samples == 1 and Path(m.recipe.base_dir) == tmp_path / "r"


def test_shipped_zoo_files_are_valid():
    tv = load_zoo(REPO / "recipes" / "zoo" / "torchvision.yaml")
    assert len(tv) == 24 and len({m.name for m in tv}) == 24
    ci = load_zoo(REPO / "recipes" / "zoo" / "ci.yaml")
    assert len(ci) == 12 and len([m for m in ci if m.name in {t.name for t in tv}]) == 4
    # the other three torchvision families (ViT, DenseNet, ConvNeXt) at CI's size: torchvision's own classes
    assert {m.recipe.model.factory for m in ci} >= {
        "torch2ms.zoo.factories:vision_transformer",
        "torchvision.models:DenseNet",
        "torch2ms.zoo.factories:convnext",
    }
    timm, smp, yolo = (load_zoo(REPO / "recipes" / "zoo" / f"{z}.yaml") for z in ("timm", "smp", "yolo"))
    assert (len(timm), len(smp), len(yolo)) == (84, 23, 8)
    assert {m.recipe.model.kwargs["arch"] for m in smp} == {
        "Unet", "UnetPlusPlus", "MAnet", "Linknet", "FPN", "PSPNet", "PAN", "DeepLabV3", "DeepLabV3Plus", "UPerNet",
        "Segformer", "DPT",
    }  # fmt: skip
    assert all(m.recipe.postprocess.format == "yolo" and m.recipe.inputs[0].shape == (1, 3, 640, 640) for m in yolo)


@pytest.mark.slow
def test_the_small_factories_build_the_full_models_classes():
    """The CI zoo's ConvNeXt and Mixer factories, at the full models' sizes, build exactly the
    torchvision and timm models (the same parameter names and shapes)."""
    import timm
    import torchvision

    from torch2ms.zoo.factories import convnext, timm_class

    def shapes(model):
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}

    assert shapes(convnext()) == shapes(torchvision.models.convnext_tiny())
    mixer = timm_class("timm.models.mlp_mixer:MlpMixer", patch_size=16, num_blocks=8, embed_dim=512)
    assert shapes(mixer) == shapes(timm.create_model("mixer_s16_224", pretrained=False))
    assert not mixer.training and mixer.head.weight.any()  # eval mode, the zero-initialised head re-initialised
    with pytest.raises(ValueError, match="timm.<module>:<Class>"):
        timm_class("os:system")


def test_text_zoo_has_every_family_the_issue_names():
    text = {m.name: m.recipe for m in load_zoo(REPO / "recipes" / "zoo" / "text.yaml")}
    tasks = {n: r.task for n, r in text.items()}
    assert tasks == {
        **dict.fromkeys(["bert", "distilbert", "roberta", "xlm_roberta", "mobilebert"], "sequence_classification"),
        **dict.fromkeys(["gpt2", "llama"], "language_model"),
        **dict.fromkeys(["t5_encoder", "clip_text", "whisper_encoder"], "embedding"),
    }
    for name, r in text.items():
        dtypes = [i.dtype for i in r.inputs]
        assert dtypes == (["float32"] if name == "whisper_encoder" else ["int64"] * len(dtypes)), name
        if name != "whisper_encoder":  # a padded row: the graph must apply the mask
            assert r.inputs[1].name == "attention_mask" and min(r.inputs[1].lengths) < r.inputs[1].shape[1], name
    assert all(32 <= text[n].inputs[0].shape[1] <= 128 for n in ("gpt2", "llama"))
    assert 2 <= text["llama"].model.kwargs["num_hidden_layers"] <= 4


def test_timm_zoo_input_sizes_are_each_models_pretrained_cfg():
    timm = pytest.importorskip("timm")
    for m in load_zoo(REPO / "recipes" / "zoo" / "timm.yaml"):
        cfg = timm.models.get_pretrained_cfg(m.recipe.model.kwargs["name"])
        want = tuple(cfg.input_size) if cfg is not None and cfg.input_size else (3, 224, 224)
        assert m.recipe.inputs[0].shape == (1, *want), m.name


@pytest.mark.slow
def test_ray_executor_gives_the_same_statuses_as_local(tiny_zoo, tmp_path):
    ray = pytest.importorskip("ray")
    path, _, _, _, first = tiny_zoo
    local = {r["name"]: (r["status"], r["stages"]) for r in first["models"]}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        data = run_batch(
            load_zoo(path), ZooOptions(out_root=tmp_path / "ray", executor="ray", jobs=2), str(path), log=lambda m: None
        )
    finally:
        ray.shutdown()
    assert data["executor"] == "ray" and data["headline"] == "2/2 models passed (100.0%)"
    got = {r["name"]: (r["status"], r["stages"]) for r in data["models"]}
    assert got == local == {n: ("passed", dict.fromkeys(stage_names(), "passed")) for n in ("tiny_net", "tiny_seg")}
    assert [r["name"] for r in data["models"]] == list(local)


def test_ray_executor_without_ray_says_how_to_get_it(monkeypatch, tmp_path):
    import sys

    from torch2ms.errors import Torch2msError
    from torch2ms.zoo.executors import run_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(Torch2msError, match=r"pip install 'torch2ms\[ray\]'"):
        run_ray([], None, None, on_done=lambda r: None)


# The CI zoo's families that no other test in `make test` converts: depthwise/hardswish/squeeze-excite
# (torchvision), LayerNorm2d/GELU/layer scale (ConvNeXt), timm attention, an smp decoder with
# ConvTranspose. A third of the zoo's conversion time; the whole zoo is the slow test below.
CI_FAMILIES = ("mobilenet_v3_small", "convnext_small_blocks", "vit_tiny_patch16_64", "linknet_resnet18")


def _zoo_passes(out: Path, *args) -> dict:
    code = zoo_cli(REPO / "recipes" / "zoo" / "ci.yaml", "--jobs", 2, "--out", out, *args)
    rows = {r["name"]: r for r in summary(out)["models"]}
    failed = {n: f"{r['status']}: {r['reason']}" for n, r in rows.items() if r["status"] != "passed"}
    assert not failed, failed
    assert code == 0
    return rows


def test_ci_zoo_families_only_it_covers_pass(tmp_path):
    """Four models of recipes/zoo/ci.yaml, through all five stages."""
    assert set(_zoo_passes(tmp_path / "ci", "--only", ",".join(CI_FAMILIES))) == set(CI_FAMILIES)


@pytest.mark.slow
def test_ci_zoo_every_model_passes(tmp_path):
    """recipes/zoo/ci.yaml, one model per family (12, the wider zoos' families included)."""
    assert len(_zoo_passes(tmp_path / "ci")) == 12


@pytest.mark.slow
def test_text_zoo_every_model_passes(tmp_path):
    """recipes/zoo/text.yaml: ten transformers models built from their configs, all five stages, every
    task figure 1 (25-91 s a model with --jobs 1, 10 min for the zoo on a loaded machine)."""
    pytest.importorskip("transformers")
    out = tmp_path / "text"
    code = zoo_cli(REPO / "recipes" / "zoo" / "text.yaml", "--jobs", 1, "--out", out)
    rows = {r["name"]: r for r in summary(out)["models"]}
    failed = {n: f"{r['status']}: {r['reason']}" for n, r in rows.items() if r["status"] != "passed"}
    assert not failed, failed
    assert code == 0 and len(rows) == 10
    for name in rows:
        for stage in stage_names():
            record = json.loads((out / name / stage / "stage.json").read_text())
            assert record["task"]["agreement"] >= 0.9999, (name, stage, record["task"])


def test_the_summary_says_which_bound_judged_a_model():
    from torch2ms.zoo.row import bound_cell

    def rec(rel, by="recipe", bound=1e-4, task=None):
        return {
            "metrics": [{"name": "out", "rel_error": rel, "cosine": 1.0}],
            "bounds": {"out": {"rel_error": bound, "cosine": 0.99999, "by": by}},
            "task": task,
        }

    floor = "10x onnxruntime's distance from PyTorch"
    assert bound_cell({}) is None
    assert bound_cell({"export": rec(3e-6), "rebuild": rec(5e-6)}) == "recipe"
    # a widened bound the model did not need (error within 1e-4) is not reported
    assert bound_cell({"rebuild": rec(8e-5, floor, 6e-4)}) == "recipe"
    gate = {"agreement": 0.9425, "by": "10x onnxruntime's disagreement with PyTorch (0.9943)"}
    task = {"metric": "detection agreement", "agreement": 0.9885, "gate": gate}
    cell = bound_cell({"export": rec(3e-3, floor, 2.9e-2), "fold": rec(6.2e-3, floor, 6.2e-2, task)})
    assert cell == (
        f"rel 6.20e-03 <= 6.20e-02 ({floor}); task 0.9885 >= 0.9425 (10x onnxruntime's disagreement with "
        "PyTorch (0.9943))"
    )
