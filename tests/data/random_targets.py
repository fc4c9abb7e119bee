"""Two training steps that draw random numbers, for ``remat report`` / ``remat tune`` and the FLOP
tests: an NNX transformer with dropout (``nnx.Dropout`` streams from ``nnx.Rngs``) and an
Equinox denoiser trained with a diffusion-style loss (noise from ``jax.random.normal`` under
``vmap``). On CPU each draw is a threefry loop; their FLOPs are counted per iteration.

Both hold their blocks in a list (paths ``blocks.<i>``); each block tags ``attn_out`` and
``mlp_hidden``. The steps are plain SGD, so the targets need nothing beyond the two frameworks.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import equinox_remat_plugin as erp
import flax_remat_plugin as frp
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from remat_common import Plan, checkpoint_name
from remat_common.measurement import MeasureTarget


def _attention(x: jax.Array, qkv: jax.Array, heads: int) -> jax.Array:
    b, t, d = x.shape
    q, k, v = (a.reshape(b, t, heads, d // heads) for a in jnp.split(x @ qkv, 3, -1))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(b, t, d)


class NnxBlock(nnx.Module):
    def __init__(self, d: int, heads: int, rate: float, *, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.norm1 = nnx.RMSNorm(d, rngs=rngs)
        self.qkv = nnx.Param(jax.random.normal(rngs.params(), (d, 3 * d)) / d**0.5)
        self.out = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.drop1 = nnx.Dropout(rate, rngs=rngs)
        self.norm2 = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, use_bias=False, rngs=rngs)
        self.drop2 = nnx.Dropout(rate, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        a = checkpoint_name(_attention(self.norm1(x), self.qkv[...], self.heads), "attn_out")
        x = x + self.drop1(self.out(a))
        h = checkpoint_name(jax.nn.gelu(self.up(self.norm2(x))), "mlp_hidden")
        return x + self.drop2(self.down(h))


class DropoutLM(nnx.Module):
    def __init__(self, *, vocab: int, d_model: int, n_layers: int, n_heads: int, rate: float,
                 rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocab, d_model, rngs=rngs)
        self.blocks = nnx.List([NnxBlock(d_model, n_heads, rate, rngs=rngs)
                                for _ in range(n_layers)])
        self.head = nnx.Linear(d_model, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def dropout_target(plan: Plan | None, *, batch: int, vocab: int = 64, d_model: int = 32,
                   n_layers: int = 3, n_heads: int = 2, seq_len: int = 32, rate: float = 0.1,
                   seed: int = 0, lr: float = 0.01) -> MeasureTarget:
    """The NNX transformer with dropout under ``plan`` (``None``: as written): one SGD step."""
    model = DropoutLM(vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, rate=rate,
                      rngs=nnx.Rngs(params=seed, dropout=seed + 1))
    compiled = None
    if plan is not None:
        frp.annotate(model, plan)
        compiled = frp.compiled_plan(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (batch, seq_len + 1)),
                         jnp.int32)

    def loss_fn(params: nnx.State, rest: nnx.State, tokens: jax.Array) -> jax.Array:
        logits = nnx.merge(graphdef, params, rest, copy=True)(tokens[:, :-1])
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

    def step_fn(params: nnx.State, rest: nnx.State, tokens: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, rest, tokens)
        return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss

    return MeasureTarget(loss_fn, (params, rest, tokens), step_fn, (params, rest, tokens), compiled)


class EqxBlock(eqx.Module):
    norm1: eqx.nn.LayerNorm
    qkv: jax.Array
    out: jax.Array
    norm2: eqx.nn.LayerNorm
    up: jax.Array
    down: jax.Array
    heads: int = eqx.field(static=True)

    def __init__(self, d: int, heads: int, *, key: jax.Array) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.norm1, self.norm2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
        self.qkv = jax.random.normal(k1, (d, 3 * d)) / d**0.5
        self.out = jax.random.normal(k2, (d, d)) / d**0.5
        self.up = jax.random.normal(k3, (d, 4 * d)) / d**0.5
        self.down = jax.random.normal(k4, (4 * d, d)) / (4 * d) ** 0.5
        self.heads = heads

    def __call__(self, x: jax.Array) -> jax.Array:
        a = checkpoint_name(_attention(jax.vmap(jax.vmap(self.norm1))(x), self.qkv, self.heads),
                            "attn_out")
        x = x + a @ self.out
        h = checkpoint_name(jax.nn.gelu(jax.vmap(jax.vmap(self.norm2))(x) @ self.up), "mlp_hidden")
        return x + h @ self.down


class Denoiser(eqx.Module):
    embed: jax.Array
    blocks: list[EqxBlock]
    head: jax.Array

    def __init__(self, *, channels: int, d_model: int, n_layers: int, n_heads: int,
                 key: jax.Array) -> None:
        keys = jax.random.split(key, n_layers + 2)
        self.embed = jax.random.normal(keys[0], (channels + 1, d_model)) / channels**0.5
        self.blocks = [EqxBlock(d_model, n_heads, key=k) for k in keys[1:-1]]
        self.head = jax.random.normal(keys[-1], (d_model, channels)) / d_model**0.5

    def __call__(self, x: jax.Array, t: jax.Array) -> jax.Array:  # x: [batch, seq, channels]
        h = jnp.concatenate([x, jnp.broadcast_to(t, (*x.shape[:-1], 1))], -1) @ self.embed
        for block in self.blocks:
            h = block(h)
        return h @ self.head


def diffusion_target(plan: Plan | None, *, batch: int, channels: int = 8, d_model: int = 32,
                     n_layers: int = 3, n_heads: int = 2, seq_len: int = 32, seed: int = 0,
                     lr: float = 0.01) -> MeasureTarget:
    """The Equinox denoiser under ``plan``: one SGD step on a diffusion-style loss (a noise level
    per example, Gaussian noise drawn per example under ``vmap``, the noise predicted)."""
    model = Denoiser(channels=channels, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                     key=jax.random.key(seed))
    compiled = None
    if plan is not None:
        model = erp.annotate(model, plan)
        compiled = erp.compiled_plan(model)
    params, static = eqx.partition(model, eqx.is_array)
    x0 = jnp.asarray(np.random.default_rng(seed).standard_normal((batch, seq_len, channels)),
                     jnp.float32)
    key = jax.random.key(seed + 1)

    def loss_fn(params: Any, x0: jax.Array, key: jax.Array) -> jax.Array:
        k_t, k_n = jax.random.split(key)
        t = jax.random.uniform(k_t, (x0.shape[0], 1, 1))
        noise = jax.vmap(lambda k, x: jax.random.normal(k, x.shape))(
            jax.random.split(k_n, x0.shape[0]), x0)
        xt = jnp.sqrt(1 - t) * x0 + jnp.sqrt(t) * noise
        return jnp.mean((eqx.combine(params, static)(xt, t) - noise) ** 2)

    def step_fn(params: Any, x0: jax.Array, key: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x0, key)
        return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss

    return MeasureTarget(loss_fn, (params, x0, key), step_fn, (params, x0, key), compiled)
