"""Strict verify cannot be fooled (issue 27): a plan is checked against the boundaries the traced
function really runs, so a stale plan (a module swapped out after the plan was taken), a plain
model, or a model annotated with another plan fail, naming the module and the reason.

Each case traces one small model (no compilation); the Equinox model is a list of blocks as
public models write it, swapped with ``eqx.tree_at``; the NNX one an ``nnx.List`` of blocks.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import equinox_remat_plugin as erp
import flax_remat_plugin as frp
import remat_common as rc
from fixtures.tolerance import assert_close
from remat_common import VerificationError

PLAN = {"blocks.*": "recompute", "blocks.1": "offload"}


class EqxBlock(eqx.Module):
    lin: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        self.lin = eqx.nn.Linear(8, 8, key=key)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.lin(x))


class EqxModel(eqx.Module):
    blocks: list[EqxBlock]

    def __init__(self, key: jax.Array) -> None:
        self.blocks = [EqxBlock(k) for k in jax.random.split(key, 3)]

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.lin(x))


class NnxModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, n: int = 3) -> None:
        self.blocks = nnx.List([NnxBlock(rngs) for _ in range(n)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


def loss(model, x):  # noqa: ANN001, ANN201 - any model
    return jnp.sum(model(x))


X = jnp.linspace(-1.0, 1.0, 8)
# The offload policy as the installed JAX names it (the 0.11 class; the factory on 0.12).
OFFLOAD_POLICY = ("SaveAndOffloadOnlyTheseNames" if rc.capabilities().policy_classes
                  else "save_and_offload_only_these_names")


def _problems(model, plan) -> tuple[str, ...]:  # noqa: ANN001
    v = rc.verify(loss, model, X, plan=plan, strict=False)
    with pytest.raises(VerificationError):
        rc.verify(loss, model, X, plan=plan, strict=True)
    return v.problems


def test_equinox_stale_swapped_and_plain(remat3):
    plain = EqxModel(jax.random.key(0))
    model = erp.annotate(plain, PLAN)
    plan = erp.plan_of(model)  # taken at start-up, as for a report target
    ok = rc.verify(loss, model, X, plan=plan, strict=True)
    assert ok.ok and ok.report.names("host") == {"blocks.1/__input__"}

    swapped = eqx.tree_at(lambda m: m.blocks[1], model, EqxBlock(jax.random.key(5)))
    (problem,) = _problems(swapped, plan)
    assert problem.startswith("module 'blocks.1': the plan puts a boundary here (offload")
    assert "eqx.tree_at" in problem and "frp.annotate(model, plan, replace=True)" in problem
    # the suggested fix: annotate again after the swap and verify with the model's own plan
    again = erp.annotate(swapped, PLAN, replace=True)
    assert rc.verify(loss, again, X, plan=erp.plan_of(again), strict=True).ok

    (problem,) = _problems(plain, plan)
    assert problem.startswith("none of the plan's 3 boundaries ('blocks.0', 'blocks.1', 'blocks.2')")
    assert "A plan with no boundary that ran verifies nothing" in " ".join(problem.split())


def test_equinox_model_annotated_with_another_plan():
    plain = EqxModel(jax.random.key(0))
    stale = erp.plan_of(erp.annotate(plain, PLAN))
    other = erp.annotate(plain, {"blocks.*": "recompute"})
    problems = _problems(other, stale)
    # (alike layers share blocks.0's trace by default: they run as 'blocks.0')
    assert problems[0].startswith("modules 'blocks.0' run under another plan than the one given")
    assert any(p.startswith("module 'blocks.1': the plan puts a boundary here") for p in problems)
    assert rc.verify(loss, other, X, plan=erp.plan_of(other), strict=True).ok


def test_a_recompute_only_plan_on_a_swapped_model_is_not_ok():
    """The issue's figures: residual bytes 192 (annotated) -> 256 (swapped) -> 384 (plain), all
    'ok' before; only the annotated one is now."""
    plain = EqxModel(jax.random.key(0))
    model = erp.annotate(plain, {"blocks.*": "recompute"})
    plan = erp.plan_of(model)
    swapped = eqx.tree_at(lambda m: m.blocks[1], model, EqxBlock(jax.random.key(5)))
    got = {name: rc.verify(loss, m, X, plan=plan, strict=False)
           for name, m in (("annotated", model), ("swapped", swapped), ("plain", plain))}
    sizes = {k: v.report.nbytes("device") for k, v in got.items()}
    assert sizes["annotated"] < sizes["swapped"] < sizes["plain"]
    assert got["annotated"].ok and not got["swapped"].ok and not got["plain"].ok
    # alike layers share one trace by default: the group's boundary ran twice, not three times
    assert got["swapped"].problems[0].startswith(
        "layers 'blocks.0', 'blocks.1', 'blocks.2' run as 'blocks.0' (one shared trace")
    assert "should run 3 times, but the traced function runs it 2 time(s)" in " ".join(
        got["swapped"].problems[0].split())
    per_layer = erp.annotate(plain, {"blocks.*": "recompute"}, share_alike_layers=False)
    swapped = eqx.tree_at(lambda m: m.blocks[1], per_layer, EqxBlock(jax.random.key(5)))
    (problem,) = rc.verify(loss, swapped, X, plan=erp.plan_of(per_layer), strict=False).problems
    assert problem.startswith("module 'blocks.1': the plan puts a boundary here (recompute")


def test_a_jitted_function_is_traced_afresh():
    """A jitted loss that already ran (jit's trace cache holds it) still shows its boundaries."""
    model = erp.annotate(EqxModel(jax.random.key(0)), PLAN)
    plan = erp.plan_of(model)
    step = jax.jit(loss)
    step(model, X)
    for _ in range(2):
        assert rc.verify(step, model, X, plan=plan, strict=True).ok
    assert not rc.verify(step, erp.unwrap(model), X, plan=plan, strict=False).ok


def test_nnx_stale_plan_plain_model_and_other_plan(remat3):
    model = frp.annotate(NnxModel(nnx.Rngs(0)), PLAN)
    plan = frp.compiled_plan(model)
    assert rc.verify(loss, model, X, plan=plan, strict=True).ok

    frp.annotate(model, {"blocks.*": "recompute"}, replace=True)
    problems = _problems(model, plan)
    assert problems[0].startswith("modules 'blocks.0' run under another plan")

    frp.unannotate(model)
    (problem,) = _problems(model, plan)
    assert problem.startswith("none of the plan's 3 boundaries")


def test_a_checkpoint_boundary_the_plan_does_not_have():
    """A plain-JAX function verified against a plan: a boundary where the plan has another."""
    plan = rc.compile_plan(rc.resolve(rc.Plan.from_mapping({"a": "recompute"}), ["a"]))
    f = rc.checkpoint(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), "dots", path="a")
    other, none_ran = rc.verify(f, X, plan=plan, strict=False).problems
    assert other.startswith("module 'a': the traced function runs a boundary here (dots_saveable) "
                            "but the plan has another one (nothing_saveable)")
    assert none_ran.startswith("none of the plan's 1 boundaries ('a') runs in the traced function")
    g = rc.checkpoint(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), "recompute", path="a")
    assert rc.verify(g, X, plan=plan, strict=True).ok


