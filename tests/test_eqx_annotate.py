"""annotate / Remat / unwrap / Stacked: paths, the tree they leave, serialisation, errors."""

from __future__ import annotations

import dataclasses
import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import equinox_remat_plugin as er
from equinox_remat_plugin._checkpoint import shared_filter_checkpoint_impl
import remat_common as rc

from fixtures import eqx_models as em
from fixtures.tolerance import assert_close
from versions import SAVE_AND_OFFLOAD

DATA = __import__("pathlib").Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def models():
    return em.transformer(), em.transformer(stacked=True), em.inputs()


def _leaves(tree):
    return jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))


def _close(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) and la
    assert_close(la, lb)


# -- paths -------------------------------------------------------------------------------------------

def test_paths(models):
    plain, stacked, _ = models
    block = ["", ".ln1", ".attn", ".attn.qkv", ".attn.out", ".ln2", ".mlp", ".mlp.fc1", ".mlp.fc2",
             ".dropout"]
    listed = er.module_paths(plain)
    assert listed == ("", "embed", *(f"blocks.{i}{s}" for i in range(3) for s in block), "head")
    # a Stacked reads like the list: the stack, then each layer's virtual paths
    assert set(er.module_paths(stacked)) == set(listed) | {"blocks"}
    user = er.module_paths(em.UserModel(key=jax.random.key(0)))
    assert {"blocks.1.attention.query_proj", "blocks.0.mlp.layers.1", "head"} <= set(user)


def test_dict_and_tuple_children():
    class Heads(eqx.Module):
        heads: dict[str, eqx.nn.Linear]
        pair: tuple[eqx.nn.Linear, eqx.nn.Linear]

        def __call__(self, x):
            return sum(h(x) for h in self.heads.values()) + self.pair[1](self.pair[0](x))

    k = jax.random.split(jax.random.key(0), 4)
    m = Heads({"a": eqx.nn.Linear(2, 2, key=k[0]), "b": eqx.nn.Linear(2, 2, key=k[1])},
              (eqx.nn.Linear(2, 2, key=k[2]), eqx.nn.Linear(2, 2, key=k[3])))
    assert er.module_paths(m) == ("", "heads.a", "heads.b", "pair.0", "pair.1")
    a = er.annotate(m, {"heads.b": "recompute", "pair.*": "offload"})
    assert [b.path for b in er.plan_of(a).boundaries] == ["heads.b", "pair.0", "pair.1"]
    g = eqx.filter_grad(lambda m, x: jnp.sum(m(x) ** 2))
    _close(er.unwrap(g(a, jnp.ones(2))), g(m, jnp.ones(2)))

    bad = Heads({"a.b": m.heads["a"]}, m.pair)
    with pytest.raises(rc.PlanError, match=r"dict key 'a\.b' under 'heads' contains '\.'"):
        er.annotate(bad, {})


# -- the annotated tree ------------------------------------------------------------------------------

