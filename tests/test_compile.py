"""The compiler emits only policies that every supported JAX honours, remat3 off and on."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from remat_common.adapter import BoundarySpec, compile_boundary

from fixtures.core_model import PATHS, compile_plan, init, loss_loop
from fixtures.tolerance import assert_close

# docs/jax_behaviour.md "Policies remat3 changes silently": silently changed under jax_remat3 (or ignoring their argument). Never emitted.
SILENTLY_CHANGED = ("save_from_both_policies", "everything_saveable", "save_anything_except_these_names",
                    "save_any_names_but_these", "SaveAnyNamesButThese")

SPECS = {
    "recompute": BoundarySpec("l", "recompute"),
    "offload": BoundarySpec("l", "offload", offload=frozenset({"l/__input__"})),
    "dots": BoundarySpec("l", "dots"),
    "dots_no_batch": BoundarySpec("l", "dots_no_batch"),
    "offload_dots_no_batch": BoundarySpec("l", "offload_dots_no_batch"),
    "save": BoundarySpec("l", "names", save=frozenset({"l/h"})),
    "save_offload": BoundarySpec("l", "names", save=frozenset({"l/h"}), offload=frozenset({"l/a"})),
    "custom": BoundarySpec("l", "custom"),
}


def _policy_identity(policy):
    return getattr(policy, "__name__", type(policy).__name__)


@pytest.mark.compat
@pytest.mark.parametrize("name", list(SPECS))
def test_only_honoured_policies_are_emitted(name):
    caps = rc.capabilities()
    compiled = compile_boundary(SPECS[name], caps)
    assert compiled.policy_name in rc.adapter.EMITTED_POLICIES
    assert compiled.policy_name not in SILENTLY_CHANGED
    ident = _policy_identity(compiled.policy)
    assert not ident.startswith("<lambda") and ident not in SILENTLY_CHANGED
    cp = jax.checkpoint_policies
    if caps.policy_classes and compiled.policy_name[0].isupper():
        assert type(compiled.policy) is getattr(cp, compiled.policy_name)  # the 0.11 class itself
        hash(compiled.policy)  # frozen dataclass: JAX caches traces on it
    elif compiled.policy_name in ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable"):
        assert compiled.policy is getattr(cp, compiled.policy_name)
    # The same spec always gives an equal policy (no fresh closures: no silent re-traces).
    assert compile_boundary(SPECS[name], caps).policy == compiled.policy


@pytest.mark.compat
def test_every_policy_of_a_full_plan_is_honoured_kind():
    plan = compile_plan({"layers.0": "recompute", "layers.1": {"save": ["h"], "offload": ["act"]},
                         "layers.2": "dots"})
    assert [b.policy_name for b in plan.boundaries][0] == "nothing_saveable"
    assert all(b.policy_name in rc.adapter.EMITTED_POLICIES for b in plan.boundaries)
    assert "layers.1: SaveAndOffloadOnlyTheseNames" in plan.describe() or \
        "layers.1: save_and_offload_only_these_names" in plan.describe()


@pytest.mark.compat
def test_factory_path_where_classes_are_absent(remat3):
    """With the 0.11 classes gone (0.12), the factories are used — same residuals and gradients."""
    caps = dataclasses.replace(rc.capabilities(), policy_classes=False)
    res = rc.resolve(rc.Plan.from_mapping({"layers.*": {"save": ["h"], "offload": ["act"]}}), PATHS)
    plan = rc.compile_plan(res, caps)
    assert {b.policy_name for b in plan.boundaries} == {"save_and_offload_only_these_names"}
    assert rc.compile_plan(res, caps).boundaries[0].policy is plan.boundaries[0].policy  # cached
    params, x = init(jax.random.key(0)), jnp.ones((8, 16))
    check = rc.verify(loss_loop, params, x, plan, plan=plan)
    assert check.report.names("device") == {f"layers.{i}/h" for i in range(3)}
    assert check.report.names("host") == {f"layers.{i}/act" for i in range(3)}
    g, g0 = jax.grad(loss_loop)(params, x, plan), jax.grad(loss_loop)(params, x, None)
    assert_close(g, g0)


@pytest.mark.compat
def test_missing_memory_kind_is_a_clear_error():
    caps = dataclasses.replace(rc.capabilities(), memory_kinds=("device",), backend="tpu")
    with pytest.raises(rc.CapabilityError, match=r"(?s)module 'l': the plan offloads 'l/a' from 'device' "
                                                 r"to 'pinned_host', but the tpu backend's.*'device'.*Fix"):
        compile_boundary(SPECS["save_offload"], caps)
    bad = BoundarySpec("l", "names", offload=frozenset({"l/a"}), offload_dst="hbm_host")
    with pytest.raises(rc.CapabilityError, match="to 'hbm_host'"):
        compile_boundary(bad)


@pytest.mark.compat
def test_dots_with_names_cannot_be_one_policy():
    with pytest.raises(rc.PlanError, match=r"'dots' boundary cannot also keep named values.*Fix"):
        compile_boundary(BoundarySpec("l", "dots", save=frozenset({"l/h"})))


@pytest.mark.compat
def test_recompute_everything_no_remat_and_policy_none_are_distinct():
    """'recompute' is an explicit nothing_saveable boundary; 'save' is no boundary at all."""
    assert compile_plan({"layers.0": "recompute"}).boundary("layers.0").policy is \
        jax.checkpoint_policies.nothing_saveable
    assert compile_plan({"layers.0": "save"}).boundaries == ()
    assert compile_plan({}).boundaries == ()


@pytest.mark.compat
def test_compiled_plan_repr_is_one_short_line_and_describe_the_long_form():
    def plan(layers):
        paths = ["layers"] + [f"layers.{i}{s}" for i in range(layers) for s in ("", ".attn", ".mlp")]
        rules = {"layers.*.attn": {"save": ["attn_out"]}, "layers.*.mlp": "dots"}
        return rc.compile_plan(rc.resolve(rc.Plan.from_mapping(rules), paths))

    small, big = plan(2), plan(64)
    assert repr(small) == (f"CompiledPlan(4 boundaries over 8 modules: layers.0.attn "
                           f"{small.boundaries[0].policy_name}, layers.0.mlp dots_saveable, ... "
                           f"(+2 more); plan {small.resolution.plan.fingerprint()}; .describe() "
                           "lists them)")
    assert len(repr(big)) == len(repr(small)) + 6  # "128 boundaries over 194 modules", "+126"
    assert "\n" not in repr(big) and len(repr(big)) < 200  # was 8.7 kB for 4 layers
    lines = big.describe().splitlines()
    assert len(lines) == 128 and lines[-1] == "layers.63.mlp: dots_saveable"
    assert repr(big.resolution) == (f"Resolution(2 rules over 194 modules, 128 boundaries; plan "
                                    f"{big.resolution.plan.fingerprint()})")
    assert repr(rc.compile_plan(rc.resolve(rc.Plan(), ["a"]))).startswith(
        "CompiledPlan(0 boundaries over 2 modules; plan ")
