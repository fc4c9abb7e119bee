"""The peak breakdown: every byte of a compiled step at its peak, by kind and module, read from
XLA's buffer assignment (remat_common.measurement, PlanReport.breakdown)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import jax
import pytest

import remat_common
from remat_common.measurement import MemoryBreakdown, Report, measure

ACTIVATION_KINDS = ("saved residual", "offloaded residual", "temporary (forward)",
                    "temporary (backward)")

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import report_target  # noqa: E402
from versions import CSE_UNDOES_REMAT  # noqa: E402

#: Layer 2's MLP is 16x d_model wide, the others 4x: the fat module.
SIZE = {"batch": 64, "d_model": 32, "n_layers": 4, "wide": {2: 16}}
PLANS: dict[str, Any] = {
    "none": None,
    "save": {"layers.*": "save"},
    "recompute": {"layers.*": "recompute"},
    "hidden": {"layers.*": {"save": ["hidden"]}},
}


@pytest.fixture(scope="module")
def report() -> Report:
    return measure(lambda plan: report_target.measure_target(plan, **SIZE), PLANS, steps=0)


def _kind(b: MemoryBreakdown, kind: str) -> int:
    return sum(r.bytes for r in b.rows if r.kind == kind)


@pytest.mark.parametrize("name", list(PLANS))
def test_rows_sum_to_the_compiled_peak(report: Report, name: str) -> None:
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
        report_target.measure_target(None, **SIZE).loss_args[0]))
    assert _kind(b, "parameter") == params
    assert _kind(b, "input batch") == 4 * SIZE["batch"] * (SIZE["d_model"] + 1)
    assert {r.module for r in b.rows if r.kind == "parameter"} == {
        "", *(f"layers.{i}" for i in range(SIZE["n_layers"]))}  # '' is the root's head


@pytest.mark.parametrize("name", ["none", "save", "hidden"])
def test_the_fat_module_is_the_largest_activation_contributor(report: Report, name: str) -> None:
    b = report[name].breakdown
    assert b is not None
    by_module = b.by_module()
    assert next(iter(by_module)) == "layers.2", by_module
    assert by_module["layers.2"] > 2 * max(v for k, v in by_module.items() if k != "layers.2")


def _saved(b: MemoryBreakdown) -> int:
    return sum(r.bytes for r in b.saved)


def test_residual_rows_match_the_verified_residuals(report: Report) -> None:
    """What the compiled program keeps by name is what the verifier saw AD keep by name; for
    unnamed residuals XLA may keep less than the traced program (it fuses 1 - tanh(h)**2 into
    the backward pass instead of keeping it next to tanh(h)), never more."""
    hidden = report["hidden"]
    assert hidden.breakdown is not None
    named = sum(r.nbytes for r in hidden.residuals if r.kind == "named")
    rows = sum(r.bytes for r in hidden.breakdown.saved if r.name == "hidden")
    assert named > 0 and abs(rows - named) <= 0.01 * named, (rows, named)
    save, rec = report["save"], report["recompute"]
    assert save.breakdown is not None and rec.breakdown is not None
    assert 0 < _saved(rec.breakdown) <= _saved(hidden.breakdown) <= _saved(save.breakdown)
    if not CSE_UNDOES_REMAT:  # jax 0.11.0: XLA:CPU merges the recomputation back (versions.py)
        assert _saved(rec.breakdown) < _saved(hidden.breakdown)
    assert _saved(save.breakdown) <= save.device_bytes


def test_saved_residuals_carry_their_tags(report: Report) -> None:
    b = report["hidden"].breakdown
    assert b is not None
    named = {(r.module, r.name) for r in b.rows if r.kind == "saved residual" and r.name}
    assert ("layers.2", "hidden") in named


def test_the_breakdown_round_trips_through_json(report: Report, tmp_path: Path) -> None:
    path = report.save(tmp_path / "r.json")
    assert Report.load(path) == report
    import json
    rows = json.loads(path.read_text())["plans"][1]["peak_breakdown"]
    assert set(rows[0]) == {"kind", "module", "name", "bytes"}
    assert sum(r["bytes"] for r in rows) == report["save"].memory.device_total


@pytest.mark.parametrize(("op_name", "modules", "want"), [
    ("jit(step)/transpose(jvp(blocks.0))/while/body/eval_jaxpr/checkpoint/blocks.0/mul", None,
     "blocks.0"),
    ("jit(step)/jvp(layers.0)/jvp(layers.0.mlp)/dot_general", None, "layers.0.mlp"),
    ("jit(step)/jit(tree_bias_correction)/div", None, None),
    ("jit(step)/jvp(head)/dot_general", frozenset({"head"}), "head"),
    ("jit(step)/jvp(head)/dot_general", None, None),  # a bare word is a module only when known
    ("jit(step)/jvp(vmap())/while/body/eval_jaxpr/blocks.0/blocks.0.mlp/vmap(blocks.0.mlp.up)/"
     "eqx.nn.Linear/dot_general", None, "blocks.0.mlp.up"),  # not Equinox's own scope
])
def test_module_of_reads_the_name_stack(op_name: str, modules: frozenset[str] | None,
                                        want: str | None) -> None:
    from remat_common.internal import module_of

    assert module_of(op_name, modules) == want


def test_unscoped_values_name_their_source() -> None:
    """A step run outside any module scope (no adapter, no plan): its values say where in the
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


