"""The peak breakdown: every byte of a compiled step at its peak, by kind and module, read from
XLA's buffer assignment (remat_common.measurement, PlanReport.breakdown).

The models are measured as users measure theirs: un-annotated (``none``) they open no scope of
their own; the measurement traces their module calls in named scopes of their paths."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from remat_common.measurement import MemoryBreakdown, Report, measure

ACTIVATION_KINDS = ("saved residual", "offloaded residual", "temporary (forward)",
                    "temporary (backward)")
#: Methods of the models' own classes: a value made in one of them has a module.
MODEL_CODE = ("FatMLP.", "Layer.", "GPT.", "Block.", "MLP.", "CausalSelfAttention.")

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from versions import CSE_UNDOES_REMAT  # noqa: E402

#: fixtures/fat_mlp.py: layer 2's hidden layer is 16x d_model wide (fat_mlp.FAT), the others 4x.
SIZE = {"batch": 64, "d_model": 32, "n_layers": 4}
FAT = "layers.2"
PLANS: dict[str, Any] = {
    "none": None,
    "save": {"layers.*": "save"},
    "recompute": {"layers.*": "recompute"},
    "hidden": {"layers.*": {"save": ["hidden"]}},
}

# Tooling: remat report's peak breakdown (the jax 0.11.2 stage only).
pytestmark = pytest.mark.tooling


@pytest.fixture(scope="module")
def fat(standard_promotion: None) -> Any:
    pytest.importorskip("flax")
    from fixtures import fat_mlp

    assert f"layers.{fat_mlp.FAT}" == FAT
    return fat_mlp


@pytest.fixture(scope="module")
def report(fat: Any) -> Report:
    return measure(lambda plan: fat.measure_target(plan, **SIZE), PLANS, steps=0)


def _kind(b: MemoryBreakdown, kind: str) -> int:
    return sum(r.bytes for r in b.rows if r.kind == kind)


def _cut(module: str | None) -> str:
    return "(no module)" if module is None else ".".join(module.split(".")[:2])


@pytest.mark.cpu_figures(
    "the breakdown of a model under 1 MiB: on a TPU v5e chip the arrays were tile-padded and "
    "the rows came to 5-8 % under XLA:TPU's heap peak; the breakdown is checked on XLA:CPU "
    "and for an H100 target, not yet for a TPU")
@pytest.mark.parametrize("name", list(PLANS))
def test_rows_sum_to_the_compiled_peak(report: Report, fat: Any, name: str) -> None:
    p = report[name]
    b = p.breakdown
    assert b is not None and b.compiler == jax.default_backend()
    peak = p.memory.device_total
    assert peak and abs(b.total - peak) <= 0.01 * peak
    assert sum(r["bytes"] for r in p.peak_breakdown) == b.total
    # the timeline's largest point is the compiled peak, less the temporary buffer's slack there
    assert abs(b.timeline.max_bytes - peak) <= 0.01 * peak
    assert b.timeline.total[b.timeline.peak] == b.timeline.max_bytes
    # the step's inputs: its parameters (the loss's first argument) and the batch, whole
    params = sum(x.nbytes for x in jax.tree_util.tree_leaves(
        fat.measure_target(None, **SIZE).loss_args[0]))
    # the parameters, whole; beside them XLA:CPU's copies of some (a donated buffer takes the
    # update while the old value is still read), each a whole parameter
    copies = [r.bytes for r in b.rows if r.kind == "parameter" and (r.name or "").endswith("(copy)")]
    assert _kind(b, "parameter") - sum(copies) == params
    assert all(c in {x.nbytes for x in jax.tree_util.tree_leaves(
        fat.measure_target(None, **SIZE).loss_args[0])} for c in copies), copies
    assert _kind(b, "input batch") == 4 * SIZE["batch"] * (SIZE["d_model"] + 1)
    assert {r.module for r in b.rows if r.kind == "parameter"} == {
        "head", *(f"layers.{i}.{lin}" for i in range(SIZE["n_layers"]) for lin in ("up", "down"))}
    # an activation without a module was made outside the model (the loss, the step's update)
    for r in b.rows:
        if r.kind in ACTIVATION_KINDS and r.module is None:
            assert r.note and not any(c in r.note for c in MODEL_CODE), r


@pytest.mark.parametrize("name", list(PLANS))
def test_the_fat_module_is_the_largest_activation_contributor(report: Report, name: str) -> None:
    b = report[name].breakdown
    assert b is not None
    by_module = b.by_module(depth=2)
    assert next(iter(by_module)) == FAT, by_module
    assert by_module[FAT] > 2 * max(v for k, v in by_module.items() if k != FAT)


@pytest.mark.parametrize("name", list(PLANS))
def test_the_timeline_by_module_sums_to_the_activations(report: Report, name: str) -> None:
    """At every point of the schedule the modules' series add up to the activation kinds; at
    the peak each series holds what the peak's rows say its module holds."""
    b = report[name].breakdown
    assert b is not None
    tl = b.timeline
    assert FAT in tl.modules and len(tl.module_bytes) == len(tl.modules)
    assert np.array_equal(np.sum(np.asarray(tl.module_bytes), axis=0), tl.activations())
    at_peak: dict[str, int] = {}
    for r in b.rows:
        if r.kind in ACTIVATION_KINDS:
            at_peak[_cut(r.module)] = at_peak.get(_cut(r.module), 0) + r.bytes
    assert {m: v[tl.peak] for m, v in zip(tl.modules, tl.module_bytes) if v[tl.peak]} == at_peak


