"""Verification and measurement on models shaped like public ones: typed PRNG keys and integer
inputs, stacks scanned by scan_layers / Stacked / the model's own nnx.scan and lax.scan, layer
groups, and FLOPs of scanned stacks (XLA counts a loop body once; the report must not)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import equinox_remat_plugin as er
import flax_remat_plugin as frp
import remat_common as rc

import eqx_models as em
import nnx_models as nm

L = nm.LAYERS


def _verify(model: nnx.Module, **kw: object) -> rc.Verification:
    loss, params = nm.split_loss(model, *nm.batch())
    return rc.verify(loss, params, plan=frp.compiled_plan(model), **kw)  # type: ignore[arg-type]


def _named(v: rc.Verification | rc.ResidualReport) -> dict[str, rc.Residual]:
    rep = v.report if isinstance(v, rc.Verification) else v
    return {r.name: r for r in rep.residuals if r.name is not None}


# -- a ViT-like block with dropout (typed keys from nnx.Rngs) and integer positions -------------------

class ViTBlock(nnx.Module):
    """Pre-norm attention + MLP with dropout; positions (int32) are an input of the block."""

    def __init__(self, d: int, *, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, rngs=rngs)
        self.mlp = nnx.Linear(d, d, rngs=rngs)
        self.pos = nnx.Embed(16, d, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        h = self.norm(x) + self.pos(positions)
        q, k, v = jnp.split(self.qkv(h), 3, axis=-1)
        a = jax.nn.softmax(q @ k.swapaxes(-1, -2) / jnp.sqrt(jnp.float32(x.shape[-1]))) @ v
        a = frp.checkpoint_name(self.drop(a), "attn_out")
        return x + self.mlp(jax.nn.gelu(a))


class ViT(nnx.Module):
    def __init__(self, d: int = 16, depth: int = 2, *, rngs: nnx.Rngs) -> None:
        self.patch = nnx.Linear(12, d, rngs=rngs)
        self.blocks = nnx.List([ViTBlock(d, rngs=rngs) for _ in range(depth)])
        self.head = nnx.Linear(d, 4, rngs=rngs)

    def __call__(self, patches: jax.Array) -> jax.Array:
        positions = jnp.broadcast_to(jnp.arange(patches.shape[1]), patches.shape[:2])
        x = self.patch(patches)
        for block in self.blocks:
            x = block(x, positions)
        return self.head(x.mean(axis=1))


def _vit_loss(model: nnx.Module) -> tuple[object, object, jax.Array]:
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    patches = jax.random.normal(jax.random.key(1), (2, 8, 12))

    def loss(params: object, patches: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, params, rest, copy=True)
        return jnp.mean(m(patches) ** 2)

    return loss, params, patches


def test_typed_keys_and_integer_inputs_are_reported_by_their_real_size(remat3):
    model = ViT(rngs=nnx.Rngs(0, dropout=jax.random.key(2)))
    frp.annotate(model, {"blocks.*": {"save": ["attn_out"]}})
    loss, params, patches = _vit_loss(model)
    v = rc.verify(loss, params, patches, plan=frp.compiled_plan(model), strict=True)
    assert v.ok
    keys = [r for r in v.report.residuals if r.dtype.startswith("key<")]
    assert keys and all(r.nbytes == 8 * int(np.prod(r.shape)) for r in keys)  # two uint32 per key
    names = _named(v)
    assert {n.rpartition("/")[0] for n in names} == {"blocks.0", "blocks.1"}
    assert all(names[n].nbytes == 2 * 8 * 16 * 4 for n in names)  # batch x patches x d float32


def test_offloading_a_modules_inputs_moves_floating_point_activations_only(remat3):
    model = ViT(rngs=nnx.Rngs(0, dropout=1))
    frp.annotate(model, {"blocks.*": "offload"})
    loss, params, patches = _vit_loss(model)
    v = rc.verify(loss, params, patches, plan=frp.compiled_plan(model), strict=True)
    host = v.report.select(placement="host")
    # each block's float input x is on host; its int32 positions input and dropout keys are not
    assert sorted(r.name for r in host) == ["blocks.0/__input__", "blocks.1/__input__"]
    assert all(r.dtype == "float32" and r.shape == (2, 8, 16) for r in host)
    assert not any(r.placement == "host" for r in v.report.residuals if r.dtype != "float32")


# -- names inside scans --------------------------------------------------------------------------

@pytest.mark.parametrize("plan", [{"layers.*": {"save": ["attn_out"]}},
                                  {"layers.*": {"save": ["attn_out"], "offload": ["mlp_hidden"]}}])
def test_names_kept_inside_scan_layers_match_the_list_layout_per_layer(remat3, plan):
    lst, scanned = nm.Transformer(rngs=nnx.Rngs(0)), nm.ScannedTransformer(rngs=nnx.Rngs(0))
    frp.annotate(lst, plan)
    frp.annotate(scanned, plan)
    a, b = _verify(lst, strict=True), _verify(scanned, strict=True)
    assert a.ok and b.ok and not b.report.opaque
    per_list = {n.replace("layers.1.", "layers.0."): r for n, r in _named(a).items()}
    for name, r in _named(b).items():  # one stacked residual per name, one row per layer
        assert r.layers == L and r.shape[0] == L
        twin = per_list[name]
        assert (r.per_layer, r.placement, r.dtype) == (twin.nbytes, twin.placement, twin.dtype)
        assert sum(x.nbytes for n, x in _named(a).items() if n.endswith(name.rpartition("/")[2])) \
            == r.nbytes
    want = {"layers.0.attn/attn_out"} | ({"layers.0.mlp/mlp_hidden"} if "offload" in plan["layers.*"]
                                          else set())
    assert set(_named(b)) == want
    assert {r.placement for r in b.report.residuals if r.name == "layers.0.mlp/mlp_hidden"} <= {"host"}


class OwnScan(nnx.Module):
    """Stacked blocks scanned by the model's own ``nnx.scan`` around ``nnx.remat`` (no adapter)."""

    def __init__(self, policy: object, *, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> nm.Block:
            return nm.Block(nm.D, nm.HEADS, nm.F, rngs=rngs)

        self.embed = nnx.Embed(nm.VOCAB, nm.D, rngs=rngs)
        self.layers = create(rngs)
        self.head = nnx.Linear(nm.D, nm.VOCAB, rngs=rngs)
        self.policy = policy

    def __call__(self, tokens: jax.Array) -> jax.Array:
        @nnx.remat(policy=self.policy)
        def body(layer: nm.Block, x: jax.Array) -> jax.Array:
            return layer(x)

        scan = nnx.scan(lambda x, layer: body(layer, x), in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        return self.head(scan(self.embed(tokens), self.layers))


def test_a_models_own_nnx_scan_is_seen_through(remat3):
    policy = jax.checkpoint_policies.save_only_these_names("attn_out")
    model = OwnScan(policy, rngs=nnx.Rngs(0))
    loss, params = nm.split_loss(model, *nm.batch())
    rep = rc.saved_residuals(loss, params)
    assert not rep.opaque
    kept = _named(rep)
    assert set(kept) == {"attn_out"} and kept["attn_out"].layers == L
    assert kept["attn_out"].per_layer == nm.BATCH * nm.SEQ * nm.D * 4


def test_lax_scan_residuals_keep_names_bytes_and_iterations(remat3):
    def layer(w: jax.Array, h: jax.Array) -> jax.Array:
        a = rc.checkpoint_name(jnp.sin(h @ w), "a")
        return jnp.cos(rc.checkpoint_name(a @ w, "b"))

    body = rc.checkpoint(layer, {"save": ["a"]}, path="layer")

    def f(ws: jax.Array, h: jax.Array) -> jax.Array:
        return jnp.sum(jax.lax.scan(lambda c, w: (body(w, c), None), h, ws)[0])

    rep = rc.saved_residuals(f, jnp.ones((5, 4, 4)), jnp.ones((3, 4)))
    (a,) = [r for r in rep.residuals if r.kind == "named"]
    assert (a.name, a.shape, a.layers, a.per_layer) == ("layer/a", (5, 3, 4), 5, 48)
    # the carry of every iteration is the boundary's input, kept per layer; ws is the argument
    assert sorted((r.kind, r.shape) for r in rep.residuals) == [
        ("argument", (5, 4, 4)), ("named", (5, 3, 4)), ("other", (5, 3, 4))]


def test_strict_verify_names_module_and_name_kept_in_a_scan_the_plan_recomputes(remat3):
    model = nm.ScannedTransformer(rngs=nnx.Rngs(0))
    frp.annotate(model, {"layers.*": {"save": ["attn_out"]}})
    recompute = rc.compile_plan(rc.resolve(rc.Plan.from_mapping({"layers.*": "recompute"}),
                                           frp.module_paths(model), stacks=["layers"]))
    loss, params = nm.split_loss(model, *nm.batch())
    with pytest.raises(rc.VerificationError, match=r"layers\.0\.attn/attn_out.*kept on device but "
                                                   r"the plan does not save"):
        rc.verify(loss, params, plan=recompute, strict=True)


def test_strict_verify_fails_on_a_part_it_cannot_see_into(remat3):
    def layer(w: jax.Array, h: jax.Array) -> jax.Array:
        a = rc.checkpoint_name(jnp.sin(h @ w), "a")
        return jax.lax.cond(jnp.sum(a) > 0, lambda t: jnp.tanh(rc.checkpoint_name(t @ w, "c")),
                            lambda t: t @ w, a)

    plan = rc.compile_plan(rc.resolve(rc.Plan.from_mapping({"blk": "save"}), ["", "blk"]))
    f = lambda w, h: jnp.sum(rc.call_module(plan, "blk", layer, w, h))  # noqa: E731
    with pytest.raises(rc.VerificationError, match=r"module 'blk'.*cannot be verified: output of cond"):
        rc.verify(f, jnp.ones((4, 4)), jnp.ones((3, 4)), plan=plan, strict=True)