def test_report_prints_the_peak_table_and_plots_the_timeline(report: Report, tmp_path: Path
                                                               ) -> None:
    pytest.importorskip("matplotlib")
    from remat_common.measurement import plot_timeline, render_text

    text = render_text(report, width=200)
    assert "at the compiled peak, by kind and module" in text
    assert "layers.2" in text.split("at the compiled peak")[1]
    out = plot_timeline(report, tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    assert kinds["parameter"] == 2 * 512 * 1024 * 4
    assert kinds["optimizer state"] >= 2 * kinds["parameter"]  # mu and nu (and the count)
    fit = b.will_it_fit(b.total - 1)
    assert not fit.fits and fit.peak == b.total
    top = {k for k, _, _ in fit.largest}
    assert {"optimizer state", "parameter"} <= top and not top & set(ACTIVATION_KINDS), top
    assert "no remat plan frees them" in fit.advice and "donate_argnums" in fit.advice
    assert b.will_it_fit(b.total).fits
    # the optimizer state is placed at the parameter it belongs to
    assert {(r.module, r.name) for r in b.rows if r.kind == "optimizer state" and r.name
            and r.name.startswith("w1")} >= {("", "w1 (mu)"), ("", "w1 (nu)")}


def test_will_it_fit_points_at_the_fat_module(report: Report) -> None:
    b = report["save"].breakdown
    assert b is not None
    fit = b.will_it_fit(2**40)
    assert fit.fits and sum(v for _, v in fit.parts) == b.total
    assert "'layers.2'" in fit.advice


def test_the_html_timeline_is_self_contained_and_valid(report: Report, tmp_path: Path) -> None:
    """One file that opens from disk: no network address, no external script, style or image;
    the markup parses with balanced tags; the embedded data holds every plan's timeline with
    its peak; the script is valid JavaScript (where node is installed)."""
    import html.parser
    import json
    import re
    import shutil
    import subprocess

    from remat_common.measurement import write_html

    out = write_html(report, tmp_path / "t.html")
    text = out.read_text()
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/|\bsrc=|\bhref=|<link|@import", text)

    class Check(html.parser.HTMLParser):
        VOID = {"meta", "br", "img", "input", "link", "hr"}

        def __init__(self) -> None:
            super().__init__()
            self.stack: list[str] = []
            self.scripts: list[str] = []
            self.data: list[str] = []

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
    data = json.loads(check.scripts[0])
    assert [p["name"] for p in data["plans"]] == list(report.names)
    for p in data["plans"]:
        b = report[p["name"]].breakdown
        assert b is not None
        assert max(sum(col[i] for col in p["bytes"]) for i in range(len(p["x"]))) == p["max"]
        assert p["max"] == b.timeline.max_bytes and p["total"] == b.total
    node = shutil.which("node")
    if node:
        js = tmp_path / "t.js"
        js.write_text(check.scripts[1])
        subprocess.run([node, "--check", str(js)], check=True, capture_output=True)


GPT_SIZE = {"n_layers": 4, "d_model": 64, "n_heads": 2, "seq_len": 64, "batch": 8}
HIDDEN = {"blocks.*": {"save": ["mlp_hidden"]}}


@pytest.fixture(scope="module")
def gpts(standard_promotion: None) -> dict[tuple[str, str], Report]:
    """Both example GPTs, list and scanned layouts, under a plan that keeps each block's MLP
    hidden activation by name and recomputes the rest of the block (4 small compiles)."""
    for needed in ("flax", "equinox", "optax"):  # the example GPTs' targets
        pytest.importorskip(needed)
    from remat_common.internal import ReportConfig, run_report

    root = Path(__file__).parent.parent / "examples"
    out = {}
    for framework in ("nnx", "eqx"):
        for layout in ("list", "scan"):
            cfg = ReportConfig.load(root / f"{framework}_gpt" / "report.yaml").with_sizes(
                {**GPT_SIZE, "layout": layout})
            cfg = dataclasses.replace(cfg, plans=(("hidden", HIDDEN),))
            out[(framework, layout)] = run_report(cfg, steps=0, warmup=0)
    return out


@pytest.mark.tooling  # the examples' steps: runs in the jax 0.11.2 stage only
@pytest.mark.parametrize("framework", ["nnx", "eqx"])
def test_example_gpts_break_down_by_block(gpts: dict[tuple[str, str], Report], framework: str
                                          ) -> None:
    """Each example GPT, both layouts: the rows sum to the compiled peak; the activations at the
    peak are the blocks'; a block's MLP hidden activation kept by name is the same bytes per layer
    in the list layout and the scanned one."""
    per_layer = {}
    for layout in ("list", "scan"):
        rep = gpts[(framework, layout)]
        for p in rep.plans:
            b = p.breakdown
            assert b is not None and p.memory.device_total
            assert abs(b.total - p.memory.device_total) <= 0.01 * p.memory.device_total
            assert abs(b.timeline.max_bytes - b.total) <= 0.01 * b.total
            top = next(iter(b.by_module(depth=2)))
            assert top is not None and top.startswith("blocks."), b.by_module(depth=2)
        b = rep["hidden"].breakdown
        assert b is not None
        named: dict[str, int] = {}
        for r in b.saved:
            if r.name == "mlp_hidden":
                label, n = b.layer_of(r.module)
                named[label or ""] = named.get(label or "", 0) + r.bytes // n
        per_layer[layout] = named
    one = 4 * GPT_SIZE["batch"] * GPT_SIZE["seq_len"] * 4 * GPT_SIZE["d_model"]  # f32, 4x wide
    # list layers alike share one traced boundary (the adapters' default), whose values carry
    # the first layer's path, as a scan body's do: both are the group blocks.0-3
    assert per_layer["list"] == per_layer["scan"] == {"blocks.0-3.mlp": one}


def test_the_caveats_block_prints_only_what_applies(report: Report) -> None:
    """No plan offloads or is timed here, and every plan has a breakdown: the host, placement,
    step-time and CPU peak_memory caveats are left out; the residual and FLOP ones stay."""
    from remat_common.internal import notes_lines

    figures = {line.split(":")[0].strip() for line in notes_lines(report) if line.startswith("  ")}
    assert {"residuals", "flops"} <= figures
    assert not figures & {"host_*", "host_transfer_bytes", "placement", "step_time",
                          "peak_memory_in_bytes"}