def _saved(b: MemoryBreakdown) -> int:
    return sum(r.bytes for r in b.saved)


@pytest.mark.cpu_figures(
    "the breakdown of a model under 1 MiB: on a TPU v5e chip the arrays were tile-padded and "
    "the rows came to 5-8 % under XLA:TPU's heap peak; the breakdown is checked on XLA:CPU "
    "and for an H100 target, not yet for a TPU")
def test_residual_rows_match_the_verified_residuals(report: Report) -> None:
    """What the compiled program keeps by name is what the verifier saw AD keep by name, and
    save-all and recompute differ in the residual rows by what they differ in verified
    residuals (the layers square their hidden activation: XLA fuses nothing the traced program
    keeps into the backward pass)."""
    hidden = report["hidden"]
    assert hidden.breakdown is not None
    named = sum(r.nbytes for r in hidden.residuals if r.kind == "named")
    rows = sum(r.bytes for r in hidden.breakdown.saved if r.name == "hidden")
    assert named > 0 and abs(rows - named) <= 0.01 * named, (rows, named)
    save, rec = report["save"], report["recompute"]
    assert save.breakdown is not None and rec.breakdown is not None
    assert 0 < _saved(rec.breakdown) <= _saved(hidden.breakdown) <= _saved(save.breakdown)
    if CSE_UNDOES_REMAT:  # jax 0.11.0: XLA:CPU merges the recomputation back (versions.py)
        return
    assert _saved(rec.breakdown) < _saved(hidden.breakdown) < _saved(save.breakdown)
    verified = save.device_bytes - rec.device_bytes
    compiled = _saved(save.breakdown) - _saved(rec.breakdown)
    assert verified > 0 and abs(compiled - verified) <= 0.01 * verified, (compiled, verified)


def test_saved_residuals_carry_their_tags(report: Report) -> None:
    b = report["hidden"].breakdown
    assert b is not None
    named = {(r.module, r.name) for r in b.rows if r.kind == "saved residual" and r.name}
    assert (FAT, "hidden") in named


@pytest.mark.cpu_figures(
    "the breakdown of a model under 1 MiB: on a TPU v5e chip the arrays were tile-padded and "
    "the rows came to 5-8 % under XLA:TPU's heap peak; the breakdown is checked on XLA:CPU "
    "and for an H100 target, not yet for a TPU")