# -- the same on models of this repo (fixtures/): a stale plan, a swapped, plain or re-annotated model

REPO_PLAN = {"blocks.*": "recompute", "blocks.1": "offload"}
REPO_PLAN_NNX = {"layers.*": "recompute", "layers.1": "offload"}


@pytest.fixture(scope="module")
def eqx_repo():
    """The repo's Equinox transformer (3 list blocks: attention, MLP with a tagged hidden), plain,
    annotated, and the plan taken from it at start-up: built once for the module."""
    from fixtures import eqx_models as em

    plain = em.transformer()
    model = erp.annotate(plain, REPO_PLAN)
    return em, plain, model, erp.plan_of(model), em.inputs()


def test_a_repo_equinox_model_stale_swapped_plain_and_other_plan(eqx_repo):
    em, plain, model, plan, x = eqx_repo

    def strict_fails(m) -> str:  # noqa: ANN001
        with pytest.raises(VerificationError) as info:  # one trace: the problems are the message
            rc.verify(em.loss, m, x, plan=plan, strict=True)
        return str(info.value).removeprefix("remat plan verification failed:\n- ")

    ok = rc.verify(em.loss, model, x, plan=plan, strict=True)
    assert ok.report.names("host") == {"blocks.1/__input__"}
    swapped = eqx.tree_at(lambda m: m.blocks[1], model, plain.blocks[1])
    assert strict_fails(swapped).startswith("module 'blocks.1': the plan puts a boundary here (offload")
    assert strict_fails(plain).startswith(
        "none of the plan's 3 boundaries ('blocks.0', 'blocks.1', 'blocks.2')")
    other = erp.annotate(plain, {"blocks.*": "recompute"})
    assert strict_fails(other).startswith("modules 'blocks.0' run under another plan")
    assert rc.verify(em.loss, other, x, plan=erp.plan_of(other), strict=True).ok  # the fix


