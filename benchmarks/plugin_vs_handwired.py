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

``--trace-sharing`` instead times trace + lower of a deep list model (default 96 layers, each
layer one call with its parameters as arguments) four ways: hand-wired with one shared name and
policy (``jax.checkpoint`` of one function: JAX traces the body once), hand-wired with per-layer
names and policies, and the plugin with and without ``compile_plan(..., share_alike_layers=True)``;
it prints how many times each traced the layer body and the ratio plugin-shared / hand-wired-shared.

``--adapters`` measures the build (trace + lower of ``jit(grad)``) of a Flax NNX and an Equinox
list model (``self.layers`` a list of layer modules called in a loop) at 48 and 96 layers:
hand-wired (``nnx.remat`` of one function for every layer; for Equinox ``eqx.filter_checkpoint``
of one function, which builds a new ``jax.checkpoint`` per call, and ``jax.checkpoint`` of one
function over the layer's arrays), and ``annotate(model, plan)`` as it is by default (alike
layers share one trace), with ``--per-layer`` also ``share_alike_layers=False``. Per route: wall
and CPU time (medians, routes alternated) and the Python function calls of one build (cProfile,
deterministic), each as a ratio to ``nnx.remat`` / ``eqx.filter_checkpoint``, and how many times
the route traced the layer body.

Run: ``python benchmarks/plugin_vs_handwired.py [--layers 8 --d-model 512 --batch 256 --reps 7]``,
``python benchmarks/plugin_vs_handwired.py --trace-sharing [--layers 96 --reps 5]`` or
``python benchmarks/plugin_vs_handwired.py --adapters [--per-layer] [--reps 7]``.
This is a benchmark that prints figures, not a timed test; tests/test_measure_handwired.py
asserts the equality part.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import pstats
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


def _trace_lower(loss_fn: Callable[..., jax.Array], args: tuple[Any, ...]) -> tuple[float, float]:
    step = jax.jit(jax.grad(loss_fn))
    t0 = time.perf_counter()
    traced = step.trace(*args)
    t1 = time.perf_counter()
    traced.lower()
    return t1 - t0, time.perf_counter() - t1


