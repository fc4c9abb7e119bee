"""The Flax NNX adapter touches only what the plan names (issue 11).

Modules the plan does not name keep their class (``type(m) is Cls``); names tagged in them are
still qualified by their path (NNX's graph traversal of the nearest swapped module places them),
and a swapped module replaced after ``annotate`` is refused, never silently skipped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import flax_remat_plugin as frp
import remat_common as rc
from fixtures.tolerance import assert_close

D = 4


class Inner(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(rc.checkpoint_name(self.lin(x), "h"))


class Block(nnx.Module):
    def __init__(self, rngs):
        self.inner = Inner(rngs)
        self.out = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return x + self.out(jnp.sin(rc.checkpoint_name(self.inner(x), "g")))


class Net(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([Block(rngs) for _ in range(2)])

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _loss(m, x):
    return jnp.sum(m(x) ** 2)


def _check(model, x):
    return rc.verify(lambda s: _loss(nnx.merge(nnx.graphdef(model), s, copy=True), x),
                     nnx.state(model), plan=frp.plan_of(model))


def test_only_named_modules_change_class(remat3):
    plain, model = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    x = jnp.linspace(-1.0, 1.0, 2 * D).reshape(2, D)
    state0 = nnx.state(model)
    frp.annotate(model, {"blocks.0": {"offload": ["inner/h"], "save": ["g"]}})
    assert type(model) is Net and type(model.blocks[1]) is Block  # not named: untouched
    assert type(model.blocks[0].inner) is Inner and type(model.blocks[0].inner.lin) is nnx.Linear
    assert isinstance(model.blocks[0], Block) and type(model.blocks[0]) is not Block
    assert jax.tree_util.tree_structure(nnx.state(model)) == jax.tree_util.tree_structure(state0)
    assert_close(model(x), plain(x))
    g0 = nnx.grad(_loss)(plain, x)
    assert_close(nnx.state(nnx.grad(_loss)(model, x)), nnx.state(g0))
    # inner keeps its class, yet its tag is qualified by its path: the plan's relative name holds
    check = _check(model, x)
    assert check.report.names("host") == {"blocks.0.inner/h"}
    assert check.report.names("device") >= {"blocks.0/g"}
    with rc.adapter.collect_tags() as tags:
        model(x)
    assert {t.name for t in tags} == {"blocks.0.inner/h", "blocks.0/g", "h", "g"}  # blocks.1: bare
    frp.unannotate(model)
    assert type(model.blocks[0]) is Block and frp.plan_of(model) is None


def test_nnx_transforms_keep_the_plan(remat3):
    model = Net(nnx.Rngs(1))
    frp.annotate(model, {"blocks.*": "offload"})
    x = jnp.ones((2, D))
    graphdef, state = nnx.split(model)
    again = nnx.merge(graphdef, state)
    assert frp.plan_of(again) == frp.plan_of(model) and type(again.blocks[0].inner) is Inner

    @nnx.jit
    def step(m, x):  # an in-place SGD step
        g = nnx.grad(_loss)(m, x)
        nnx.update(m, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, nnx.state(m, nnx.Param),
                                             nnx.state(g, nnx.Param)))

    ref = Net(nnx.Rngs(1))
    step(model, x)
    step(ref, x)
    assert_close(nnx.state(model), nnx.state(ref))
    assert frp.plan_of(model).boundaries[0].path == "blocks.0" and type(model) is Net


class ScanNet(nnx.Module):
    """Scans its own stack of Inner layers with nnx.scan."""

    def __init__(self, rngs):
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Inner(rngs)

        self.layers = make(rngs)

    def __call__(self, x):
        return nnx.scan(lambda h, layer: (layer(h), None), in_axes=(nnx.Carry, 0),
                        out_axes=(nnx.Carry, 0))(x, self.layers)[0]


def test_a_model_that_scans_its_own_stack(remat3):
    model, plain = ScanNet(nnx.Rngs(2)), ScanNet(nnx.Rngs(2))
    x = jnp.ones((2, D))
    frp.annotate(model, {"layers": {"offload": ["h"]}})  # the scan body: every layer
    assert type(model) is ScanNet and type(model.layers.lin) is nnx.Linear
    assert_close(nnx.state(nnx.grad(_loss)(model, x)), nnx.state(nnx.grad(_loss)(plain, x)))
    state = nnx.state(model)
    grad = jax.jit(jax.grad(lambda s: _loss(nnx.merge(nnx.graphdef(model), s, copy=True), x)))
    text = jax.export.export(grad, platforms=["cuda"])(state).mlir_module()
    assert text.count("annotate_device_placement") >= 2  # layers/h to host and back
    with pytest.raises(rc.PlanError, match=r"'layers\.0' addresses layers of 'layers', one Inner "
                       r"whose\narrays share a leading axis of 3: a stack the model scans itself"
                       r"(.|\n)*stacks=\['layers'\](.|\n)*scan_layers") as e:
        frp.annotate(ScanNet(nnx.Rngs(2)), {"layers.*": "recompute", "layers.0": "offload"})
    assert len(str(e.value)) < 600


def test_a_replaced_module_is_refused():
    model = Net(nnx.Rngs(3))
    frp.annotate(model, {"blocks.*.inner": "recompute"})
    model.blocks[1].inner = Inner(nnx.Rngs(4))  # a plain module where the plan put a boundary
    with pytest.raises(rc.PlanError, match=r"compiled_plan: module 'blocks\.1\.inner' \(recompute\) "
                       r"was replaced \(or removed\) after annotate(.|\n)*Fix: annotate the model "
                       r"again(.|\n)*replace=True") as e:
        frp.compiled_plan(model)
    assert len(str(e.value)) < 600
    frp.annotate(model, {"blocks.*": "recompute", "blocks.*.inner": "offload"}, replace=True)
    model.blocks[1].inner = Inner(nnx.Rngs(4))
    # refused at trace time by its swapped parent, which runs as blocks.0 (alike blocks share it)
    with pytest.raises(rc.PlanError, match=r"module 'blocks\.0\.inner' \(offload; in 'blocks\.0' "
                       r"or a layer that runs as it: blocks\.1\) was replaced"):
        nnx.jit(_loss)(model, jnp.ones((2, D)))
    frp.annotate(model, {"blocks.*": "recompute", "blocks.*.inner": "offload"}, replace=True)  # the fix
    assert frp.compiled_plan(model) is not None and type(model.blocks[1].inner) is not Inner


class VmapBlock(nnx.Module):
    """Runs its Inner through nnx.vmap: inside, the Inner is a copy NNX made."""

    def __init__(self, rngs):
        self.inner = Inner(rngs)

    def __call__(self, xs):
        return nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(self.inner, xs)


def test_a_copy_made_by_a_transform_in_model_code():
    model, x = VmapBlock(nnx.Rngs(5)), jnp.ones((3, D))
    frp.annotate(model, {".": {"save": ["inner/h"]}})
    with pytest.raises(rc.PlanError, match=r"checkpoint_name\(x, 'h'\) runs in a submodule(.|\n)*"
                       r"keeps 'h' by path \('inner/h'\)(.|\n)*Fix: name that submodule") as e:
        nnx.grad(_loss)(model, x)
    assert len(str(e.value)) < 600
    frp.annotate(model, {".": {"save": ["inner/h"]}, "inner": "inherit"}, replace=True)  # the fix
    loss = lambda s: _loss(nnx.merge(nnx.graphdef(model), s, copy=True), x)  # noqa: E731
    assert rc.saved_residuals(loss, nnx.state(model)).names("device") == {"inner/h"}


def test_a_declared_stack_under_a_names_boundary():
    """A stack run by scan_layers inside a boundary that keeps its names by path: the stack carries
    its path into the scan (it is swapped), so its layers' tags match the plan."""
    from fixtures import nnx_models as nm

    model, plain = (nm.ScannedTransformer(layers=2, rngs=nnx.Rngs(6)) for _ in range(2))
    # (gradients under scanned plans: tests/test_flax_annotate.py; here, what the trace tags)
    tokens, targets = nm.batch(0)
    frp.annotate(model, {".": {"save": ["attn_out"]}})
    assert type(model.layers) is not type(plain.layers) and type(model.embed) is type(plain.embed)
    with rc.adapter.collect_tags() as tags:
        nm.loss_fn(model, tokens, targets)
    assert {t.name for t in tags} == {"layers.0.attn/attn_out", "layers.0.mlp/mlp_hidden"}
    assert "layers.0.attn/attn_out" in frp.plan_of(model).boundaries[0].spec.save
    assert_close(nm.loss_fn(model, tokens, targets), nm.loss_fn(plain, tokens, targets))