def test_a_repo_equinox_model_with_remat_in_model_code(eqx_repo):
    """erp.Remat written around the repo's blocks, one keeping the MLP's tagged hidden by name:
    plan_of is the plan they carry, verify passes on the model as written and its residuals are
    those the wrappers keep standalone (tags inside children are qualified by their paths)."""
    import dataclasses

    em, plain, _, _, x = eqx_repo
    b = plain.blocks
    model = dataclasses.replace(plain, blocks=[erp.Remat(b[0], "offload"), b[1],
                                               erp.Remat(b[2], {"save": ["hidden"]})])
    plan = erp.plan_of(model)
    assert [b.path for b in plan.boundaries] == ["blocks.0", "blocks.2"]
    v = rc.verify(em.loss, model, x, plan=plan, strict=True)
    assert v.report.names("host") == {"blocks.0/__input__"}
    assert "blocks.2.mlp/hidden" in v.report.names("device")
    leaves, treedef = jax.tree_util.tree_flatten(model)
    as_run = rc.saved_residuals(
        lambda ls, x: em.loss(jax.tree_util.tree_unflatten(treedef, ls), x), leaves, x)
    assert as_run.names("host") == {"__input__"} and "hidden" in as_run.names("device")
    assert _unqualified(as_run) == _unqualified(v.report)
    assert not rc.verify(em.loss, plain, x, plan=plan, strict=False).ok


def test_a_repo_nnx_model_stale_swapped_plain_and_other_plan():
    import numpy as np

    from fixtures import nnx_models as nm

    # from shapes (nnx.eval_shape): verify traces, and initialising the arrays would compile
    tokens = targets = jax.ShapeDtypeStruct((nm.BATCH, nm.SEQ), np.int32)
    model = frp.annotate(nnx.eval_shape(lambda: nm.Transformer(rngs=nnx.Rngs(0))), REPO_PLAN_NNX)
    plan = frp.compiled_plan(model)

    def strict_fails() -> str:
        with pytest.raises(VerificationError) as info:  # one trace: the problems are the message
            rc.verify(nm.loss_fn, model, tokens, targets, plan=plan, strict=True)
        return str(info.value).removeprefix("remat plan verification failed:\n- ")

    ok = rc.verify(nm.loss_fn, model, tokens, targets, plan=plan, strict=True)
    assert ok.report.names("host") == {"layers.1/__input__"}
    model.layers[1] = nnx.eval_shape(lambda: nm.Block(nm.D, nm.HEADS, nm.F, rngs=nnx.Rngs(3)))
    assert strict_fails().startswith("module 'layers.1': the plan puts a boundary here (offload")
    frp.annotate(model, {"layers.*": "recompute"}, replace=True)
    assert strict_fails().startswith("modules 'layers.0' run under another plan")
    frp.unannotate(model)
    assert strict_fails().startswith("none of the plan's 2 boundaries ('layers.0', 'layers.1')")


# -- a layer added after annotate runs outside the plan --------------------------------------------

