"""The rule library: values and gradients equal plain autodiff, on every path the rules run through.

Each rule (attention, causal attention, SwiGLU, GeGLU, RMSNorm, LayerNorm) is checked against the
plain function it declares: values, gradients and grad-of-grad under ``jit``, and gradients through
``lax.scan`` over layers, with ``jax_remat3`` off (the portable ``custom_vjp`` path) and on
(``jax.custom_remat`` on 0.11.x, the portable path on 0.12), plus the portable path forced with
remat3 on. What each rule keeps is asserted on the residuals JAX reports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close

HAS_CUSTOM_REMAT = hasattr(jax, "custom_remat")


def _args(key: jax.Array, shapes: list[tuple[int, ...]], scale: float = 1.0) -> tuple[jax.Array, ...]:
    keys = jax.random.split(key, len(shapes))
    return tuple(scale * jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes))


# (rule set, plain function, argument shapes, expected kept residual shapes)
B, T, H, Dh, DM, F = 2, 8, 2, 4, 8, 16
RULES: dict[str, tuple[Callable[[], rc.rules.RuleSet], Callable[..., Any], list[tuple[int, ...]]]] = {
    "attention": (lambda: rc.rules.attention_rules(),
                  lambda q, k, v: rc.rules.attention(q, k, v), [(B, T, H, Dh)] * 3),
    "attention_causal": (lambda: rc.rules.attention_rules(causal=True, scale=0.3),
                         lambda q, k, v: rc.rules.attention(q, k, v, causal=True, scale=0.3),
                         [(B, T, H, Dh)] * 3),
    "swiglu": (lambda: rc.rules.gated_mlp_rules(activation="silu"),
               lambda *a: rc.rules.gated_mlp(*a, activation="silu"),
               [(B, T, DM), (DM, F), (DM, F), (F, DM)]),
    "geglu": (lambda: rc.rules.gated_mlp_rules(activation="gelu"),
              lambda *a: rc.rules.gated_mlp(*a, activation="gelu"),
              [(B, T, DM), (DM, F), (DM, F), (F, DM)]),
    "rms_norm": (lambda: rc.rules.rms_norm_rules(), rc.rules.rms_norm, [(B, T, DM), (DM,)]),
    "layer_norm": (lambda: rc.rules.layer_norm_rules(), rc.rules.layer_norm, [(B, T, DM), (DM,), (DM,)]),
}
KEPT = {  # what each rule keeps by default, by shape (besides its inputs)
    "attention": [(B, T, H, Dh), (B, H, T)], "attention_causal": [(B, T, H, Dh), (B, H, T)],
    "swiglu": [(B, T, F), (B, T, F)], "geglu": [(B, T, F), (B, T, F)],
    "rms_norm": [(B, T, 1)], "layer_norm": [(B, T, 1)],
}
# Paths: (impl forced, remat3) -> expected impl. On 0.12, custom_remat is gone.
PATHS = {
    "remat3-off": ("auto", False),
    "remat3-on": ("auto", True),
    "remat3-on-forced-custom_vjp": ("custom_vjp", True),
}


def _expected_impl(impl: str, remat3: bool) -> str:
    return "custom_remat" if impl == "auto" and remat3 and HAS_CUSTOM_REMAT else "custom_vjp"


@pytest.fixture(params=list(PATHS), ids=list(PATHS))
def path(request: pytest.FixtureRequest) -> Any:
    impl, remat3 = PATHS[request.param]
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", remat3)
    try:
        with rc.rules.custom_impl(impl):
            yield impl, remat3
    finally:
        jax.config.update("jax_remat3", old)


def _loss(f: Callable[..., Any]) -> Callable[..., Any]:
    # sin() makes the output cotangent depend on the output; the sum keeps the loss scalar.
    return lambda *a: jnp.sum(jnp.sin(f(*a)))


def _close(got: Any, want: Any) -> None:
    assert_close(got, want)


_BASELINES: dict[tuple[str, str], Any] = {}


def _value_and_grads(f: Callable[..., Any], n: int) -> Callable[..., Any]:
    argnums = tuple(range(n))
    return jax.jit(lambda *a: (f(*a), jax.grad(_loss(f), argnums)(*a)))


def _grad_of_grad(f: Callable[..., Any], n: int) -> Callable[..., Any]:
    argnums = tuple(range(n))

    def grad_norm(*a: Any) -> jax.Array:
        return sum(jnp.sum(g ** 2) for g in jax.grad(_loss(f), argnums)(*a))
    return jax.jit(jax.grad(grad_norm))


def _baseline(rule: str, what: str, args: tuple[jax.Array, ...]) -> Any:
    """Plain autodiff of the plain function (computed once per rule: no flag changes it)."""
    if (rule, what) not in _BASELINES:
        plain = RULES[rule][1]
        make = _value_and_grads if what == "grads" else _grad_of_grad
        _BASELINES[rule, what] = make(plain, len(args))(*args)
    return _BASELINES[rule, what]


@pytest.mark.compat
@pytest.mark.parametrize("rule", list(RULES))
def test_values_and_grads_equal_plain_autodiff(rule: str, remat3: bool, key: jax.Array) -> None:
    """Under jit: the value and the gradients equal plain autodiff, and the expected path ran."""
    make, _, shapes = RULES[rule]
    args = _args(key, shapes, scale=0.5)
    with rc.rules.collect_rule_runs() as runs:
        got = _value_and_grads(make(), len(args))(*args)
    _close(got, _baseline(rule, "grads", args))
    assert {r.impl for r in runs if r.forward_ran} == {_expected_impl("auto", remat3)}, runs


@pytest.mark.compat
@pytest.mark.parametrize("rule", ["attention_causal", "rms_norm"])
def test_portable_path_forced_with_remat3_on(rule: str, key: jax.Array) -> None:
    """``custom_impl('custom_vjp')`` runs the portable path even where custom_remat would run."""
    make, _, shapes = RULES[rule]
    args = _args(key, shapes, scale=0.5)
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", True)
    try:
        with rc.rules.custom_impl("custom_vjp"), rc.rules.collect_rule_runs() as runs:
            got = _value_and_grads(make(), len(args))(*args)
    finally:
        jax.config.update("jax_remat3", old)
    _close(got, _baseline(rule, "grads", args))
    assert {(r.impl, r.reason) for r in runs} == {("custom_vjp", "impl='custom_vjp' requested")}


@pytest.mark.compat
@pytest.mark.parametrize("rule", ["attention_causal", "geglu", "layer_norm"])
def test_grad_of_grad_equals_plain_autodiff(rule: str, remat3: bool, key: jax.Array) -> None:
    """Second order (the gradient of the squared gradient norm) through the rules' backward pass."""
    make, _, shapes = RULES[rule]
    args = _args(key, shapes, scale=0.5)
    with rc.rules.collect_rule_runs() as runs:
        got = _grad_of_grad(make(), len(args))(*args)
    _close(got, _baseline(rule, "gg", args))
    assert {r.impl for r in runs if r.forward_ran} == {_expected_impl("auto", remat3)}


