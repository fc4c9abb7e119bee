"""Small Equinox transformers for the adapter's tests and benchmark.

``Transformer`` holds its blocks as a Python list (paths ``blocks.0.attn`` ...) or as a
``Stacked`` built from the same parameters (scan over layers, the same paths as virtual ones).
Modules work on ``[batch, seq, dim]`` arrays directly (no ``jax.vmap`` around the model), so the
MLP's custom remat rule (``jax.custom_remat`` has no batching rule) can run.

Tags: ``blocks.i.attn/attn_out`` (attention output before the projection) and
``blocks.i.mlp/hidden`` (MLP pre-activation). ``UserModel`` is written as a user would, from
``eqx.nn.MultiheadAttention``, ``eqx.nn.MLP`` and ``eqx.nn.LayerNorm``, with no tags at all.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import equinox_remat_plugin as er
import remat_common as rc
from remat_common import checkpoint_name


@dataclasses.dataclass(frozen=True)
class Dims:
    batch: int = 2
    seq: int = 4
    d_in: int = 8
    dim: int = 16
    heads: int = 2
    hidden: int = 32
    layers: int = 3
    dropout: float = 0.1

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


SMALL = Dims()


class Dense(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, d_in: int, d_out: int, *, rng: np.random.Generator) -> None:
        # numpy initialisation: building the test models compiles nothing
        self.weight = jnp.asarray(rng.standard_normal((d_in, d_out), np.float32) / d_in**0.5)
        self.bias = jnp.full((d_out,), 0.01, jnp.float32)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight + self.bias


class LayerNorm(eqx.Module):
    scale: jax.Array
    shift: jax.Array

    def __init__(self, dim: int) -> None:
        self.scale = jnp.ones(dim, jnp.float32)
        self.shift = jnp.zeros(dim, jnp.float32)

    def __call__(self, x: jax.Array) -> jax.Array:
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * self.scale + self.shift


class Attention(eqx.Module):
    qkv: Dense
    out: Dense
    heads: int = eqx.field(static=True)

    def __init__(self, dim: int, heads: int, *, rng: np.random.Generator) -> None:
        self.qkv = Dense(dim, 3 * dim, rng=rng)
        self.out = Dense(dim, dim, rng=rng)
        self.heads = heads

    def __call__(self, x: jax.Array) -> jax.Array:
        *lead, t, d = x.shape
        q, k, v = (a.reshape(*lead, t, self.heads, d // self.heads)
                   for a in jnp.split(self.qkv(x), 3, axis=-1))
        s = jnp.einsum("...qhd,...khd->...hqk", q, k) / (d // self.heads) ** 0.5
        o = jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(s, axis=-1), v)
        o = checkpoint_name(o.reshape(*lead, t, d), "attn_out")
        return self.out(o)


def _mlp(w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w1 + b1) @ w2 + b2


def _mlp_fwd(ambient: rc.Ambient, w1, b1, w2, b2, x):  # noqa: ANN001, ANN202 - rule signature
    del ambient
    a = jnp.tanh(x @ w1 + b1)
    return a @ w2 + b2, {"act": a}


def _mlp_rem(res, w1, b1, w2, b2, x):  # noqa: ANN001, ANN202
    a = res["act"] if res["act"] is not None else jnp.tanh(x @ w1 + b1)
    return a @ w2 + b2, (a, w1, w2, x)


def _mlp_bwd(res, ct):  # noqa: ANN001, ANN202
    a, w1, w2, x = res
    lead = tuple(range(ct.ndim - 1))
    d_h = (ct @ w2.T) * (1 - a * a)
    return (jnp.einsum("...i,...o->io", x, d_h), jnp.sum(d_h, lead),
            jnp.einsum("...i,...o->io", a, ct), jnp.sum(ct, lead), d_h @ w1.T)


#: The MLP with its own rules: the forward rule keeps the activation ``act`` (no first matmul in
#: the backward pass) unless the ambient policy recomputes it.
MLP_RULES = rc.RuleSet("tanh_mlp", _mlp, _mlp_fwd, _mlp_rem, _mlp_bwd, residuals=("act",),
                       keep=frozenset({"act"}))


class MLP(eqx.Module):
    fc1: Dense
    fc2: Dense

    def __init__(self, dim: int, hidden: int, *, rng: np.random.Generator) -> None:
        self.fc1 = Dense(dim, hidden, rng=rng)
        self.fc2 = Dense(hidden, dim, rng=rng)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = checkpoint_name(self.fc1(x), "hidden")
        return self.fc2(jnp.tanh(h))

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        """The same function through its own remat rules (``MLP_RULES``)."""
        return MLP_RULES(self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, x)


class Block(eqx.Module):
    ln1: LayerNorm
    attn: Attention
    ln2: LayerNorm
    mlp: MLP
    dropout: eqx.nn.Dropout

    def __init__(self, dims: Dims, *, rng: np.random.Generator) -> None:
        self.ln1 = LayerNorm(dims.dim)
        self.attn = Attention(dims.dim, dims.heads, rng=rng)
        self.ln2 = LayerNorm(dims.dim)
        self.mlp = MLP(dims.dim, dims.hidden, rng=rng)
        self.dropout = eqx.nn.Dropout(dims.dropout)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        h = self.mlp(self.ln2(x))
        if key is not None:  # dropout runs only when the caller passes a key
            h = self.dropout(h, key=key)
        return x + h


class Transformer(eqx.Module):
    embed: Dense
    blocks: list[Block] | er.Stacked[Block]
    head: Dense

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        h = self.embed(x)
        if isinstance(self.blocks, er.Stacked):
            h = self.blocks(h, key=key)
        else:
            keys = [None] * len(self.blocks) if key is None else list(jax.random.split(key, len(self.blocks)))
            for block, k in zip(self.blocks, keys, strict=True):
                h = block(h, key=k)
        return self.head(h)


def transformer(seed: int = 0, dims: Dims = SMALL, *, stacked: bool = False) -> Transformer:
    """A transformer; the stacked variant has exactly the list variant's parameters."""
    rng = np.random.default_rng(seed)
    embed = Dense(dims.d_in, dims.dim, rng=rng)
    blocks = [Block(dims, rng=rng) for _ in range(dims.layers)]
    head = Dense(dims.dim, dims.d_in, rng=rng)
    return Transformer(embed, stack(blocks) if stacked else blocks, head)