def test_nnx_layer_appended_after_annotate():
    model = frp.annotate(NnxModel(nnx.Rngs(0)), {"blocks.*": "recompute"})
    plan = frp.compiled_plan(model)
    model.blocks.append(NnxBlock(nnx.Rngs(3)))
    (problem,) = _problems(model, plan)
    assert problem.startswith("module 'blocks.3' (NnxBlock) is not in the model the plan was "
                              "compiled for: it was added after\nannotate")
    with pytest.raises(rc.PlanError, match=r"compiled_plan: module 'blocks.3' \(NnxBlock\) is not in"):
        frp.compiled_plan(model)
    frp.annotate(model, {"blocks.*": "recompute"}, replace=True)  # the fix the message names
    assert rc.verify(loss, model, X, plan=frp.compiled_plan(model), strict=True).ok


def test_equinox_layer_appended_after_annotate():
    model = erp.annotate(EqxModel(jax.random.key(0)), {"blocks.*": "recompute"})
    plan = erp.plan_of(model)
    longer = eqx.tree_at(lambda m: m.blocks, model, [*model.blocks, EqxBlock(jax.random.key(9))])
    (problem,) = _problems(longer, plan)
    assert problem.startswith("module 'blocks.3' (EqxBlock) is not in the model the plan was")
    with pytest.raises(rc.PlanError, match=r"plan_of: module 'blocks.3' \(EqxBlock\) is not in"):
        erp.plan_of(longer)
    fixed = erp.annotate(longer, {"blocks.*": "recompute"}, replace=True)
    assert rc.verify(loss, fixed, X, plan=erp.plan_of(fixed), strict=True).ok


# -- re-annotation is explicit ---------------------------------------------------------------------

def test_nnx_annotating_twice_is_refused_until_replace():
    model = frp.annotate(NnxModel(nnx.Rngs(0), n=4), {"blocks.[2-3]": "recompute"})
    with pytest.raises(rc.PlanError, match=(
            r"annotate: this model already runs a plan given to an earlier annotate\(\) call\n"
            r"\(modules 'blocks.2', 'blocks.3'\)(.|\n)*frp.annotate\(model, plan, replace=True\)")):
        frp.annotate(model, {"blocks.0": "offload"})
    assert [b.path for b in frp.compiled_plan(model).boundaries] == ["blocks.2", "blocks.3"]
    frp.annotate(model, {"blocks.0": "offload"}, replace=True)  # the first fix
    assert [b.path for b in frp.compiled_plan(model).boundaries] == ["blocks.0"]
    frp.annotate(frp.unannotate(model), {"blocks.[2-3]": "recompute"})  # the second
    assert [b.path for b in frp.compiled_plan(model).boundaries] == ["blocks.2", "blocks.3"]
    with pytest.raises(TypeError, match="replace must be True or False"):
        frp.annotate(model, {}, replace="yes")


def test_equinox_annotating_twice_is_refused_until_replace():
    plain = EqxModel(jax.random.key(0))
    model = erp.annotate(plain, {"blocks.[1-2]": "recompute"})
    with pytest.raises(rc.PlanError, match=(
            r"annotate: this model already runs a plan given to an earlier annotate\(\) call\n"
            r"\(modules 'blocks.1', 'blocks.2'\)(.|\n)*erp.annotate\(model, plan, replace=True\)")):
        erp.annotate(model, {"blocks.0": "offload"})
    for fixed in (erp.annotate(model, {"blocks.0": "offload"}, replace=True),
                  erp.annotate(erp.unwrap(model), {"blocks.0": "offload"})):
        assert [b.path for b in erp.plan_of(fixed).boundaries] == ["blocks.0"]


# -- annotations written in model code are verifiable as written -----------------------------------

@frp.remat
class DeclaredBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.lin(x))


class DeclaredModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([DeclaredBlock(rngs, remat="offload"), DeclaredBlock(rngs),
                                DeclaredBlock(rngs, remat="offload")])

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