@pytest.mark.parametrize("stacked", [False, True], ids=["list", "scan"])
def test_same_leaves_and_unwrap(stacked, models):
    """Annotating adds no array leaves and keeps their order; unwrap gives the plain model back."""
    model = models[stacked]
    a = er.annotate(model, {"blocks.*": "recompute"})
    assert all(u is v for u, v in zip(_leaves(a), _leaves(model), strict=True))
    assert jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(model)
    plain = er.unwrap(a)
    assert jax.tree_util.tree_structure(plain) == jax.tree_util.tree_structure(model)
    assert eqx.tree_equal(plain, model)
    # eqx.partition / combine round trip, and the un-annotated model's arrays slot in
    params, static = eqx.partition(a, eqx.is_array)
    assert eqx.tree_equal(eqx.combine(params, static), a)
    swapped = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params),
                                           jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array)))
    assert eqx.tree_equal(eqx.combine(swapped, static), a)


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "scan"])
def test_serialisation_interchange(stacked, models, tmp_path):
    """eqx.tree_serialise_leaves files load across annotated and plain models, both ways."""
    model = models[stacked]
    plan = {"blocks.*": "offload", "blocks.*.attn": {"save": ["attn_out"]}}
    scaled = jax.tree_util.tree_map(lambda v: v * 3 if eqx.is_inexact_array(v) else v, model)
    annotated_scaled = er.annotate(scaled, plan)
    eqx.tree_serialise_leaves(tmp_path / "annotated.eqx", annotated_scaled)
    loaded = eqx.tree_deserialise_leaves(tmp_path / "annotated.eqx", model)  # into the plain model
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(model)
    assert eqx.tree_equal(loaded, scaled)

    eqx.tree_serialise_leaves(tmp_path / "plain.eqx", scaled)
    back = eqx.tree_deserialise_leaves(tmp_path / "plain.eqx", er.annotate(model, plan))
    assert eqx.tree_equal(back, annotated_scaled)
    assert er.plan_of(back) == er.plan_of(annotated_scaled)


def test_types_survive(models):
    """Annotated modules are instances of their own class (an annotated subclass); modules the plan
    does not act on, the root included, are the same objects (was: every module in a Remat)."""
    plain, stacked, _ = models
    a = er.annotate(plain, {"blocks.*": "recompute"})
    assert type(a) is type(plain) and a.embed is plain.embed and a.head is plain.head
    block = a.blocks[1]
    assert isinstance(block, em.Block) and type(block) is not em.Block
    assert type(block).__name__ == "Block" and isinstance(block.attn.qkv, em.Dense)
    assert block.attn.qkv.bias is plain.blocks[1].attn.qkv.bias and block.attn.heads == 2
    assert type(er.unwrap(a).blocks[1]) is em.Block
    s = er.annotate(stacked, {"blocks": "recompute"})
    assert isinstance(s.blocks.layers, em.Block) and s.blocks.num_layers == 3


def test_reannotate_replaces_the_plan_only_when_asked(models):
    plain, _, x = models
    once = er.annotate(plain, {"blocks.*": "offload"})
    with pytest.raises(rc.PlanError, match=r"already runs a plan(.|\n)*replace=True"):
        er.annotate(once, {"blocks.*": "recompute"})
    twice = er.annotate(once, {"blocks.*": "recompute"}, replace=True)
    fresh = er.annotate(plain, {"blocks.*": "recompute"})
    assert jax.tree_util.tree_structure(twice) == jax.tree_util.tree_structure(fresh)
    assert er.plan_of(twice) == er.plan_of(fresh)
    assert er.plan_of(plain) is None


def test_plan_forms(models, tmp_path):
    """A Plan, a mapping, a list of pairs, a file and a function of (path, module) all work."""
    plain, stacked, _ = models
    want = ["blocks.0", "blocks.1", "blocks.2"]
    (tmp_path / "p.toml").write_text('[rules]\n"blocks.*" = "recompute"\n')
    for plan in (rc.Plan.from_mapping({"blocks.*": "recompute"}), {"blocks.*": "recompute"},
                 [("blocks.*", "recompute")], str(tmp_path / "p.toml"),
                 lambda path, m: "recompute" if isinstance(m, em.Block) else None):
        assert [b.path for b in er.plan_of(er.annotate(plain, plan)).boundaries] == want
        assert [b.path for b in er.plan_of(er.annotate(stacked, plan)).boundaries] == want


