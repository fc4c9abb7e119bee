"""The peak breakdown: every byte of a compiled step at its peak, by kind and module, read from
XLA's buffer assignment (remat_common.measurement, PlanReport.breakdown)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import pytest

import remat_common
from remat_common.measurement import MemoryBreakdown, Report, measure

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import report_target  # noqa: E402

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
    assert 0 < _saved(rec.breakdown) < _saved(hidden.breakdown) <= _saved(save.breakdown)
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
])
def test_module_of_reads_the_name_stack(op_name: str, modules: frozenset[str] | None,
                                        want: str | None) -> None:
    from remat_common._tooling._breakdown import module_of

    assert module_of(op_name, modules) == want
