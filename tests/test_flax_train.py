"""Training with a plan: nnx.jit + nnx.value_and_grad + nnx.Optimizer (optax), dropout rng streams,
orbax checkpoints across annotation, and an 8-device CPU mesh (in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import flax_remat_plugin as frp
from devices import with_devices
from fixtures import nnx_models as nm
from fixtures.tolerance import assert_close

ROOT = Path(__file__).resolve().parents[1]
TX = optax.adam(1e-2)  # one object: the optimizer's graphdef (and so nnx.jit's cache) is shared
PLANS: dict[str, dict[str, Any]] = {
    # mixed: offload the first block, recompute the others but keep their attention outputs
    "list": {"layers.*": "recompute", "layers.*.attn": {"save": ["attn_out"]}, "layers.0": "offload"},
    # two layer groups, so the scan is split and the rng counts of both slices are written back
    "scanned": {"layers": "recompute", "layers.0": "offload"},
}


def _model(variant: str, seed: int = 0) -> nnx.Module:
    cls = nm.ScannedTransformer if variant == "scanned" else nm.Transformer
    return cls(dropout=0.1, rngs=nnx.Rngs(params=seed, dropout=seed + 100))


@nnx.jit
def train_step(model: nnx.Module, optimizer: nnx.Optimizer, tokens: jax.Array,
               targets: jax.Array) -> jax.Array:
    loss, grads = nnx.value_and_grad(nm.loss_fn)(model, tokens, targets)
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int and float
        optimizer.update(model, grads)
    return loss


def _train(model: nnx.Module, steps: int) -> list[float]:
    opt = nnx.Optimizer(model, TX, wrt=nnx.Param)
    # Commit every array to the device, as a restored checkpoint is: jit keys its cache on it, so
    # fresh, trained and restored models then share one compiled step per graphdef.
    for obj in (model, opt):
        nnx.update(obj, jax.device_put(nnx.state(obj), jax.devices()[0]))
    tokens, targets = nm.batch(0)
    return [float(train_step(model, opt, tokens, targets)) for _ in range(steps)]


def _rng_counts(model: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.RngCount))]


@pytest.mark.parametrize("variant", ["list", "scanned"])
def test_optax_steps_give_identical_losses_with_and_without_a_plan(variant):
    plain, annotated = _model(variant), frp.annotate(_model(variant), PLANS[variant])
    losses = _train(plain, 3)
    # recomputation replays the same ops (bit for bit for the list; a split scan may reorder a sum)
    assert_close(_train(annotated, 3), losses)
    assert losses[-1] < losses[0]
    counts = _rng_counts(annotated)  # the dropout streams advanced inside the remat boundaries
    for a, b in zip(counts, _rng_counts(plain), strict=True):
        np.testing.assert_array_equal(a, b)
    assert all(int(np.max(c)) == 3 for c in counts)  # one dropout draw per step, every layer
    nm.assert_trees_close(nnx.state(annotated, nnx.Param), nnx.state(plain, nnx.Param))


def test_orbax_checkpoints_restore_across_annotation(tmp_path):
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    plain = _model("list")
    _train(plain, 1)
    checkpointer.save(tmp_path / "plain", nnx.state(plain))
    checkpointer.wait_until_finished()
    # 1) the un-annotated model's checkpoint restores into an annotated model (other weights)
    annotated = frp.annotate(_model("list", seed=1), PLANS["list"])
    restored = checkpointer.restore(tmp_path / "plain", nnx.state(annotated))
    nnx.update(annotated, restored)
    nm.assert_trees_close(nnx.state(annotated), nnx.state(plain), exact=True)
    losses = _train(annotated, 2)
    assert_close(_train(plain, 2), losses)
    # 2) ... and the annotated model's checkpoint restores into a plain model
    checkpointer.save(tmp_path / "annotated", nnx.state(annotated))
    checkpointer.wait_until_finished()
    fresh = _model("list", seed=2)
    nnx.update(fresh, checkpointer.restore(tmp_path / "annotated", nnx.state(fresh)))
    assert_close(_train(fresh, 2), _train(annotated, 2))
    checkpointer.close()


_MESH_SCRIPT = r"""
import sys
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from flax import nnx
sys.path.insert(0, ".")  # the repository root: the fixtures package
from fixtures import nnx_models as nm
from fixtures.tolerance import assert_close
import flax_remat_plugin as frp
import remat_common as rc

assert jax.device_count() == 8, jax.devices()
# Auto axes: XLA propagates shardings through the model (the model code has no sharding annotations)
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def spec(x):
    # matrices split over 'model' along their last axis; everything else replicated
    return P(*([None] * (x.ndim - 1)), "model") if x.ndim >= 2 and x.shape[-1] % 2 == 0 else P()


with jax.set_mesh(mesh):
    tokens, targets = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in nm.batch(0, batch=8))
    for variant, plan in [("list", {"layers.*": "offload", "layers.*.attn": {"save": ["attn_out"]}}),
                          ("scanned", {"layers": "recompute", f"layers.[1-{nm.LAYERS - 1}]": "offload"})]:
        out = {}
        for name in ("plain", "annotated"):
            cls = nm.ScannedTransformer if variant == "scanned" else nm.Transformer
            model = cls(rngs=nnx.Rngs(0))
            state = nnx.state(model)
            nnx.update(model, jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), state))
            if name == "annotated":
                frp.annotate(model, plan)
            loss, params = nm.split_loss(model, tokens, targets)
            value, grads = nm.fast_jit(jax.value_and_grad(loss))(params)
            out[name] = (value, grads, params)
        (v0, g0, p0), (v1, g1, p1) = out["plain"], out["annotated"]
        assert_close(v1, v0)
        nm.assert_trees_close(g1, g0)
        # the plan changes no sharding: gradients laid out as without it; parameters as placed
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
        kernels = [p for p in jax.tree.leaves(p1) if p.ndim >= 2 and p.shape[-1] % 2 == 0]
        assert kernels and all(p.sharding.spec[-1] == "model" for p in kernels)
        assert any(not g.sharding.is_fully_replicated for g in jax.tree.leaves(g1))
        print(variant, "ok", float(v1), len(kernels))
"""


@pytest.mark.slow  # an eight-device mesh (stage 1 only), as tests/test_eqx_sharding.py's
def test_sharded_8_device_mesh_gives_the_plain_gradients_and_shardings():
    env = {**os.environ, "XLA_FLAGS": with_devices(8), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_MESH_SCRIPT)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.split("\n")
    assert [ln.split()[:2] for ln in lines if ln] == [["list", "ok"], ["scanned", "ok"]]
