"""``annotate`` in both adapters: alike list layers trace once (by default;
``share_alike_layers=False`` opts out).

Asserted by complexity, not wall time: a Python side effect in the layer body counts how often JAX
traces it (once per group of alike layers with sharing, once per layer without), with gradients
checked against the unshared plan in float64, under ``jax_remat3`` off and on. Models are tiny.
"""

from __future__ import annotations

import collections
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import equinox_remat_plugin as erp  # noqa: E402
import flax_remat_plugin as frp  # noqa: E402
import remat_common as rc  # noqa: E402
from fixtures.tolerance import assert_close  # noqa: E402
from fixtures.work import lines_run  # noqa: E402

N, D, B = 4, 4, 2
TRACES: list[str] = []
SAVE_H = {"layers.*": {"save": ["h"]}}
TWO_GROUPS = {"layers.*": {"save": ["h"]}, "layers.[0-1]": "recompute"}  # {0, 1} and {2, 3}


def f64(tree):
    """``tree`` with its float arrays in float64 (under ``jax.enable_x64``): models are built in
    float32, so their random initialisation is not compiled again for float64."""
    return jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, tree)


def traced(fn, *args):
    """``fn(*args)`` and how many times a layer body was traced meanwhile."""
    TRACES.clear()
    out = fn(*args)
    return out, len(TRACES)


# -- Flax NNX --------------------------------------------------------------------------------------

def nnx_classes(label: str = "nnx") -> tuple[type, type]:
    """A layer class (its traces counted under ``label``) and a model class holding ``N`` of them
    in an ``nnx.List``: new classes per test, so no trace cached by an earlier test (keyed on the
    class) is reused."""
    class NLayer(nnx.Module):
        def __init__(self, rngs: nnx.Rngs, *, dropout: float):
            self.lin = nnx.Linear(D, D, rngs=rngs)
            self.drop = nnx.Dropout(dropout, rngs=rngs) if dropout else None

        def __call__(self, x, scale=1.0):
            TRACES.append(label)
            h = rc.checkpoint_name(self.lin(x), "h")  # lin keeps its class: placed by path finder
            if self.drop is not None:
                h = self.drop(h)
            return x + jnp.tanh(h) * scale

    class NModel(nnx.Module):
        def __init__(self, *, dropout: float = 0.0):
            rngs = nnx.Rngs(jax.random.key(0, impl="unsafe_rbg"))
            self.layers = nnx.List([NLayer(rngs, dropout=dropout) for _ in range(N)])

        def __call__(self, x, scale=1.0):
            for layer in self.layers:
                x = layer(x, scale)
            return x

    return NLayer, NModel


def nnx_model(plan, share: bool, *, classes) -> nnx.Module:
    return frp.annotate(classes[1](), plan, share_alike_layers=share)


def nnx_traces(model, *, scale=1.0):
    """How many times ``jit(grad)`` of a loss over ``model`` traces a layer body (traced only), and
    the traced program."""
    graphdef, state = nnx.split(model)

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state, copy=True)(x, scale) ** 2)

    return traced(jax.make_jaxpr(jax.grad(loss)), state, jnp.ones((B, D)))[::-1]


def test_nnx_alike_layers_trace_once_per_group(remat3):
    c = nnx_classes()
    assert nnx_traces(nnx_model(SAVE_H, True, classes=c))[0] == 1
    assert nnx_traces(nnx_model(SAVE_H, False, classes=c))[0] == N
    assert nnx_traces(nnx_model(TWO_GROUPS, True, classes=c))[0] == 2  # {0, 1} and {2, 3}
    # gradients: the train step below (sharing changes what is traced, never the values)


class _Half:
    """0.5 as an unhashable Python object (a static argument that cannot key a cache)."""

    __hash__ = None  # type: ignore[assignment]

    def __rmul__(self, other):
        return other * 0.5


def test_nnx_unhashable_static_argument_traces_per_layer():
    model = nnx_model(SAVE_H, True, classes=nnx_classes())
    assert (nnx_traces(model, scale=_Half())[0], nnx_traces(model, scale=0.5)[0]) == (N, 1)
    x = jnp.ones((B, D))
    assert_close(model(x, _Half()), model(x, 0.5))


@pytest.mark.cpu_figures(
    "float64 exactness: XLA:TPU emulates float64 (these gradients differed by 1e-8 "
    "at a scale of 1e-8 on a v5e chip) and cannot compile the reduce_precision "
    "jax.checkpoint puts on a float64 residual (UNIMPLEMENTED, also a plain "
    "jax.checkpoint, seen deviceless for v5e)")
