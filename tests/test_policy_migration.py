"""Migrating from ``jax.checkpoint``: JAX policy objects where an annotation goes, and
``checkpoint(f, policy=...)`` (docs/semantics.md "Migrating from jax.checkpoint")."""

import jax
import numpy as np
import jax.numpy as jnp
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close
from remat_common.adapter import compile_annotation

cp = jax.checkpoint_policies
CLASSES = hasattr(cp, "SaveOnlyTheseNames")  # jax 0.11.x


def mlp(w, x):
    h = rc.checkpoint_name(x @ w, "h")
    return jnp.sum(jnp.tanh(rc.checkpoint_name(jnp.sin(h), "s")) @ w)


W = jnp.eye(8) * 0.3
X = jnp.arange(32.0, dtype=jnp.float32).reshape(4, 8) / 32
HOST = {"offload_src": "device", "offload_dst": "pinned_host"}


def _policies():
    """(id, policy, the annotation it means, whether jax.checkpoint honours it with remat3 on and
    off on every version: docs/jax_behaviour.md)."""
    out = [
        ("None", None, "recompute", True),
        ("nothing_saveable", cp.nothing_saveable, "recompute", True),
        ("everything_saveable", cp.everything_saveable, "save", False),
        ("dots_saveable", cp.dots_saveable, "dots", True),
        ("checkpoint_dots", cp.checkpoint_dots, "dots", True),
        ("dots_with_no_batch_dims_saveable", cp.dots_with_no_batch_dims_saveable,
         "dots_no_batch", True),
        ("checkpoint_dots_with_no_batch_dims", cp.checkpoint_dots_with_no_batch_dims,
         "dots_no_batch", True),
        ("offload_dot_with_no_batch_dims", cp.offload_dot_with_no_batch_dims("device", "pinned_host"),
         {"remat": "offload_dots_no_batch", **HOST}, True),
        ("save_only_these_names", cp.save_only_these_names("h"), {"save": ["h"]}, True),
        ("save_and_offload_only_these_names", cp.save_and_offload_only_these_names(
            names_which_can_be_saved=["h"], names_which_can_be_offloaded=["s"], **HOST),
         {"save": ["h"], "offload": ["s"], **HOST}, True),
        ("save_from_both_policies(names, names)", cp.save_from_both_policies(
            cp.save_only_these_names("h"), cp.save_only_these_names("s")),
         {"save": ["h", "s"]}, False),  # saves nothing on 0.11.0 with remat3 on
        ("save_from_both_policies(nothing, names)", cp.save_from_both_policies(
            cp.nothing_saveable, cp.save_only_these_names("s")), {"save": ["s"]}, False),
        ("save_from_both_policies(dots, dots_no_batch)", cp.save_from_both_policies(
            cp.dots_saveable, cp.dots_with_no_batch_dims_saveable), "dots", False),
    ]
    if CLASSES:
        out += [
            ("SaveOnlyTheseNames", cp.SaveOnlyTheseNames(frozenset({"h", "s"})),
             {"save": ["h", "s"]}, True),
            ("SaveAndOffloadOnlyTheseNames", cp.SaveAndOffloadOnlyTheseNames(
                frozenset({"s"}), frozenset({"h"}), "device", "pinned_host"),
             {"save": ["s"], "offload": ["h"], **HOST}, True),
        ]
    return out


POLICIES = _policies()


def _placements(rep):
    return sorted((r.name or r.kind, r.placement, r.nbytes) for r in rep.select())


@pytest.mark.compat
@pytest.mark.parametrize("name,policy,annotation,honoured", POLICIES, ids=[p[0] for p in POLICIES])
def test_policy_round_trips_to_the_annotations_compiled_policy(name, policy, annotation, honoured,
                                                               remat3):
    assert rc.parse_annotation(rc.from_jax_policy(policy)) == rc.parse_annotation(annotation)
    if policy is not None:  # None is no annotation (a YAML null is a mistake), only policy=None
        assert rc.parse_annotation(policy) == rc.parse_annotation(annotation)
    mine, theirs = compile_annotation(annotation), compile_annotation(rc.from_jax_policy(policy))
    assert theirs.describe() == mine.describe()
    b1, b2 = mine.boundary(""), theirs.boundary("")
    assert (b1 is None) == (b2 is None)
    if b1 is not None:
        assert b2.policy == b1.policy and b2.policy_name == b1.policy_name
        if CLASSES and type(policy).__name__.startswith("Save"):  # the 0.11 classes: JAX's own object
            assert b2.policy == policy
    f = rc.checkpoint(mlp, policy=policy)
    rep = rc.saved_residuals(f, W, X)
    assert _placements(rep) == _placements(rc.saved_residuals(rc.checkpoint(mlp, annotation), W, X))
    if honoured and policy is not None:  # what jax.checkpoint(f, policy=...) itself keeps
        assert _placements(rep) == _placements(
            rc.saved_residuals(jax.checkpoint(mlp, policy=policy), W, X))
    assert_close(jax.grad(f, argnums=(0, 1))(W, X), jax.grad(mlp, argnums=(0, 1))(W, X))


