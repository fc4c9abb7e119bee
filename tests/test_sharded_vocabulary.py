"""Every vocabulary entry on an 8-device CPU mesh (data x fsdp x tensor = 2 x 2 x 2), both frameworks.

Parameters are sharded over ``fsdp`` and ``tensor``, the batch over ``data``. Per framework and
plan: ``annotate`` leaves every parameter's sharding as it was; the sharded step's gradients equal
the un-annotated, unsharded model's. In the step exported for ``cuda`` (sharding propagated as
XLA's partitioner would) every offloaded residual of the two offloading plans goes to
``pinned_host`` and back with the sharding it was computed with — split over ``data`` like the
batch, never gathered — while ``recompute`` (standing for the plans that offload nothing; one
export each costs) places nothing on host. The same check flags a value that changes sharding on
its way to host. One subprocess runs all cases, so the device count can
be forced without touching this process's JAX.
"""

from __future__ import annotations

import json

import pytest

from devices import run_on_cpu_devices

pytest.importorskip("flax")
pytest.importorskip("equinox")


SCRIPT = r"""
import json, sys
import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import equinox_remat_plugin as er
import flax_remat_plugin as frp
from remat_common.measurement import export_placements
from fixtures import eqx_models as em
from fixtures import nnx_models as nm
from fixtures.tolerance import assert_close
from fixtures.vocabulary import EQX_PLANS, NNX_PLANS

assert jax.device_count() == 8, jax.devices()
mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
OFFLOADING = {"offload", "names"}
EXPORTED = OFFLOADING | {"recompute"}  # and one that offloads nothing: no host placement at all


def spec(a):
    # 2-D weights over fsdp x tensor, vectors over tensor, where the sizes divide
    axes = ("fsdp", "tensor")[-a.ndim:] if a.ndim <= 2 else (None,) * (a.ndim - 2) + ("fsdp", "tensor")
    return NamedSharding(mesh, P(*(ax if n % 2 == 0 else None for ax, n in zip(axes, a.shape))))


def shard(tree):
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, spec(a)), tree)


def shardings(tree):
    return [a.sharding for a in jax.tree_util.tree_leaves(tree)]


def check_placements(fw, name, fn, *args):
    if name not in EXPORTED:
        return None
    ps = export_placements(fn, *args)
    host = [p for p in ps if p.to_host]
    back = [p for p in ps if not p.to_host]
    if name not in OFFLOADING:
        assert not host, (fw, name, host)
        return {"to_host": 0}
    assert host and back, (fw, name, ps)
    for p in ps:
        assert p.keeps_sharding, (fw, name, p)
    for p in host:  # an activation: split over data like the batch, one device holds a part
        assert p.kind == "pinned_host", (fw, name, p)
        assert any("data" in ax for ax in p.axes), (fw, name, p)
        assert p.shard_nbytes * 2 <= p.nbytes, (fw, name, p)
    return {"to_host": len(host), "to_device": len(back),
            "host_bytes": sum(p.nbytes for p in host),
            "host_bytes_per_device": sum(p.shard_nbytes for p in host),
            "shardings": sorted({p.sharding for p in host})}


def all_grads(losses, params, *batch):
    # every plan's gradients in one compiled program (one SPMD compile instead of eight: the
    # compiles are the cost of this test); each plan differentiates its own copy of the
    # parameters, so XLA cannot share work between plans
    def grads(params, *batch):
        return {n: jax.grad(losses[n])(params[n], *batch) for n in losses}

    return nm.fast_jit(grads)(params, *batch)


out = {}

# -- Flax NNX: the nnx.List transformer ---------------------------------------------------------
tokens, targets = nm.batch(0, batch=4)
data = NamedSharding(mesh, P("data"))
s_tokens, s_targets = jax.device_put(tokens, data), jax.device_put(targets, data)


def nnx_grad_fn(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, tokens, targets):
        return nm.loss_fn(nnx.merge(graphdef, params, rest, copy=True), tokens, targets)

    return loss, params


loss0, params0 = nnx_grad_fn(nm.Transformer(layers=1, rngs=nnx.Rngs(0)))
g0 = nm.fast_jit(jax.grad(loss0))(params0, tokens, targets)
losses, params = {}, {}
for name, plan in NNX_PLANS.items():
    model = nm.Transformer(layers=1, rngs=nnx.Rngs(0))
    nnx.update(model, shard(nnx.state(model, nnx.Param)))
    before = shardings(nnx.state(model, nnx.Param))
    frp.annotate(model, plan)
    assert shardings(nnx.state(model, nnx.Param)) == before, name
    losses[name], params[name] = nnx_grad_fn(model)
grads = all_grads(losses, params, s_tokens, s_targets)
for name in NNX_PLANS:
    nm.assert_trees_close(grads[name], g0)
    out[f"nnx/{name}"] = check_placements("nnx", name, jax.grad(losses[name]), params[name],
                                          s_tokens, s_targets)

# -- Equinox: the list transformer ---------------------------------------------------------------
dims = em.Dims(batch=4, layers=1)
x = em.inputs(1, dims)
s_x = jax.device_put(x, data)
params0, static0 = eqx.partition(em.transformer(0, dims), eqx.is_array)
g0 = nm.fast_jit(jax.grad(lambda p, x: em.loss(eqx.combine(p, static0), x)))(params0, x)
losses, params, statics = {}, {}, {}
for name, plan in EQX_PLANS.items():
    p, static = eqx.partition(em.transformer(0, dims), eqx.is_array)
    model = eqx.combine(shard(p), static)
    before = shardings(eqx.filter(model, eqx.is_array))
    annotated = er.annotate(model, plan)
    assert shardings(eqx.filter(annotated, eqx.is_array)) == before, name
    params[name], statics[name] = eqx.partition(annotated, eqx.is_array)
    losses[name] = (lambda st: lambda p, x: em.loss(eqx.combine(p, st), x))(statics[name])
grads = all_grads(losses, params, s_x)
for name in EQX_PLANS:
    g_plain = eqx.filter(er.unwrap(eqx.combine(grads[name], statics[name])), eqx.is_array)
    nm.assert_trees_close(g_plain, g0)
    out[f"eqx/{name}"] = check_placements("eqx", name, jax.grad(losses[name]), params[name], s_x)

# -- the check sees a lost sharding: a value sent to host replicated, though computed split over data
def lose(x):
    h = jax.device_put(jnp.sin(x), NamedSharding(mesh, P(), memory_kind="pinned_host"))
    return jax.device_put(h, NamedSharding(mesh, P("data"), memory_kind="device")) * 2


lost = [p for p in export_placements(jax.jit(lose), s_x) if p.to_host]
assert lost and not any(p.keeps_sharding for p in lost), lost
out["lost"] = [p.keeps_sharding for p in lost]

print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_every_vocabulary_entry_on_an_eight_device_mesh(tmp_path):
    proc = run_on_cpu_devices(SCRIPT, tmp_path, 8)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    from fixtures.vocabulary import EQX_PLANS, NNX_PLANS

    assert sorted(result) == sorted([f"nnx/{n}" for n in NNX_PLANS] + [f"eqx/{n}" for n in EQX_PLANS]
                                    + ["lost"])
    assert result["lost"] == [False]  # the same check flags an offload that changes sharding
    for fw in ("nnx", "eqx"):
        off, names = result[f"{fw}/offload"], result[f"{fw}/names"]
        # the one block's offload: its input for "offload", the named hidden for "names"
        assert off["to_host"] >= 1 and names["to_host"] >= 1, result
        # what one device moves is a quarter of the whole: the activations split over data x tensor
        # or data x fsdp at least halve it, never the full array on every device
        for r in (off, names):
            assert r["host_bytes_per_device"] * 2 <= r["host_bytes"], r