def _sharing_routes(n_layers: int, count: list[int]) -> dict[str, Callable[..., jax.Array]]:
    """Fresh loss functions (nothing cached from an earlier repetition) for the four routes."""
    def body(tag: Callable[[jax.Array, str], jax.Array], name: str) -> Callable[..., jax.Array]:
        def layer(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
            count[0] += 1
            h = tag(x @ p["w1"], name)
            return x + jnp.tanh(h) @ p["w2"]
        return layer

    def head(x: jax.Array) -> jax.Array:
        return jnp.mean(x ** 2)

    one = jax.checkpoint(body(jax_checkpoint_name, "hidden"),
                         policy=jax.checkpoint_policies.SaveOnlyTheseNames(frozenset({"hidden"})))
    per_layer = [jax.checkpoint(body(jax_checkpoint_name, f"layers.{i}/hidden"),
                                policy=jax.checkpoint_policies.SaveOnlyTheseNames(
                                    frozenset({f"layers.{i}/hidden"})))
                 for i in range(n_layers)]
    paths = ["layers", *(f"layers.{i}" for i in range(n_layers))]
    resolution = remat_common.resolve(Plan.coerce(PLAN), paths)
    plans = {"plugin, shared": remat_common.compile_plan(resolution, share_alike_layers=True),
             "plugin, per layer": remat_common.compile_plan(resolution)}
    layer = body(remat_common.checkpoint_name, "hidden")

    def hand_shared(params: Any, x: jax.Array) -> jax.Array:
        for p in params["layers"]:
            x = one(p, x)
        return head(x)

    def hand_per_layer(params: Any, x: jax.Array) -> jax.Array:
        for f, p in zip(per_layer, params["layers"]):
            x = f(p, x)
        return head(x)

    def plugin(plan: Any) -> Callable[..., jax.Array]:
        def loss_fn(params: Any, x: jax.Array) -> jax.Array:
            for i, p in enumerate(params["layers"]):
                x = remat_common.adapter.call_module(plan, f"layers.{i}", layer, p, x)
            return head(x)
        return loss_fn

    return {"hand-wired, shared": hand_shared, "hand-wired, per layer": hand_per_layer,
            **{name: plugin(plan) for name, plan in plans.items()}}


def trace_sharing(*, n_layers: int = 96, d_model: int = 64, batch: int = 8, reps: int = 5
                  ) -> dict[str, float]:
    """Trace + lower of a deep list model, hand-wired and through a plan; returns the medians."""
    kp, kx = jax.random.split(jax.random.key(0))
    params = init(kp, d_model, 4 * d_model, n_layers)
    args = (params, jax.random.normal(kx, (batch, d_model)))
    count = [0]
    print(f"jax {jax.__version__}, jax_remat3={jax.config.jax_remat3}; trace + lower of jit(grad) of "
          f"{n_layers} list layers, d_model {d_model}, batch {batch}; median of {reps}, "
          "order rotated, fresh functions each time")
    times: dict[str, list[tuple[float, float]]] = {}
    bodies: dict[str, int] = {}
    for r in range(reps):
        routes = _sharing_routes(n_layers, count)
        names = list(routes)
        for name in names[r % len(names):] + names[:r % len(names)]:
            count[0] = 0
            times.setdefault(name, []).append(_trace_lower(routes[name], args))
            bodies[name] = count[0]
    med = {n: (statistics.median(t for t, _ in ts), statistics.median(lo for _, lo in ts))
           for n, ts in times.items()}
    for n, (t, lo) in med.items():
        print(f"{n:>22}: trace {t * 1e3:8.1f} ms  lower {lo * 1e3:7.1f} ms  total "
              f"{(t + lo) * 1e3:8.1f} ms  layer body traced {bodies[n]}x")
    base = sum(med["hand-wired, shared"])
    ratios = {n: sum(v) / base for n, v in med.items()}
    print("ratio to hand-wired (shared names): " + ", ".join(f"{n} {r:.2f}" for n, r in ratios.items()))
    return ratios


# -- the adapters: NNX and Equinox list models -----------------------------------------------------

def _nnx_routes(n_layers: int, d_model: int, count: list[int]) -> dict[str, Callable[[], Any]]:
    """``{route: make}``; ``make()`` builds a fresh model (new classes: no trace cached by an
    earlier repetition is reused) and returns ``(loss, args)`` for ``jit(grad(loss))(*args)``."""
    from flax import nnx

    import flax_remat_plugin as frp

    def classes(tag: Callable[[jax.Array, str], jax.Array]) -> tuple[type, type]:
        class Layer(nnx.Module):
            def __init__(self, rngs: nnx.Rngs) -> None:
                self.w1 = nnx.Linear(d_model, 4 * d_model, use_bias=False, rngs=rngs)
                self.w2 = nnx.Linear(4 * d_model, d_model, use_bias=False, rngs=rngs)

            def __call__(self, x: jax.Array) -> jax.Array:
                count[0] += 1
                return x + self.w2(jnp.tanh(tag(self.w1(x), "hidden")))

        class Model(nnx.Module):
            def __init__(self, run: Callable[..., jax.Array] | None) -> None:
                rngs = nnx.Rngs(0)
                self.layers = nnx.List([Layer(rngs) for _ in range(n_layers)])
                self.run = run

            def __call__(self, x: jax.Array) -> jax.Array:
                for layer in self.layers:
                    x = layer(x) if self.run is None else self.run(layer, x)
                return x

        return Layer, Model

    def loss_of(model: Any) -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
        graphdef, state = nnx.split(model)

        def loss(state: Any, x: jax.Array) -> jax.Array:
            return jnp.mean(nnx.merge(graphdef, state, copy=True)(x) ** 2)

        return loss, (state,)

    def hand() -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
        _, model_cls = classes(jax_checkpoint_name)
        policy = jax.checkpoint_policies.SaveOnlyTheseNames(frozenset({"hidden"}))
        run = nnx.remat(lambda layer, x: layer(x), policy=policy)  # one function for every layer
        return loss_of(model_cls(run))

    def annotated(**kw: Any) -> Callable[[], tuple[Callable[..., jax.Array], tuple[Any, ...]]]:
        def make() -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
            _, model_cls = classes(remat_common.checkpoint_name)
            return loss_of(frp.annotate(model_cls(None), PLAN, **kw))
        return make

    return {"hand-wired nnx.remat": hand, "annotate (default)": annotated(),
            "annotate, per layer": annotated(share_alike_layers=False)}


def _eqx_routes(n_layers: int, d_model: int, count: list[int]) -> dict[str, Callable[[], Any]]:
    """As :func:`_nnx_routes`, for an Equinox model holding its layers in a Python list."""
    import equinox as eqx

    import equinox_remat_plugin as erp

    policy = jax.checkpoint_policies.SaveOnlyTheseNames(frozenset({"hidden"}))

    def classes(tag: Callable[[jax.Array, str], jax.Array]) -> tuple[type, type]:
        class Layer(eqx.Module):
            w1: jax.Array
            w2: jax.Array

            def __init__(self, key: jax.Array) -> None:
                k1, k2 = jax.random.split(key)
                self.w1 = jax.random.normal(k1, (d_model, 4 * d_model)) / d_model ** 0.5
                self.w2 = jax.random.normal(k2, (4 * d_model, d_model)) / (4 * d_model) ** 0.5

            def __call__(self, x: jax.Array) -> jax.Array:
                count[0] += 1
                return x + jnp.tanh(tag(x @ self.w1, "hidden")) @ self.w2

        class Model(eqx.Module):
            layers: list[Any]

            def __init__(self) -> None:
                self.layers = [Layer(k) for k in jax.random.split(jax.random.key(0), n_layers)]

        return Layer, Model

    def loss_of(model: Any, run: Callable[..., jax.Array]
                ) -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
        dynamic, static = eqx.partition(model, eqx.is_array)

        def loss(dynamic: Any, x: jax.Array) -> jax.Array:
            m = eqx.combine(dynamic, static)
            for layer in m.layers:
                x = run(layer, x)
            return jnp.mean(x ** 2)

        return loss, (dynamic,)

    def hand_filter() -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
        _, model_cls = classes(jax_checkpoint_name)
        # eqx.filter_checkpoint builds a new jax.checkpoint per call: JAX traces every layer.
        return loss_of(model_cls(), eqx.filter_checkpoint(lambda layer, x: layer(x), policy=policy))

    def hand_jax() -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
        _, model_cls = classes(jax_checkpoint_name)
        model = model_cls()
        static = eqx.partition(model.layers[0], eqx.is_array)[1]  # every layer's: they are alike
        one = jax.checkpoint(lambda dyn, x: eqx.combine(dyn, static)(x), policy=policy)
        return loss_of(model, lambda layer, x: one(eqx.filter(layer, eqx.is_array), x))

    def annotated(**kw: Any) -> Callable[[], tuple[Callable[..., jax.Array], tuple[Any, ...]]]:
        def make() -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
            _, model_cls = classes(remat_common.checkpoint_name)
            return loss_of(erp.annotate(model_cls(), PLAN, **kw), lambda layer, x: layer(x))
        return make

    return {"hand-wired eqx.filter_checkpoint": hand_filter,
            "hand-wired jax.checkpoint": hand_jax, "annotate (default)": annotated(),
            "annotate, per layer": annotated(share_alike_layers=False)}


#: The hand-written route each framework's build cost is held to (issue 26: <= 1.1x).
HAND = {"Flax NNX": "hand-wired nnx.remat", "Equinox": "hand-wired eqx.filter_checkpoint"}


def _build_cost(loss_fn: Callable[..., jax.Array], args: tuple[Any, ...]) -> tuple[float, float]:
    """Wall and CPU seconds (``time.process_time``: this process only, so other jobs on the
    machine weigh on it far less than on the wall clock) of trace + lower of ``jit(grad(loss))``,
    after a garbage collection (so one route does not pay for the garbage of another)."""
    step = jax.jit(jax.grad(loss_fn))
    gc.collect()
    w, c = time.perf_counter(), time.process_time()
    step.trace(*args).lower()
    return time.perf_counter() - w, time.process_time() - c


def _python_calls(loss_fn: Callable[..., jax.Array], args: tuple[Any, ...]) -> int:
    """Python function calls made by trace + lower of ``jit(grad(loss))`` (cProfile's count): the
    same on any machine and under any load, for the same program."""
    step = jax.jit(jax.grad(loss_fn))
    prof = cProfile.Profile()
    prof.enable()
    step.trace(*args).lower()
    prof.disable()
    return pstats.Stats(prof).total_calls  # type: ignore[attr-defined,no-any-return]


def adapter_trace_sharing(*, layer_counts: tuple[int, ...] = (48, 96), d_model: int = 64,
                          batch: int = 8, reps: int = 7, per_layer: bool = False
                          ) -> dict[tuple[str, int], dict[str, dict[str, float]]]:
    """Build cost (trace + lower of ``jit(grad(loss))``) of an NNX and an Equinox list model at
    each layer count, hand-wired and annotated (by default; with ``per_layer`` also with
    ``share_alike_layers=False``, which traces every layer: slow at these depths).

    Three figures per route, each a ratio to :data:`HAND`'s route: wall time and CPU time
    (``time.process_time``), medians of ``reps`` repetitions that alternate the routes (rotated
    order, fresh classes each time), and the Python function calls of one more build
    (cProfile: deterministic, what no machine load changes). Prints the table; returns
    ``{(framework, layers): {route: {"wall", "cpu", "calls"}}}`` (the ratios)."""
    x = jax.random.normal(jax.random.key(1), (batch, d_model))
    out: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    rows: list[tuple[str, int, str, dict[str, float], dict[str, float], int]] = []
    for framework, routes_of in (("Flax NNX", _nnx_routes), ("Equinox", _eqx_routes)):
        for n_layers in layer_counts:
            count = [0]
            routes = routes_of(n_layers, d_model, count)
            if not per_layer:
                routes = {k: v for k, v in routes.items() if k != "annotate, per layer"}
            print(f"{framework}: trace + lower of jit(grad) of {n_layers} list layers, d_model "
                  f"{d_model}, batch {batch}; median of {reps}, order rotated, fresh classes "
                  "each time", flush=True)
            names = list(routes)
            for name in names:  # once first: imports and JAX's own one-time caches
                loss, args = routes[name]()
                _build_cost(loss, (*args, x))
            times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
            bodies: dict[str, int] = {}
            for r in range(reps):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    loss, args = routes[name]()
                    count[0] = 0
                    times[name].append(_build_cost(loss, (*args, x)))
                    bodies[name] = count[0]
            calls = {}
            for name in names:
                loss, args = routes[name]()
                calls[name] = _python_calls(loss, (*args, x))
            med = {n: {"wall": statistics.median(w for w, _ in ts),
                       "cpu": statistics.median(c for _, c in ts), "calls": float(calls[n])}
                   for n, ts in times.items()}
            hand = med[HAND[framework]]
            ratios = {n: {k: v[k] / hand[k] for k in v} for n, v in med.items()}
            for n, v in med.items():
                rows.append((framework, n_layers, n, v, ratios[n], bodies[n]))
                print(f"{n:>34}: wall {v['wall']:6.3f} s ({ratios[n]['wall']:.2f}x)  cpu "
                      f"{v['cpu']:6.3f} s ({ratios[n]['cpu']:.2f}x)  calls {int(v['calls']):>9,} "
                      f"({ratios[n]['calls']:.3f}x)  layer body traced {bodies[n]}x", flush=True)
            out[(framework, n_layers)] = ratios
    print("\n| framework | layers | route | wall | CPU | Python calls | layer body traced |\n"
          "|---|---|---|---|---|---|---|")
    for framework, n_layers, n, v, q, b in rows:
        print(f"| {framework} | {n_layers} | {n} | {v['wall']:.3f} s ({q['wall']:.2f}x) | "
              f"{v['cpu']:.3f} s ({q['cpu']:.2f}x) | {int(v['calls']):,} ({q['calls']:.3f}x) | {b}x |")
    print("(ratios to " + " / ".join(HAND.values()) + ")")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=None, help="default 8 (96 with --trace-sharing)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=None, help="default 7 (5 with --trace-sharing)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--trace-sharing", action="store_true",
                    help="time trace + lower of a deep list model, shared and per-layer names")
    ap.add_argument("--adapters", action="store_true",
                    help="time trace + lower of NNX and Equinox list models at 48 and 96 layers "
                         "(or --layers), annotated by default vs hand-written")
    ap.add_argument("--per-layer", action="store_true",
                    help="with --adapters: also annotate(..., share_alike_layers=False)")
    a = ap.parse_args()
    if a.adapters:
        adapter_trace_sharing(layer_counts=(a.layers,) if a.layers else (48, 96),
                              reps=a.reps or 7, per_layer=a.per_layer)
    elif a.trace_sharing:
        trace_sharing(n_layers=a.layers or 96, reps=a.reps or 5)
    else:
        main(n_layers=a.layers or 8, d_model=a.d_model, batch=a.batch, reps=a.reps or 7,
             steps=a.steps)