@pytest.mark.compat
def test_policies_go_where_annotations_go():
    plan = rc.Plan.from_mapping({"layers.*": cp.dots_saveable,
                                 "layers.1": cp.save_only_these_names("h")})
    assert [r.annotation for r in plan.rules] == [rc.parse_annotation("dots"),
                                                  rc.parse_annotation({"save": ["h"]})]
    deco = rc.checkpoint(policy=cp.save_only_these_names("h"))(mlp)
    assert rc.saved_residuals(deco, W, X).names("device") == {"h"}


@pytest.mark.compat
@pytest.mark.parametrize("policy,match", [
    (cp.save_any_names_but_these("h"),
     r"keeps every checkpoint_name value except 'h'(.|\n)*Fix: list the names to keep: "
     r"\{\"save\": \[every name you tag except 'h'\]\}"),
    (cp.save_anything_except_these_names("h"),
     r"ignores its names and saves every value(.|\n)*Fix: 'save' for what JAX does"),
    (lambda prim, *_, **__: prim.name == "sin",
     r"a function the annotation vocabulary cannot read(.|\n)*Fix: tag the values"),
    (cp.save_from_both_policies(cp.dots_saveable, cp.save_only_these_names("h")),
     r"keeps matmul outputs and named values in one\nboundary(.|\n)*\{\"save\": \['h', \.\.\.\]\}"),
    (cp.save_from_both_policies(cp.save_and_offload_only_these_names(
        names_which_can_be_saved=["h"], names_which_can_be_offloaded=["s"], **HOST),
        cp.save_only_these_names("t")),
     r"combines an offloading policy(.|\n)*Fix: one mapping with both lists: \{'save': \['h', "
     r"'t'\], 'offload': \['s'\]"),
], ids=["save_any_names_but_these", "save_anything_except_these_names", "lambda",
        "both(dots, names)", "both(offload, names)"])
def test_policies_the_vocabulary_cannot_express_are_refused_with_the_annotation(policy, match):
    with pytest.raises(rc.AnnotationError, match=match):
        rc.checkpoint(mlp, policy=policy)
    with pytest.raises(rc.AnnotationError, match="module 'layers.0'"):
        rc.Plan.from_mapping({"layers.0": policy})


@pytest.mark.compat
def test_checkpoint_policy_argument_errors():
    with pytest.raises(TypeError, match="say the same thing twice. Fix: pass one of them"):
        rc.checkpoint(mlp, "dots", policy=cp.dots_saveable)
    with pytest.raises(TypeError, match=r"policy='dots' is not a jax.checkpoint policy(.|\n)*"
                                        r"checkpoint\(f, 'recompute'\)"):
        rc.checkpoint(mlp, policy="dots")


def test_nnx_adapter_takes_policies_in_plans_and_the_decorator():
    pytest.importorskip("flax")
    from flax import nnx

    import flax_remat_plugin as frp
    from fixtures import nnx_models as nm

    def described(plan):
        model = nm.Transformer(layers=2, rngs=nnx.Rngs(0))
        return frp.compiled_plan(frp.annotate(model, plan)).describe()

    assert described({"layers.*.attn": cp.save_only_these_names("attn_out"),
                      "layers.1.mlp": cp.dots_saveable}) == described(
        {"layers.*.attn": {"save": ["attn_out"]}, "layers.1.mlp": "dots"})
    with pytest.raises(rc.PlanError, match=r"a jax.checkpoint policy is an annotation(.|\n)*"
                                           r"Fix: say where it goes, e.g. \{\"\.\": policy\}"):
        frp.annotate(nm.Transformer(layers=2, rngs=nnx.Rngs(0)), cp.dots_saveable)

    @frp.remat(cp.dots_with_no_batch_dims_saveable)
    class Dense(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x):
            return jnp.tanh(self.lin(x))

    assert frp.compiled_plan(Dense(nnx.Rngs(0))).describe() == "<root>: dots_with_no_batch_dims_saveable"


def test_equinox_adapter_takes_policies_in_plans_and_remat():
    pytest.importorskip("equinox")
    import equinox_remat_plugin as er
    from fixtures import eqx_models as em

    model = em.transformer()
    mine = er.annotate(model, {"blocks.*.mlp": {"save": ["hidden"]}})
    theirs = er.annotate(model, {"blocks.*.mlp": cp.save_only_these_names("hidden")})
    assert er.compiled_plan(theirs).describe() == er.compiled_plan(mine).describe()
    wrapped = er.Remat(em.Dense(4, 4, rng=np.random.default_rng(0)), cp.nothing_saveable)
    assert wrapped.annotation == rc.parse_annotation("recompute")
