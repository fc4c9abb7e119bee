"""The Equinox transformer under every annotation, remat3 off and on, as a list and as a scan.

Gradients equal the un-annotated model's; the residuals AD keeps are what the plan says
(``remat_common.verify`` in strict mode, for the scanned stack too, with the same bytes on device and
on host as the list under the same plan).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import equinox_remat_plugin as er
import remat_common as rc

from fixtures.jaxprs import count_scans
from fixtures import eqx_models as em
from fixtures.tolerance import assert_close
from versions import SHOW_REMAT, TEMP_TRACKS_RESIDUALS, temp_is_flagged

D = em.SMALL
L = D.layers
ACT = D.tokens * D.dim * 4        # one [batch, seq, dim] float32 activation
HID = D.tokens * D.hidden * 4     # one [batch, seq, hidden] float32 activation
OUT = D.tokens * D.d_in * 4       # the loss's own residual, 2 * (y - x)

# case -> (plan, named on device, named on host); names are per block, {i} the block index.
CASES = {
    "inherit": ({"blocks.*": "inherit"}, {"blocks.{i}.attn/attn_out"}, set()),
    "save": ({"blocks.*": "save"}, {"blocks.{i}.attn/attn_out"}, set()),
    "recompute": ({"blocks.*": "recompute"}, set(), set()),
    "offload": ({"blocks.*": "offload"}, set(), {"blocks.{i}/__input__"}),
    "dots": ({"blocks.*": "dots"}, set(), set()),
    "dots_no_batch": ({"blocks.*": "dots_no_batch"}, set(), set()),
    "offload_dots_no_batch": ({"blocks.*": "offload_dots_no_batch"}, set(), set()),
    "names": ({"blocks.*": {"save": ["attn_out"]}}, {"blocks.{i}.attn/attn_out"}, set()),
    "names_offload": ({"blocks.*": {"save": ["attn_out"], "offload": ["hidden"]}},
                      {"blocks.{i}.attn/attn_out"}, {"blocks.{i}.mlp/hidden"}),
    # the MLP's own rules (eqx_models.MLP_RULES) keep its activation in its 'custom' boundary,
    # and recompute it inside an enclosing 'recompute' boundary
    # (attention is not named by the plan: it is left as it is, so its tag is not qualified)
    "custom": ({"blocks.*.mlp": "custom"}, {"attn_out", "blocks.{i}.mlp/__rule__"}, set()),
    "custom_in_recompute": ({"blocks.*": "recompute", "blocks.*.mlp": "custom"}, set(), set()),
}


def _per_block(names: set[str]) -> set[str]:
    return {n.format(i=i) for n in names for i in range(L)}


def _close(a, b):
    la, lb = jax.tree_util.tree_leaves(eqx.filter(a, eqx.is_array)), jax.tree_util.tree_leaves(
        eqx.filter(b, eqx.is_array))
    assert len(la) == len(lb) and la
    for u, v in zip(la, lb, strict=True):
        assert_close(u, v)


def _device_bytes(report: rc.ResidualReport) -> int:
    """Device residual bytes, less scalar literals (a Python loop keeps a few, a scan none)."""
    return sum(r.nbytes for r in report.select(placement="device") if r.shape != ())


# Gradients are computed eagerly here: op by op the same remat transformation runs (policies
# decide what linearize keeps), and primitives compile once per shape instead of once per plan.
# test_keys_and_value_and_grad and test_filter_jit_traces_once cover filter_jit.
_grad = eqx.filter_grad(em.loss)


@pytest.fixture(scope="module")
def data():
    plain = em.transformer()
    stacked = em.transformer(stacked=True)
    x = em.inputs()
    return plain, stacked, x, _grad(plain, x), _grad(stacked, x)


def test_stacked_is_the_list(data):
    """The scanned variant holds the same parameters and computes the same gradients."""
    plain, stacked, x, g_list, g_stack = data
    assert_close(em.loss(stacked, x), em.loss(plain, x))
    restacked = em.stack(list(g_list.blocks))
    _close(g_stack.blocks, restacked)


@pytest.mark.parametrize("case", list(CASES))
def test_list(case, remat3, data):
    plain, _, x, g0, _ = data
    plan, dev, host = CASES[case]
    # names per block (the default shares blocks.0's: tests/test_adapter_trace_sharing.py)
    model = er.annotate(plain, plan, share_alike_layers=False)
    check = rc.verify(em.loss, model, x, plan=er.plan_of(model))  # strict: raises on a mismatch
    assert check.report.names("device") == _per_block(dev)
    assert check.report.names("host") == _per_block(host)
    _close(er.unwrap(_grad(model, x)), g0)
    _check_bytes(case, check.report)


def test_custom_rules_path(remat3, data):
    """'custom' runs the module's __remat_custom__ rules: jax.custom_remat where it really runs
    (remat3 on, jax 0.11.x), the core's portable path otherwise; the forward rule sees the plan."""
    plain, _, x, _, _ = data
    model = er.annotate(plain, CASES["custom"][0])
    with rc.rules.collect_rule_runs() as runs:
        eqx.filter_grad(em.loss)(model, x)
    fwd = [r for r in runs if r.forward_ran]
    assert sorted(r.path for r in fwd) == [f"blocks.{i}.mlp" for i in range(L)]
    assert {r.impl for r in fwd} == {rc.rules.custom_path()}
    assert all(r.ambient.location("act") == "device" for r in fwd)