def test_nnx_inplace_train_step_with_dropout_and_optimizer():
    """Two groups of alike layers with dropout, trained in place by an ``nnx.jit`` step with an
    ``nnx.Optimizer``, side by side with the same model annotated without sharing (one step, one
    compile): the same losses, parameters and rng counts, in float64 (the parameters after an SGD
    step are the gradients, checked)."""
    shared_cls, plain_cls = nnx_classes("shared"), nnx_classes("plain")
    with jax.enable_x64(True):
        models = [frp.annotate(cls[1](dropout=0.5), TWO_GROUPS, share_alike_layers=share)
                  for cls, share in ((shared_cls, True), (plain_cls, False))]
        for model in models:
            nnx.update(model, f64(nnx.state(model, nnx.Param)))
        opts = [nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param) for model in models]
        x = jnp.asarray(np.linspace(-1.0, 1.0, B * D).reshape(B, D))

        @nnx.jit
        def step(models, opts, x):
            losses = []
            for model, opt in zip(models, opts, strict=True):
                loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
                opt.update(model, grads)
                losses.append(loss)
            return losses

        TRACES.clear()
        first = step(models, opts, x)
        assert collections.Counter(TRACES) == {"shared": 2, "plain": N}  # one trace per group
        second, n = traced(step, models, opts, x)
    assert n == 0
    assert first[0] != second[0]  # the step updated the model in place
    assert_close([first[0], second[0]], [first[1], second[1]])
    shared, plain = models
    assert_close(nnx.state(shared, nnx.Param), nnx.state(plain, nnx.Param))
    counts = [jax.tree.leaves(nnx.state(m, nnx.RngCount)) for m in models]
    assert counts[0] == counts[1] == [2] * N  # each layer's dropout stream drew once per step
    assert frp.compiled_plan(shared).shared == (("layers.1", "layers.0"), ("layers.3", "layers.2"))
    assert type(frp.unannotate(shared).layers[3]) is shared_cls[0]


def test_nnx_shared_names_verify_and_replacement_check():
    NLayer, NModel = nnx_classes()
    model = frp.annotate(NModel(), SAVE_H, share_alike_layers=True)
    assert {type(layer) for layer in model.layers} == {type(model.layers[0])}  # one class, one trace
    x = jnp.ones((B, D))
    plan = frp.compiled_plan(model)
    rep = rc.verify(lambda m: jnp.sum(m(x) ** 2), model, plan=plan, strict=True).report
    assert [r.name for r in rep.residuals if r.kind == "named"] == ["layers.0/h"] * N
    model.layers[2] = NLayer(nnx.Rngs(1), dropout=0.0)  # replaced after annotate
    with pytest.raises(rc.PlanError, match=r"module 'layers.2' .*was replaced"):
        frp.compiled_plan(model)


# -- Equinox ---------------------------------------------------------------------------------------

def eqx_classes() -> tuple[type, type]:
    """A layer class (dropout: a PRNG key by keyword) and a model class holding ``N`` of them in a
    Python list: new classes per test, as for NNX."""
    class ELayer(eqx.Module):
        lin: eqx.nn.Linear
        drop: eqx.nn.Dropout

        def __init__(self, key):
            self.lin = eqx.nn.Linear(D, D, key=key)
            self.drop = eqx.nn.Dropout(0.5)

        def __call__(self, x, *, key=None, inference=False):
            TRACES.append("eqx")
            h = rc.checkpoint_name(self.lin(x), "h")  # lin keeps its class
            h = self.drop(h, key=key, inference=bool(inference) or key is None)
            return x + jnp.tanh(h)

    class EModel(eqx.Module):
        layers: list

        def __init__(self):
            self.layers = [ELayer(k) for k in jax.random.split(jax.random.key(0), N)]

        def __call__(self, x, key=None, inference=False):
            keys = [None] * N if key is None else list(jax.random.split(key, N))
            for layer, k in zip(self.layers, keys, strict=True):
                x = layer(x, key=k, inference=inference)
            return x

    return ELayer, EModel


def eqx_traces(model, key=None, **kwargs):
    """How many times ``grad`` of a loss over ``model`` traces a layer body (traced only)."""
    loss = eqx.filter_grad(lambda m, x, k: jnp.sum(m(x, k, **kwargs) ** 2))
    return traced(eqx.filter_make_jaxpr(loss), model, jnp.ones(D), key)[1]


@pytest.mark.cpu_figures(
    "float64 exactness: XLA:TPU emulates float64 (these gradients differed by 1e-8 "
    "at a scale of 1e-8 on a v5e chip) and cannot compile the reduce_precision "
    "jax.checkpoint puts on a float64 residual (UNIMPLEMENTED, also a plain "
    "jax.checkpoint, seen deviceless for v5e)")
