"""The private-JAX and version-quirk helpers, measured against the installed JAX.

``remat_common._jaxcompat`` is the one file that reads private JAX, sniffs error messages and
compares versions; these tests run on every supported version (``./scripts/test``), so a JAX
release that changes any of it fails here first. docs/jax_behaviour.md cites them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from remat_common.internal import jaxcompat as jc

pytestmark = pytest.mark.compat  # core only: runs under jax 0.12 too


def test_the_forward_mode_error_of_a_custom_vjp_is_recognised() -> None:
    @jax.custom_vjp
    def f(x: jax.Array) -> jax.Array:
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x),))
    with pytest.raises(TypeError) as e:
        jax.jvp(f, (jnp.float32(1.0),), (jnp.float32(1.0),))
    assert jc.is_custom_vjp_forward_mode_error(e.value)
    assert not jc.is_custom_remat_vmap_error(e.value)


@pytest.mark.skipif(not hasattr(jax, "custom_remat"), reason="jax.custom_remat is 0.11.x only")
def test_the_vmap_error_of_a_custom_remat_is_recognised(remat3_on: None) -> None:
    cr = jax.custom_remat(jnp.sin, lambda pol, x: (jnp.sin(x), x),  # type: ignore[attr-defined]
                          lambda res, x: (jnp.sin(x), res), lambda res, g: (g * jnp.cos(res),))
    with pytest.raises(NotImplementedError) as e:
        jax.grad(lambda x: jnp.sum(jax.vmap(jax.checkpoint(cr))(x)))(jnp.ones(3))
    assert jc.is_custom_remat_vmap_error(e.value)
    assert not jc.is_custom_vjp_forward_mode_error(e.value)


def test_the_trace_stack_is_read_under_every_transformation() -> None:
    seen: list[tuple[str | None, bool, bool]] = []

    def g(x: jax.Array) -> jax.Array:
        seen.append((jc.nearest_ad_trace(), jc.innermost_trace_is_vmap(), jc.is_differentiated(x)))
        return jnp.sum(x)

    x = jnp.ones(2)
    g(x)
    jax.vmap(g)(jnp.ones((2, 2)))
    jax.grad(g)(x)
    jax.jvp(g, (x,), (x,))
    jax.linearize(g, x)
    jax.jit(jax.grad(g))(x)
    assert seen == [(None, False, False), ("vmap", True, False), ("vjp", False, True),
                    ("jvp", False, True), ("linearize", False, True), ("vjp", False, True)]


def test_the_trace_chain_names_each_transformation_and_what_each_jaxpr_traces_for() -> None:
    seen: list[list[str] | None] = []

    def block(x: jax.Array) -> jax.Array:
        seen.append(jc.trace_chain())
        return jnp.sin(x)

    def model(xs: jax.Array) -> jax.Array:  # a fresh checkpoint each call: its body is traced
        body = jax.checkpoint(lambda x: block(x))
        return jnp.sum(jax.vmap(lambda x: jax.lax.scan(lambda h, _: (body(h), None), x, None,
                                                       length=2)[0])(xs))

    xs = jnp.ones((2, 3))
    jax.grad(model)(xs)
    jax.jit(jax.grad(model))(xs)
    block(xs)
    assert seen == [["checkpoint / remat", "scan", "vmap", "linearize"],
                    ["checkpoint / remat", "scan", "vmap", "linearize", "jit"], []]


def test_policies_are_asked_where_names_go() -> None:
    cp = jax.checkpoint_policies
    assert jc.policy_location(None, ["a"]) == ("recompute", None, None)
    assert jc.policy_location(cp.nothing_saveable, ["a"]) == ("recompute", None, None)
    assert jc.policy_location(cp.save_only_these_names("a"), ["b", "a"]) == ("device", None, None)
    offload = cp.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["a"],
        offload_src="device", offload_dst="pinned_host")
    assert jc.policy_location(offload, ["a"]) == ("host", "device", "pinned_host")


def test_checkpoint_names_are_read_from_jaxprs() -> None:
    j = jax.make_jaxpr(lambda x: checkpoint_name(x * 2.0, "h"))(jnp.float32(1.0))
    assert [jc.checkpoint_name_of(e) for e in j.jaxpr.eqns] == [None, "h"]


def test_remat3_is_turned_off_locally_only(remat3_on: None) -> None:
    with jc.local_remat3_off():
        assert not jax.config.jax_remat3
    assert jax.config.jax_remat3


@pytest.mark.parametrize(("version", "want"), [
    ("0.11.0", (True, True, False, False)),
    ("0.11.0+cuda12", (True, True, False, False)),
    ("0.11.1rc1", (False, True, False, False)),   # a pre-release of 0.11.1 counts as older
    ("0.11.2", (False, False, True, False)),
    ("0.12.0.1", (False, False, False, True)),
])
def test_version_predicates(version: str, want: tuple[bool, ...]) -> None:
    got = (jc.is_jax_0110(version), jc.cse_undoes_remat_on_cpu(version),
           jc.cpu_temp_tracks_residuals(version), jc.policy_classes_removed(version))
    assert got == want


def test_the_installed_surface_matches_the_version() -> None:
    removed = jc.policy_classes_removed(jax.__version__)
    assert jc.has_custom_remat() is not removed
    assert jc.has_policy_classes() is not removed
    assert jc.remat3_drops_names_under_vmap() is (jc.remat3_on() and not removed)