def _check_bytes(case: str, report: rc.ResidualReport) -> None:
    dev, host = _device_bytes(report), report.nbytes("host")
    inputs = (L + 1) * ACT + OUT  # block inputs, the head's input, the loss's residual
    if case == "recompute":
        assert (dev, host) == (inputs, 0)
    elif case == "offload":
        assert (dev, host) == (inputs - L * ACT, L * ACT)
    elif case == "names":
        assert (dev, host) == (inputs + L * ACT, 0)
    elif case == "names_offload":
        assert (dev, host) == (inputs + L * ACT, L * HID)
    elif case in ("dots", "dots_no_batch"):
        assert inputs < dev and host == 0
    elif case == "offload_dots_no_batch":  # the matmul outputs go to host, the block inputs stay
        assert dev == inputs and host > 0
    elif case == "custom_in_recompute":
        assert (dev, host) == (inputs, 0)
    elif case == "custom":
        kept = [r for r in report.select() if r.name and r.name.endswith("mlp/__rule__")]
        assert sum(r.nbytes for r in kept) == L * HID


def test_bytes_order(data):
    """Across annotations: recompute < dots_no_batch < dots < no remat, on device."""
    plain, _, x, _, _ = data

    def dev(plan):
        return _device_bytes(rc.saved_residuals(em.loss, er.annotate(plain, plan), x))

    none = _device_bytes(rc.saved_residuals(em.loss, plain, x))
    sizes = [dev({"blocks.*": a}) for a in ("recompute", "dots_no_batch", "dots")]
    assert sizes == sorted(sizes) and sizes[-1] < none
    assert dev({"blocks.*": "inherit"}) == none


@pytest.mark.parametrize("case", ["recompute", "offload", "names_offload", "custom"])
def test_stacked(case, remat3, data):
    """scan(remat(layer)): gradients equal; the verifier finds nothing against the plan; device and
    host bytes equal the list's under the same plan."""
    plain, stacked, x, _, g0 = data
    plan = CASES[case][0]
    model = er.annotate(stacked, plan)
    _close(er.unwrap(_grad(model, x)), g0)
    check = rc.verify(em.loss, model, x, plan=er.plan_of(model))  # strict
    got = check.report
    want = rc.saved_residuals(em.loss, er.annotate(plain, plan), x)
    assert not got.opaque  # the verifier follows the residuals into the scan
    assert (_device_bytes(got), got.nbytes("host")) == (_device_bytes(want), want.nbytes("host"))


def _scans(fun, *args) -> int:
    return count_scans(eqx.filter_make_jaxpr(fun)(*args)[0].jaxpr)


def test_layer_groups(data):
    """Layers the plan treats differently are scanned separately; each group keeps its policy."""
    plain, stacked, x, _, g0 = data
    plan = {"blocks.*": "recompute", "blocks.[0-1]": "offload"}
    model = er.annotate(stacked, plan)
    assert _scans(lambda m: em.loss(m, x), model) == 2
    assert _scans(lambda m: em.loss(m, x), er.annotate(stacked, {"blocks": "recompute"})) == 1
    _close(er.unwrap(_grad(model, x)), g0)
    got = rc.saved_residuals(em.loss, model, x)
    listed = er.annotate(plain, plan, share_alike_layers=False)  # names per layer
    want = rc.verify(em.loss, listed, x, plan=er.plan_of(listed)).report
    assert want.names("host") == {"blocks.0/__input__", "blocks.1/__input__"}
    assert got.nbytes("host") == want.nbytes("host") == 2 * ACT
    # Each group reads its layers out of the whole stack, and the backward pass reads them there
    # again: no slice of the stacked parameters is kept; the activations kept are the list's.
    assert not [r for r in got.residuals if r.kind == "copy"]
    assert _device_bytes(got) == _device_bytes(want)


