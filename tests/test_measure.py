"""remat_common.measurement.measure: residual bytes, compiled FLOPs, host placement, timing, JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import remat_common
from remat_common import Plan, RematError
from remat_common.measurement import (
    MeasureEvent,
    MeasureTarget,
    PlacementCheck,
    Report,
    measure,
    render_text,
)

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import report_target  # noqa: E402
from packaging.version import Version
from fixtures.tolerance import assert_close

SIZE = {"batch": 32, "d_model": 32, "n_layers": 3}
PLANS: dict[str, Any] = {
    "none": None,
    "recompute": DATA / "plans" / "recompute.yaml",
    "hidden": {"layers.*": {"save": ["hidden"]}},
    "offload": DATA / "plans" / "offload.yaml",
}
STEPS = 3
#: jax 0.11.0's XLA:CPU merges recomputation back (docs/jax_behaviour.md, "CSE").
CSE_UNDOES_REMAT = (jax.default_backend() == "cpu"
                    and remat_common.capabilities().jax_version < Version("0.11.1"))

# Tooling: the measurement behind remat report (the jax 0.11.2 stage only).
pytestmark = pytest.mark.tooling


def build(plan: Plan | None) -> MeasureTarget:
    return report_target.measure_target(plan, **SIZE)


@pytest.fixture(scope="module")
def events() -> list[MeasureEvent]:
    return []


@pytest.fixture(scope="module")
def report(events: list[MeasureEvent]) -> Report:
    return measure(build, PLANS, steps=STEPS, warmup=1, progress=events.append)


def _pullback_leaves(plan: Any) -> list[jax.Array]:
    """An independent count: the residual arrays jax.vjp's pullback really holds."""
    t = build(None if plan is None else Plan.coerce(plan))
    _, pullback = jax.vjp(t.loss_fn, *t.loss_args)
    return jax.tree.leaves(pullback)


@pytest.mark.parametrize("name", list(PLANS))
def test_residual_bytes_agree_with_the_pullback(report: Report, name: str) -> None:
    p = report[name]
    leaves = _pullback_leaves(PLANS[name])
    assert p.device_bytes + p.host_bytes + p.argument_bytes == sum(x.nbytes for x in leaves)
    assert sorted(r.shape for r in p.residuals) == sorted(x.shape for x in leaves)


def test_residuals_by_module_name_and_placement(report: Report) -> None:
    b, d, h, n = SIZE["batch"], SIZE["d_model"], 4 * SIZE["d_model"], SIZE["n_layers"]
    layers = [f"layers.{i}" for i in range(n)]
    # 'hidden': exactly one [batch, hidden] float32 tag kept on device per layer.
    hidden = report["hidden"]
    named = [r for r in hidden.residuals if r.kind == "named"]
    assert sorted(r.name for r in named) == [f"{p}/hidden" for p in layers]
    assert all(r.shape == (b, h) and r.placement == "device" for r in named)
    assert {k: v for k, v in hidden.bytes_by_path("device").items() if k != "<other>"} == {
        p: b * h * 4 for p in layers}
    # 'offload': every layer input goes to host, nothing named stays on device.
    off = report["offload"]
    host = off.bytes_by_path("host")
    assert host == {p: b * d * 4 for p in layers}
    assert off.host_bytes == n * b * d * 4
    assert off.host_transfer_bytes == 2 * off.host_bytes
    assert {r.name for r in off.residuals if r.placement == "host"} == {
        f"{p}/__input__" for p in layers}
    # 'recompute' keeps less than 'hidden', which keeps less than no remat at all.
    assert report["recompute"].device_bytes < hidden.device_bytes < report["none"].device_bytes
    assert report["none"].host_bytes == report["recompute"].host_bytes == 0
    for name in ("recompute", "hidden", "offload"):
        assert report[name].problems == ()
        assert len(report[name].boundaries) == n


