"""An annotated Equinox model on an 8-device CPU mesh (data parallel), in a subprocess so that the
device count can be forced without touching this process's JAX."""

from __future__ import annotations

import pytest

from devices import run_on_cpu_devices


SCRIPT = r"""
import equinox as eqx
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import equinox_remat_plugin as er
from fixtures import eqx_models as em
from fixtures.tolerance import assert_close

assert jax.device_count() == 8, jax.devices()
mesh = jax.make_mesh((8,), ("data",))
dims = em.Dims(batch=8, layers=2)
x = jax.device_put(em.inputs(1, dims), NamedSharding(mesh, P("data")))
replicated = NamedSharding(mesh, P())
step = eqx.filter_jit(eqx.filter_value_and_grad(em.loss))
plan = {"blocks.*": "offload", "blocks.*.attn": {"save": ["attn_out"]}}

for stacked in (False, True):
    model = eqx.filter_shard(em.transformer(0, dims, stacked=stacked), replicated)
    v0, g0 = step(model, x)
    annotated = er.annotate(model, plan)
    v1, g1 = step(annotated, x)
    assert_close(v1, v0)
    g0, g1 = (jax.tree_util.tree_leaves(eqx.filter(g, eqx.is_array)) for g in (g0, er.unwrap(g1)))
    assert len(g0) == len(g1) > 0
    for a, b in zip(g1, g0):
        assert_close(a, b)
        assert a.sharding.is_fully_replicated and len(a.sharding.device_set) == 8
    # the step really runs data-parallel: gradients are summed across the 8 devices
    params, static = eqx.partition(annotated, eqx.is_array)
    grad = jax.jit(lambda p, x: jax.grad(lambda p: em.loss(eqx.combine(p, static), x))(p))
    hlo = grad.lower(params, x).compile().as_text()
    assert "all-reduce" in hlo, "no cross-device reduction in the compiled step"
    print("ok", "scan" if stacked else "list", float(v1))
"""


@pytest.mark.slow
def test_eight_device_mesh(tmp_path):
    proc = run_on_cpu_devices(SCRIPT, tmp_path, 8)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split()[:2] for line in proc.stdout.splitlines()] == [["ok", "list"], ["ok", "scan"]]