def test_nnx_blocks_with_remat_in_their_constructor(remat3):
    model = DeclaredModel(nnx.Rngs(0))
    # before compiled_plan as after it: the qualified names (was: one '__input__' for both)
    before = rc.saved_residuals(loss, model, X)
    plan = frp.compiled_plan(model)  # was: "annotated by 3 separate annotate() calls"
    assert before.names("host") == rc.saved_residuals(loss, model, X).names("host") == {
        "blocks.0/__input__"}  # blocks.2 runs as blocks.0 (alike)
    assert plan.describe().splitlines() == [
        f"blocks.0: {OFFLOAD_POLICY} offload=['blocks.0/__input__'] device->pinned_host",
        "blocks.1: nothing_saveable",
        f"blocks.2: {OFFLOAD_POLICY} offload=['blocks.2/__input__'] device->pinned_host"]
    v = rc.verify(loss, model, X, plan=plan, strict=True)  # blocks.2 runs as blocks.0 (alike)
    assert v.report.names("host") == {f"{plan.canonical_path(p)}/__input__" for p in ("blocks.0", "blocks.2")}
    grads = nnx.grad(loss)(model, X)
    plain = nnx.grad(loss)(frp.unannotate(nnx.clone(model)), X)
    assert_close(grads, plain)
    assert frp.compiled_plan(model) == plan  # asked again: the same plan, nothing re-annotated
    frp.annotate(model, {"blocks.1": "offload"})  # a plan over the declarations is still allowed
    assert [b.path for b in frp.compiled_plan(model).boundaries] == ["blocks.0", "blocks.1", "blocks.2"]


