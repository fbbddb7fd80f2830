"""compile.fusion: the typed graph-kernel rules, the one flags string they render into, the errors
that name the field, and the bundle's ATC fusion switch file built from them."""

from __future__ import annotations

import json
import tarfile

import pytest
from conftest import run_cli, write_recipe

from torch2ms.bundle.targets import atc_sh, get_target
from torch2ms.recipe import load_recipe
from torch2ms.runtime import graph_kernel


def _compile(tmp_path, **compile_section):
    return load_recipe(write_recipe(tmp_path / "r.yaml", compile=compile_section)).compile


def test_typed_fields_and_the_flags_string_render_into_one_string(tmp_path):
    spec = _compile(
        tmp_path,
        graph_kernel_flags="--dump_as_text",
        fusion={"opt_level": 2, "enable_cluster_ops": ["MatMul"], "disable_cluster_ops": ["Gather"]},
    )
    assert graph_kernel.flags(spec) == (
        "--dump_as_text=true --enable_cluster_ops=MatMul --disable_cluster_ops=Gather --opt_level=2"
    )
    # a retry rule extends the list the recipe gives, once per op type
    retry = {"disable_cluster_ops": ["Select", "Gather"]}
    assert "--disable_cluster_ops=Gather,Select " in graph_kernel.flags(spec, retry) + " "
    assert graph_kernel.rules(spec, retry) == {
        "enable_cluster_ops": ["MatMul"],
        "disable_cluster_ops": ["Gather", "Select"],
        "opt_level": 2,
    }
    # the old string alone still works as written
    assert graph_kernel.flags(_compile(tmp_path, graph_kernel_flags="--opt_level=1")) == "--opt_level=1"


@pytest.mark.parametrize(
    ("compile_section", "words"),
    [
        ({"fusion": {"opt_level": 4}}, "compile.fusion.opt_level: Input should be less than or equal to 3"),
        ({"fusion": {"disable_cluster_ops": ["select op"]}}, "compile.fusion.disable_cluster_ops: "),
        ({"fusion": {"exclude_modules": ["classifier"]}}, "cannot keep one module out of graph-kernel fusion"),
        ({"fusion": {"opt_lvl": 1}}, "compile.fusion.opt_lvl: unknown key; did you mean 'opt_level'?"),
        ({"graph_kernel_flags": "opt_level=1"}, "compile.graph_kernel_flags: "),
        (
            {"graph_kernel_flags": "--opt_level=1", "fusion": {"opt_level": 2}},
            "graph_kernel_flags sets --opt_level, which compile.fusion sets too",
        ),
    ],
)
def test_bad_fusion_rules_name_the_field_and_exit_2(tmp_path, capsys, compile_section, words):
    recipe = write_recipe(tmp_path / "bad.yaml", compile=compile_section)
    assert run_cli("convert", "--recipe", str(recipe)) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_atc_switch_flag_lands_in_the_atc_command(tmp_path):
    """The compile record's rules (a retry rule included) become the switch file; its flag goes on
    the atc command line that targets.atc_sh writes."""
    from torch2ms.bundle import fusion_switch

    target = get_target("atlas-200i-dk-a2")
    text = atc_sh(target, "m", [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}], "fp16", with_aipp=False)
    files = {f"targets/{target.name}/atc.sh": text.encode()}
    manifest = {"warnings": []}
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml"))
    records = {"compile": {"extra": {"fusion_rules": {"disable_cluster_ops": ["MatMul", "Select"]}}}}
    fusion_switch.add(files, manifest, recipe, records, target.name)
    atc = files[f"targets/{target.name}/atc.sh"].decode()
    command = atc[atc.index("atc --framework") : atc.index('echo "wrote')]
    assert '--fusion_switch_file="$HERE/fusion_switch.cfg"' in command
    switch = json.loads(files[f"targets/{target.name}/fusion_switch.cfg"])
    assert switch == {"Switch": {"GraphFusion": {"MatMulBiasAddFusionPass": "off"}, "UBFusion": {}}}
    assert "['Select']" in manifest["warnings"][0]


def test_bundle_of_a_recipe_with_fusion_rules_carries_the_switch_file(tmp_path):
    recipe = write_recipe(
        tmp_path / "tiny.yaml",
        compile={"graph_kernel": "off", "warmup": 0, "runs": 1, "fusion": {"opt_level": 0}},
    )
    assert run_cli("package", "--recipe", str(recipe), "--out", str(tmp_path / "dist")) == 0
    (bundle,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        (switch_name,) = [n for n in names if n.endswith("/fusion_switch.cfg")]
        switch = json.loads(tar.extractfile(switch_name).read())
        atc = tar.extractfile(switch_name.replace("fusion_switch.cfg", "atc.sh")).read().decode()
        manifest = json.loads(tar.extractfile(next(n for n in names if n.endswith("manifest.json"))).read())
    # opt_level 0 (no graph-kernel fusion) is every ATC pattern off
    assert switch == {"Switch": {"GraphFusion": {"ALL": "off"}, "UBFusion": {"ALL": "off"}}}
    assert '--fusion_switch_file="$HERE/fusion_switch.cfg"' in atc
    assert any(switch_name.endswith(name) for name in manifest["files"] if name.endswith("fusion_switch.cfg"))