def test_per_layer_rows_read_save_all_from_the_report(report: Report) -> None:
    """Each plan's per-layer rows say what the same layers keep under the report's save-all
    plan (the un-annotated model): its own figures there."""
    assert report.save_all is report["none"]
    none = {r["module"]: r for r in report.per_layer("none")}
    assert none[FAT]["saved"] == none[FAT]["save_all"] > 0
    for name in ("recompute", "hidden"):
        rows = {r["module"]: r for r in report.per_layer(name)}
        assert rows[FAT]["save_all"] == none[FAT]["saved"] >= rows[FAT]["saved"] > 0
        assert rows[FAT]["layer_paths"] == [FAT] and rows[FAT]["layers"] == 1
        if not CSE_UNDOES_REMAT:  # jax 0.11.0: XLA:CPU merges the recomputation back
            assert rows[FAT]["saved"] < none[FAT]["saved"]
    without = dataclasses.replace(report, plans=(report["recompute"],))
    assert without.save_all is None and all(r["save_all"] is None
                                            for r in without.per_layer("recompute"))


def test_the_breakdown_round_trips_through_json(report: Report, tmp_path: Path) -> None:
    """The JSON holds every row of the peak, not the timeline; ``timeline=True`` (``remat report
    --timeline-json``) writes that too, and it reads back."""
    path = report.save(tmp_path / "r.json")
    assert Report.load(path) == report
    assert all(p.breakdown and p.breakdown.timeline is None for p in Report.load(path).plans)
    plans = {p["name"]: p for p in json.loads(path.read_text())["plans"]}
    rows = plans["save"]["breakdown"]["rows"]
    assert {"kind", "module", "name", "bytes"} <= set(rows[0]) <= {"kind", "module", "name",
                                                                   "bytes", "note"}
    assert [{k: r.get(k) for k in ("kind", "module", "name", "bytes")} for r in rows] == list(
        report["save"].peak_breakdown)
    assert sum(r["bytes"] for r in rows) == report["save"].memory.device_total
    assert plans["hidden"]["per_layer"] == report.per_layer("hidden")
    assert "timeline" not in plans["hidden"]["breakdown"]
    full = report.save(tmp_path / "t.json", timeline=True)
    again, hidden = Report.load(full)["hidden"], report["hidden"]
    assert again == hidden and again.breakdown and hidden.breakdown
    assert again.breakdown.timeline == hidden.breakdown.timeline
    plans = {p["name"]: p for p in json.loads(full.read_text())["plans"]}
    assert plans["hidden"]["breakdown"]["timeline"]["modules"][0] == FAT


@pytest.mark.parametrize(("op_name", "modules", "want"), [
    ("jit(step)/transpose(jvp(blocks.0))/while/body/eval_jaxpr/checkpoint/blocks.0/mul", None,
     "blocks.0"),
    ("jit(step)/jvp(layers.0)/jvp(layers.0.mlp)/dot_general", None, "layers.0.mlp"),
    ("jit(step)/jit(tree_bias_correction)/div", None, None),
    ("jit(step)/jvp(head)/dot_general", frozenset({"head"}), "head"),
    ("jit(step)/jvp(head)/dot_general", None, None),  # a bare word is a module only when known
    ("jit(step)/jvp(<root>)/add", None, ""),  # the root's own code
    ("jit(step)/jvp(<root>)/jvp(blocks.1)/add", None, "blocks.1"),
    ("jit(step)/jvp(vmap())/while/body/eval_jaxpr/blocks.0/blocks.0.mlp/vmap(blocks.0.mlp.up)/"
     "eqx.nn.Linear/dot_general", None, "blocks.0.mlp.up"),  # not Equinox's own scope
])
def test_module_of_reads_the_name_stack(op_name: str, modules: frozenset[str] | None,
                                        want: str | None) -> None:
    from remat_common.internal import module_of

    assert module_of(op_name, modules) == want


