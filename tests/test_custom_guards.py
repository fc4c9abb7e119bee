"""Every known failure of ``jax.custom_remat`` meets a working fallback or a clear error.

docs/jax_behaviour.md ("custom_remat") lists them: ``grad`` without an enclosing checkpoint raises an empty
``NotImplementedError('')``; remat3 off silently skips the forward rule; ``vmap`` has no batching
rule; ``linearize`` raises a TypeError under remat3; ``everything_saveable`` around it fails on
0.11.2; 0.12 removed it. Each test asserts the fallback's numbers (and which path ran) or the
error's message.
"""

from __future__ import annotations

from typing import Any

import jax
from packaging.version import Version
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close

HAS_CUSTOM_REMAT = hasattr(jax, "custom_remat")
#: Under nested checkpoints jax 0.11.0 hands custom_remat's forward rule the innermost policy,
#: 0.11.1+ the outermost (docs/jax_behaviour.md, "custom_remat").
INNERMOST_POLICY = Version(jax.__version__) < Version("0.11.1")
needs_custom_remat = pytest.mark.skipif(not HAS_CUSTOM_REMAT,
                                        reason="jax.custom_remat exists on JAX 0.11.x only")
B, T, H, D = 2, 8, 2, 4
ATTN = rc.rules.attention_rules(causal=True)


def plain(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return rc.rules.attention(q, k, v, causal=True)


@pytest.fixture(scope="module")
def qkv() -> tuple[jax.Array, jax.Array, jax.Array]:
    ks = jax.random.split(jax.random.key(3), 3)
    return tuple(jax.random.normal(k, (B, T, H, D), jnp.float32) for k in ks)  # type: ignore[return-value]


def _close(a: Any, b: Any) -> None:
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert_close(u, v)


def _loss(f: Any) -> Any:
    return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))


@needs_custom_remat
def test_bare_custom_remat_fails_but_a_rule_set_does_not(remat3: bool, qkv: Any) -> None:
    """JAX's own failure, then the rule set: grad with no enclosing checkpoint works."""
    cr = jax.custom_remat(plain, lambda pol, *a: (plain(*a), None),  # type: ignore[attr-defined]
                          lambda res, *a: (plain(*a), a), lambda res, g: jax.vjp(plain, *res)[1](g))
    with pytest.raises(NotImplementedError) as err:
        jax.grad(_loss(cr))(*qkv)
    assert str(err.value).partition("\n")[0] == ""  # JAX's empty message
    with rc.rules.collect_rule_runs() as runs:
        got = jax.jit(jax.grad(_loss(ATTN), (0, 1, 2)))(*qkv)
    _close(got, jax.jit(jax.grad(_loss(plain), (0, 1, 2)))(*qkv))
    assert [r.impl for r in runs] == ["custom_remat" if remat3 else "custom_vjp"]


@pytest.mark.compat
def test_remat3_off_runs_the_forward_rule_through_the_portable_path(qkv: Any) -> None:
    """With remat3 off, custom_remat would skip f_fwd; the portable path really runs it."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", False)
    try:
        with rc.rules.collect_rule_runs() as runs:
            report = rc.saved_residuals(_loss(ATTN), *qkv)
    finally:
        jax.config.update("jax_remat3", old)
    (run,) = runs
    assert run.impl == "custom_vjp" and run.forward_ran
    assert "jax_remat3 off" in run.reason or "no jax.custom_remat" in run.reason
    assert (B, H, T) in [r.shape for r in report.select()]  # the lse the forward rule kept


@pytest.mark.compat
def test_strict_custom_remat_names_version_flag_and_remedy(qkv: Any) -> None:
    """Asking for custom_remat where it cannot run is an error, never a silent fallback."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", False)
    try:
        if HAS_CUSTOM_REMAT:
            want = (rf"(?s)rule set 'attention': custom_remat was requested \(strict\), but "
                    rf"jax_remat3 is off \(jax {jax.__version__}\).*skips the forward rule.*"
                    r"Fix: jax.config.update\('jax_remat3', True\).*impl='auto'")
        else:
            want = (rf"(?s)custom_remat was requested \(strict\), but jax {jax.__version__} has "
                    r"no jax.custom_remat.*0.12 removed it.*Fix: install jax 0.11.2.*impl='auto'")
        with rc.rules.custom_impl("custom_remat"), pytest.raises(rc.CapabilityError, match=want):
            jax.grad(_loss(ATTN))(*qkv)
        with pytest.raises(rc.CapabilityError, match=want.replace("rule set 'attention': ", "")):
            rc.rules.custom_path("custom_remat")
        strict = rc.rules.RuleSet(ATTN.name, ATTN.fun, ATTN.fwd, ATTN.rem, ATTN.bwd,
                            residuals=ATTN.residuals, keep=ATTN.keep, impl="custom_remat")
        with pytest.raises(rc.CapabilityError, match="strict"):
            jax.grad(_loss(strict))(*qkv)
    finally:
        jax.config.update("jax_remat3", old)


