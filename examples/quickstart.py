"""Quickstart: say what survives the forward pass, per layer, and see what JAX really keeps.

A four-layer MLP in plain JAX tags two intermediates per layer (``h``, the matmul output, and
``act``, its activation). We (1) write a plan per layer path, (2) resolve and compile it into the
checkpoint policies the installed JAX honours, (3) run every layer through the plan, and
(4) verify: the residuals JAX keeps for the backward pass are exactly the plan's, and gradients
equal the un-annotated model's.

Run: ``./scripts/demo`` (or ``python examples/quickstart.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import remat_common as rc

LAYERS, BATCH, WIDTH = 4, 64, 128
PATHS = [f"layers.{i}" for i in range(LAYERS)]


def layer(w: jax.Array, x: jax.Array) -> jax.Array:
    h = rc.checkpoint_name(x @ w, "h")
    act = rc.checkpoint_name(jax.nn.gelu(h), "act")
    return x + act


def loss(ws: jax.Array, x: jax.Array, plan: rc.CompiledPlan | None) -> jax.Array:
    for i in range(LAYERS):
        fn = lambda x, w=ws[i]: layer(w, x)  # noqa: E731 - weights closed over: only x is an input
        x = fn(x) if plan is None else rc.adapter.call_module(plan, f"layers.{i}", fn, x)
    return jnp.mean(x * x)


def main(layers: int = LAYERS) -> None:
    ws = jax.random.normal(jax.random.key(0), (layers, WIDTH, WIDTH)) / WIDTH**0.5
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    baseline = jax.grad(loss)(ws, x, None)
    caps = rc.capabilities()
    print(f"jax {caps.jax} on {caps.backend}, jax_remat3={caps.remat3}, memory kinds {caps.memory_kinds}")
    if not caps.host_offload_placed:
        print("(on this backend host offload compiles but is not placed; host bytes below are what a GPU/TPU moves)")

    # 1. Plans: later rules win for the paths they match.
    plans = {
        "save everything": {},
        "recompute": {"layers.*": "recompute"},
        "offload first two": {"layers.*": "recompute", "layers.[0-1]": "offload"},
        "keep h": {"layers.*": {"save": ["h"]}},
        "offload h": {"layers.*": {"offload": ["h"]}},
    }
    for name, rules in plans.items():
        # 2. Resolve against the model's module paths and compile to JAX policies.
        plan = rc.compile_plan(rc.resolve(rc.Plan.from_mapping(rules), PATHS))
        # 3 + 4. Run through the plan and verify residuals (strict: raises on any mismatch).
        check = rc.verify(loss, ws, x, plan, plan=plan)
        grads = jax.grad(loss)(ws, x, plan)
        # round-off only: a plan changes where values are computed, not what they are
        tol = 256 * float(np.finfo(baseline.dtype).eps)
        np.testing.assert_allclose(grads, baseline, rtol=tol, atol=tol * float(np.max(np.abs(baseline))))
        rep = check.report
        print(f"\n== {name}: {rules or '(no plan)'}")
        print(plan.describe())
        saved = sorted(rep.names("device"))
        offloaded = sorted(r.name or "?" for r in rep.select(placement="host"))
        print(f"  kept on device: {rep.nbytes('device'):>8,d} bytes  named: {', '.join(saved) or '-'}")
        print(f"  kept on host:   {rep.nbytes('host'):>8,d} bytes  named: {', '.join(offloaded) or '-'}")
        print("  gradients equal the un-annotated model's: yes")


if __name__ == "__main__":
    main()
