"""A small plain-JAX residual MLP that ``remat report`` and the measurement tests run under plans.

Each layer is a module at path ``layers.<i>`` (run through :func:`remat_common.adapter.call_module`) and
tags two activations: ``hidden`` (``x @ w1``) and ``out`` (``tanh(hidden) @ w2``). The step is plain
SGD, so the target needs nothing beyond JAX.
"""

from __future__ import annotations

from typing import Any

import functools

import jax
import jax.numpy as jnp

import remat_common
from remat_common import Plan, checkpoint_name
from remat_common.adapter import call_module, module_scope
from remat_common.measurement import MeasureTarget


def paths(n_layers: int) -> list[str]:
    """Every module path of the model: the stack and its layers."""
    return ["layers", *(f"layers.{i}" for i in range(n_layers))]


def layer(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = checkpoint_name(x @ p["w1"], "hidden")
    y = checkpoint_name(jnp.tanh(h) @ p["w2"], "out")
    return x + y


def init(key: jax.Array, *, d_model: int, hidden: int, n_layers: int,
         wide: dict[int, int] | None = None) -> dict[str, Any]:
    """Parameters; ``wide={i: k}`` gives layer ``i`` a hidden layer ``k`` times ``d_model`` wide."""
    keys = jax.random.split(key, 2 * n_layers + 1)
    widths = [(wide or {}).get(i, 0) * d_model or hidden for i in range(n_layers)]
    layers = [
        {"w1": jax.random.normal(keys[2 * i], (d_model, h)) / d_model ** 0.5,
         "w2": jax.random.normal(keys[2 * i + 1], (h, d_model)) / h ** 0.5}
        for i, h in enumerate(widths)
    ]
    return {"layers": layers, "head": jax.random.normal(keys[-1], (d_model, 1)) / d_model ** 0.5}


def measure_target(plan: Plan | None, *, batch: int, d_model: int = 64, hidden: int | None = None,
                   n_layers: int = 4, seed: int = 0, lr: float = 0.01,
                   wide: dict[int, int] | None = None) -> MeasureTarget:
    """The model under ``plan`` (``None``: un-annotated), as measurement wants it; ``wide``: see
    :func:`init`."""
    hidden = hidden or 4 * d_model
    compiled = None if plan is None else remat_common.compile_plan(
        remat_common.resolve(plan, paths(n_layers)))
    k_param, k_x, k_y = jax.random.split(jax.random.key(seed), 3)
    params = init(k_param, d_model=d_model, hidden=hidden, n_layers=n_layers, wide=wide)
    x = jax.random.normal(k_x, (batch, d_model))
    y = jax.random.normal(k_y, (batch, 1))

    def loss_fn(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
        for i, p in enumerate(params["layers"]):
            # Parameters are closed over, so an 'offload' plan moves only the layer input.
            fun = functools.partial(layer, p)
            if compiled is None:  # un-annotated, but names are still qualified by module path
                with module_scope(f"layers.{i}"):
                    x = fun(x)
            else:
                x = call_module(compiled, f"layers.{i}", fun, x)
        return jnp.mean((x @ params["head"] - y) ** 2)

    def step_fn(params: dict[str, Any], x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss

    return MeasureTarget(loss_fn, (params, x, y), step_fn, (params, x, y), compiled)


def handwired_target(save: tuple[str, ...], *, batch: int, d_model: int = 64,
                     hidden: int | None = None, n_layers: int = 4, seed: int = 0,
                     lr: float = 0.01) -> MeasureTarget:
    """The same model with ``jax.checkpoint(policy=SaveOnlyTheseNames(...))`` written by hand.

    Each layer is a checkpoint whose policy keeps the tags ``layers.<i>/<name>`` for the names in
    ``save``: what ``measure_target({"layers.*": {"save": list(save)}})`` should compile to.
    """
    from jax.ad_checkpoint import checkpoint_name as jax_checkpoint_name

    hidden = hidden or 4 * d_model
    k_param, k_x, k_y = jax.random.split(jax.random.key(seed), 3)
    params = init(k_param, d_model=d_model, hidden=hidden, n_layers=n_layers)
    x = jax.random.normal(k_x, (batch, d_model))
    y = jax.random.normal(k_y, (batch, 1))

    def make_layer(i: int) -> Any:
        def layer_i(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
            h = jax_checkpoint_name(x @ p["w1"], f"layers.{i}/hidden")
            out = jax_checkpoint_name(jnp.tanh(h) @ p["w2"], f"layers.{i}/out")
            return x + out

        # The 0.11 class where it exists (remat3 honours it); 0.12 has only the factory.
        names = [f"layers.{i}/{n}" for n in save]
        cp = jax.checkpoint_policies
        policy = (cp.SaveOnlyTheseNames(frozenset(names)) if hasattr(cp, "SaveOnlyTheseNames")
                  else cp.save_only_these_names(*names))
        return jax.checkpoint(layer_i, policy=policy, prevent_cse=True)

    layers = [make_layer(i) for i in range(n_layers)]

    def loss_fn(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
        for f, p in zip(layers, params["layers"]):
            x = f(p, x)
        return jnp.mean((x @ params["head"] - y) ** 2)

    def step_fn(params: dict[str, Any], x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss

    return MeasureTarget(loss_fn, (params, x, y), step_fn, (params, x, y))