def test_eqx_alike_layers_trace_once_per_group(remat3):
    _, EModel = eqx_classes()
    key = jax.random.key(1)  # dropout: a PRNG key passed to each layer by keyword
    assert eqx_traces(erp.annotate(EModel(), SAVE_H, share_alike_layers=True), key) == 1
    assert eqx_traces(erp.annotate(EModel(), SAVE_H, share_alike_layers=False), key) == N
    assert eqx_traces(erp.annotate(EModel(), TWO_GROUPS, share_alike_layers=True), key) == 2
    if remat3:
        return  # gradients: with remat3 off (sharing changes what is traced, never the values)
    with jax.enable_x64(True):  # without dropout: random bits make XLA:CPU compile for seconds
        x = jnp.asarray(np.linspace(-1.0, 1.0, D))
        grad = eqx.filter_grad(lambda m, x: jnp.sum(m(x) ** 2))
        both = eqx.filter_jit(lambda models, x: [grad(m, x) for m in models])  # one compile
        grads = both([f64(erp.annotate(EModel(), TWO_GROUPS, share_alike_layers=share))
                      for share in (True, False)], x)
    assert_close(erp.unwrap(grads[0]), erp.unwrap(grads[1]))


def test_eqx_plan_of_unwrap_verify_and_unhashable_static():
    ELayer, EModel = eqx_classes()
    model = erp.annotate(EModel(), SAVE_H, share_alike_layers=True)
    assert {type(layer) for layer in model.layers} == {type(model.layers[0])}
    plan = erp.plan_of(model)
    assert dict(plan.shared) == {f"layers.{i}": "layers.0" for i in range(1, N)}
    assert type(erp.unwrap(model).layers[3]) is ELayer
    x = jnp.ones(D)
    rep = rc.verify(lambda m: jnp.sum(m(x) ** 2), model, plan=plan, strict=True).report
    assert [r.name for r in rep.residuals if r.kind == "named"] == ["layers.0/h"] * N

    # a Remat written in model code inside a shared layer runs as the first layer's too
    marked = eqx.tree_at(lambda m: [layer.lin for layer in m.layers], EModel(),
                         replace_fn=lambda lin: erp.Remat(lin, "recompute"))
    marked = erp.annotate(marked, SAVE_H, share_alike_layers=True)
    assert [layer.lin.path for layer in marked.layers] == ["layers.0.lin"] * N
    assert erp.plan_of(marked).shared_as("layers.3") == "layers.0"  # checked, no PlanError
    assert eqx_traces(marked, inference=True) == 1

    odd = types.SimpleNamespace(flag=True)  # unhashable non-array argument: traced per layer
    assert eqx_traces(model, inference=odd) == N
    assert eqx_traces(model, inference=True) == 1


# -- the default: one trace per group, per-layer figures ------------------------------------------

DEEP = 96


def test_default_annotate_traces_a_96_layer_body_once_in_both_adapters():
    """``annotate(model, plan)`` with nothing else: a 96-layer list model traces its layer body
    once in each adapter; verify names every layer's residual (96 of ``layers.0/h``) and says
    which layers run as ``layers.0``, counted x96."""
    NLayer, _ = nnx_classes()

    class NDeep(nnx.Module):
        def __init__(self):
            rngs = nnx.Rngs(0)
            self.layers = nnx.List([NLayer(rngs, dropout=0.0) for _ in range(DEEP)])

        def __call__(self, x, scale=1.0):
            for layer in self.layers:
                x = layer(x, scale)
            return x

    ELayer, _ = eqx_classes()

    class EDeep(eqx.Module):
        layers: list

        def __init__(self):
            self.layers = [ELayer(k) for k in jax.random.split(jax.random.key(0), DEEP)]

        def __call__(self, x, key=None, inference=True):
            for layer in self.layers:
                x = layer(x, inference=inference)
            return x

    nmodel, emodel = frp.annotate(NDeep(), SAVE_H), erp.annotate(EDeep(), SAVE_H)
    assert nnx_traces(nmodel)[0] == 1
    assert eqx_traces(emodel) == 1
    for model, plan, x in ((nmodel, frp.compiled_plan(nmodel), jnp.ones((B, D))),
                           (emodel, erp.plan_of(emodel), jnp.ones(D))):
        assert plan.shared_groups() == (("layers.0", tuple(f"layers.{i}" for i in range(DEEP))),)
        v = rc.verify(lambda m: jnp.sum(m(x) ** 2), model, plan=plan, strict=True)
        assert [r.name for r in v.report.residuals if r.kind == "named"] == ["layers.0/h"] * DEEP
        (note,) = [n for n in v.notes if "one shared trace" in n]
        assert f"x{DEEP}, once per layer" in note and "layers.95" in note