def test_nnx_one_decorated_block_inside_a_plain_model():
    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.first = nnx.Linear(8, 8, rngs=rngs)
            self.block = DeclaredBlock(rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.block(self.first(x))

    net = Net(nnx.Rngs(0))
    assert frp.compiled_plan(net.block).describe() == "<root>: nothing_saveable"  # its own plan
    plan = frp.compiled_plan(net)  # was: the block's own plan, one '<root>' boundary
    assert plan.describe() == "block: nothing_saveable"
    assert rc.verify(loss, net, X, plan=plan, strict=True).ok
    assert frp.compiled_plan(net.block) is plan  # a part of the annotated model: the model's plan
    assert frp.compiled_plan(net) is plan


class EqxDeclared(eqx.Module):
    """Annotations written in model code, as the issue's user wrote them."""

    blocks: list

    def __init__(self, key: jax.Array) -> None:
        k0, k1, k2 = jax.random.split(key, 3)
        self.blocks = [erp.Remat(EqxBlock(k0), "offload"), EqxBlock(k1),
                       erp.Remat(EqxBlock(k2), "recompute")]

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


def _as_run(model) -> rc.ResidualReport:  # noqa: ANN001
    """The residuals of ``model`` traced exactly as a training step runs it (its leaves are the
    arguments and the model is rebuilt inside, so nothing binds its wrappers first)."""
    leaves, treedef = jax.tree_util.tree_flatten(model)
    return rc.saved_residuals(lambda ls, x: loss(jax.tree_util.tree_unflatten(treedef, ls), x),
                              leaves, X)


def _unqualified(report: rc.ResidualReport) -> list[tuple]:
    return sorted((r.kind, (r.name or "").rpartition("/")[2], r.shape, r.nbytes, r.placement)
                  for r in report.residuals)


def test_equinox_remat_in_model_code_is_verifiable_as_written(remat3):
    model = EqxDeclared(jax.random.key(0))
    plan = erp.plan_of(model)  # was: a PlanError saying to call erp.annotate(model, {}) first
    assert plan.describe().splitlines() == [
        f"blocks.0: {OFFLOAD_POLICY} offload=['blocks.0/__input__'] device->pinned_host",
        "blocks.2: nothing_saveable"]
    v = rc.verify(loss, model, X, plan=plan, strict=True)
    assert v.report.names("host") == {"blocks.0/__input__"}
    # honest: the wrappers run standalone in training (unqualified names) and keep exactly what
    # verify's trace of the plan keeps
    as_run = _as_run(model)
    assert as_run.names("host") == {"__input__"}
    assert _unqualified(as_run) == _unqualified(v.report)
    assert_close(eqx.filter_grad(loss)(model, X).blocks[0].module,
                 eqx.filter_grad(loss)(erp.unwrap(model), X).blocks[0])
    assert erp.plan_of(erp.annotate(model, {})) == plan  # what binding them would compile

    swapped = eqx.tree_at(lambda m: m.blocks[0], model, EqxBlock(jax.random.key(5)))
    problems = _problems(swapped, plan)
    assert problems[0].startswith("modules 'blocks.2' run under another plan than the one given")
    assert problems[1].startswith("module 'blocks.0': the plan puts a boundary here (offload")
    (problem,) = _problems(erp.unwrap(model), plan)
    assert problem.startswith("none of the plan's 2 boundaries ('blocks.0', 'blocks.2')")
    other = eqx.tree_at(lambda m: m.blocks[0], model, erp.Remat(model.blocks[0].module, "recompute"))
    # (both wrappers now recompute: alike layers, blocks.2 runs as 'blocks.0')
    assert _problems(other, plan)[0].startswith("modules 'blocks.0' run under another plan")
    assert rc.verify(loss, other, X, plan=erp.plan_of(other), strict=True).ok  # the fix it names

    closure = rc.verify(lambda x: loss(model, x), X, plan=plan, strict=False).problems
    assert "the function reaches it through a closure" in " ".join(closure[0].split())


def test_equinox_remat_wrappers_that_plan_of_refuses_say_how_to_bind_them():
    model = EqxDeclared(jax.random.key(0))
    nested = eqx.tree_at(lambda m: m.blocks[2].module.lin, model,
                         erp.Remat(model.blocks[2].module.lin, "offload"))
    with pytest.raises(rc.PlanError, match=(
            r"plan_of: the erp.Remat wrapper at 'blocks.2.lin' is inside the one at 'blocks.2',"
            r"(.|\n)*model = erp.annotate\(model, \{\}\)")):
        erp.plan_of(nested)
    bound = erp.annotate(nested, {})  # the fix: one policy at blocks.2 that offloads blocks.2.lin's input
    plan = erp.plan_of(bound)
    assert rc.verify(loss, bound, X, plan=plan, strict=True).report.names("host") == {
        "blocks.0/__input__", "blocks.2.lin/__input__"}

    annotated = erp.annotate(erp.unwrap(model), {"blocks.0": "offload"})
    added = eqx.tree_at(lambda m: m.blocks[1], annotated, erp.Remat(annotated.blocks[1], "recompute"))
    with pytest.raises(rc.PlanError, match=r"plan_of: the erp.Remat wrapper at 'blocks.1' was put "
                       r"into the model after\nannotate(.|\n)*replace=True"):
        erp.plan_of(added)
    fixed = erp.annotate(added, {"blocks.0": "offload"}, replace=True)
    assert [b.path for b in erp.plan_of(fixed).boundaries] == ["blocks.0", "blocks.1"]


def test_equinox_remat_around_a_stack_in_model_code():
    """A wrapper around an erp.Stacked: one boundary per layer, as the plan says (annotate
    bound the Stacked's layers at a wrong path before: no boundary ran)."""
    class Scanned(eqx.Module):
        blocks: erp.Remat

        def __init__(self, key: jax.Array) -> None:
            self.blocks = erp.Remat(erp.Stacked.from_keys(EqxBlock, jax.random.split(key, 3)), "offload")

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.blocks(x)

    model = Scanned(jax.random.key(0))
    plan = erp.plan_of(model)
    assert [b.path for b in plan.boundaries] == ["blocks.0", "blocks.1", "blocks.2"]
    v = rc.verify(loss, model, X, plan=plan, strict=True)
    assert _unqualified(v.report) == _unqualified(_as_run(model))
    bound = erp.annotate(model, {})
    assert rc.verify(loss, bound, X, plan=erp.plan_of(bound), strict=True).report.names("host") == {
        "blocks.0/__input__"}


# -- messages that pointed the wrong way: each fix, applied, works --------------------------------

class NnxWithFunction(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([nnx.Linear(8, 8, rngs=rngs), jnp.tanh, nnx.Linear(8, 8, rngs=rngs)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for f in self.blocks:
            x = f(x)
        return x


class EqxWithFunction(eqx.Module):
    blocks: list

    def __init__(self, key: jax.Array, middle=jax.nn.relu) -> None:  # noqa: ANN001
        k1, k2 = jax.random.split(key)
        self.blocks = [eqx.nn.Linear(8, 8, key=k1), middle, eqx.nn.Linear(8, 8, key=k2)]

    def __call__(self, x: jax.Array) -> jax.Array:
        for f in self.blocks:
            x = f(x)
        return x


def test_a_function_inside_a_list_names_a_module_that_can_be_annotated():
    """The fix was "annotate 'blocks'": a list (an nnx.List has no __call__) cannot be."""
    msg = r"names 'blocks.1' \(a .*\), not a module(.|\n)*Fix: annotate the module whose __call__ runs " \
          r"it: '\.' \(the root\); or wrap it in a module of its own\n\(eqx.nn.Lambda\(fn\)"
    with pytest.raises(rc.PlanError, match=msg):
        frp.annotate(NnxWithFunction(nnx.Rngs(0)), {"blocks.1": "recompute"})
    with pytest.raises(rc.PlanError, match=msg):
        erp.annotate(EqxWithFunction(jax.random.key(0)), {"blocks.1": "recompute"})
    nnx_model = frp.annotate(NnxWithFunction(nnx.Rngs(0)), {".": "recompute"})  # the first fix
    assert rc.verify(loss, nnx_model, X, plan=frp.compiled_plan(nnx_model), strict=True).ok
    wrapped = erp.annotate(EqxWithFunction(jax.random.key(0), eqx.nn.Lambda(jax.nn.relu)),
                           {"blocks.1": "recompute"})  # the second
    assert [b.path for b in erp.plan_of(wrapped).boundaries] == ["blocks.1"]
    assert rc.verify(loss, wrapped, X, plan=erp.plan_of(wrapped), strict=True).ok


def test_nested_on_a_list_of_layers_says_how_to_declare_a_stack():
    with pytest.raises(rc.PlanError, match=r"pattern 'blocks' nests 'blocks' \(nested: 2\), but 'blocks' "
                       r"is\na Python list of 3 modules, not a stack(.|\n)*erp.Stacked(.|\n)*'blocks.\*'"):
        erp.annotate(EqxModel(jax.random.key(0)), {"blocks": {"remat": "recompute", "nested": 2}})
    with pytest.raises(rc.PlanError, match=r"pattern 'blocks' nests 'blocks' \(nested: 2\), but 'blocks' "
                       r"is\na list of 3 modules, not a stack(.|\n)*stacks=\['blocks'\](.|\n)*'blocks.\*'"):
        frp.annotate(NnxModel(nnx.Rngs(0)), {"blocks": {"remat": "recompute", "nested": 2}})

    class Scanned(eqx.Module):  # the fix: the layers held in erp.Stacked
        blocks: erp.Stacked[EqxBlock]

        def __init__(self, key: jax.Array) -> None:
            self.blocks = erp.Stacked.from_keys(EqxBlock, jax.random.split(key, 4))

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.blocks(x)

    model = erp.annotate(Scanned(jax.random.key(0)), {"blocks": {"remat": "recompute", "nested": 2}})
    assert rc.verify(loss, model, X, plan=erp.plan_of(model), strict=True).ok
    listed = erp.annotate(EqxModel(jax.random.key(0)), {"blocks.*": "recompute"})  # no nesting
    assert rc.verify(loss, listed, X, plan=erp.plan_of(listed), strict=True).ok


def test_an_offloaded_identity_module_says_so_and_inherit_fixes_it():
    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.lin = nnx.Linear(8, 8, rngs=rngs)
            self.drop = nnx.Dropout(0.0, rngs=rngs)
            self.out = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.out(self.drop(jnp.tanh(self.lin(x))))

    model = frp.annotate(Net(nnx.Rngs(0)), {"drop": "offload"})
    (problem,) = _problems(model, frp.compiled_plan(model))  # was: "a policy other than the plan's"
    assert problem.startswith("module 'drop': the plan offloads 'drop/__input__', but it is kept on "
                              "device: the value leaves the boundary\nunchanged")
    assert "Fix: annotate\n'drop' 'inherit'" in problem
    frp.annotate(model, {"drop": "inherit", "out": "offload"}, replace=True)  # the fix
    check = rc.verify(loss, model, X, plan=frp.compiled_plan(model), strict=True)
    assert check.report.names("host") == {"out/__input__"}


def test_pickling_an_annotated_graphdef_says_to_pickle_the_state():
    import pickle

    model = frp.annotate(NnxModel(nnx.Rngs(0)), {"blocks.*": "recompute"})
    with pytest.raises(pickle.PicklingError, match=r"NnxBlock at 'blocks.0' runs a plan: its class was "
                       r"made by annotate\(\) at run time(.|\n)*Fix: pickle nnx.state\(model\)"):
        pickle.dumps(nnx.graphdef(model))
    with pytest.raises(pickle.PicklingError, match="runs a plan"):
        pickle.dumps(model)
    state = pickle.loads(pickle.dumps(nnx.state(model)))  # the fix: the state, restored into a
    fresh = frp.annotate(NnxModel(nnx.Rngs(1)), {"blocks.*": "recompute"})  # model built the same way
    nnx.update(fresh, state)
    assert jnp.array_equal(fresh(X), model(X))
    assert pickle.loads(pickle.dumps(nnx.graphdef(frp.unannotate(fresh)))) == nnx.graphdef(fresh)


def test_pickling_an_annotated_equinox_model_says_to_serialise_the_leaves(tmp_path):
    import pickle

    model = erp.annotate(EqxModel(jax.random.key(0)), PLAN)
    for obj in (model, jax.tree_util.tree_structure(model)):  # was: "Can't pickle <class
        with pytest.raises(pickle.PicklingError, match=(  # 'EqxBlock'>: it's not the same object"
                r"EqxBlock at 'blocks.0' runs a plan: its class was made by annotate\(\) at run "
                r"time(.|\n)*Fix:\nsave the arrays, eqx.tree_serialise_leaves\(file, model\)")):
            pickle.dumps(obj)
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", model)  # the first fix, into a model built and
    fresh = erp.annotate(EqxModel(jax.random.key(1)), PLAN)  # annotated the same way
    fresh = eqx.tree_deserialise_leaves(tmp_path / "m.eqx", fresh)
    assert eqx.tree_equal(erp.unwrap(fresh), erp.unwrap(model))
    assert erp.plan_of(fresh) == erp.plan_of(model)
    plain = pickle.loads(pickle.dumps(erp.unwrap(model)))  # the second: the plain model
    assert eqx.tree_equal(plain, erp.unwrap(model))
    assert erp.plan_of(erp.annotate(plain, PLAN)) == erp.plan_of(model)


def test_measure_reports_a_stale_plan():
    """measure's check is verify: the swapped model's step is measured, and the plan's boundary
    that no longer runs is a problem of that plan's report."""
    from remat_common.measurement import MeasureTarget, measure

    model = erp.annotate(EqxModel(jax.random.key(0)), PLAN)
    plan = erp.plan_of(model)
    swapped = eqx.tree_at(lambda m: m.blocks[1], model, EqxBlock(jax.random.key(5)))

    def step(m, x):  # noqa: ANN001, ANN202
        g = eqx.filter_grad(loss)(m, x)
        return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, eqx.filter(m, eqx.is_array), g)

    rep = measure({"stale": MeasureTarget(loss, (swapped, X), step, (swapped, X), plan),
                   "fresh": MeasureTarget(loss, (model, X), step, (model, X), plan)}, steps=0,
                  placement=False)
    (problem,) = rep["stale"].problems
    assert problem.startswith("module 'blocks.1': the plan puts a boundary here (offload")
    assert rep["fresh"].problems == ()