def test_stacked_names_are_the_groups(data):
    """Inside a group every layer tags under the group's first layer: blocks.0.attn/attn_out."""
    _, stacked, x, _, _ = data
    model = er.annotate(stacked, {"blocks.*": "recompute", "blocks.2": {"save": ["attn_out"]}})
    with rc.adapter.collect_tags() as tags:
        eqx.filter_eval_shape(em.loss, model, x)
    assert {t.name for t in tags} == {"blocks.0.attn/attn_out", "blocks.0.mlp/hidden",
                                      "blocks.2.attn/attn_out", "blocks.2.mlp/hidden"}


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "scan"])
def test_keys_and_value_and_grad(stacked, data):
    """Per-call PRNG keys (dropout) under filter_jit(filter_value_and_grad): same value and grads,
    so the recomputation replays the same dropout mask."""
    plain, stack, x, _, _ = data
    model = stack if stacked else plain
    k1, k2 = jax.random.split(jax.random.key(7))
    step = eqx.filter_jit(eqx.filter_value_and_grad(em.loss))
    annotated = er.annotate(model, {"blocks.*": "recompute", "blocks.*.mlp": {"offload": ["hidden"]}})
    v0, g0 = eqx.filter_value_and_grad(em.loss)(model, x, k1)
    v1, g1 = step(annotated, x, k1)
    assert_close(v1, v0)
    _close(er.unwrap(g1), g0)
    assert abs(float(step(annotated, x, k2)[0]) - float(v1)) > 1e-6  # dropout really runs


def test_filter_jit_traces_once(data):
    """The plan is a hashable static field: one trace for repeated calls and equal plans."""
    plain, _, x, _, _ = data
    traces = []

    @eqx.filter_jit
    def f(model, x):
        traces.append(1)
        return em.loss(model, x)

    plan = {"blocks.*": "recompute"}
    a, b = er.annotate(plain, plan), er.annotate(plain, dict(plan))
    assert er.plan_of(a) == er.plan_of(b)  # equal plans: the same annotated classes
    f(a, x), f(a, x), f(b, x)
    assert len(traces) == 1
    f(er.annotate(plain, {"blocks.*": "offload"}), x)
    assert len(traces) == 2


def _export_text(model, x) -> str:
    params, static = eqx.partition(model, eqx.is_array)

    def step(params, x):
        return jax.grad(lambda p: em.loss(eqx.combine(p, static), x))(params)

    return jax.export.export(jax.jit(step), platforms=["cuda"])(params, x).mlir_module()


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "scan"])
def test_offload_exported_for_gpu(stacked, data):
    """On CPU offload is a no-op; the same step exported for CUDA moves the values to pinned host."""
    plain, stack, x, _, _ = data
    model = stack if stacked else plain
    text = _export_text(er.annotate(model, {"blocks.*": "offload"}), x)
    assert "annotate_device_placement" in text and "pinned_host" in text
    assert "pinned_host" not in _export_text(er.annotate(model, {"blocks.*": "recompute"}), x)


@pytest.mark.cpu_figures(
    "the temporaries of a small program: on a TPU v5e chip XLA:TPU kept them in "
    "on-chip memory (temp 0) and tile-padded the arrays; TPU figures are checked at "
    "real sizes by the target stage and scripts/device_check")
@pytest.mark.slow
def test_compiled_memory_and_flops():
    """At a size where it shows: recompute lowers temp memory and raises FLOPs; saving the
    attention outputs recomputes less (jax 0.11.2 on CPU, see docs/jax_behaviour.md "Measuring on CPU")."""
    dims = em.Dims(batch=8, seq=128, d_in=128, dim=256, heads=4, hidden=1024, layers=4)
    plain = em.transformer(0, dims)
    x = em.inputs(1, dims)

    def cost(model):
        params, static = eqx.partition(model, eqx.is_array)
        grad = jax.jit(jax.grad(lambda p, x: em.loss(eqx.combine(p, static), x)))
        compiled = grad.lower(params, x).compile(SHOW_REMAT)  # jax 0.11.0: no CSE (versions.py)
        return compiled.memory_analysis().temp_size_in_bytes, compiled.cost_analysis()["flops"]

    t0, f0 = cost(plain)
    t1, f1 = cost(er.annotate(plain, {"blocks.*": "recompute"}))
    t2, f2 = cost(er.annotate(plain, {"blocks.*": {"save": ["attn_out"]}}))
    act = dims.tokens * dims.dim * 4
    assert f1 > 1.1 * f0 and f0 < f2 < f1
    if not TEMP_TRACKS_RESIDUALS:  # jax 0.11.0 / 0.12 on CPU: the report says temp means nothing
        assert temp_is_flagged()
        return
    assert t1 < t0 - dims.layers * act
    assert t1 <= t2 < t0