def test_flop_ratio_of_full_recompute_is_in_the_expected_band(report: Report) -> None:
    # Per layer the step does 2 forward matmuls and 4 backward ones (3 for the first layer: the
    # input gets no gradient). Recomputing a layer re-runs x @ w1 only (tanh(h) @ w2 is not
    # needed by the backward pass), so the ratio is (7n - 1) / (6n - 1) up to elementwise work.
    n = SIZE["n_layers"]
    expected = (7 * n - 1) / (6 * n - 1)
    assert report["none"].flop_ratio == 1.0
    if CSE_UNDOES_REMAT:  # jax 0.11.0 on CPU: the compiler merges every recomputation back ...
        assert 1.0 <= report["hidden"].flop_ratio < 1.02  # only the tanh's recomputation survives
        for name in ("recompute", "offload"):
            assert report[name].flop_ratio == 1.0
            assert any("XLA's CSE" in note and "xla_disable_hlo_passes=cse" in note
                       for note in report[name].notes), (name, report[name].notes)  # ... and we say so
        return
    assert not any("CSE" in note for p in report.plans for note in p.notes)
    assert report["recompute"].flop_ratio == pytest.approx(expected, abs=0.02)
    # Saving 'hidden' leaves only the tanh to recompute; offloading recomputes what 'recompute' does.
    assert 1.0 < report["hidden"].flop_ratio < 1.02
    assert report["offload"].flops == pytest.approx(report["recompute"].flops, rel=1e-6)


def test_cse_detection_rule() -> None:
    from remat_common.internal import cse_undid_remat

    assert cse_undid_remat(100.0, 100.0, True, False)
    assert not cse_undid_remat(101.0, 100.0, True, False)  # remat visible
    assert not cse_undid_remat(100.0, 100.0, False, False)  # nothing recomputed: equal is right
    assert not cse_undid_remat(100.0, 100.0, True, True)  # the baseline recomputes too
    assert not cse_undid_remat(None, 100.0, True, False)  # unknown FLOPs: no claim


def test_offloads_are_placed_on_host_in_the_program_lowered_for_cuda(report: Report) -> None:
    n = SIZE["n_layers"]
    check = report["offload"].placement
    assert check is not None and check.platform == "cuda" and check.error is None
    assert (check.to_host, check.to_device, check.offloaded) == (n, n, n)
    assert dict(check.placements) == {"pinned_host": n, "device": n}
    assert check.placed is True
    # one device, no loop: the bytes placed on host are the verifier's host residuals, unresharded
    assert check.resharded == 0 and check.host_bytes_per_device == report["offload"].host_bytes > 0
    assert report["recompute"].placement is None  # not checked by default: nothing offloaded


def test_a_placement_that_reshards_is_not_placed_and_is_reported(report: Report) -> None:
    check = report["offload"].placement
    assert check is not None and check.placed is True
    lost = dataclasses.replace(check, resharded=1)  # what the check records for a lost sharding
    assert lost.placed is False and PlacementCheck.from_json(lost.to_json()) == lost
    bad = dataclasses.replace(report, plans=tuple(
        dataclasses.replace(p, placement=lost) if p.name == "offload" else p for p in report.plans))
    text = render_text(bad)
    assert "offload: 1 host placement(s) change the sharding" in text


def test_placement_check_of_a_plan_without_offloads() -> None:
    rep = measure(build, {"recompute": PLANS["recompute"]}, steps=0, placement=True)
    check = rep["recompute"].placement
    assert check is not None and check.placements == () and check.placed is True


def test_memory_figures_and_backend_notes(report: Report) -> None:
    caps = report.capabilities
    assert caps.backend == jax.default_backend()
    notes = {f.figure: f for f in report.figures}
    for p in report.plans:
        m = p.memory
        assert m.argument_size_in_bytes is not None and m.argument_size_in_bytes > 0
        assert m.output_size_in_bytes is not None and m.output_size_in_bytes > 0
        assert m.device_total is not None and m.device_total >= m.argument_size_in_bytes
    if caps.backend == "cpu":
        assert notes["host_*"].meaningful is False
        assert "no-op" in notes["host_*"].note
        assert report["offload"].memory.host_temp_size_in_bytes == 0
    assert notes["residuals"].meaningful is True


