"""The plan search (``bundle/search.py``): it finds the layers that matter without one emulation
per layer, and on a small case finds the same plan as measuring every layer alone.

The model is a chain of ordinary layers (multiply, add: fp16 rounds each by ~5e-4 relative) with
two fp16-fragile spots, each a cancellation ``(y + 1000) - 1000`` whose two nodes must both stay
fp32 (fp16 keeps ~0.5 of absolute precision at 1000). The reference is exact (float64 numpy), the
emulation is onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torch2ms.bundle import fp16, search
from torch2ms.bundle.emulate import Fp16Emulator
from torch2ms.recipe import Recipe

LAYERS = 48
SPOTS = (9, 33)  # the Add(+1000) of each spot; the Sub(-1000) follows it


def chain(tmp_path, seed: int = 0):
    """A chain of LAYERS nodes on an 8x8 input; returns the ONNX path, the fragile nodes' names and
    a float64 function that computes the same chain."""
    rng = np.random.default_rng(seed)
    nodes, inits, steps, fragile = [], [], [], set()
    x = "x"
    k = 0
    while k < LAYERS:
        name = f"n{k}"
        if k in SPOTS:
            big = np.full((8, 8), 1000, np.float32)
            inits += [numpy_helper.from_array(big, f"c{k}")]
            nodes += [
                helper.make_node("Add", [x, f"c{k}"], [f"{name}_a"], name=f"{name}_add"),
                helper.make_node("Sub", [f"{name}_a", f"c{k}"], [f"y{k + 1}"], name=f"n{k + 1}_sub"),
            ]
            fragile |= {f"{name}_add", f"n{k + 1}_sub"}
            steps += [lambda v: v]  # exact: the cancellation gives y back
            x, k = f"y{k + 1}", k + 2
            continue
        if k % 2:
            w = rng.uniform(0.9, 1.1, (8, 8)).astype(np.float32)
            nodes.append(helper.make_node("Mul", [x, f"w{k}"], [f"y{k}"], name=name))
            steps.append(lambda v, w=w: v * w.astype(np.float64))
        else:
            w = rng.normal(0, 0.1, (8, 8)).astype(np.float32)
            nodes.append(helper.make_node("Add", [x, f"w{k}"], [f"y{k}"], name=name))
            steps.append(lambda v, w=w: v + w.astype(np.float64))
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        x, k = f"y{k}", k + 1
    nodes.append(helper.make_node("Identity", [x], ["output"], name="out"))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [8, 8])],
        inits,
    )
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    def exact(v):
        v = v.astype(np.float64)
        for f in steps:
            v = f(v)
        return v

    return path, fragile, exact


def recipe(bound: float) -> Recipe:
    return Recipe.model_validate(
        {
            "name": "chain",
            "model": {"factory": "tiny_models:fp16_fragile"},
            "inputs": [{"name": "x", "shape": [8, 8]}],
            "precision": {"fp16_rel_error": bound},
        }
    )


@pytest.fixture
def model(tmp_path):
    path, fragile, exact = chain(tmp_path)
    rng = np.random.default_rng(1)
    inputs = [{"x": rng.normal(0, 1, (8, 8)).astype(np.float32)} for _ in range(2)]
    reference = [{"output": exact(s["x"]).astype(np.float32)} for s in inputs]
    return path, fragile, inputs, reference


def test_search_finds_the_spots_with_fewer_emulations_than_layers(model):
    path, fragile, inputs, reference = model
    r = recipe(1e-2)
    emu = Fp16Emulator(path, inputs, ["output"])
    n = len(emu.labels)
    assert n == LAYERS + 1  # the Identity too
    plan = fp16.make_plan(r, path, inputs, reference, log=lambda m: None, emulator=emu)
    assert {k["label"] for k in plan["keep_fp32"]} == fragile
    assert not plan["before"]["ok"] and plan["after"]["ok"]
    assert plan["emulations"] < n, plan["search"]
    assert plan["search"]["emulations"] + plan["search"]["screening_emulations"] == plan["emulations"]
    # the shipped figures are the plan's own emulation on every sample, re-run here independently
    keep = [emu.labels.index(k["label"]) for k in plan["keep_fp32"]]
    got = emu.run(fp32=keep)
    a, ref = np.stack([g["output"] for g in got]), np.stack([s["output"] for s in reference])
    err = np.abs(a - ref).max() / np.abs(ref).max()  # over all samples, as compare_arrays
    assert err <= r.precision.fp16_rel_error and float(plan["after"]["error"]) == pytest.approx(err, rel=1e-2)
    # neither spot alone is enough: the bound really needs both
    for spot in (fragile - {f"n{SPOTS[0]}_add", f"n{SPOTS[0] + 1}_sub"}, {f"n{SPOTS[0]}_add", f"n{SPOTS[0] + 1}_sub"}):
        half = [emu.labels.index(label) for label in spot]
        assert not fp16.judge(r, emu.run(fp32=half), reference)["ok"]
    md = fp16.plan_markdown(plan, "chain")
    assert f"It took {plan['search']['emulations']} emulations on every sample" in md


@pytest.mark.parametrize("bound", [1e-2, 3e-3, 2e-3])
def test_search_gives_the_exhaustive_plan(model, bound):
    """At 1e-2 and 3e-3 the spots decide: both searches must keep exactly them. At 2e-3 the
    ordinary layers' rounding matters too and many sets of them would do; both plans must meet
    the bound, and the group search keeps the spots (found by bisection) plus whole blocks of
    ordinary layers where measuring each alone picks single ones, so it may keep a few more."""
    path, fragile, inputs, reference = model
    r = recipe(bound)
    emu = Fp16Emulator(path, inputs, ["output"])
    fast = fp16.make_plan(r, path, inputs, reference, log=lambda m: None, emulator=emu)
    slow = fp16.make_plan(r, path, inputs, reference, log=lambda m: None, emulator=emu, exhaustive=True)
    assert slow["emulations"] > len(emu.labels)  # one per layer, and more
    assert fast["emulations"] < slow["emulations"]
    assert fast["after"]["ok"] and slow["after"]["ok"]
    fast_keep, slow_keep = ({k["label"] for k in p["keep_fp32"]} for p in (fast, slow))
    if bound > 2e-3:
        assert fast_keep == slow_keep == fragile
    else:
        assert fast_keep > fragile and slow_keep > fragile


def test_same_inputs_same_plan(model):
    path, _, inputs, reference = model
    plans = [
        fp16.make_plan(recipe(2e-3), path, inputs, reference, log=lambda m: None)
        for _ in range(2)  # a fresh emulator each time
    ]
    for p in plans:
        p.pop("seconds")
    assert plans[0] == plans[1]


# --- the search alone, with a known error model: what an INT8 plan would pass in ---------------


def quadrature(weights: np.ndarray, bound: float):
    def evaluate(low: frozenset[int]) -> search.Verdict:
        error = float(np.sqrt(sum(weights[i] ** 2 for i in low)))
        return search.Verdict(error <= bound, error)

    return evaluate


def test_search_is_independent_of_fp16():
    """Errors that add in quadrature, three layers far above the rest: the search keeps exactly
    those three, meets the bound, and costs fewer evaluations than layers."""
    rng = np.random.default_rng(0)
    weights = rng.uniform(1e-4, 2e-4, 200)
    weights[[17, 90, 151]] = [0.5, 0.2, 0.05]
    # three layers hidden among 200 take ~8 halvings each to isolate, two evaluations per halving
    found = search.search(200, quadrature(weights, 1e-2), rank_budget=48)
    assert sorted(found.keep) == [17, 90, 151] and found.keep[0] == 17
    assert found.verdict.ok and found.verdict.error <= 1e-2
    assert found.evaluated < 200 // 2
    # with less budget the blocks stay coarser: more kept, the bound still met
    coarse = search.search(200, quadrature(weights, 1e-2), rank_budget=8, release_budget=4)
    assert {17, 90, 151} <= set(coarse.keep) and len(coarse.keep) > 3 and coarse.verdict.ok
    exhaustive = search.search(200, quadrature(weights, 1e-2), exhaustive=True)
    assert sorted(exhaustive.keep) == sorted(found.keep) and exhaustive.evaluated > 200


def test_an_unreachable_bound_is_refused():
    weights = np.full(10, 0.1)

    def evaluate(low):
        return search.Verdict(False, float(np.sqrt(sum(weights[i] ** 2 for i in low))))

    with pytest.raises(search.Unreachable):
        search.search(10, evaluate)
