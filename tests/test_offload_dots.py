"""``offload_dots_no_batch``: matmul outputs without batch dimensions moved to host.

It compiles to JAX's ``offload_dot_with_no_batch_dims`` (honoured on 0.11.0, 0.11.2 and 0.12, remat3
off and on: docs/semantics.md "Matmul outputs to host"). On the plain-JAX core model each layer has two
matmuls (``x @ w_in`` and ``a @ w_out``); their outputs are what goes to host.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import remat_common as rc
from remat_common.adapter import BoundarySpec, compile_boundary

from fixtures.core_model import ACT_BYTES, L, PATHS, compile_plan, init, loss_loop
from fixtures.tolerance import assert_close


@pytest.mark.compat
def test_parsed_with_memory_kinds_and_round_trips():
    ann = rc.parse_annotation({"remat": "offload_dots_no_batch", "offload_dst": "unpinned_host"})
    assert ann.is_boundary and ann.moves_to_host
    assert rc.parse_annotation(ann.to_config()) == ann
    plan = compile_plan({"layers.*": ann.to_config()})
    b = plan.boundary("layers.0")
    assert b.policy_name == "offload_dot_with_no_batch_dims"
    assert b.spec.offload_dst == "unpinned_host" and "device->unpinned_host" in b.describe()


@pytest.mark.compat
def test_memory_kinds_are_checked():
    with pytest.raises(rc.AnnotationError, match=r"does not move activations off the device.*Fix"):
        rc.parse_annotation({"remat": "offload_dots_no_batch", "offload_dst": "device"})
    caps = dataclasses.replace(rc.capabilities(), memory_kinds=("device",), backend="tpu")
    with pytest.raises(rc.CapabilityError, match=r"(?s)module 'l': the plan offloads its matmul outputs.*Fix"):
        compile_boundary(BoundarySpec("l", "offload_dots_no_batch"), caps)


@pytest.mark.compat
@pytest.mark.parametrize("nested_in", ["recompute", "offload"])
def test_cannot_merge_into_an_enclosing_boundary(nested_in):
    with pytest.raises(rc.PlanError, match=r"(?s)'layers.0'.*inside the remat boundary at 'layers'.*Saving matmul outputs.*Fix"):
        compile_plan({"layers": nested_in, "layers.0": "offload_dots_no_batch"})


@pytest.mark.compat
def test_matmul_outputs_go_to_host_and_gradients_match():
    """(remat3 off and on: tests/test_flax_vocabulary.py and tests/test_eqx_remat.py.)"""
    params, x = init(jax.random.key(0)), jnp.ones((8, 16))
    plan = compile_plan({"layers.*": "offload_dots_no_batch"})
    check = rc.verify(loss_loop, params, x, plan, plan=plan, strict=True)
    host = check.report.select(placement="host")
    # per layer, h = x @ w_in (tanh's derivative reads it); a @ w_out only feeds a sum: not needed
    assert check.report.nbytes("host") == L * ACT_BYTES
    assert all(r.shape == (8, 16) and r.name is None for r in host)
    assert not check.report.names("device")  # h and act are recomputed, not kept by name
    assert_close(jax.grad(loss_loop)(params, x, plan), jax.grad(loss_loop)(params, x, None))


@pytest.mark.compat
def test_a_boundary_without_matmuls_is_reported():
    """Nothing reaches host when the module has no matmul: verify says the offload changes nothing."""
    plan = rc.compile_plan(rc.resolve(rc.Plan.coerce({"f": "offload_dots_no_batch"}), ["f"]))
    fn = lambda x: jnp.sum(rc.adapter.call_module(plan, "f", lambda x: jnp.sin(jnp.sin(x)), x))  # noqa: E731
    check = rc.verify(fn, jnp.ones((4, 4)), plan=plan, strict=False)
    assert any("offload_dots_no_batch" in p and "no residual is on host" in p for p in check.problems)
