"""A small multi-layer model in plain JAX with named intermediates, run through the core.

Each layer is the module ``layers.i``; it tags ``h`` (a matmul output) and ``act`` (its tanh).
Weights are closed over, so a layer's only input is its activation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import remat_common as rc

L, B, D = 3, 8, 16
PATHS = ["layers"] + [f"layers.{i}" for i in range(L)]
ACT_BYTES = B * D * 4  # one [B, D] float32 activation


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w_in": jax.random.normal(k1, (L, D, D)) / 4, "w_out": jax.random.normal(k2, (L, D, D)) / 4}


def block(w_in: jax.Array, w_out: jax.Array, x: jax.Array) -> jax.Array:
    h = rc.checkpoint_name(x @ w_in, "h")
    a = rc.checkpoint_name(jnp.tanh(h), "act")
    return x + a @ w_out


def compile_plan(rules, *, stacked: bool = False) -> rc.CompiledPlan:
    return rc.compile_plan(rc.resolve(rc.Plan.coerce(rules), PATHS, stacks=["layers"] if stacked else ()))


def loss_loop(params, x, plan: rc.CompiledPlan | None):
    """Layers unrolled in Python, each run through ``call_module`` (or plainly without a plan)."""
    for i in range(L):
        w_in, w_out = params["w_in"][i], params["w_out"][i]
        fn = lambda x, w_in=w_in, w_out=w_out: block(w_in, w_out, x)  # noqa: E731
        x = fn(x) if plan is None else rc.call_module(plan, f"layers.{i}", fn, x)
    return jnp.sum(x * x)


def loss_scan(params, x, plan: rc.CompiledPlan | None):
    """Layers stacked and run with ``lax.scan``, one scan per layer group of the plan."""
    groups = ((0, L, "layers.0"),) if plan is None else tuple(
        (g.start, g.stop, g.path) for g in rc.layer_groups(plan.resolution, "layers", L))
    for start, stop, path in groups:
        def body(x, w, path=path):
            fn = lambda x: block(w["w_in"], w["w_out"], x)  # noqa: E731
            if plan is None:
                return fn(x), None
            with rc.layer_scope("layers", path):
                return rc.call_module(plan, "layers", fn, x), None
        x, _ = jax.lax.scan(body, x, jax.tree_util.tree_map(lambda a: a[start:stop], params))
    return jnp.sum(x * x)