def test_step_timing_is_separated_from_compilation(report: Report) -> None:
    for p in report.plans:
        t = p.timing
        assert len(t.steps) == STEPS and t.warmup == 1
        assert all(s > 0 for s in t.steps)
        assert t.median_s == float(np.median(t.steps))
        assert t.lower_s > 0 and t.compile_s > 0
        base = report[report.baseline].timing.median_s
        assert p.step_time_ratio == pytest.approx(t.median_s / base)
    assert report.baseline == "none" and report["none"].step_time_ratio == 1.0


def test_progress_events(report: Report, events: list[MeasureEvent]) -> None:
    total = 4 * len(PLANS) + STEPS + 1
    index = [e.index for e in events]
    if jax.default_backend() == "cpu":  # the timed rounds take turns over the plans
        assert index == list(range(total + 1))
    else:  # on a device each plan's rounds run together: an event per plan, then all the rounds
        assert index[:4 * len(PLANS)] == list(range(4 * len(PLANS))), index
        assert index == sorted(index) and index[-1] == total, index
        assert [e.plan for e in events if e.stage == "time"] == list(PLANS)
    assert all(e.total == total for e in events)
    assert [e.stage for e in events[:4]] == ["build", "compile", "residuals", "placement"]
    assert [e.plan for e in events[:4 * len(PLANS):4]] == list(PLANS)
    assert events[-1].stage == "done"


def test_json_round_trip(report: Report, tmp_path: Path) -> None:
    data = json.loads(json.dumps(report.to_json()))
    assert Report.from_json(data) == report
    assert data["plans"][3]["host_transfer_bytes"] == report["offload"].host_transfer_bytes
    assert Report.load(report.save(tmp_path / "r.json")) == report


def test_plans_agree_on_the_step_they_measure() -> None:
    """The test target itself: every plan gives the un-annotated gradients (float32)."""
    ref = build(None)
    want = jax.jit(ref.step_fn)(*ref.step_args)
    for plan in list(PLANS.values())[1:]:
        t = build(Plan.coerce(plan))
        got = jax.jit(t.step_fn)(*t.step_args)
        assert_close(got, want)


def test_problems_are_reported_not_raised() -> None:
    rep = measure(build, {"typo": {"layers.*": {"save": ["hiden"]}}}, steps=0)
    p = rep["typo"]
    assert len(p.problems) == SIZE["n_layers"]
    assert "'hiden'" in p.problems[0] and "no checkpoint_name tag" in p.problems[0]
    assert rep.problems[0].startswith("typo: module 'layers.0'")


def test_targets_given_as_a_mapping_and_baseline() -> None:
    targets = {"a": build(Plan.coerce(PLANS["recompute"])), "b": build(None)}
    rep = measure(targets, steps=0, baseline="b")
    assert rep.names == ("a", "b") and rep.baseline == "b"
    assert rep["a"].timing.steps == () and rep["a"].step_time_ratio is None
    if CSE_UNDOES_REMAT:  # the compiler undid the remat, and the report says so
        assert rep["a"].flop_ratio == 1.0 and len(rep["a"].notes) == 1 and "CSE" in rep["a"].notes[0]
        return
    assert rep["a"].flop_ratio is not None and rep["a"].flop_ratio > 1.1
    assert rep["a"].notes == ()


@pytest.mark.parametrize("call, match", [
    (lambda: measure(build, {"none": None}, baseline="x"), "baseline 'x' is not a plan"),
    (lambda: measure(build), "needs a non-empty mapping plans"),
    (lambda: measure({"a": 1}), "target 'a' is a int, not a MeasureTarget"),
    (lambda: measure(build(None), {"x": None}), "one MeasureTarget and plans"),
    (lambda: measure(lambda plan: 3, {"x": None}), "returned a int for plan 'x'"),
    (lambda: measure(build, {"x": None}, steps=-1), "steps must be an integer >= 0, got int -1"),
])
def test_bad_inputs(call: Any, match: str) -> None:
    with pytest.raises(RematError, match=match):
        call()