def test_unscoped_values_name_their_source() -> None:
    """A step run outside any module scope (plain JAX, no adapter): its values say where in the
    model's code they were made, from the HLO's stack frames."""
    from remat_common.measurement import MeasureTarget

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        h = jax.numpy.tanh(x @ w)  # the line the residual comes from
        return jax.numpy.sum((h @ w) ** 2)

    args = (jax.numpy.eye(64), jax.numpy.ones((256, 64)))
    step = lambda w, x: w - 0.1 * jax.grad(loss)(w, x)  # noqa: E731
    b = measure(MeasureTarget(loss, args, step, args), steps=0)["step"].breakdown
    assert b is not None
    rows = [r for r in b.rows if r.kind == "saved residual"]
    assert rows and all(r.module is None for r in rows)
    assert any(r.note and "<locals>.loss (test_breakdown.py:" in r.note for r in rows), rows


_RUN_TWICE = """\
import jax, jax.numpy as jnp
from jax._src import monitoring
from remat_common.measurement import MeasureTarget, measure

misses = []
monitoring.register_event_listener(
    lambda e, **k: misses.append(e) if e == "/jax/compilation_cache/cache_misses" else None)
loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
args = (jnp.eye(32), jnp.ones((16, 32)))
step = lambda w, x: w - 0.1 * jax.grad(loss)(w, x)
for _ in range(2):
    before = len(misses)
    b = measure(MeasureTarget(loss, args, step, args), steps=0)["step"].breakdown
    print(len(misses) - before, b.total)
"""


def test_a_report_run_again_compiles_nothing(tmp_path: Path) -> None:
    """With a persistent compilation cache, a step measured before is taken from the cache and
    its buffer assignment from beside it: no compile (XLA writes no dump for a cached program,
    which was compiled a second time for it before)."""
    import os
    import subprocess

    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    out = subprocess.run([sys.executable, "-c", _RUN_TWICE], env=env, capture_output=True,
                         text=True, check=True, timeout=300).stdout.split()
    first, second = (int(out[0]), int(out[1])), (int(out[2]), int(out[3]))
    assert first[0] >= 1 and second == (0, first[1]), out
    assert list((tmp_path / "remat-buffer-assignment").iterdir())


def test_report_prints_the_tables_and_plots_the_timelines(report: Report, tmp_path: Path
                                                          ) -> None:
    pytest.importorskip("matplotlib")
    from remat_common.measurement import plot_timeline, render_text

    text = render_text(report, width=240)
    peak = text.split("at the compiled peak")[1]
    assert FAT in peak and "kept if all saved (none)" in peak
    layers = text.split("activation residuals by module")[1].split("at the compiled peak")[0]
    # a module's input is its own: the squared hidden activation, read by layers.2.down
    assert f"{FAT}.down " in layers and f"{FAT} " in layers
    for by in ("kind", "module"):
        out = plot_timeline(report, tmp_path / f"t-{by}.png", by=by)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from remat_common.measurement import write_html

    for draw in (plot_timeline, write_html):
        with pytest.raises(ValueError, match="by must be one of .*'kind', 'module'.*Fix"):
            draw(report, tmp_path / "t.png", by="layer")
    without = dataclasses.replace(report, plans=(report["recompute"],))
    assert "Fix: measure the un-annotated model" in render_text(without, width=240)


@pytest.mark.cpu_figures(
    "the breakdown of a model under 1 MiB: on a TPU v5e chip the arrays were tile-padded and "
    "the rows came to 5-8 % under XLA:TPU's heap peak; the breakdown is checked on XLA:CPU "
    "and for an H100 target, not yet for a TPU")