def _nnx_trace_work(n: int, annotated: bool) -> int:
    """Python lines run by tracing ``grad`` of a loss over an ``n``-layer NNX list model:
    ``annotate(model, SAVE_H)``, or hand-written ``nnx.remat`` of one function for every layer."""
    NLayer, _ = nnx_classes()
    policy = jax.checkpoint_policies.save_only_these_names("h")
    run = None if annotated else nnx.remat(lambda layer, x: layer(x), policy=policy)

    class Deep(nnx.Module):
        def __init__(self):
            rngs = nnx.Rngs(0)
            self.layers = nnx.List([NLayer(rngs, dropout=0.0) for _ in range(n)])

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x) if run is None else run(layer, x)
            return x

    model = frp.annotate(Deep(), SAVE_H) if annotated else Deep()
    graphdef, state = nnx.split(model)

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state, copy=True)(x) ** 2)

    return lines_run(jax.make_jaxpr(jax.grad(loss)), state, jnp.ones((B, D)))


def _eqx_trace_work(n: int, annotated: bool) -> int:
    """As :func:`_nnx_trace_work` for an Equinox list model; hand-written: ``jax.checkpoint`` of
    one function over the layer's arrays (the cheapest route: ``eqx.filter_checkpoint`` builds a
    new ``jax.checkpoint`` per call and traces every layer)."""
    ELayer, _ = eqx_classes()

    class Deep(eqx.Module):
        layers: list

    model = Deep([ELayer(k) for k in jax.random.split(jax.random.key(0), n)])
    if annotated:
        model = erp.annotate(model, SAVE_H)

        def run(layer, x):
            return layer(x, inference=True)
    else:
        static = eqx.partition(model.layers[0], eqx.is_array)[1]
        one = jax.checkpoint(lambda arrays, x: eqx.combine(arrays, static)(x, inference=True),
                             policy=jax.checkpoint_policies.save_only_these_names("h"))

        def run(layer, x):
            return one(eqx.filter(layer, eqx.is_array), x)

    def loss(model, x):
        for layer in model.layers:
            x = run(layer, x)
        return jnp.sum(x ** 2)

    return lines_run(eqx.filter_make_jaxpr(eqx.filter_grad(loss)), model, jnp.ones(D))


@pytest.mark.parametrize("work", [_nnx_trace_work, _eqx_trace_work], ids=["nnx", "equinox"])
def test_default_annotate_adds_little_trace_work_per_layer(work):
    """The build cost of a deep list model, counted rather than timed (fixtures/work.py): what
    one more layer costs to trace under ``annotate(model, plan)`` by default, in Python lines
    run, is within 5 % of what it costs hand-written (measured 1.8 % NNX, 3.0 % Equinox; before
    the per-call work of a shared layer was cut to lookups, 6.0 % and 6.4 %, with a pass over
    every annotation per call)."""
    for annotated in (False, True):
        work(2, annotated)  # JAX's own first-use caches
    per_layer = {a: (work(12, a) - work(4, a)) / 8 for a in (False, True)}
    assert per_layer[True] <= 1.05 * per_layer[False], per_layer


def test_report_counts_a_shared_boundary_per_layer_and_lists_the_layers():
    """The report's per-module table: a shared boundary's row holds every layer's residuals and
    says so (``shared x4: layers.0, ...``); without sharing, one row per layer of the same total."""
    from remat_common.internal import layer_bytes

    _, NModel = nnx_classes()

    def target(share: bool) -> rc.measurement.MeasureTarget:
        model = frp.annotate(NModel(), SAVE_H, share_alike_layers=share)
        graphdef, state = nnx.split(model)

        def loss(state, x):
            return jnp.sum(nnx.merge(graphdef, state, copy=True)(x) ** 2)

        args = (state, jnp.ones((B, D)))
        return rc.measurement.MeasureTarget(loss, args, jax.grad(loss), args,
                                            frp.compiled_plan(model))

    rep = rc.measurement.measure({"shared": target(True), "per layer": target(False)}, steps=0,
                                 placement=False)
    assert rep.plans[0].shared == (("layers.0", tuple(f"layers.{i}" for i in range(N))),)
    rows, table = layer_bytes(rep)
    label = "layers.0 (shared x4: layers.0, layers.1, layers.2, layers.3)"
    assert label in rows
    per_layer = {f"layers.{i}": table["per layer"][f"layers.{i}"][0] for i in range(N)}
    # each layer keeps its h and its input, which is counted to the layer that reads it: the
    # first layer's input is the step's argument (live anyway), so it keeps only its h
    h = B * D * 4
    assert per_layer == {"layers.0": h, **{f"layers.{i}": 2 * h for i in range(1, N)}}
    assert table["shared"][label][0] == sum(per_layer.values())
    again = rc.measurement.Report.from_json(rep.to_json())
    assert again.plans[0].shared == rep.plans[0].shared
