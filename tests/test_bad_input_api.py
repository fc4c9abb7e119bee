"""Misusing the core's public functions, or an adapter, never crashes or passes silently (issues
13, 27 and 39): the message names the function, what was given and the fix, and the fix works.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import remat_common as rc
from remat_common import AnnotationError, Plan, PlanError, RematError, resolve

from bad_input import MAX_MESSAGE

pytestmark = pytest.mark.lock_only  # what is refused and the message: checked before JAX runs


# -- the core's functions --------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("call, match", [
    (lambda: resolve({"a": "save"}, ["a"]), r"resolve: plan must be a remat_common.Plan; got dict"),
    (lambda: resolve(None, ["a"]), r"resolve: plan must be .*got NoneType None"),
    (lambda: resolve(Plan(), "layers.0"), r"resolve: paths must be a list.*got str 'layers.0'.*"
                                          r"Fix: pass \['layers.0'\]"),
    (lambda: resolve(Plan(), None), r"resolve: paths must be a list.*got NoneType"),
    (lambda: resolve(Plan(), {"a": 1}), r"resolve: paths must be a list.*got dict"),
    (lambda: resolve(Plan(), [1, 2]), r"resolve: each of paths must be a dotted module path"),
    (lambda: resolve(Plan(), ["layers"], stacks="layers"), r"resolve: stacks must be a list"),
    (lambda: rc.compile_plan(None), r"compile_plan: resolution must be a remat_common.Resolution"),
    (lambda: rc.compile_plan(Plan()), r"compile_plan: resolution must be .*got Plan"),
    (lambda: rc.compile_plan(resolve(Plan(), ["a"]), share_alike_layers="yes"),
     r"compile_plan: share_alike_layers must be True or False; got str 'yes'"),
    (lambda: rc.checkpoint(lambda x: x, prevent_cse="no"),
     r"remat_common.checkpoint: prevent_cse must be True or False; got str 'no'.*not read as "),
    (lambda: rc.verify(lambda x: x, 1.0, plan=None), r"verify: plan must be a .*CompiledPlan"),
    (lambda: rc.verify(lambda x: x, 1.0, plan=Plan()), r"verify: plan must be .*got Plan"),
    (lambda: Plan({"a": "save"}), r"Plan: rules must be a tuple of remat_common.Rule; got dict"
                                  r".*Plan.from_mapping"),
    (lambda: Plan(rules=[("a", "save")]), r"Plan: rules must be a tuple"),
    (lambda: Plan.from_mapping([("a", "save")]), r"Plan.from_mapping: rules must be a mapping"),
    (lambda: Plan.from_rules("abc"), r"Plan.from_rules: rules must be a list"),
    (lambda: Plan.from_rules(3), r"Plan.from_rules: rules must be a list.*got int 3"),
    (lambda: Plan.coerce(3), r"cannot make a plan from int 3"),
    (lambda: Plan.coerce(b"x"), r"cannot make a plan from bytes"),
    (lambda: Plan.load(3), r"Plan.load: path must be a file path"),
    (lambda: rc.Rule("a", "save"), r"Rule: annotation must be an Annotation"),
    (lambda: rc.adapter.check_targets(None, [], {}), r"check_targets: plan must be"),
    (lambda: rc.adapter.check_targets(Plan(), "mlp", {}), r"check_targets: module_paths must be a list"),
])
def test_api_misuse_is_a_type_error_naming_the_function(call, match):
    with pytest.raises(TypeError, match=match) as info:
        call()
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.compat
@pytest.mark.parametrize("name", ["", " h", "h ", "a/b", "h\x00", "__input__", "__rule__", 3, None])
def test_checkpoint_name_refuses_names_a_plan_cannot_mean(name):
    """' h' can never be named by a plan (plan names have no surrounding spaces); '__input__' is
    the core's own tag of a module's offloaded input, so a user's value of that name would be
    offloaded with it."""
    import jax.numpy as jnp

    with pytest.raises(ValueError, match=r"checkpoint_name: name must be a non-empty string .*"
                                         r"not '__input__' or '__rule__'"):
        rc.checkpoint_name(jnp.ones(2), name)


@pytest.mark.compat
@pytest.mark.parametrize("name", ["*", "h*", "*_out"])
def test_checkpoint_name_refuses_a_star_no_plan_may_name(name):
    """'*' was accepted, though a plan refuses '*' in a name (its resolver's '*' is every name):
    nothing could keep or offload the value by name."""
    import jax
    import jax.numpy as jnp

    with pytest.raises(ValueError, match=rf"checkpoint_name: name '{re.escape(name)}' contains '\*', "
                       r"which no plan may\s+name(.|\n)*Fix: a name without '\*'"):
        rc.checkpoint_name(jnp.ones(2), name)
    f = rc.checkpoint(lambda x: jnp.sum(jnp.sin(rc.checkpoint_name(x * 2, "h"))), {"save": ["h"]})
    assert rc.saved_residuals(f, jnp.ones(2)).names() == {"h"}  # the fix: a plain name, kept
    assert float(jax.grad(f)(jnp.zeros(2))[0]) == 2.0


@pytest.mark.compat
def test_checkpoint_custom_on_a_plain_function_is_refused():
    with pytest.raises(PlanError, match=r"annotation 'custom' on .*plain function has none.*Fix"):
        rc.checkpoint(lambda x: x, "custom")
    with pytest.raises(PlanError, match=r"annotation 'custom'"):
        rc.checkpoint({"remat": "custom"})


@pytest.mark.compat
@pytest.mark.parametrize("annotation", [{"save": ["*"]}, {"offload": ["*"]}, {"save": ["mlp/*"]},
                                        {"save": ["h"], "offload": ["attn_*"]}])
def test_a_glob_as_a_name_is_refused(annotation):
    """``"*"`` kept nothing and strict checks passed (the resolver uses it for every name)."""
    key = "save" if "*" in "".join(annotation.get("save", [])) else "offload"
    with pytest.raises(AnnotationError, match=r"is a glob: names are matched exactly(.|\n)*Fix: list "
                       rf"the tagged names \({key}: \[attn_out, \.\.\.\]\), or annotate the module "
                       rf"'{'save' if key == 'save' else 'offload'}'") as info:
        Plan.from_mapping({"layers.*": annotation})
    assert len(str(info.value)) < MAX_MESSAGE
    with pytest.raises(AnnotationError, match="is a glob"):
        rc.checkpoint(lambda x: x, annotation)
    assert Plan.from_mapping({"layers.*": {"save": ["*.mlp/h"]}})  # a glob sub-path stays allowed


@pytest.mark.compat
def test_arguments_that_contain_themselves_are_refused_not_a_crash():
    """A cycle made ``jax.tree_util`` recurse until the interpreter died."""
    import jax.numpy as jnp

    loop: list[Any] = [jnp.ones(2)]
    loop.append(loop)
    for call in (lambda: rc.saved_residuals(lambda v: jnp.sum(v[0]), loop),
                 lambda: rc.verify(lambda v: jnp.sum(v[0]), loop,
                                   plan=rc.compile_plan(resolve(Plan(), [])))):
        with pytest.raises(TypeError, match=r"the arguments hold a reference cycle:\nthe list at "
                           r"args\[0\] \(again at args\[0\]\[1\]\) contains itself \(a list that holds "
                           r"itself through its items\)"):
            call()


@pytest.mark.compat
@pytest.mark.parametrize("call, match", [
    (lambda: rc.checkpoint(3), r"checkpoint: fun must be a function \(or, to decorate, the "
                               r"annotation\); got int 3\. Fix: checkpoint\(fn, 'recompute'\)"),
    (lambda: rc.checkpoint(3, "recompute"), r"fun must be a function .*got int 3"),
    (lambda: rc.checkpoint(lambda x, n: x, static_argnums="2"),
     r"static_argnums must be an int or a sequence of ints; got str '2'\. Fix: static_argnums=2"),
    (lambda: rc.checkpoint(lambda x, n: x, static_argnums=True), r"static_argnums must be .*bool True"),
    (lambda: rc.checkpoint(lambda x, n: x, "offload", offload_argnums=["0"]),
     r"offload_argnums must be an int or a sequence of ints"),
    (lambda: rc.checkpoint("recompute")(3),  # was a function that failed only when called
     r"checkpoint: the decorated object must be a function; got int 3\. Fix: put "
     r"@checkpoint\('recompute'\) above a def"),
    (lambda: rc.checkpoint({"save": ["h"]})("not a function"), r"decorated object must be a function"),
])
def test_checkpoint_of_a_non_callable_or_string_argnums(call, match):
    with pytest.raises(TypeError, match=match):  # static_argnums='2' was accepted
        call()


@pytest.mark.compat
def test_checkpoint_argnums_fix_works():
    import jax
    import jax.numpy as jnp

    f = rc.checkpoint(lambda x, n: jnp.sum(jnp.sin(x) * n), static_argnums=1)
    assert float(jax.grad(f)(jnp.zeros(2), 3)[0]) == 3.0


@pytest.mark.parametrize("kwargs, given, what", [
    (dict(policy="nothing_saveable", offload_argnums=(1,)), r"offload_argnums=\(1,\)",
     "policy=nothing_saveable"),
    (dict(annotation="recompute", offload_argnums=(1,)), r"offload_argnums=\(1,\)",
     "the annotation 'recompute'"),
    (dict(annotation="save", offload_argnames=("x",)), r"offload_argnames=\('x',\)",
     "the annotation 'save'"),
])
def test_offload_arguments_that_an_annotation_would_ignore_are_refused(kwargs, given, what):
    import jax
    if kwargs.get("policy"):
        kwargs = {**kwargs, "policy": getattr(jax.checkpoint_policies, kwargs["policy"])}

    def layer(w, x):
        return (x @ w).sum()
    with pytest.raises(PlanError, match=rf"^remat_common\.checkpoint: {given} .*{re.escape(what)} "
                                        r"offloads no argument.*Fix: checkpoint\(fn, 'offload'"):
        rc.checkpoint(layer, **kwargs)
    rc.checkpoint(layer, "offload", offload_argnums=(1,))  # the fix works


@pytest.mark.parametrize("kwargs, match", [
    (dict(offload_argnums=(5,)), r"offload_argnums=\(5,\): .* takes 2 positional argument\(s\) "
                                 r"\(w, x\), so \[5\] name\(s\) none.*Fix: positions from 0 to 1"),
    (dict(offload_argnames=("nope",)), r"offload_argnames=\('nope',\): .* has no argument\(s\) "
                                       r"\['nope'\]; its arguments: \['w', 'x'\]"),
    (dict(offload_argnums=()), r"offload_argnums=\(\) / offload_argnames=\(\) offload no argument"),
])
def test_offload_arguments_that_name_no_argument_are_refused(kwargs, match):
    """Own round: an out-of-range position, an unknown name or an empty tuple offloaded nothing,
    silently."""
    def layer(w, x):
        return (x @ w).sum()
    with pytest.raises(PlanError, match=match):
        rc.checkpoint(layer, "offload", **kwargs)
    rc.checkpoint(layer, "offload", offload_argnums=(-1,))  # the last one: a position it has


def test_clip_keeps_the_start_and_the_fix():
    from remat_common.internal import clip
    text = "CausalSelfAttention: d_model=130 is not divisible by n_heads=4: " + "x " * 300 + \
        "the rest. Fix: choose heads that do."
    out = clip(text, 200)
    assert len(out) <= 200 and out.startswith("CausalSelfAttention: d_model=130 is not divisible")
    assert out.endswith("... Fix: choose heads that do.")


# -- the adapters ----------------------------------------------------------------------------------
def test_nnx_child_holding_its_parent_is_refused_and_the_fix_works():
    pytest.importorskip("flax")
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    class Child(nnx.Module):
        def __init__(self, parent: nnx.Module, rngs: nnx.Rngs) -> None:
            self.parent = parent
            self.lin = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return jnp.tanh(self.lin(x))

    class Parent(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.child = Child(self, rngs)

        def __call__(self, x: Any) -> Any:
            return self.child(x)

    model = frp.annotate(Parent(nnx.Rngs(0)), {"child": "recompute"})
    loss = lambda m, x: jnp.sum(m(x))  # noqa: E731
    with pytest.raises(TypeError, match=r"verify: the arguments hold a reference cycle:\nthe "
                       r"Parent at args\[0\] \(again at args\[0\]\.child\.parent\) contains itself \(a "
                       r"child module that keeps a reference to its parent\?\)(.|\n)*nnx\.split"):
        rc.verify(loss, model, jnp.ones(4), plan=frp.compiled_plan(model))
    graphdef, state = nnx.split(model)  # the fix the message names
    check = rc.verify(lambda s, x: loss(nnx.merge(graphdef, s, copy=True), x), state, jnp.ones(4),
                      plan=frp.compiled_plan(model), strict=True)
    assert check.ok


def test_dict_keys_with_a_slash_or_a_dot_are_refused_in_both_adapters():
    pytest.importorskip("flax")
    eqx = pytest.importorskip("equinox")
    import jax
    from flax import nnx

    import equinox_remat_plugin as erp
    import flax_remat_plugin as frp

    class Heads(nnx.Module):
        def __init__(self, key: str) -> None:
            self.heads = nnx.Dict({key: nnx.Linear(2, 2, rngs=nnx.Rngs(0))})

    class EHeads(eqx.Module):
        heads: dict[str, Any]

        def __init__(self, key: str) -> None:
            self.heads = {key: eqx.nn.Linear(2, 2, key=jax.random.key(0))}

    for key in ("a/b", "a.b"):
        with pytest.raises(PlanError, match=rf"module 'heads': child key {re.escape(repr(key))} cannot "
                           r"be written(.|\n)*'/' a path from an activation name(.|\n)*Fix: rename"):
            frp.annotate(Heads(key), {"heads": "recompute"})
        with pytest.raises(PlanError, match=rf"the dict key {re.escape(repr(key))} under 'heads' "
                           r"contains '\.' or '/'(.|\n)*Fix: use other keys"):
            erp.annotate(EHeads(key), {"heads": "recompute"})
    assert frp.module_paths(Heads("a_b")) == ("", "heads", "heads.a_b")  # the fix: another key
    assert erp.module_paths(EHeads("a_b")) == ("", "heads.a_b")


def test_jax_vmap_over_an_annotated_nnx_module_names_the_fix():
    pytest.importorskip("flax")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.block = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return jnp.tanh(self.block(x))

    model = frp.annotate(Net(nnx.Rngs(0)), {"block": "recompute"})
    xs = jnp.ones((3, 4))
    with pytest.raises(RematError, match=r"module 'block': its remat boundary \(nnx.remat\) writes the "
                       r"module's variables back(.|\n)*Fix: use the NNX transform,\nnnx.vmap") as info:
        jax.vmap(lambda x: model(x))(xs)  # was Flax's bare TraceContextError
    assert type(info.value.__cause__).__name__ == "TraceContextError"  # kept, not swallowed
    fresh = frp.annotate(Net(nnx.Rngs(0)), {"block": "recompute"})
    want = jax.vmap(Net(nnx.Rngs(0)))(xs)  # the plain model runs under jax.vmap
    got = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(fresh, xs)  # the first fix
    graphdef, state = nnx.split(fresh)  # the second
    got2 = jax.vmap(lambda s, x: nnx.merge(graphdef, s, copy=True)(x), in_axes=(None, 0))(state, xs)
    assert jnp.allclose(got, want) and jnp.allclose(got2, want)


def test_annotate_inside_nnx_jit_says_to_annotate_before():
    pytest.importorskip("flax")
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    @nnx.jit
    def step(m: nnx.Module, x: Any) -> Any:
        frp.annotate(m, {".": "recompute"})
        return m(x)

    with pytest.raises(PlanError, match=r"annotate: the model's variables are tracers: annotate runs "
                       r"inside a transform(.|\n)*Fix: annotate the model once, before the transform"):
        step(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), jnp.ones(2))  # was 'expected Linear, got Linear'
    model = frp.annotate(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), {".": "recompute"})  # the fix
    assert nnx.jit(lambda m, x: m(x))(model, jnp.ones(2)).shape == (2,)