@pytest.mark.compat
@pytest.mark.parametrize("rule", list(RULES))
def test_keeps_only_what_the_rule_says(rule: str, path: Any, key: jax.Array) -> None:
    """Outside any boundary a rule keeps its inputs and its default residuals, nothing else."""
    make, plain, shapes = RULES[rule]
    args = _args(key, shapes)
    with rc.rules.collect_rule_runs() as runs:
        report = rc.saved_residuals(_loss(make()), *args)
    out_shape = jax.eval_shape(plain, *args).shape
    kept = sorted(r.shape for r in report.select())
    # The loss itself keeps cos(output) for sin's backward pass: one output-shaped residual.
    assert kept == sorted(KEPT[rule] + [out_shape])
    args_kept = [r.shape for r in report.residuals if r.kind == "argument"]
    assert set(args_kept) <= set(shapes) and shapes[0] in args_kept  # inputs, never more
    (run,) = {r for r in runs if r.forward_ran}
    assert run.impl == _expected_impl(*path)
    assert run.ambient is not None and run.ambient.kept == make().keep


@pytest.mark.compat
@pytest.mark.parametrize("rule", ["attention_causal", "swiglu"])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["scan", "scan-checkpoint"])
def test_inside_scan_over_layers(rule: str, checkpointed: bool, remat3: bool, key: jax.Array) -> None:
    """A rule applied per layer in ``lax.scan`` (optionally with a checkpointed body)."""
    make, plain, shapes = RULES[rule]
    rules = make()
    n = 3
    x0, *rest = _args(key, shapes, scale=0.5)
    stacked = tuple(jnp.stack([r * (1 + 0.1 * i) for i in range(n)]) for r in rest)
    if rule == "attention_causal":  # self-attention: q = k = v = the carry, no weights
        stacked = ()
        f_rule, f_plain = (lambda x: rules(x, x, x)), (lambda x: plain(x, x, x))
    else:
        f_rule, f_plain = rules, plain

    def net(f: Callable[..., Any]) -> Callable[..., Any]:
        def body(x: jax.Array, w: tuple[jax.Array, ...]) -> tuple[jax.Array, None]:
            return jnp.tanh(f(x, *w)), None
        body = jax.checkpoint(body) if checkpointed else body

        def loss(x: jax.Array, ws: tuple[jax.Array, ...]) -> jax.Array:
            return jnp.sum(jax.lax.scan(body, x, ws, length=n)[0] ** 2)
        return jax.jit(jax.value_and_grad(loss, (0, 1)))

    with rc.rules.collect_rule_runs() as runs:
        got = net(f_rule)(x0, stacked)
    _close(got, net(f_plain)(x0, stacked))
    assert {r.impl for r in runs if r.forward_ran} == {_expected_impl("auto", remat3)}


@pytest.mark.compat
def test_attention_at_512_keeps_no_scores_and_fewer_bytes(path: Any, key: jax.Array) -> None:
    """Sequence length 512: residual bytes below full save, no [.., H, T, T] residual, and the
    forward rule really ran (it wrote its record while reverse-mode AD traced it)."""
    t, h, d = 512, 2, 16
    q, k, v = _args(key, [(1, t, h, d)] * 3)
    attn = rc.rules.attention_rules(causal=True)
    with rc.rules.collect_rule_runs() as runs:
        rule = rc.saved_residuals(_loss(attn), q, k, v)
    full = rc.saved_residuals(_loss(lambda q, k, v: rc.rules.attention(q, k, v, causal=True)), q, k, v)
    scores = (1, h, t, t)
    assert any(r.shape == scores for r in full.residuals)
    assert not any(r.shape == scores for r in rule.residuals)
    assert rule.nbytes(include_arguments=True) < full.nbytes(include_arguments=True) / 10
    # Exactly: the three inputs, the output and the row log-sum-exp, plus cos(output) of the loss.
    assert rule.nbytes() == (2 * t * h * d + h * t) * 4
    (run,) = [r for r in runs if r.forward_ran]
    assert run.impl == _expected_impl(*path) and run.rule == "attention"
    assert dict(run.ambient.locations) == {"attn_out": "device", "attn_lse": "device"}
