"""A zoo model's result: one typed row, made by the launcher, kept as the run folder's
``zoo-result.json``, shown by the progress display and rendered by the summaries.

``COLUMNS`` says which fields the summary tables show and how: adding a column is one line there
(plus the field, and where ``launch.build_row`` reads it from the stage records).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class ModelRow:
    name: str
    status: str  # passed | failed | crashed | timeout | oom
    stages: dict[str, str] = field(default_factory=dict)  # stage -> its status
    reason: str = ""
    category: str | None = None  # a failed model's: unsupported-op | export | numeric | crash | timeout | oom
    blockers: list[str] = field(default_factory=list)  # what blocks it (torch2ms.zoo.failures)
    worst_rel_error: float | None = None  # over all stages, against PyTorch
    min_cosine: float | None = None
    task_agreement: float | None = None  # the recipe task's agreement with PyTorch, worst stage
    task: str | None = None  # that stage's task figures, as the report shows them
    bound: str | None = None  # "recipe", or the widest noise-floor bound a stage passed under (bound_cell)
    onnx_nodes: int | None = None
    conv2d_bn_act: int | None = None
    fusion_coverage: str | None = None  # Conv->(BN)->act chains fused / found, e.g. "49/49"
    batchnorm_folded: int | None = None
    # CANN ops the Ascend 310 runs off AI Core (on AI CPU, or with no kernel), after the rewrites (torch2ms.ascend)
    off_ai_core_ops: int | None = None
    off_ai_core_ops_unrewritten: int | None = None  # the same without fold.ascend_rewrites
    channel_waste_pct: float | None = None  # convolution MACs computed on channel padding (C0 = 16), %
    # the rebuild's module layout (its stage.json counts.layout): ONNX nodes inside a module class / all
    nodes_in_modules: int | None = None
    layout_nodes: int | None = None
    module_share: float | None = None
    flat_reason: str | None = None  # why the module classes failed and the flat listing was written
    convert_s: float | None = None  # the stage times summed (a cached model's: from when it converted)
    latency_ms: float | None = None  # the compiled network's median
    # the compile stage's choice (compile.json ``chosen``) and its margin: the other variant's median
    # over the chosen one's, minus 1 (None with one variant built); ``decision`` says how sure
    winner: str | None = None
    winner_margin: float | None = None
    # from <run>/profile/profile.json when `torch2ms profile` ran on the model: the compiled
    # network's kernels per call and small-op share (torch2ms.profile)
    kernels: float | None = None
    small_op_share: float | None = None
    profile_png: str | None = None  # <run>/profile/modules.png: time per module, per profiled variant
    peak_rss_mb: float | None = None  # the worker process's
    disk_mb: float | None = None  # the run folder's, after a passed model's intermediate weights went
    wall_s: float | None = None
    timeout_s: float | None = None
    max_memory_mb: float | None = None
    cached: bool = False
    exit_code: int | None = None
    run_dir: str | None = None
    log: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def layout_cell(self) -> str | None:
        """The module share as the tables show it: "97.3%", or "flat: <reason>" after a fallback."""
        if self.flat_reason:
            return f"flat: {self.flat_reason}"
        return f"{100.0 * self.module_share:.1f}%" if self.module_share is not None else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ModelRow | None:
        """A row read back from JSON (fields this version does not know are dropped)."""
        if not data:
            return None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# The summary tables' metric columns after model, status and the stages: (header, field, format).
COLUMNS: list[tuple[str, str, str]] = [
    ("max rel err", "worst_rel_error", ".2e"),
    ("min cosine", "min_cosine", ".7f"),
    ("task agreement", "task_agreement", ".4f"),  # the gated figure, as `verify` prints it
    ("task (worst stage)", "task", "s"),
    ("bound", "bound", "s"),  # which rule judged it: the recipe's, or k x the float32 noise floor
    ("ONNX nodes", "onnx_nodes", "d"),
    ("Conv2dBnAct", "conv2d_bn_act", "d"),
    ("fusion coverage", "fusion_coverage", "s"),
    ("BN folded", "batchnorm_folded", "d"),
    ("off AI Core ops", "off_ai_core_ops", "d"),  # AI CPU or no kernel on the 310 (docs/ascend310.md)
    ("off AI Core unrewritten", "off_ai_core_ops_unrewritten", "d"),
    ("channel waste %", "channel_waste_pct", ".2f"),
    ("module share", "layout_cell", "s"),  # ONNX nodes in a module class, or "flat: <reason>"
    ("convert s", "convert_s", ".1f"),
    ("latency ms", "latency_ms", ".2f"),
    ("winner", "winner", "s"),  # compile.json `chosen`: graph or graph_kernel
    ("winner margin", "winner_margin", ".1%"),  # the other variant's median over the winner's, minus 1
    ("kernels", "kernels", ".0f"),  # per call, from `torch2ms profile`
    ("small-op share", "small_op_share", ".1%"),  # kernel time in kernels under the profile's threshold
    ("peak RSS MB", "peak_rss_mb", ".0f"),
    ("disk MB", "disk_mb", ".0f"),
    ("category", "category", "s"),
]


def bound_cell(records: dict[str, dict], rel_error: float = 1e-4, cosine: float = 0.99999, gate: float = 1.0):
    """Which bound a model needed (stage.json ``bounds`` and ``task.gate``): "recipe" when every
    stage is within the recipe's (``rel_error``, ``cosine``, task ``gate``), else the widest
    noise-floor bound a stage needed, e.g. "rel 2.91e-03 <= 2.91e-02 (10x onnxruntime's distance
    from PyTorch)": the summaries show which models pass only because float32 cannot do better."""
    if not records:
        return None
    rel = task = None
    for r in records.values():
        bounds = r.get("bounds") or {}
        for m in r.get("metrics") or []:
            b = bounds.get(m["name"]) or {}
            value = m.get("rel_error")
            if b.get("by", "recipe") == "recipe" or not isinstance(value, float):
                continue
            if (value > rel_error or m.get("cosine", 1.0) < cosine) and (rel is None or value > rel[0]):
                rel = (value, b["rel_error"], b["by"])
        t = r.get("task") or {}
        g = t.get("gate") or {}
        if g.get("by", "recipe") != "recipe" and t["agreement"] < gate and (task is None or t["agreement"] < task[0]):
            task = (t["agreement"], g["agreement"], g["by"])
    parts = ([f"rel {rel[0]:.2e} <= {rel[1]:.2e} ({rel[2]})"] if rel else []) + (
        [f"task {task[0]:.4f} >= {task[1]:.4f} ({task[2]})"] if task else []
    )
    return "; ".join(parts) or "recipe"