def test_sequential_with_state():
    """eqx.nn.Sequential still hands the state to a wrapped BatchNorm (Remat is stateful exactly
    when the module it wraps is), and state indices are left alone."""
    k = jax.random.split(jax.random.key(0), 3)
    model, state = eqx.nn.make_with_state(eqx.nn.Sequential)([
        eqx.nn.Linear(4, 8, key=k[0]), eqx.nn.BatchNorm(8, axis_name="batch", mode="batch"),
        eqx.nn.Sequential([eqx.nn.Lambda(jnp.tanh), eqx.nn.Linear(8, 4, key=k[1])])])
    x = jax.random.normal(k[2], (6, 4))

    def loss(m, s, x):
        y, s = jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, s)
        return jnp.sum(y**2), s

    annotated = er.annotate(model, {"layers.1": "recompute", "layers.2": "offload"})
    assert annotated.layers[1].is_stateful() and not annotated.layers[2].is_stateful()
    (v0, s0), g0 = eqx.filter_value_and_grad(loss, has_aux=True)(model, state, x)
    (v1, s1), g1 = eqx.filter_value_and_grad(loss, has_aux=True)(annotated, state, x)
    assert_close(v1, v0)
    # as one vector: BatchNorm makes the first layer's bias gradient zero up to round-off, which
    # only the scale of the whole gradient can judge (per leaf it compares noise with noise)
    flat = [jnp.concatenate([jnp.ravel(v) for v in _leaves(g)]) for g in (er.unwrap(g1), g0)]
    assert_close(*flat)
    _close(s1, s0)
    check = rc.verify(lambda m, s, x: loss(m, s, x)[0], annotated, state, x, plan=er.plan_of(annotated))
    assert check.expected_host == {"layers.2/__input__"} and check.report.nbytes("host") == 6 * 8 * 4


# -- Remat in model code -----------------------------------------------------------------------------

def test_declared_remat(models):
    """Remat(...) in model code is a rule for its path; the plan's rules come after it and win."""
    plain, _, x = models
    blocks = list(plain.blocks)
    blocks[1] = er.Remat(blocks[1], "offload")
    model = dataclasses.replace(plain, blocks=blocks)
    g0 = eqx.filter_grad(em.loss)(plain, x)
    _close(er.unwrap(eqx.filter_grad(em.loss)(model, x)), g0)  # standalone: one boundary

    declared = er.annotate(model, {})
    assert er.plan_of(declared).describe().splitlines() == [
        f"blocks.1: {SAVE_AND_OFFLOAD} offload=['blocks.1/__input__'] device->pinned_host"]
    check = rc.verify(em.loss, declared, x, plan=er.plan_of(declared))
    assert check.report.names("host") == {"blocks.1/__input__"}
    overridden = er.annotate(model, {"blocks.*": "recompute"})
    assert {b.path: b.policy_name for b in er.plan_of(overridden).boundaries} == {
        f"blocks.{i}": "nothing_saveable" for i in range(3)}
    assert declared.blocks[1].annotation == rc.parse_annotation("offload")  # kept for re-annotation
    assert eqx.tree_equal(er.unwrap(overridden), plain)


def test_standalone_remat_names_stay_bare(models):
    plain, _, x = models
    block = er.Remat(plain.blocks[0], {"save": ["attn_out"]})

    def loss(b, h):
        return jnp.sum(jnp.tanh(b(h)))

    h = plain.embed(x)
    check = rc.verify(loss, block, h, plan=block.plan)
    assert check.report.names("device") == {"attn_out"}
    _close(eqx.filter_grad(loss)(block, h).module, eqx.filter_grad(loss)(plain.blocks[0], h))


def test_standalone_remat_on_a_stack(models):
    """Remat(Stacked(...), annotation) puts the boundary around each layer, not the whole scan."""
    plain, stacked, x = models
    h = plain.embed(x)

    def loss(blocks, h):
        return jnp.sum(blocks(h) ** 2)

    wrapped = er.Remat(stacked.blocks, "recompute")
    report = rc.saved_residuals(loss, wrapped, h)
    carries = [r for r in report.select() if r.shape == (3, *h.shape)]
    assert len(carries) == 1 and report.nbytes("device") == carries[0].nbytes + h.nbytes
    _close(eqx.filter_grad(loss)(wrapped, h).module, eqx.filter_grad(loss)(stacked.blocks, h))


