"""Layers the plan treats alike share one traced boundary; names no tag produces fail at trace time.

Sharing (``compile_plan(..., share_alike_layers=True)``) is asserted by complexity, not wall time:
a Python side effect counts how often JAX traces the layer body (once for N alike layers, once per
group of unlike ones), with gradients and ``verify`` results checked against the unshared plan.
"""

from __future__ import annotations

import functools
import gc
import warnings
import weakref

import jax
import jax.numpy as jnp
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close

N, B, D = 6, 4, 8
PATHS = ["layers", *(f"layers.{i}" for i in range(N)), *(f"layers.{i}.mlp" for i in range(N))]
TRACES: list[str] = []


def mlp(p, x):
    TRACES.append("mlp")
    return rc.checkpoint_name(jnp.tanh(x @ p["w"]), "act")


@functools.lru_cache(maxsize=None)
def layer_of(plan: rc.CompiledPlan):
    """The layer body for ``plan``: one function object for every layer (what lets JAX reuse a
    trace); the nested module's path is the layer's own, as an adapter gives it."""
    def layer(p, x):
        TRACES.append("layer")
        h = rc.checkpoint_name(x @ p["w"], "h")
        here = rc.adapter.current_module_path()
        return x + rc.adapter.call_module(plan, f"{here}.mlp", mlp, p["mlp"], jnp.sin(h))
    return layer


def loss(params, x, plan):
    for i, p in enumerate(params):
        if plan is None:
            x = x + jnp.tanh(jnp.sin(x @ p["w"]) @ p["mlp"]["w"])
        else:
            x = rc.adapter.call_module(plan, f"layers.{i}", layer_of(plan), p, x)
    return jnp.sum(x * x)


@pytest.fixture(scope="module")
def data():
    keys = jax.random.split(jax.random.key(0), 2 * N + 1)
    params = [{"w": jax.random.normal(keys[2 * i], (D, D)) / 3,
               "mlp": {"w": jax.random.normal(keys[2 * i + 1], (D, D)) / 3}} for i in range(N)]
    return params, jax.random.normal(keys[-1], (B, D))


def compiled(rules, *, share: bool = True, **defaults) -> rc.CompiledPlan:
    plan = rc.Plan.coerce(rules).with_defaults(**defaults) if defaults else rc.Plan.coerce(rules)
    return rc.compile_plan(rc.resolve(plan, PATHS), share_alike_layers=share)


def traced_grad(plan, params, x):
    TRACES.clear()
    g = jax.jit(jax.grad(loss), static_argnums=2)(params, x, plan)
    return g, TRACES.count("layer")


def test_alike_layers_trace_once_and_match_the_unshared_plan(data):
    params, x = data
    rules = {"layers.*": {"save": ["h", "mlp/act"]}}
    shared, plain = compiled(rules), compiled(rules, share=False)
    assert dict(shared.shared) == {f"layers.{i}": "layers.0" for i in range(1, N)}
    g_shared, n_shared = traced_grad(shared, params, x)
    g_plain, n_plain = traced_grad(plain, params, x)
    assert (n_shared, n_plain) == (1, N)
    assert_close(g_shared, g_plain)
    assert_close(g_shared, jax.grad(loss)(params, x, None))

    v_shared = rc.verify(loss, params, x, shared, plan=shared)
    v_plain = rc.verify(loss, params, x, plain, plan=plain)
    assert v_shared.ok and v_plain.ok
    named = [r.name for r in v_shared.report.residuals if r.kind == "named"]
    assert named == ["layers.0/h"] * N  # every layer keeps its h, under the group's name
    assert sorted(r.name.split("/")[0] for r in v_plain.report.residuals if r.kind == "named") == \
        sorted(f"layers.{i}" for i in range(N))
    assert v_shared.report.nbytes("device") == v_plain.report.nbytes("device")
    assert any("run as 'layers.0'" in n and "layers.5" in n for n in v_shared.notes)