@pytest.mark.compat
@pytest.mark.parametrize("transform", ["grad(vmap)", "vmap(grad)"])
def test_vmap(transform: str, remat3: bool, qkv: Any) -> None:
    """vmap inside grad: custom_remat has no batching rule, so the portable path runs (same
    numbers); vmap outside grad needs no fallback."""
    q, k, v = qkv

    def per_example(f: Any) -> Any:
        if transform == "grad(vmap)":
            return jax.grad(lambda q: jnp.sum(jnp.sin(jax.vmap(f)(q, k, v))))
        return jax.vmap(jax.grad(lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))))

    with rc.rules.collect_rule_runs() as runs:
        got = jax.jit(per_example(ATTN))(q) if transform == "grad(vmap)" else \
            jax.jit(per_example(ATTN))(q, k, v)
    want = jax.jit(per_example(plain))(q) if transform == "grad(vmap)" else \
        jax.jit(per_example(plain))(q, k, v)
    _close(got, want)
    (run,) = runs
    if remat3 and HAS_CUSTOM_REMAT and transform == "grad(vmap)":
        assert run.impl == "custom_vjp" and run.reason.startswith("vmap")
    else:
        assert run.impl == ("custom_remat" if remat3 and HAS_CUSTOM_REMAT else "custom_vjp")


@needs_custom_remat
def test_vmap_with_strict_custom_remat_is_a_clear_error(remat3_on: None, qkv: Any) -> None:
    q, k, v = qkv
    with rc.rules.custom_impl("custom_remat"), pytest.raises(
            rc.CapabilityError, match=r"(?s)custom_remat was requested \(strict\), but vmap: "
            r"jax.custom_remat has no batching rule.*vmap\(grad\(f\)\) works"):
        jax.grad(lambda q: jnp.sum(jax.vmap(ATTN)(q, k, v)))(q)


@needs_custom_remat
def test_vmap_error_raised_at_a_boundary_is_retried_on_the_portable_path(
        remat3_on: None, qkv: Any) -> None:
    """When the batching error surfaces from a boundary around the rule (not detected up front),
    ``with_fallbacks`` (what call_module runs) traces the call again on the portable path."""
    import remat_common.internal as _custom

    q, k, v = qkv
    calls = []

    def boundary(q: jax.Array) -> jax.Array:
        def traced() -> jax.Array:
            calls.append(1)
            if len(calls) == 1:  # what JAX raises when it batches a CustomRemat
                raise NotImplementedError("for vmap support, subclass <class 'jax._src.ad_"
                                          "checkpoint.CustomRemat'> must implement `batch`")
            return ATTN(q, k, v)
        return _custom.with_fallbacks(traced)

    with rc.rules.collect_rule_runs() as runs:
        got = jax.jit(jax.grad(lambda q: jnp.sum(jnp.sin(boundary(q)))))(q)
    _close(got, jax.jit(jax.grad(lambda q: jnp.sum(jnp.sin(plain(q, k, v)))))(q))
    assert len(calls) == 2 and [r.impl for r in runs] == ["custom_vjp"]
    assert runs[0].reason.startswith("vmap")


@pytest.mark.compat
@pytest.mark.parametrize("mode", ["jvp", "linearize", "jacfwd", "hessian"])
def test_forward_mode(mode: str, remat3: bool, qkv: Any) -> None:
    """jvp/linearize/jacfwd run the plain function (no custom rule has a forward-mode rule, and
    linearize of a custom_vjp raises in JAX itself); hessian (forward over reverse) keeps the rule."""
    q, k, v = qkv
    tq = jnp.cos(q)

    def run(f: Any) -> Any:
        g = lambda q: f(q, k, v)  # noqa: E731
        if mode == "jvp":
            return jax.jvp(g, (q,), (tq,))
        if mode == "linearize":
            out, lin = jax.linearize(g, q)
            return out, lin(tq)
        # jacfwd / hessian of one query row (a small slice keeps the matrices small)
        def row(s: jax.Array) -> jax.Array:
            return jnp.sum(jnp.sin(f(q.at[:1, 3:4, :1, :].set(s), k, v)))
        return (jax.jacfwd if mode == "jacfwd" else jax.hessian)(row)(q[:1, 3:4, :1, :])

    with rc.rules.collect_rule_runs() as runs:
        got = jax.jit(lambda: run(ATTN))()
    _close(got, jax.jit(lambda: run(plain))())
    impls = {r.impl for r in runs}
    if mode == "hessian":  # reverse mode innermost: the rule runs
        assert impls == {"custom_remat" if remat3 and HAS_CUSTOM_REMAT else "custom_vjp"}
    else:
        assert impls == {"plain"} and all(f"({mode if mode != 'jacfwd' else 'jvp'})" in r.reason
                                          for r in runs)


