"""annotate / unannotate / @remat / scan_layers on NNX models: paths, state, scopes, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import flax_remat_plugin as frp
from fixtures import nnx_models as nm
from fixtures.work import lines_run
import remat_common as rc
from versions import SAVE_AND_OFFLOAD

DATA = Path(__file__).parent / "data"
B, T, D, H, F, L = nm.BATCH, nm.SEQ, nm.D, nm.HEADS, nm.F, nm.LAYERS


@pytest.fixture(scope="module")
def lst() -> nnx.Module:
    return nm.Transformer(rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def scanned() -> nnx.Module:
    return nm.ScannedTransformer(rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def data() -> tuple[jax.Array, jax.Array]:
    return nm.batch(0)


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Any:
    yield
    for name in ("lst", "scanned"):
        if name in request.fixturenames:
            frp.unannotate(request.getfixturevalue(name))


def _tags(model: nnx.Module, data: Any) -> set[str]:
    loss, params = nm.split_loss(model, *data)
    with rc.adapter.collect_tags() as tags:
        jax.eval_shape(loss, params)
    return {t.name for t in tags}


def _leaves(model: nnx.Module) -> list[tuple[Any, type, Any]]:
    flat = nnx.to_flat_state(nnx.state(model))
    return [(path, type(v), v.get_value()) for path, v in flat]


# -- paths ------------------------------------------------------------------------------------------

def test_module_paths_name_lists_dicts_and_stacked_layers(lst, scanned):
    paths = frp.module_paths(lst)
    assert paths[:4] == ("", "embed", "head", "layers")
    assert {"layers.0.attn.qkv", "layers.1.mlp.down", "layers.1.norm2", "norm"} <= set(paths)

    sp = frp.module_paths(scanned)  # stacked layers listed per layer, the real paths are not
    assert {"layers", "layers.0", "layers.1", "layers.0.attn", "layers.1.mlp.up"} <= set(sp)
    assert "layers.attn" not in sp

    class WithDict(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.heads = nnx.Dict({"cls": nnx.Linear(2, 2, rngs=rngs), "reg": nnx.Linear(2, 1, rngs=rngs)})

    assert frp.module_paths(WithDict(nnx.Rngs(0))) == ("", "heads", "heads.cls", "heads.reg")


# -- what annotate changes, and what it does not ----------------------------------------------------

def test_annotate_leaves_state_untouched_and_unannotate_restores_classes(lst):
    before, graphdef0, text0 = _leaves(lst), nnx.graphdef(lst), repr(lst)
    classes0 = {p: type(m) for p, m in nnx.iter_graph(lst) if isinstance(m, nnx.Module)}
    frp.annotate(lst, {"layers.*": "offload", "layers.*.attn": {"save": ["attn_out"]}})
    after = _leaves(lst)
    assert [(p, t) for p, t, _ in after] == [(p, t) for p, t, _ in before]
    assert all(a is b for (_, _, a), (_, _, b) in zip(after, before, strict=True))  # same arrays
    assert repr(lst) == text0
    swapped = {p: type(m) for p, m in nnx.iter_graph(lst) if isinstance(m, nnx.Module)}
    for p, cls in classes0.items():  # a subclass of the original, same name, or (no __call__) itself
        assert issubclass(swapped[p], cls) and swapped[p].__name__ == cls.__name__
    assert swapped[("layers",)] is nnx.List and swapped[("layers", 0)] is not nm.Block
    assert nnx.graphdef(lst) != graphdef0
    clone = nnx.clone(lst)  # split/merge keeps the plan (it lives on the classes)
    assert frp.compiled_plan(clone) == frp.compiled_plan(lst)
    frp.unannotate(lst)
    assert {p: type(m) for p, m in nnx.iter_graph(lst) if isinstance(m, nnx.Module)} == classes0
    assert nnx.graphdef(lst) == graphdef0 and frp.compiled_plan(lst) is None


def test_every_module_runs_in_its_own_scope(lst, scanned, data):
    """Without any boundary, tags are qualified by the module that made them, in lists and scans,
    inside the modules the plan names (their submodules keep their classes)."""
    assert _tags(lst, data) == {"attn_out", "mlp_hidden"}  # plain model: JAX's bare names
    frp.annotate(lst)  # a plan that names nothing touches nothing
    assert frp.compiled_plan(lst) is None and _tags(lst, data) == {"attn_out", "mlp_hidden"}
    frp.annotate(lst, {"layers.*": "inherit"})
    assert not frp.compiled_plan(lst).boundaries
    assert type(lst.layers[0].attn) is nm.Attention
    assert _tags(lst, data) == {f"layers.{i}.{m}" for i in range(L)
                                for m in ("attn/attn_out", "mlp/mlp_hidden")}
    frp.annotate(scanned, {"layers.*": "inherit"})  # scanned: one scan body, named as its first layer
    assert _tags(scanned, data) == {"layers.0.attn/attn_out", "layers.0.mlp/mlp_hidden"}
    frp.annotate(scanned, {f"layers.[1-{L - 1}]": "recompute"}, replace=True)  # two groups, two bodies
    assert _tags(scanned, data) == {f"layers.{i}.{m}" for i in range(L)
                                    for m in ("attn/attn_out", "mlp/mlp_hidden")}


def test_a_later_annotate_is_refused_unless_it_replaces_the_plan(lst, data):
    frp.annotate(lst, {"layers.*": "offload"})
    with pytest.raises(rc.PlanError, match=r"already runs a plan(.|\n)*replace=True"):
        frp.annotate(lst, {"layers.1": "recompute"})
    assert len(frp.compiled_plan(lst).boundaries) == L  # the first plan still runs
    frp.annotate(lst, {"layers.1": "recompute"}, replace=True)
    assert [b.path for b in frp.compiled_plan(lst).boundaries] == ["layers.1"]
    loss, params = nm.split_loss(lst, *data)
    assert rc.saved_residuals(loss, params).nbytes("host") == 0


# -- a model as a user writes it, annotated only from a file ----------------------------------------

class UserBlock(nnx.Module):
    def __init__(self, d: int, heads: int, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.fc1 = nnx.Linear(d, 4 * d, rngs=rngs)
        self.fc2 = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x), mask=mask, deterministic=True)
        return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))


class UserModel(nnx.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.blocks = nnx.List([UserBlock(d, heads, rngs=rngs) for _ in range(layers)])
        self.ln_f = nnx.LayerNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        mask = nnx.make_causal_mask(tokens)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


@pytest.mark.cpu_figures(
    "float64 exactness: XLA:TPU emulates float64 (these gradients differed by 1e-8 "
    "at a scale of 1e-8 on a v5e chip) and cannot compile the reduce_precision "
    "jax.checkpoint puts on a float64 residual (UNIMPLEMENTED, also a plain "
    "jax.checkpoint, seen deviceless for v5e)")
def test_a_user_model_of_flax_layers_annotated_from_yaml(data, remat3):
    model = UserModel(nm.VOCAB, D, H, 3, rngs=nnx.Rngs(1))
    loss, params = nm.split_loss(model, *data)
    grads0, base = nm.fast_jit(jax.grad(loss))(params), rc.saved_residuals(loss, params)

    frp.annotate(model, DATA / "flax_user_plan.yaml")
    plan = frp.compiled_plan(model)
    assert plan.resolution.plan.source.endswith("flax_user_plan.yaml")
    assert [b.path for b in plan.boundaries] == ["blocks.0", "blocks.1", "blocks.2"]
    loss, params = nm.split_loss(model, *data)
    nm.assert_trees_close(nm.fast_jit(jax.grad(loss))(params), grads0)
    rep = rc.verify(loss, params, plan=plan, strict=True).report
    hidden = [r for r in rep.select() if r.shape == (B, T, 4 * D)]
    # on host: each block's MLP hidden state, and the first block's inputs (activation and mask);
    # nothing wide on device
    assert sorted((r.shape, r.dtype) for r in rep.select(placement="host")) == [
        ((B, 1, T, T), "float32"), ((B, T, D), "float32")] + [((B, T, 4 * D), "float32")] * 3
    assert all(r.placement == "host" for r in hidden) and len(hidden) == 3
    assert rep.nbytes("device") < base.nbytes("device")
    assert sum(r.shape == (B, T, 4 * D) for r in base.select()) > 3  # plain AD kept more of them


# -- stacks run by the model's own nnx.scan --------------------------------------------------------

class OwnScan(nnx.Module):
    """Stacked blocks scanned by the model's own ``nnx.scan`` (not ``scan_layers``)."""

    __remat_stacks__ = ("layers",)

    def __init__(self, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> nm.Block:
            return nm.Block(D, H, F, rngs=rngs)

        self.layers = create(rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.scan(lambda c, layer: layer(c), in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(x, self.layers)


def test_a_stack_scanned_by_the_model_itself_takes_one_annotation_for_all_layers():
    model = OwnScan(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    frp.annotate(model, {"layers": "offload"})
    rep = rc.verify(lambda m: jnp.sum(m(x) ** 2), model, plan=frp.compiled_plan(model), strict=True).report
    assert rep.nbytes("host") == L * B * T * D * 4
    frp.annotate(model, {"layers": "recompute", "layers.0": "offload"}, replace=True)
    with pytest.raises(rc.PlanError, match=r"(?s)'layers' is a stack of 2 layers called as a whole.*"
                                           r"layers 0-0: offload, layers 1-1: recompute.*"
                                           r"Fix: run the stack with flax_remat_plugin.scan_layers"):
        jax.eval_shape(lambda m: m(x), model)


# -- @remat: intent declared in the class ----------------------------------------------------------

@frp.remat
class RecomputedBlock(nm.Block):
    pass


@frp.remat({".": "recompute", "mlp": {"offload": ["mlp_hidden"]}})
class MappedBlock(nm.Block):
    pass


def _describe(model: nnx.Module) -> list[tuple[str, str, bool]]:
    """Per boundary: path, policy, whether the MLP's hidden state (``<path>.mlp/mlp_hidden``) goes to host."""
    return [(b.path, b.policy_name, rc.adapter.qualify(f"{b.path}.mlp".lstrip("."), "mlp_hidden") in b.spec.offload)
            for b in frp.compiled_plan(model).boundaries]


def test_decorated_classes_apply_their_declarations_when_built():
    block = RecomputedBlock(D, H, F, rngs=nnx.Rngs(0))
    assert _describe(block) == [("", "nothing_saveable", False)]
    model = nm.Transformer(block=MappedBlock, rngs=nnx.Rngs(0))  # the list holds decorated blocks
    assert _describe(model.layers[1]) == [("", SAVE_AND_OFFLOAD, True)]
    frp.annotate(model)  # from the root: the same declarations under full paths
    assert _describe(model) == [(f"layers.{i}", SAVE_AND_OFFLOAD, True) for i in range(L)]


def test_the_remat_keyword_declares_per_instance_and_annotate_overrides(data):
    off = RecomputedBlock(D, H, F, rngs=nnx.Rngs(0), remat="offload")
    sub = RecomputedBlock(D, H, F, rngs=nnx.Rngs(0), remat={".": "inherit", "attn": "recompute"})
    assert _describe(off)[0][:2] == ("", SAVE_AND_OFFLOAD)  # the keyword beats the class
    assert [b.path for b in frp.compiled_plan(sub).boundaries] == ["attn"]
    model = nm.Transformer(block=RecomputedBlock, rngs=nnx.Rngs(0))
    frp.annotate(model, {"layers.0": "offload", "layers.1": "inherit"})  # the plan wins
    assert [(b.path, b.policy_name) for b in frp.compiled_plan(model).boundaries] == [
        ("layers.0", SAVE_AND_OFFLOAD)]
    frp.unannotate(model)
    assert frp.compiled_plan(model) is None
    frp.annotate(model)  # declarations stay declared
    assert [b.path for b in frp.compiled_plan(model).boundaries] == ["layers.0", "layers.1"]


def test_declarations_inside_a_stack_apply_per_layer():
    model = nm.ScannedTransformer(block=MappedBlock, rngs=nnx.Rngs(0))
    frp.annotate(model)
    assert _describe(model) == [(f"layers.{i}", SAVE_AND_OFFLOAD, True) for i in range(L)]


def test_subclasses_of_decorated_classes_annotate_once_fully_built():
    class Extended(RecomputedBlock):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.extra = nnx.Linear(D, D, rngs=nnx.Rngs(2))

    ext = Extended(D, H, F, rngs=nnx.Rngs(0))
    assert "extra" in frp.compiled_plan(ext).resolution.paths
    assert type(ext.extra) is nnx.Linear  # not named: keeps its class (placed by path when it runs)


# -- errors -----------------------------------------------------------------------------------------

def test_a_pattern_that_matches_nothing_lists_the_nearest_paths(lst):
    with pytest.raises(rc.PlanError, match=r"(?s)pattern 'layers.\*.atn' \(annotation recompute\) "
                                           r"matches no module.*Nearest existing paths:.*'layers.0.attn'"):
        frp.annotate(lst, {"layers.*.atn": "recompute"})
    with pytest.warns(rc.UnmatchedPatternWarning, match="layers.9"):
        frp.annotate(lst, rc.Plan.from_mapping({"layers.9": "recompute"}, mode="lenient"))


def test_annotating_a_variable_or_a_container_names_the_module_to_annotate(lst, scanned):
    with pytest.raises(rc.PlanError, match=r"(?s)'layers.0.attn.qkv.kernel' \(a Param float32\[16, 48\]\), "
                                           r"not a module.*Fix: annotate the module that holds it: "
                                           r"'layers.0.attn.qkv'"):
        frp.annotate(lst, {"layers.0.attn.qkv.kernel": "offload"})
    with pytest.raises(rc.PlanError, match=r"(?s)module 'layers' \(List\) is annotated recompute but has "
                                           r"no __call__.*'layers.\*'"):
        frp.annotate(lst, {"layers": "recompute"})
    with pytest.raises(rc.PlanError, match=r"(?s)'layers.attn', inside the stacked layers 'layers'.*"
                                           r"Fix: write 'layers.\*.attn'.*'layers.\[0-0\].attn'"):
        frp.annotate(scanned, {"layers.attn": "recompute"})
    with pytest.raises(rc.PlanError, match=r"(?s)'layers.0.attn' \(Attention\) is annotated 'custom' "
                                           r"but Attention defines no __remat_custom__"):
        frp.annotate(lst, {"layers.0.attn": "custom"})
    assert all("__remat_path__" not in vars(type(m))  # nothing half-applied
               for _, m in nnx.iter_graph(lst) if isinstance(m, nnx.Module))


def test_bound_methods_and_non_modules_are_refused(lst):
    with pytest.raises(TypeError, match=r"(?s)annotate: got the bound method 'Block.__call__'.*"
                                        r"must see the module as an argument.*right:  annotate\(model"):
        frp.annotate(lst.layers[0].__call__, {".": "recompute"})
    with pytest.raises(TypeError, match=r"annotate: expected an nnx.Module instance, got State"):
        frp.annotate(nnx.state(lst), {".": "recompute"})
    with pytest.raises(TypeError, match=r"scan_layers: got the bound method"):
        frp.scan_layers(lst.layers[0].__call__, jnp.zeros((B, T, D)))
    with pytest.raises(TypeError, match=r"remat: got the bound method"):
        frp.remat(lst.layers[0].__call__)
    with pytest.raises(TypeError, match=r"(?s)remat: decorates nnx.Module classes, got a Block "
                                        r"instance.*annotate\(model, plan\)"):
        frp.remat(lst.layers[0])
    with pytest.raises(TypeError, match=r"(?s)got the function .*nnx.remat\(fn"):
        frp.remat(lambda x: x)


def test_bad_declarations_fail_at_class_definition():
    with pytest.raises(rc.AnnotationError, match=r"(?s)unknown remat annotation 'offlaod'.*"
                                                  r"Allowed strings: .*'offload'"):
        frp.remat("offlaod")

    class HasRemat(nnx.Module):
        def __init__(self, remat: bool = False):
            self.flag = remat

    with pytest.raises(TypeError, match=r"already has a parameter named 'remat'"):
        frp.remat("offload")(HasRemat)


def test_per_example_gradients_under_vmap(lst, data, remat3):
    tokens, targets = data

    def per_example(model: nnx.Module) -> Any:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss(p: Any, t: jax.Array, y: jax.Array) -> jax.Array:
            return nm.loss_fn(nnx.merge(graphdef, p, rest, copy=True), t[None], y[None])

        return nm.fast_jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(params, tokens, targets)

    expected = per_example(lst)
    frp.annotate(lst, {"layers.*": "offload", "layers.*.attn": {"save": ["attn_out"]}})
    nm.assert_trees_close(per_example(lst), expected)


def test_flags_and_stacks_of_the_wrong_type_are_refused(lst):
    """bool('no') is True and a string is a sequence of characters: neither is read as meant."""
    for kw in ("share_alike_layers", "prevent_cse"):
        with pytest.raises(TypeError, match=rf"annotate: {kw} must be True or False; got str 'no'"):
            frp.annotate(lst, {"layers.*": "recompute"}, **{kw: "no"})
    with pytest.raises(TypeError, match=r"annotate: stacks must be a list of dotted module path "
                                        r"strings; got str 'layers'.*pass \['layers'\]"):
        frp.annotate(lst, stacks="layers")
    assert all("__remat_path__" not in vars(type(m))  # nothing half-applied
               for _, m in nnx.iter_graph(lst) if isinstance(m, nnx.Module))


def test_stacks_that_are_not_stacks_are_refused(lst):
    # a list of layers whose arrays happen to share a leading size is not an nnx.vmap stack
    with pytest.raises(rc.PlanError, match=r"(?s)annotate: stack 'layers' \(List\) holds \d+ "
                                           r"modules by index \('layers.0', .*not layers stacked "
                                           r"with nnx.vmap.*Fix: leave 'layers' out of stacks"):
        frp.annotate(lst, stacks=["layers"])
    with pytest.raises(rc.PlanError, match=r"(?s)annotate: stack 'layer' is not a module path.*nearest: 'layers'"):
        frp.annotate(lst, stacks=["layer"])
    with pytest.raises(rc.PlanError, match=r"(?s)annotate: stack 'layers.0.mlp' has arrays with different "
                                           r"leading sizes \[16, 32\]"):
        frp.annotate(lst, stacks=["layers.0.mlp"])
    with pytest.raises(rc.PlanError, match=r"(?s)scan_layers: stack '<root>' has arrays with different "
                                           r"leading sizes \[3, 4\].*nnx.vmap"):
        frp.scan_layers(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), jnp.zeros((2, 3)))


class _Leaf(nnx.Module):
    def __init__(self) -> None:
        self.w = nnx.Param(jnp.ones((2,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.w


class _Block(nnx.Module):
    def __init__(self) -> None:
        self.subs = nnx.List([_Leaf() for _ in range(9)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for s in self.subs:
            x = s(x)
        return x


class _Deep(nnx.Module):
    def __init__(self, n: int) -> None:
        self.layers = nnx.List([_Block() for _ in range(n)])


def test_annotate_scales_linearly_with_the_model() -> None:
    """Annotating 5,500 modules with 250 rules took 7 s: a dict rebuilt per module lookup, every
    rule tested against every path, the plan hashed once per swapped class. Four times the model
    (and the rules) must cost about four times as much, not sixteen (Python lines executed by
    annotate, fixtures/work.py)."""
    models = {n: _Deep(n) for n in (8, 60, 240)}  # built outside the count

    def cost(n: int) -> None:
        rules = {f"layers.{i}": "recompute" for i in range(0, n, 4)}
        rules.update({f"layers.{i}.subs.[0-3]": {"save": ["h"]} for i in range(1, n, 4)})
        frp.annotate(models[n], rules)

    cost(8)  # warm up
    small, big = lines_run(cost, 60), lines_run(cost, 240)
    assert big < 5.5 * small, (small, big)  # 3.8; the code before this test: 6.9
