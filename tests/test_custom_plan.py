"""Rule sets under a plan: the ambient policy each rule sees is the plan's, and what is kept,
offloaded or recomputed is what the plan says, through ``remat_common.adapter.call_module`` (what every
adapter does for every module call).

The model: a block at ``layers.0`` whose attention at ``layers.0.attn`` has a ``__remat_custom__``
that runs the attention rule set. With ``jax_remat3`` on and JAX 0.11.x the forward rule receives
JAX's policy object (the outermost checkpoint's on 0.11.2); elsewhere the plugin tracks the plan.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close

B, T, D, H = 2, 16, 8, 2
PATHS = ["layers", "layers.0", "layers.0.attn"]
ATTN = "layers.0.attn"
HAS_CUSTOM_REMAT = hasattr(jax, "custom_remat")
RULES = rc.rules.attention_rules(causal=True)


def _params(key: jax.Array) -> dict[str, jax.Array]:
    ks = jax.random.split(key, 4)
    return {n: jax.random.normal(k, (D, D), jnp.float32) / D ** 0.5
            for n, k in zip(("wq", "wk", "wv", "wo"), ks)}


def _heads(x: jax.Array) -> jax.Array:
    return x.reshape(*x.shape[:-1], H, D // H)


def model(plan: rc.CompiledPlan | None, p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """Two residual attention blocks' worth of work, the first one annotated by ``plan``."""
    def attn_plain(x: jax.Array) -> jax.Array:
        q, k, v = (_heads(x @ p[n]) for n in ("wq", "wk", "wv"))
        return rc.rules.attention(q, k, v, causal=True).reshape(x.shape) @ p["wo"]

    def attn_custom(x: jax.Array) -> jax.Array:  # the module's __remat_custom__
        q, k, v = (_heads(x @ p[n]) for n in ("wq", "wk", "wv"))
        return RULES(q, k, v).reshape(x.shape) @ p["wo"]

    def block(x: jax.Array) -> jax.Array:
        if plan is None:
            return x + attn_plain(x)
        return x + rc.adapter.call_module(plan, ATTN, attn_plain, x, custom=attn_custom)

    y = block(x) if plan is None else rc.adapter.call_module(plan, "layers.0", block, x)
    return jnp.sum(jnp.tanh(y) ** 2)


def _plan(rules: dict[str, Any], **defaults: Any) -> rc.CompiledPlan:
    return rc.compile_plan(rc.resolve(rc.Plan.from_mapping(rules, **defaults), PATHS))


@pytest.fixture(scope="module")
def data() -> tuple[dict[str, jax.Array], jax.Array, Any]:
    p = _params(jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (B, T, D), jnp.float32)
    return p, x, jax.jit(jax.grad(lambda p, x: model(None, p, x)))(p, x)


def _close(a: Any, b: Any) -> None:
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert_close(u, v)


def _on_custom_remat(remat3: bool) -> bool:
    return remat3 and HAS_CUSTOM_REMAT