@needs_custom_remat
def test_everything_saveable_around_a_rule_set_works(remat3_on: None, qkv: Any) -> None:
    """A bare custom_remat under everything_saveable raises NotImplementedError('') on 0.11.2; the
    rule set's own boundary keeps its policy, so the forward rule still runs."""
    cp = jax.checkpoint_policies
    cr = jax.custom_remat(plain, lambda pol, *a: (plain(*a), None),  # type: ignore[attr-defined]
                          lambda res, *a: (plain(*a), a), lambda res, g: jax.vjp(plain, *res)[1](g))
    if jax.__version__ == "0.11.2":
        with pytest.raises(NotImplementedError) as err:
            jax.grad(_loss(jax.checkpoint(cr, policy=cp.everything_saveable)))(*qkv)
        assert str(err.value).partition("\n")[0] == ""
    with rc.rules.collect_rule_runs() as runs:
        got = jax.jit(jax.grad(_loss(jax.checkpoint(ATTN, policy=cp.everything_saveable)),
                               (0, 1, 2)))(*qkv)
    _close(got, jax.jit(jax.grad(_loss(plain), (0, 1, 2)))(*qkv))
    (run,) = runs
    assert run.impl == "custom_remat" and dict(run.ambient.locations) == {
        "attn_out": "device", "attn_lse": "device"}


@needs_custom_remat
def test_a_user_checkpoint_policy_is_the_ambient_policy(remat3_on: None, qkv: Any) -> None:
    """Without a plan, the forward rule reads the policy of the user's own jax.checkpoint."""
    cp = jax.checkpoint_policies
    pol = cp.save_and_offload_only_these_names(
        names_which_can_be_saved=["attn_out"], names_which_can_be_offloaded=["attn_lse"],
        offload_src="device", offload_dst="pinned_host")
    with rc.rules.collect_rule_runs() as runs:
        report = rc.saved_residuals(_loss(jax.checkpoint(ATTN, policy=pol)), *qkv)
    (run,) = runs
    if INNERMOST_POLICY:
        # jax 0.11.0 hands the forward rule the innermost checkpoint's policy: the rule set's own
        # boundary (its defaults here), not the user's (docs/jax_behaviour.md, "custom_remat").
        assert dict(run.ambient.locations) == {"attn_out": "device", "attn_lse": "device"}
        assert run.ambient.source == "policy" and run.ambient.policy == "SaveOnlyTheseNames"
        assert not report.select(placement="host")
        return
    assert dict(run.ambient.locations) == {"attn_out": "device", "attn_lse": "host"}
    assert run.ambient.source == "policy" and run.ambient.policy == "SaveAndOffloadOnlyTheseNames"
    assert [r.shape for r in report.select(placement="host")] == [(B, H, T)]
    with rc.rules.collect_rule_runs() as runs:
        jax.grad(_loss(jax.checkpoint(ATTN, policy=cp.nothing_saveable)))(*qkv)
    assert runs[0].ambient.kept == frozenset() and runs[0].ambient.policy == "None"


@pytest.mark.compat
def test_bad_rule_sets_and_arguments_are_clear_errors(qkv: Any) -> None:
    fwd, rem, bwd = ATTN.fwd, ATTN.rem, ATTN.bwd
    with pytest.raises(rc.RematError, match=r"RuleSet 'x': keep names 'lse' are not among its "
                       r"residuals 'out'. Fix: declare them"):
        rc.rules.RuleSet("x", plain, fwd, rem, bwd, residuals=("out",), keep=frozenset({"lse"}))
    with pytest.raises(rc.RematError, match=r"residual name 'a/b' must be a non-empty string "
                       r"without '/'"):
        rc.rules.RuleSet("x", plain, fwd, rem, bwd, residuals=("a/b",))
    with pytest.raises(rc.RematError, match=r"unknown custom-rule implementation 'fast'. Allowed: "
                       r"'auto', 'custom_remat', 'custom_vjp', 'plain'"):
        rc.rules.RuleSet("x", plain, fwd, rem, bwd, impl="fast")
    with pytest.raises(rc.RematError, match="remat_common.rules.custom_impl: unknown"):
        with rc.rules.custom_impl("fast"):
            pass
    with pytest.raises(TypeError, match=r"rule set 'attention' takes its arrays positionally, got "
                       r"keywords \['k'\]"):
        ATTN(qkv[0], k=qkv[1])
    undeclared = rc.rules.RuleSet("leaky", plain, lambda amb, *a: (plain(*a), {"extra": a[0]}), rem, bwd,
                            residuals=("attn_out", "attn_lse"))
    with pytest.raises(rc.RematError, match=r"rule set 'leaky': the forward rule returned residuals "
                       r"'extra' that the rule set does not declare"):
        jax.grad(_loss(undeclared))(*qkv)
    with pytest.raises(rc.RematError, match=r"unknown activation 'relu'. Allowed: 'gelu', "
                       r"'gelu_tanh', 'silu'"):
        rc.rules.gated_mlp_rules(activation="relu")