def test_unlike_layers_get_one_trace_per_group(data):
    params, x = data
    plan = compiled({"layers.*": {"save": ["h"]}, "layers.[0-1]": "recompute",
                     "layers.4": "dots"})
    assert dict(plan.shared) == {"layers.1": "layers.0", "layers.3": "layers.2",
                                 "layers.5": "layers.2"}
    g, n = traced_grad(plan, params, x)
    assert n == 3  # {0, 1}, {2, 3, 5}, {4}
    assert_close(g, jax.grad(loss)(params, x, None))
    v = rc.verify(loss, params, x, plan, plan=plan)
    assert v.ok
    assert sorted(r.name for r in v.report.residuals if r.kind == "named") == ["layers.2/h"] * 3


def test_what_is_never_shared():
    paths = ["layers", *(f"layers.{i}" for i in range(3))]

    def shared(rules, stacks=()):
        r = rc.resolve(rc.Plan.coerce(rules), paths, stacks=stacks)
        return dict(rc.compile_plan(r, share_alike_layers=True).shared)

    assert shared({"layers.*": "recompute"}) == {"layers.1": "layers.0", "layers.2": "layers.0"}
    assert shared({"layers": "recompute"}) == {}                     # no boundary inside a layer
    assert shared({"layers": {"save": ["h"]}, "layers.*": "recompute"}) == {}  # inside a boundary
    assert shared({"layers.*": "recompute"}, stacks=["layers"]) == {}  # stacks scan their groups
    assert shared({"layers.*": "custom"}) == {}                      # rule runs report their path
    assert dict(rc.compile_plan(rc.resolve(rc.Plan.coerce({"layers.*": "recompute"}), paths)).shared) == {}


def test_a_shared_boundary_does_not_keep_the_function_alive(data):
    params, x = data
    plan = compiled({"layers.*": "recompute"})

    def make():
        def body(p, x):
            return jnp.tanh(x @ p["w"])
        return body

    body = make()
    ref = weakref.ref(body)
    jax.grad(lambda x: jnp.sum(rc.adapter.call_module(plan, "layers.1", body, params[1], x)))(x)
    del body
    gc.collect()
    assert ref() is None


# -- names no tag produces: errors at trace time (strict), warnings (lenient) ---------------------

def test_a_name_no_tag_produces_fails_when_traced(data):
    params, x = data
    plan = compiled({"layers.*": {"save": ["hh"]}}, share=False)
    with pytest.raises(rc.UnproducedNameError,
                       match=r"(?s)module 'layers.0'.*keeps 'hh'.*tags traced here: 'act', 'h'.*Fix"):
        jax.grad(loss)(params, x, plan)
    relative = compiled({"layers.*": {"save": ["mlp/hh"]}}, share=False)
    with pytest.raises(rc.UnproducedNameError, match=r"module 'layers.0'.*keeps 'hh'"):
        jax.grad(loss)(params, x, relative)

    @rc.checkpoint({"save": ["hh"]})
    def f(x):
        return jnp.sum(jnp.sin(rc.checkpoint_name(x * 2, "h")))

    with pytest.raises(rc.UnproducedNameError, match=r"module '<root>'.*'hh'"):
        jax.grad(f)(x)


def test_lenient_plans_warn_and_verify_still_reports(data):
    params, x = data
    lenient = compiled({"layers.*": {"save": ["h", "hh"]}}, share=False, mode="lenient")
    with pytest.warns(rc.UnproducedNameWarning, match=r"module 'layers.\d'.*keeps 'hh'") as got:
        g = jax.grad(loss)(params, x, lenient)
    assert sorted(str(w.message).split("'")[1] for w in got) == [f"layers.{i}" for i in range(N)]
    assert_close(g, jax.grad(loss)(params, x, None))

    strict = compiled({"layers.*": {"save": ["h", "hh"]}}, share=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = rc.verify(loss, params, x, strict, plan=strict, strict=False)  # no trace-time raise
    assert len(v.problems) == N and all("'hh'" in p for p in v.problems)


def test_jax_own_tags_count_as_produced(data):
    _, x = data

    @rc.checkpoint({"save": ["h"]})
    def f(x):
        inner = jax.jit(lambda y: jax.ad_checkpoint.checkpoint_name(y * 2, "h"))
        return jnp.sum(jnp.sin(inner(x)))

    rep = rc.saved_residuals(f, x)
    assert [r.name for r in rep.select() if r.kind == "named"] == ["h"]