# -- a model written as a user would, annotated from a YAML file --------------------------------------

def test_user_model_from_yaml():
    model = em.UserModel(key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 4, 16))

    def loss(m, x):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    annotated = er.annotate(model, DATA / "eqx_user_plan.yaml")
    plan = er.plan_of(annotated)
    assert plan.describe().splitlines() == [
        "head: dots_saveable",
        f"blocks.0: {SAVE_AND_OFFLOAD} offload=['blocks.0.attention/__input__'] device->pinned_host",
        f"blocks.1: {SAVE_AND_OFFLOAD} offload=['blocks.1.attention/__input__'] device->pinned_host",
    ]
    check = rc.verify(loss, annotated, x, plan=plan)  # strict
    # the blocks share blocks.0's trace (annotate's default): its name for both
    assert check.expected_host == {"blocks.0.attention/__input__"}
    # query, key and value are one array: offloaded once per block
    assert len(check.report.select(placement="host")) == 2
    assert check.report.nbytes("host") == 2 * x.nbytes
    _close(er.unwrap(eqx.filter_grad(loss)(annotated, x)), eqx.filter_grad(loss)(model, x))

    with pytest.raises(rc.PlanError, match=r"eqx_typo_plan\.yaml:4: pattern 'blocks\.\*\.attn' "
                                           r"\(annotation offload\) matches no module(.|\n)*'blocks\.0\.attention'"):
        er.annotate(model, DATA / "eqx_typo_plan.yaml")


# -- training --------------------------------------------------------------------------------------

def test_optax_steps_and_state_interchange(models):
    """A few optimiser steps: the same losses with and without the plan; the optimiser state of the
    plain model carries over to the annotated one leaf for leaf. (SGD with momentum: Adam divides
    by the root of the second moment and so turns the ~1e-9 rounding noise of the key bias's
    gradient, exactly zero in theory, into updates of size lr, which no two programs share.)"""
    plain, _, x = models
    opt = optax.sgd(0.05, momentum=0.9)

    def train(model, state, steps):
        losses = []
        for _ in range(steps):
            value, grads = eqx.filter_value_and_grad(em.loss)(model, x)
            updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
            model = eqx.apply_updates(model, updates)
            losses.append(float(value))
        return model, state, losses

    annotated = er.annotate(plain, {"blocks.*": "recompute", "blocks.*.attn": {"save": ["attn_out"]}})
    p_model, p_state, p_losses = train(plain, opt.init(eqx.filter(plain, eqx.is_array)), 3)
    a_model, a_state, a_losses = train(annotated, opt.init(eqx.filter(annotated, eqx.is_array)), 3)
    # the losses are float32 values: compare them at float32's tolerance, not as Python floats
    assert_close(np.float32(a_losses), np.float32(p_losses))
    assert p_losses[-1] < p_losses[0]
    _close(er.unwrap(a_model), p_model)
    # plain training state -> annotated model: same leaves, the annotated structure
    template = opt.init(eqx.filter(a_model, eqx.is_array))
    moved = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template),
                                         jax.tree_util.tree_leaves(p_state))
    _, _, cont_a = train(a_model, moved, 2)
    _, _, cont_p = train(p_model, p_state, 2)
    assert_close(np.float32(cont_a), np.float32(cont_p))


# -- errors ------------------------------------------------------------------------------------------

def test_error_pattern_matches_nothing(models):
    with pytest.raises(rc.PlanError, match=r"pattern 'blocks\.\*\.atn' \(annotation recompute\) "
                                           r"matches no module(.|\n)*Nearest existing paths: .*'blocks\.0\.attn'"):
        er.annotate(models[0], {"blocks.*.atn": "recompute"})
    with pytest.warns(rc.UnmatchedPatternWarning, match="blocks.*.atn"):
        er.annotate(models[0], rc.Plan.from_mapping({"blocks.*.atn": "recompute"}, mode="lenient"))