LSE, OUT = (B, H, T), (B, T, H, D // H)
SCORES = (B, H, T, T)
CASES = {
    # plan, where each residual goes, which residual shapes are kept by the rule
    "own-boundary": ({ATTN: "custom"}, {"attn_out": "device", "attn_lse": "device"}),
    "outer-saves-lse": ({"layers.0": {"save": ["attn/attn_lse"]}, ATTN: "custom"},
                        {"attn_out": "recompute", "attn_lse": "device"}),
    "outer-offloads-lse": ({"layers.0": {"offload": ["attn/attn_lse"]}, ATTN: "custom"},
                           {"attn_out": "recompute", "attn_lse": "host"}),
    "outer-recomputes": ({"layers.0": "recompute", ATTN: "custom"},
                         {"attn_out": "recompute", "attn_lse": "recompute"}),
}


def _portable_inside_remat3_boundary(case: str, remat3: bool) -> bool:
    """JAX recomputes a custom_vjp's residuals inside a remat3 checkpoint (0.12: no custom_remat)."""
    return case in ("outer-saves-lse", "outer-offloads-lse") and remat3 and not HAS_CUSTOM_REMAT


@pytest.mark.compat
@pytest.mark.parametrize("case", list(CASES))
def test_rule_sees_the_plan_and_keeps_what_it_says(case: str, remat3: bool, data: Any) -> None:
    p, x, g0 = data
    rules, where = CASES[case]
    plan = _plan(rules)
    loss = lambda p, x: model(plan, p, x)  # noqa: E731
    if _portable_inside_remat3_boundary(case, remat3):
        with pytest.raises(rc.CapabilityError, match=r"(?s)'layers.0.attn'.*'attention'.*attn_lse.*"
                           r"jax_remat3 on.*recomputes a\s+custom_vjp's residuals.*Fix: "
                           r"jax.config.update\('jax_remat3', False\)"):
            jax.grad(loss)(p, x)
        return
    with rc.rules.collect_rule_runs() as runs:
        _close(jax.jit(jax.grad(loss))(p, x), g0)
        check = rc.verify(loss, p, x, plan=plan)  # strict plan: raises on any problem
    assert check.ok
    report = check.report
    assert not any(r.shape == SCORES for r in report.residuals)
    fwd = [r for r in runs if r.forward_ran]
    assert fwd and all(r.path == ATTN for r in fwd)
    for run in fwd:
        # What the forward rule saw equals what the plan says, per JAX version and flag.
        assert dict(run.plan_locations) == where
        assert dict(run.ambient.locations) == where
        if _on_custom_remat(remat3):
            assert run.impl == "custom_remat" and run.ambient.source == "policy"
            # JAX passes the outermost checkpoint's policy on 0.11.2: the plan's boundary.
            want = {"own-boundary": "SaveOnlyTheseNames", "outer-saves-lse": "SaveOnlyTheseNames",
                    "outer-offloads-lse": "SaveAndOffloadOnlyTheseNames",
                    "outer-recomputes": "None"}[case]
            assert run.ambient.policy == want
        else:
            assert run.impl == "custom_vjp" and run.ambient.source == "plan"
    host = [r.shape for r in report.select(placement="host")]
    assert host == ([LSE] if where["attn_lse"] == "host" else [])
    device = [r.shape for r in report.select(placement="device")]
    assert (LSE in device) == (where["attn_lse"] == "device")
    if case == "outer-saves-lse":
        assert report.names("device") == {f"{ATTN}/attn_lse"}
    if case == "outer-recomputes":  # nothing but the boundary input survives the forward pass
        assert LSE not in device and OUT not in device


@pytest.mark.compat
def test_own_boundary_recomputes_projections_but_keeps_rule_residuals(remat3: bool, data: Any) -> None:
    """'custom' is a boundary: the q/k/v projections are recomputed, the rule's out and lse kept
    (with remat3 on and no custom_remat the boundary is left out: projections kept instead)."""
    p, x, _ = data
    plan = _plan({ATTN: "custom"})
    report = rc.saved_residuals(lambda p, x: model(plan, p, x), p, x)
    shapes = [r.shape for r in report.select()]
    assert shapes.count(LSE) == 1 and shapes.count(OUT) >= 1
    boundary_open = not (remat3 and not HAS_CUSTOM_REMAT)
    projections = shapes.count((B, T, H, D // H))  # q, k, v (and out) in the per-head layout
    assert projections == (1 if boundary_open else 4)
    spec = plan.boundary(ATTN).spec
    assert spec.kind == "custom" and spec.save == {f"{ATTN}/__rule__"} and not spec.requested


@pytest.mark.compat
def test_lenient_plan_warns_where_the_portable_path_cannot_keep(data: Any) -> None:
    """remat3 on, portable path inside a boundary that saves a rule residual: a warning (lenient)."""
    p, x, g0 = data
    plan = _plan({"layers.0": {"save": ["attn/attn_lse"]}, ATTN: "custom"}, mode="lenient")
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", True)
    try:
        with rc.rules.custom_impl("custom_vjp"), pytest.warns(rc.CustomRuleWarning, match="attn_lse"):
            g = jax.grad(lambda p, x: model(plan, p, x))(p, x)
    finally:
        jax.config.update("jax_remat3", old)
    _close(g, g0)  # still correct: the residual is recomputed


def test_strict_plan_error_on_0_11_when_the_portable_path_is_forced(data: Any) -> None:
    """The same situation as on 0.12, reproduced on 0.11 by forcing the portable path."""
    p, x, _ = data
    plan = _plan({"layers.0": {"offload": ["attn/attn_lse"]}, ATTN: "custom"})
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", True)
    try:
        with rc.rules.custom_impl("custom_vjp"), pytest.raises(
                rc.CapabilityError, match=r"(?s)module 'layers.0.attn', rule set 'attention'.*"
                r"attn_lse: host.*boundary at 'layers.0'"):
            jax.grad(lambda p, x: model(plan, p, x))(p, x)
    finally:
        jax.config.update("jax_remat3", old)


def test_capabilities_report_the_path() -> None:
    old = jax.config.jax_remat3
    try:
        for flag in (False, True):
            jax.config.update("jax_remat3", flag)
            caps = rc.capabilities()
            want = "custom_remat" if flag and HAS_CUSTOM_REMAT else "custom_vjp"
            assert caps.custom_path == rc.rules.custom_path() == want
            assert caps.to_json()["custom_path"] == want
    finally:
        jax.config.update("jax_remat3", old)
