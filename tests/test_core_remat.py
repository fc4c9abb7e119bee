"""Every annotation, remat3 off and on: residuals are what the plan says, gradients are baseline's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc

from fixtures.core_model import ACT_BYTES, L, compile_plan, init, loss_loop, loss_scan
from fixtures.tolerance import assert_close

# annotation -> (named residuals on device, names on host) for layer i
CASES = {
    "recompute": (set(), set()),
    "offload": (set(), {"layers.{i}/__input__"}),
    "dots": (set(), set()),
    "dots_no_batch": (set(), set()),
    "names_save": ({"layers.{i}/h"}, set()),
    "names_save_offload": ({"layers.{i}/h"}, {"layers.{i}/act"}),
    "save": ({"layers.{i}/act"}, set()),  # no boundary: JAX keeps what plain AD keeps
    "inherit": ({"layers.{i}/act"}, set()),
}
VALUES = {
    "names_save": {"save": ["h"]},
    "names_save_offload": {"save": ["h"], "offload": ["act"]},
}


@pytest.fixture(scope="module")
def data():
    params = init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (8, 16))
    g0 = jax.grad(loss_loop)(params, x, None)
    return params, x, g0


def _names(pattern_set):
    return {p.format(i=i) for p in pattern_set for i in range(L)}


def _close(a, b):
    assert_close(a, b)


@pytest.mark.compat
@pytest.mark.parametrize("case", list(CASES))
def test_residuals_and_gradients(case, remat3, data):
    params, x, g0 = data
    plan = compile_plan({"layers.*": VALUES.get(case, case)})
    check = rc.verify(loss_loop, params, x, plan, plan=plan)  # strict: raises on any mismatch
    dev, host = CASES[case]
    assert check.report.names("device") == _names(dev)
    assert check.report.names("host") == _names(host)
    assert len(check.report.select(placement="host")) == len(_names(host))
    _close(jax.grad(loss_loop)(params, x, plan), g0)
    _close(jax.jit(jax.grad(loss_loop), static_argnums=2)(params, x, plan), g0)


@pytest.mark.compat
def test_bytes_order(remat3, data):
    """Recompute keeps less than no remat; offload keeps its inputs on host, not on device."""
    params, x, _ = data

    def dev(rules):
        rep = rc.saved_residuals(loss_loop, params, x, compile_plan(rules) if rules else None)
        return rep.nbytes("device"), rep.nbytes("host")

    none, recompute, offload = dev(None), dev({"layers.*": "recompute"}), dev({"layers.*": "offload"})
    names = dev({"layers.*": {"offload": ["act"]}})
    assert recompute[0] < none[0] and recompute[1] == 0
    assert offload[1] == L * ACT_BYTES and offload[0] < recompute[0]
    assert names[1] == L * ACT_BYTES


@pytest.mark.compat
@pytest.mark.parametrize("case", ["recompute", "offload", "names_save_offload"])
def test_vmap(case, remat3, data):
    params, x, _ = data
    plan = compile_plan({"layers.*": VALUES.get(case, case)})
    xs = jnp.stack([x, 2 * x])

    def batched(params, xs, plan):
        return jnp.sum(jax.vmap(lambda x: loss_loop(params, x, plan))(xs))

    # jax 0.11.x's remat3 ignores name-based policies under vmap (measured on 0.11.2); such a
    # boundary runs with remat3 off locally, so the plan is honoured (was: refused).
    before = jax.config.jax_remat3
    _close(jax.grad(batched)(params, xs, plan), jax.grad(batched)(params, xs, None))
    check = rc.verify(batched, params, xs, plan, plan=plan)
    assert len(check.report.select(placement="host")) == len(_names(CASES[case][1]))
    assert jax.config.jax_remat3 == before
    # Per-example gradients (grad inside vmap) keep the plan in both modes.
    per_example = jax.vmap(jax.grad(loss_loop), in_axes=(None, 0, None))
    _close(per_example(params, xs, plan), per_example(params, xs, None))
    jaxpr = str(jax.make_jaxpr(per_example, static_argnums=2)(params, xs, plan))
    assert ("device_put" in jaxpr) == (case != "recompute")


@pytest.fixture(scope="module")
def scan_recompute_bytes(data):
    params, x, _ = data
    plan = compile_plan({"layers": "recompute"}, stacked=True)
    return rc.saved_residuals(loss_scan, params, x, plan).nbytes("device")


# By bytes: relative to full recompute, each layer adds (device, host) activations of ACT_BYTES.
SCAN_EXTRA = {"recompute": (0, 0), "offload": (None, L), "names_save": (L, 0),
              "names_save_offload": (L, L), "dots": (L, 0)}


@pytest.mark.compat
@pytest.mark.parametrize("case", list(SCAN_EXTRA))
def test_scan_over_layers(case, remat3, data, scan_recompute_bytes):
    params, x, g0 = data
    plan = compile_plan({"layers": VALUES.get(case, case)}, stacked=True)
    _close(jax.jit(jax.grad(loss_scan), static_argnums=2)(params, x, plan), g0)
    rep = rc.saved_residuals(loss_scan, params, x, plan)
    assert not rep.opaque  # the verifier follows residuals into the scan
    dev, host = SCAN_EXTRA[case]
    assert rep.nbytes("host") == host * ACT_BYTES
    if dev is not None:
        assert rep.nbytes("device") == scan_recompute_bytes + dev * ACT_BYTES
    else:  # offload: the layer inputs leave the device; only the final output stays
        assert rep.nbytes("device") == ACT_BYTES


@pytest.mark.compat
def test_layer_groups_split_the_scan(remat3, data):
    params, x, g0 = data
    plan = compile_plan({"layers": "recompute", "layers.0": "offload"}, stacked=True)
    assert [(g.start, g.stop) for g in rc.adapter.layer_groups(plan.resolution, "layers", L)] == [(0, 1), (1, 3)]
    _close(jax.grad(loss_scan)(params, x, plan), g0)
    assert rc.saved_residuals(loss_scan, params, x, plan).nbytes("host") == ACT_BYTES


@pytest.mark.compat
def test_higher_order_ad(remat3, data):
    params, x, _ = data
    plan = compile_plan({"layers.*": {"save": ["h"]}})

    def gnorm(x, plan):
        g = jax.grad(loss_loop)(params, x, plan)
        return sum(jnp.sum(v * v) for v in jax.tree_util.tree_leaves(g))

    want = jax.grad(gnorm)(x, None)
    # Second derivatives reach 1e4 here: round-off is relative to the largest entry (tolerance.py).
    _close(jax.grad(gnorm)(x, plan), want)


@pytest.mark.compat
def test_verify_catches_a_name_no_tag_produces(data):
    params, x, _ = data
    plan = compile_plan({"layers.*": {"save": ["attn_out"]}})
    with pytest.raises(rc.VerificationError, match=r"(?s)names 'attn_out' but no checkpoint_name tag.*"
                                                   r"tags seen: 'act', 'h'.*Fix"):
        rc.verify(loss_loop, params, x, plan, plan=plan)
    lenient = rc.verify(loss_loop, params, x, plan, plan=plan, strict=False)
    assert not lenient.ok and len(lenient.problems) == L


@pytest.mark.compat
def test_custom_without_rules_is_a_clear_error(data):
    params, x, _ = data
    plan = compile_plan({"layers.0": "custom"})
    with pytest.raises(rc.PlanError, match=r"(?s)'layers.0' is annotated 'custom' but declares no "
                                           r"custom remat rules.*__remat_custom__.*Fix"):
        loss_loop(params, x, plan)