def test_error_not_a_module(models):
    plain, stacked, _ = models
    with pytest.raises(rc.PlanError, match=re.escape(
            "pattern 'blocks.0.attn.qkv.weight' (annotation recompute) names 'blocks.0.attn.qkv.weight' "
            "(a jax.Array float32[16, 48]), not a module.") + r"(.|\n)*holds it: 'blocks\.0\.attn\.qkv'"):
        er.annotate(plain, {"blocks.0.attn.qkv.weight": "recompute"})
    with pytest.raises(rc.PlanError, match=r"names 'blocks\.0\.dropout\.p' \(a float\)"):
        er.annotate(plain, {"blocks.*.dropout.p": "offload"})
    with pytest.raises(rc.PlanError, match=r"names 'blocks\.2\.attn\.qkv\.weight' "
                                           r"\(a jax\.Array float32\[3, 16, 48\]\)"):
        er.annotate(stacked, {"blocks.2.attn.qkv.weight": "recompute"})


def test_error_real_path_inside_a_stack(models):
    with pytest.raises(rc.PlanError, match=r"names 'blocks\.attn', inside the stacked layers 'blocks'"
                                           r"(.|\n)*write 'blocks\.\*\.attn' \(every layer\) or a range "
                                           r"such as\s+'blocks\.\[0-1\]\.attn'"):
        er.annotate(models[1], {"blocks.attn": "recompute"})


def test_error_custom_without_rules(models):
    with pytest.raises(rc.PlanError, match=r"module 'blocks\.0\.attn' \(Attention\) is annotated 'custom' "
                                           r"but Attention defines no __remat_custom__"):
        er.annotate(models[0], {"blocks.*.attn": "custom"})
    with pytest.raises(rc.PlanError, match=r"module '<root>' \(Linear\) is annotated 'custom'"):
        er.Remat(eqx.nn.Linear(2, 2, key=jax.random.key(0)), "custom")


def test_error_module_without_call():
    class Table(eqx.Module):  # used through its attribute, never called
        weight: jax.Array

    class Model(eqx.Module):
        table: Table
        proj: eqx.nn.Linear

        def __call__(self, i):
            return self.proj(self.table.weight[i])

    m = Model(Table(jnp.ones((5, 2))), eqx.nn.Linear(2, 2, key=jax.random.key(0)))
    assert er.module_paths(m) == ("", "table", "proj")
    with pytest.raises(rc.PlanError, match=r"module 'table' \(Table\) is annotated recompute but has no "
                                           r"__call__(.|\n)*\('table\.\*'\)"):
        er.annotate(m, {"table": "recompute"})
    a = er.annotate(m, {"proj": "recompute"})
    assert type(a.table) is Table  # not wrapped: nothing to run
    assert_close(a(3), m(3))


def test_error_wrong_targets():
    lin = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    for kw in ("share_alike_layers", "prevent_cse"):  # bool('no') is True
        with pytest.raises(TypeError, match=rf"equinox_remat_plugin.annotate: {kw} must be True or "
                                            r"False; got str 'yes'"):
            er.annotate(lin, {".": "recompute"}, **{kw: "yes"})
    with pytest.raises(TypeError, match=r"annotate: expected an eqx\.Module \(the model\), got dict"):
        er.annotate({"lin": lin}, {})
    with pytest.raises(TypeError, match=r"Remat: the wrapped value is a ArrayImpl, not a callable eqx\.Module"):
        er.Remat(jnp.ones(2), "recompute")
    with pytest.raises(TypeError, match=r"already wrapped \(annotation offload\)(.|\n)*Remat\(unwrap\(module\), 'recompute'\)"):
        er.Remat(er.Remat(lin, "offload"), "recompute")
    with pytest.raises(rc.AnnotationError, match=r"unknown remat annotation 'recompte'(.|\n)*'recompute'"):
        er.Remat(lin, "recompte")