def test_a_parameter_dominated_model_is_told_to_shard_not_to_remat(standard_promotion: None) -> None:
    """Wide weights, a tiny batch and Adam: the will-it-fit summary names parameters and
    optimizer state, not activations, and says no remat plan frees them."""
    optax = pytest.importorskip("optax")

    from remat_common.measurement import MeasureTarget

    tx = optax.adam(1e-3)
    params = {"w1": jax.numpy.ones((512, 1024)) / 512, "w2": jax.numpy.ones((1024, 512)) / 1024}
    x = jax.numpy.ones((2, 512))

    def loss(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jax.numpy.sum(jax.numpy.tanh(x @ p["w1"]) @ p["w2"])

    def step(p: dict[str, jax.Array], state: Any, x: jax.Array) -> Any:
        g = jax.grad(loss)(p, x)
        updates, state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), state

    state = tx.init(params)
    b = measure(MeasureTarget(loss, (params, x), step, (params, state, x)), steps=0)["step"].breakdown
    assert b is not None
    kinds = b.by_kind()
    copies = sum(r.bytes for r in b.rows if r.kind == "parameter" and (r.name or "").endswith("(copy)"))
    assert kinds["parameter"] - copies == 2 * 512 * 1024 * 4
    assert kinds["optimizer state"] >= 2 * (kinds["parameter"] - copies)  # mu and nu (and the count)
    fit = b.will_it_fit(b.total - 1)
    assert not fit.fits and fit.peak == b.total
    top = {k for k, _, _ in fit.largest}
    assert {"optimizer state", "parameter"} <= top and not top & set(ACTIVATION_KINDS), top
    # measured as a loop runs it, the state is donated already: no advice to donate it
    assert "no remat plan frees them" in fit.advice and "donate_argnums" not in fit.advice
    assert b.will_it_fit(b.total).fits
    # the optimizer state is placed at the parameter it belongs to
    assert {(r.module, r.name) for r in b.rows if r.kind == "optimizer state" and r.name
            and r.name.startswith("w1")} >= {("", "w1 (mu)"), ("", "w1 (nu)")}


@pytest.mark.cpu_figures(
    "the breakdown of a model under 1 MiB: on a TPU v5e chip the arrays were tile-padded and "
    "the rows came to 5-8 % under XLA:TPU's heap peak; the breakdown is checked on XLA:CPU "
    "and for an H100 target, not yet for a TPU")
@pytest.mark.parametrize("name", ["none", "save"])
def test_will_it_fit_points_at_the_fat_module(report: Report, name: str) -> None:
    b = report[name].breakdown
    assert b is not None
    fit = b.will_it_fit(2**40)
    assert fit.fits and sum(v for _, v in fit.parts) == b.total
    assert f"'{FAT}'" in fit.advice and '"layers.*": recompute' in fit.advice
    assert next(k[:2] for k in fit.largest if k[0] in ACTIVATION_KINDS) == ("saved residual", FAT)


def _html_parts(text: str) -> tuple[list[str], dict[str, Any]]:
    """The scripts of an HTML file, checked for balanced tags, and its embedded data."""
    import html.parser

    class Check(html.parser.HTMLParser):
        VOID = {"meta", "br", "img", "input", "link", "hr"}

        def __init__(self) -> None:
            super().__init__()
            self.stack: list[str] = []
            self.scripts: list[str] = []

        def handle_starttag(self, tag: str, attrs: Any) -> None:
            if tag not in self.VOID:
                self.stack.append(tag)

        def handle_endtag(self, tag: str) -> None:
            assert self.stack and self.stack.pop() == tag, (tag, self.stack)

        def handle_data(self, data: str) -> None:
            if self.stack and self.stack[-1] == "script":
                self.scripts.append(data)

    check = Check()
    check.feed(text)
    check.close()
    assert check.stack == [] and len(check.scripts) == 2
    return check.scripts, json.loads(check.scripts[0])


def check_html(path: Path, report: Report, tmp_path: Path) -> dict[str, Any]:
    """One file that opens from disk: no network address, no external script, style or image;
    the markup parses with balanced tags; the embedded data holds every plan's timelines with
    their peaks and module series; the script is valid JavaScript (where node is installed)."""
    import re
    import shutil
    import subprocess

    text = path.read_text()
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/|\bsrc=|\bhref=|<link|@import", text)
    scripts, data = _html_parts(text)
    assert [p["name"] for p in data["plans"]] == [p.name for p in report.plans if p.breakdown]
    for p in data["plans"]:
        b = report[p["name"]].breakdown
        assert b is not None
        for space, tl in (("device", b.timeline), ("host", b.host_timeline)):
            t = p[space]
            if tl is None:
                assert t is None
                continue
            assert max(sum(col[i] for col in t["bytes"]) for i in range(len(t["x"]))) == t["max"]
            assert t["max"] == tl.max_bytes and len(t["module_bytes"]) == len(tl.modules)
            act = [i for i, k in enumerate(t["kinds"]) if k in ACTIVATION_KINDS]
            for i in range(len(t["x"])):  # what the hover lists: the modules' share of it
                assert sum(col[i] for col in t["module_bytes"]) == sum(t["bytes"][k][i] for k in act)
    node = shutil.which("node")
    if node:
        js = tmp_path / "t.js"
        js.write_text(scripts[1])
        subprocess.run([node, "--check", str(js)], check=True, capture_output=True)
    return data