def test_public_names() -> None:
    for name in ("measure", "Report", "PlanReport", "MemoryFigures", "PlacementCheck",
                 "StepTiming", "FigureNote", "MeasureEvent", "MeasureTarget"):
        assert name in remat_common.measurement.__all__
    for ns in (remat_common, remat_common.measurement, remat_common.rules, remat_common.lint,
               remat_common.adapter, remat_common.internal):
        assert ns.__all__ == sorted(ns.__all__)
        assert all(hasattr(ns, n) for n in ns.__all__)


def test_offloads_under_vmap_are_named_after_their_per_example_tag() -> None:
    """A per-example model (jax.vmap over the batch) tags [16] values; the residual is [4, 16]."""
    import jax.numpy as jnp

    from remat_common import checkpoint_name, compile_plan, resolve
    from remat_common.adapter import call_module

    plan = compile_plan(resolve(Plan.from_mapping({"mlp": {"offload": ["h"]}}), ["mlp"]))

    def mlp(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(checkpoint_name(x @ w, "h")) ** 2)

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        per_example = jax.vmap(lambda xi: call_module(plan, "mlp", mlp, w, xi))
        return jnp.sum(per_example(x))

    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        return w - 0.1 * jax.grad(loss)(w, x)

    args = (jnp.ones((8, 16)) / 8, jnp.ones((4, 8)))
    rep = measure(MeasureTarget(loss, args, step, args, plan), steps=0)
    p = rep["step"]
    assert [(r.name, r.shape) for r in p.residuals if r.placement == "host"] == [("mlp/h", (4, 16))]
    assert p.bytes_by_path("host") == {"mlp": 4 * 16 * 4}
    assert p.placement is not None and p.placement.placed


def test_compiler_options_reach_every_compile() -> None:
    """``compiler_options`` go to XLA with each compile: XLA's CSE off makes the recomputation
    show in the FLOPs on every version (jax 0.11.0's CPU merges it back otherwise), and an option
    XLA does not know is refused by XLA, by name. A value that is not a mapping of option names is
    refused before anything is built, by ``measure`` and ``tune`` alike, with the fix."""
    plans = {"none": None, "recompute": PLANS["recompute"]}
    rep = measure(build, plans, steps=0, compiler_options={"xla_disable_hlo_passes": "cse"})
    assert rep["recompute"].flop_ratio is not None and rep["recompute"].flop_ratio > 1.1
    with pytest.raises(Exception, match="xla_no_such_option"):
        measure(build, plans, steps=0, compiler_options={"xla_no_such_option": True})
    fix = r"Fix: e\.g\. compiler_options=\{'xla_disable_hlo_passes': 'cse'\}\.$"
    for call, fn in ((measure, "remat_common.measurement.measure"), (remat_common.tune,
                                                                     "remat_common.tune")):
        args = (build, plans) if call is measure else (build, "1GiB")
        with pytest.raises(RematError, match=rf"^{fn}: compiler_options must be a mapping of XLA "
                                             rf"option names to values .* got list \['cse'\]\. {fix}"):
            call(*args, compiler_options=["cse"])


def test_device_arrays_held_by_reference_cycles_are_released_on_an_accelerator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose objects refer to each other (a Flax NNX graph) keeps its arrays until the
    cycle collector runs: ``release_device_memory`` runs it where the backend is an accelerator
    (measured on a TPU v5e: a capacity search's builds held 7.4 GiB), and leaves a CPU alone."""
    import gc

    from remat_common.internal import release_device_memory

    class Node:
        pass

    def held() -> int:
        a, b = Node(), Node()
        a.other, b.other, a.weights = b, a, jax.numpy.ones((123, 7))
        return id(a.weights)

    gc.disable()  # no collection but the one asked for
    try:
        kept = held()
        release_device_memory()  # the CPU: nothing collected
        assert kept in {id(x) for x in jax.live_arrays()}
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
        release_device_memory()
        assert kept not in {id(x) for x in jax.live_arrays()}
    finally:
        gc.enable()