def stack(blocks: list[Block]) -> er.Stacked[Block]:
    """A ``Stacked`` holding the same parameters as a list of blocks."""
    arrays = [eqx.filter(b, eqx.is_array) for b in blocks]
    static = eqx.filter(blocks[0], eqx.is_array, inverse=True)
    return er.Stacked(eqx.combine(jax.tree_util.tree_map(lambda *a: jnp.stack(a), *arrays), static))


def inputs(seed: int = 1, dims: Dims = SMALL) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal((dims.batch, dims.seq, dims.d_in), np.float32))


def loss(model: eqx.Module, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
    y = model(x, key=key)
    return jnp.mean((y - x) ** 2)


# -- written as a user would: eqx.nn layers on one sequence, vmapped over the batch --------------

class UserBlock(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, dim: int, heads: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(dim)
        self.attention = eqx.nn.MultiheadAttention(heads, dim, key=k1)
        self.norm2 = eqx.nn.LayerNorm(dim)
        self.mlp = eqx.nn.MLP(dim, dim, 2 * dim, depth=1, activation=jax.nn.gelu, key=k2)

    def __call__(self, x: jax.Array) -> jax.Array:  # x: [seq, dim]
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class UserModel(eqx.Module):
    blocks: tuple[UserBlock, ...]
    head: eqx.nn.Linear

    def __init__(self, dim: int = 16, heads: int = 2, depth: int = 2, *, key: jax.Array) -> None:
        keys = jax.random.split(key, depth + 1)
        self.blocks = tuple(UserBlock(dim, heads, key=k) for k in keys[:-1])
        self.head = eqx.nn.Linear(dim, dim, key=keys[-1])

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(x)