def test_error_stacks(models):
    with pytest.raises(ValueError, match=r"Stacked: the array leaves of Dense have different leading "
                                         r"sizes \[2, 3\]"):
        er.Stacked(em.Dense(3, 2, rng=np.random.default_rng(0)))
    layers = eqx.filter_vmap(lambda k: eqx.nn.Linear(2, 2, key=k))(jax.random.split(jax.random.key(0), 2))

    class Outer(eqx.Module):
        inner: er.Stacked

        def __call__(self, x):
            return self.inner(x)

    nested = er.Stacked(eqx.filter_vmap(lambda k: Outer(er.Stacked(layers)))(jax.random.split(jax.random.key(1), 2)))
    with pytest.raises(rc.PlanError, match=r"the model itself is a Stacked(.|\n)*blocks: Stacked\[Block\]"):
        er.annotate(nested, {})
    with pytest.raises(rc.PlanError, match=r"the Stacked at 'inner\.inner' is inside the stacked layers "
                                           r"at 'inner'(.|\n)*Python list or tuple"):
        er.annotate(Outer(nested), {})
    stacked, x = models[1], models[2]  # its blocks hold a dropout rate, a Python float
    with pytest.raises(ValueError, match=r"sizes \[0, 3\](.|\n)*Size 0 means scalar array leaves"
                                         r"(.|\n)*eqx\.filter_jit"):
        jax.jit(lambda s, h: s(h))(stacked.blocks, stacked.embed(x))


class _Scaled(eqx.Module):
    w: jax.Array

    def __call__(self, x, *, opts, scale, act):
        return act(x * self.w) * scale * opts["k"]


class _TwoScaled(eqx.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x, opts={"k": 2.0}, scale=0.5, act=jnp.sin)
        return jnp.sum(x)


def test_boundary_passes_no_static_argument(remat3):
    """The boundary closes over non-array arguments instead of handing them to JAX as a static
    argument (jax 0.11.0 with remat3 on hashes static arguments and fails on a dict): a keyword
    dict, a Python float and a function reach the module, with remat3 off and on, also through the
    boundary of ``annotate(..., share_alike_layers=True)``, which reuses one body per value of the
    non-array part."""
    calls = []

    def fun(x, *, scale, act):
        calls.append((type(scale), act))
        return act(x) * scale, {"flag": True, "y": x}

    x = jnp.arange(3.0)
    for impl in (er.filter_checkpoint_impl, shared_filter_checkpoint_impl):
        calls.clear()
        f = impl(fun, policy=None, prevent_cse=True, static_argnums=())
        (out, aux), grad = jax.value_and_grad(
            lambda x: (f(x, scale=2.0, act=jnp.sin)[0].sum(), f(x, scale=2.0, act=jnp.sin)[1]),
            has_aux=True)(x)
        assert aux["flag"] is True and calls[0] == (float, jnp.sin)
        assert_close(grad, 2.0 * jnp.cos(x))
        with pytest.raises(TypeError, match="static_argnums"):
            impl(jnp.sin, policy=None, prevent_cse=True, static_argnums=(0,))
    assert len(calls) == 1  # shared: the second call reused the first one's trace
    plain = _TwoScaled([_Scaled(jnp.full(3, 0.5)), _Scaled(jnp.full(3, 1.5))])
    g0 = eqx.filter_grad(lambda m, x: m(x))(plain, x)
    for share in (False, True):
        fast = er.annotate(plain, {"layers.*": "recompute"}, share_alike_layers=share)
        assert_close(_leaves(er.unwrap(eqx.filter_grad(lambda m, x: m(x))(fast, x))), _leaves(g0))


def test_no_warnings_from_equinox(models):
    """Equinox warns about transformed callables holding parameters; none is created."""
    plain, stacked, x = models
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for m in (plain, stacked):
            eqx.filter_grad(em.loss)(er.annotate(m, {"blocks.*": "recompute"}), x)