def test_the_html_timeline_is_self_contained_and_valid(report: Report, tmp_path: Path) -> None:
    from remat_common.measurement import write_html

    data = check_html(write_html(report, tmp_path / "t.html", by="module"), report, tmp_path)
    assert data["by"] == "module" and FAT in data["plans"][0]["device"]["modules"]
    assert all(p["host"] is None for p in data["plans"])  # XLA:CPU places nothing on host


def test_host_memory_is_printed_plotted_and_in_the_html(tmp_path: Path) -> None:
    """A report compiled for a GPU target (tests/data/target_offload_report.json, written by
    tests/test_targets.py::test_the_breakdown_on_a_gpu_target): the offload plan's host memory
    at its peak is its own rows in the peak table, summing to the host memory the compiler
    reports, a row of timelines under the device's, and its own plot in the HTML file."""
    pytest.importorskip("matplotlib")
    from remat_common.measurement import plot_timeline, render_text, write_html
    from remat_common.internal import peak_rows

    report = Report.load(DATA / "target_offload_report.json")
    off = report["offload"]
    b = off.breakdown
    assert b is not None and b.compiler == "cuda" and b.host_timeline is not None
    host = sum(r.bytes for r in b.host_rows)
    assert host == off.memory.host_temp_size_in_bytes == b.host_timeline.max_bytes > 0
    assert {(r.kind, r.module, r.name) for r in b.host_rows} == {("offloaded residual", "mlp", "h")}
    rows = peak_rows(report, host=True)
    assert rows == [("offloaded residual", "mlp", {"offload": host})]
    text = render_text(report, width=240)
    assert "host: offloaded residual" in text and "host peak" in text
    import matplotlib.image

    png = plot_timeline(report, tmp_path / "t.png")
    one = plot_timeline(dataclasses.replace(report, plans=(report["none"],)), tmp_path / "n.png")
    assert matplotlib.image.imread(png).shape[0] > matplotlib.image.imread(one).shape[0]  # 2 rows
    data = check_html(write_html(report, tmp_path / "t.html"), report, tmp_path)
    assert [p["host"] is not None for p in data["plans"]] == [False, False, True]
    assert 'id="plot-2-host"' in (tmp_path / "t.html").read_text()


GPT_SIZE = {"n_layers": 4, "d_model": 32, "n_heads": 2, "seq_len": 32, "batch": 4}
HIDDEN = {"blocks.*": {"save": ["mlp_hidden"]}}


@pytest.fixture(scope="module")
def gpts(standard_promotion: None) -> dict[tuple[str, str], Report]:
    """Both example GPTs, list and scanned layouts, un-annotated and under a plan that keeps each
    block's MLP hidden activation by name and recomputes the rest of the block (8 small
    compiles)."""
    for needed in ("flax", "equinox", "optax"):  # the example GPTs' targets
        pytest.importorskip(needed)
    from remat_common.internal import ReportConfig, run_report

    root = Path(__file__).parent.parent / "examples"
    out = {}
    for framework in ("nnx", "eqx"):
        for layout in ("list", "scan"):
            cfg = ReportConfig.load(root / f"{framework}_gpt" / "report.yaml").with_sizes(
                {**GPT_SIZE, "layout": layout})
            cfg = dataclasses.replace(cfg, plans=(("none", None), ("hidden", HIDDEN)))
            out[(framework, layout)] = run_report(cfg, steps=0, warmup=0)
    return out


