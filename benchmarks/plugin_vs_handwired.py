"""Plugin vs hand-wired: the same remat policy, written by hand and produced from a plan.

Goal: show that a plan costs nothing at run time. The hand-wired step wraps each layer of a
residual MLP in ``jax.checkpoint(policy=SaveOnlyTheseNames({"layers.<i>/hidden"}))`` and tags
``hidden`` with JAX's own ``checkpoint_name``; the plugin step gets the same policy from the plan
``{"layers.*": {"save": ["hidden"]}}`` through ``remat_common.adapter.call_module`` (the call every
adapter makes). The benchmark

1. compiles both steps and compares the compiled HLO (source metadata stripped), the compiled
   memory figures and FLOPs: they must be identical;
2. times trace + lower + compile of each, side by side (fresh functions each repetition, order
   alternated), and prints the ratio plugin / hand-wired;
3. measures both with ``remat_common.measurement.measure`` (steps interleaved) and prints the step-time ratio.

Run: ``python benchmarks/plugin_vs_handwired.py [--layers 8 --d-model 512 --batch 256 --reps 7]``.
This is a benchmark that prints figures, not a timed test; tests/test_measure_handwired.py
asserts the equality part.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name as jax_checkpoint_name

import remat_common
from remat_common import Plan
from remat_common.internal import normalized_hlo
from remat_common.measurement import MeasureTarget, MemoryFigures, count_flops

PLAN = {"layers.*": {"save": ["hidden"]}}


def init(key: jax.Array, d_model: int, hidden: int, n_layers: int) -> dict[str, Any]:
    keys = jax.random.split(key, 2 * n_layers + 1)
    return {
        "layers": [{"w1": jax.random.normal(keys[2 * i], (d_model, hidden)) / d_model ** 0.5,
                    "w2": jax.random.normal(keys[2 * i + 1], (hidden, d_model)) / hidden ** 0.5}
                   for i in range(n_layers)],
        "head": jax.random.normal(keys[-1], (d_model, 1)) / d_model ** 0.5,
    }


def _step(loss_fn: Callable[..., jax.Array]) -> Callable[..., Any]:
    def step_fn(params: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda w, g: w - 0.01 * g, params, grads), loss
    return step_fn


def handwired(args: tuple[Any, ...], n_layers: int) -> MeasureTarget:
    """Each layer: jax.checkpoint with a SaveOnlyTheseNames policy written by hand."""
    def make(i: int) -> Callable[..., jax.Array]:
        def layer(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
            h = jax_checkpoint_name(x @ p["w1"], f"layers.{i}/hidden")
            return x + jax_checkpoint_name(jnp.tanh(h) @ p["w2"], f"layers.{i}/out")
        policy = jax.checkpoint_policies.SaveOnlyTheseNames(frozenset({f"layers.{i}/hidden"}))
        return jax.checkpoint(layer, policy=policy, prevent_cse=True)

    layers = [make(i) for i in range(n_layers)]

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        for f, p in zip(layers, params["layers"]):
            x = f(p, x)
        return jnp.mean((x @ params["head"] - y) ** 2)

    return MeasureTarget(loss_fn, args, _step(loss_fn), args)


def plugin(args: tuple[Any, ...], n_layers: int) -> MeasureTarget:
    """The same model run through a plan: resolve, compile, call_module per layer."""
    paths = ["layers", *(f"layers.{i}" for i in range(n_layers))]
    compiled = remat_common.compile_plan(remat_common.resolve(Plan.coerce(PLAN), paths))

    def layer(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        h = remat_common.checkpoint_name(x @ p["w1"], "hidden")
        return x + remat_common.checkpoint_name(jnp.tanh(h) @ p["w2"], "out")

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        for i, p in enumerate(params["layers"]):
            x = remat_common.adapter.call_module(compiled, f"layers.{i}", functools.partial(layer, p), x)
        return jnp.mean((x @ params["head"] - y) ** 2)

    return MeasureTarget(loss_fn, args, _step(loss_fn), args, compiled)


def trace_and_compile(target: MeasureTarget) -> tuple[float, float, Any]:
    t0 = time.perf_counter()
    lowered = jax.jit(target.step_fn).lower(*target.step_args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, compiled


def main(*, n_layers: int = 8, d_model: int = 512, batch: int = 256, reps: int = 7,
         steps: int = 10) -> dict[str, Any]:
    """Runs the comparison and prints it; returns the figures."""
    hidden = 4 * d_model
    kp, kx, ky = jax.random.split(jax.random.key(0), 3)
    args = (init(kp, d_model, hidden, n_layers), jax.random.normal(kx, (batch, d_model)),
            jax.random.normal(ky, (batch, 1)))
    routes = {"handwired": handwired, "plugin": plugin}
    print(f"jax {jax.__version__} on {jax.default_backend()}, jax_remat3={jax.config.jax_remat3}; "
          f"{n_layers} layers, d_model {d_model}, hidden {hidden}, batch {batch}")

    # 1. identical programs
    compiled = {name: trace_and_compile(make(args, n_layers))[2] for name, make in routes.items()}
    hlo = {name: normalized_hlo(c) for name, c in compiled.items()}
    mem = {name: MemoryFigures.from_compiled(c) for name, c in compiled.items()}
    flops = {name: count_flops(c).flops for name, c in compiled.items()}
    same_hlo = hlo["handwired"] == hlo["plugin"]
    print(f"compiled HLO identical (metadata stripped): {same_hlo} "
          f"({len(hlo['plugin'].splitlines())} lines)")
    print(f"memory_analysis identical: {mem['handwired'] == mem['plugin']} "
          f"(temp {mem['plugin'].temp_size_in_bytes} B, argument "
          f"{mem['plugin'].argument_size_in_bytes} B, output {mem['plugin'].output_size_in_bytes} B)")
    print(f"FLOPs identical: {flops['handwired'] == flops['plugin']} ({flops['plugin']:.4g})")

    # 2. trace + compile time, side by side
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in routes}
    names = list(routes)
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            target = routes[name](args, n_layers)  # fresh functions: no trace cache hit
            lower_s, compile_s, _ = trace_and_compile(target)
            times[name].append((lower_s, compile_s))
    med = {n: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts),
               statistics.median(t[0] + t[1] for t in ts)) for n, ts in times.items()}
    for n in names:
        print(f"{n:>10}: trace+lower {med[n][0] * 1e3:8.1f} ms  compile {med[n][1] * 1e3:8.1f} ms  "
              f"total {med[n][2] * 1e3:8.1f} ms  (median of {reps})")
    ratio = med["plugin"][2] / med["handwired"][2]
    print(f"trace+compile ratio plugin / hand-wired: {ratio:.3f} "
          f"(trace+lower alone: {med['plugin'][0] / med['handwired'][0]:.3f})")

    # 3. step time, interleaved
    rep = remat_common.measurement.measure({n: make(args, n_layers) for n, make in routes.items()},
                               steps=steps, warmup=2, baseline="handwired")
    step_ratio = rep["plugin"].step_time_ratio
    print(f"step time: hand-wired {rep['handwired'].timing.median_s * 1e3:.2f} ms, plugin "
          f"{rep['plugin'].timing.median_s * 1e3:.2f} ms, ratio {step_ratio:.3f} "
          f"(median of {steps}, interleaved)")
    def key(r: Any) -> tuple[Any, ...]:
        return (r.kind, r.name, r.shape, r.dtype, r.placement)

    same_res = [key(r) for r in rep["plugin"].residuals] == [key(r) for r in rep["handwired"].residuals]
    print(f"residuals identical (kind, name, shape, placement): {same_res}, "
          f"{rep['plugin'].device_bytes} B on device")
    return {"same_hlo": same_hlo, "same_memory": mem["handwired"] == mem["plugin"],
            "same_flops": flops["handwired"] == flops["plugin"], "compile_ratio": ratio,
            "step_ratio": step_ratio}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    main(n_layers=a.layers, d_model=a.d_model, batch=a.batch, reps=a.reps, steps=a.steps)