def compile_fields(compile_record: dict | None) -> dict:
    """The winner of the compile stage's variants (``extra.chosen``) and its margin over the runner-up
    (the other compiled variant's median over the winner's, minus 1); no margin with one variant."""
    extra = (compile_record or {}).get("extra") or {}
    chosen = extra.get("chosen")
    timings = {k: v.get("median_ms") for k, v in (extra.get("variants") or {}).items() if k != "pynative_plain"}
    others = [t for k, t in timings.items() if k != chosen and t]
    best = timings.get(chosen)
    margin = round(min(others) / best - 1.0, 4) if others and best else None
    return {"winner": chosen, "winner_margin": margin}


def profile_fields(profile: dict | None, variant: str | None = None) -> dict:
    """Kernels per call and small-op share of the compiled network (``variant``: the one the compile
    stage chose; None: the plain folded graph) from a ``profile.json``, when ``torch2ms profile`` (or
    ``zoo --profile``) ran on the model."""
    v = ((profile or {}).get("variants") or {}).get(variant or "ms_graph_folded") or {}
    return {"kernels": v.get("kernels_per_call"), "small_op_share": v.get("small_op_share")}


def layout_fields(layout: dict | None) -> dict:
    """The ModelRow fields of a rebuild record's ``counts.layout``: nodes in module classes, all
    nodes and their share for the module layout; the reason when it fell back to the flat one
    (a recipe's own ``rebuild.layout: flat`` has neither)."""
    layout = layout or {}
    if layout.get("modules_failed"):
        return {"flat_reason": layout["modules_failed"]}
    inside, nodes = layout.get("nodes_in_modules"), layout.get("nodes")
    if inside is None or not nodes:
        return {}
    return {"nodes_in_modules": inside, "layout_nodes": nodes, "module_share": round(inside / nodes, 4)}


def layout_totals(rows: list[ModelRow]) -> dict:
    """The zoo-wide module share (nodes in module classes over all nodes of the models with a module
    layout) and the models that fell back to the flat layout, with their reasons."""
    inside = sum(r.nodes_in_modules for r in rows if r.layout_nodes)
    nodes = sum(r.layout_nodes for r in rows if r.layout_nodes)
    return {
        "module_share": round(inside / nodes, 4) if nodes else None,
        "nodes_in_modules": inside,
        "layout_nodes": nodes,
        "flat_fallbacks": {r.name: r.flat_reason for r in rows if r.flat_reason},
    }