@pytest.mark.parametrize("framework", ["nnx", "eqx"])
def test_example_gpts_break_down_by_block(gpts: dict[tuple[str, str], Report], framework: str
                                          ) -> None:
    """Each example GPT, both layouts: the rows sum to the compiled peak; the activations at the
    peak are the blocks'; un-annotated, everything the model's code made has its module, in the
    breakdown and in the verified residuals, and will-it-fit names the blocks."""
    for layout in ("list", "scan"):
        rep = gpts[(framework, layout)]
        for p in rep.plans:
            b = p.breakdown
            assert b is not None and p.memory.device_total
            assert abs(b.total - p.memory.device_total) <= 0.01 * p.memory.device_total
            assert abs(b.timeline.max_bytes - b.total) <= 0.02 * b.total
            assert np.array_equal(np.sum(np.asarray(b.timeline.module_bytes), axis=0),
                                  b.timeline.activations())
            top = next(iter(b.by_module(depth=2)))
            assert top is not None and top.startswith("blocks."), b.by_module(depth=2)
        none = rep["none"]
        assert none.breakdown is not None
        for r in none.breakdown.rows:
            if r.kind in ACTIVATION_KINDS and r.module is None:
                assert r.note and not any(c in r.note for c in MODEL_CODE), r
        for r in none.residuals:  # the verifier's view: module from the scope it was traced in
            if r.kind != "argument" and r.path is None and r.module is None:
                assert not any(c in r.source for c in MODEL_CODE), r
        modules = {r.module for r in none.residuals if r.kind != "argument"}
        assert {"embed", "norm", "head"} & modules and any(
            m and m.startswith("blocks.0.") for m in modules), modules
        fit = none.breakdown.will_it_fit(2**40)
        assert "'blocks." in fit.advice and '"blocks.*": recompute' in fit.advice


@pytest.mark.parametrize("framework", ["nnx", "eqx"])
def test_scanned_and_list_layouts_keep_the_same_per_layer(
        gpts: dict[tuple[str, str], Report], framework: str) -> None:
    """What each layer keeps (every residual, not one named tensor) is the same in the list
    layout, whose layers share one traced boundary, and the scanned one (within 1 %: the scan
    keeps its loop-invariant causal mask once); the MLP hidden activation kept by name too."""
    kept: dict[str, dict[str | None, float]] = {}
    named: dict[str, dict[str, int]] = {}
    for layout in ("list", "scan"):
        b = gpts[(framework, layout)]["hidden"].breakdown
        assert b is not None
        kept[layout] = b.kept_by_layer()
        named[layout] = {}
        for r in b.saved:
            if r.name == "mlp_hidden":
                label, n = b.layer_of(r.module)
                named[layout][label or ""] = named[layout].get(label or "", 0) + r.bytes // n
    b, t, d = GPT_SIZE["batch"], GPT_SIZE["seq_len"], GPT_SIZE["d_model"]
    assert named["list"] == named["scan"] == {"blocks.0-3.mlp": 4 * b * t * 4 * d}  # f32, 4x wide
    for layer in (f"blocks.{i}" for i in range(GPT_SIZE["n_layers"])):
        a, s = kept["list"][layer], kept["scan"][layer]
        if CSE_UNDOES_REMAT:  # jax 0.11.0: the list layers' recomputation merged back keeps more
            assert a >= s > 0, (layer, a, s)
        else:
            assert a > 0 and abs(a - s) <= 0.01 * a, (layer, a, s)


def test_the_caveats_block_prints_only_what_applies(report: Report) -> None:
    """No plan offloads or is timed here, and every plan has a breakdown: the host, placement,
    step-time and CPU peak_memory caveats are left out; the residual and FLOP ones stay."""
    from remat_common.internal import notes_lines

    figures = {line.split(":")[0].strip() for line in notes_lines(report) if line.startswith("  ")}
    assert {"residuals", "flops"} <= figures
    assert not figures & {"host_*", "host_transfer_bytes", "placement", "step_time",
                          "peak_memory_in_bytes"}
