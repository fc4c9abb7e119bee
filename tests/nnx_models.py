"""A small NNX transformer for the Flax adapter tests: an nnx.List of blocks and a scanned variant.

Each block is RMSNorm → attention (tags ``attn_out``) → dropout → residual, then LayerNorm →
gated MLP (tags ``mlp_hidden``; its ``__remat_custom__`` runs the core's gated-MLP rule set) →
residual. ``ScannedTransformer`` builds the same blocks with ``nnx.vmap`` and runs them with
``flax_remat_plugin.scan_layers``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import flax_remat_plugin as frp
import remat_common as rc
from tolerance import assert_close

VOCAB, D, HEADS, F, LAYERS = 40, 16, 2, 32, 2
BATCH, SEQ = 2, 8


class RMSNorm(nnx.Module):
    def __init__(self, d: int):
        self.scale = nnx.Param(jnp.ones((d,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * self.scale[...]


class Attention(nnx.Module):
    def __init__(self, d: int, heads: int, *, rngs: nnx.Rngs):
        self.heads = heads
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(d, d, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        q, k, v = (a.reshape(b, t, self.heads, d // self.heads) for a in jnp.split(self.qkv(x), 3, -1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // self.heads)
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(b, t, d)
        return frp.checkpoint_name(self.out(ctx), "attn_out")


#: The core's gated-MLP rule set: keeps the two pre-activations (``mlp_gate``, ``mlp_up``) unless
#: the enclosing boundary recomputes them.
MLP_RULES = rc.gated_mlp_rules()


class GatedMLP(nnx.Module):
    def __init__(self, d: int, f: int, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(d, f, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(d, f, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(f, d, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = frp.checkpoint_name(jax.nn.silu(self.gate(x)) * self.up(x), "mlp_hidden")
        return self.down(h)

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        """The same function through the core's gated-MLP rule set (used for ``custom``)."""
        return MLP_RULES(x, self.gate.kernel[...], self.up.kernel[...], self.down.kernel[...])


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, f: int, *, dropout: float = 0.0, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(d)
        self.attn = Attention(d, heads, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, rngs=rngs)
        self.mlp = GatedMLP(d, f, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


class Transformer(nnx.Module):
    """Embedding, ``layers`` (an ``nnx.List`` of blocks), final norm, output projection."""

    def __init__(self, *, vocab: int = VOCAB, d: int = D, heads: int = HEADS, f: int = F,
                 layers: int = LAYERS, dropout: float = 0.0, block: type[Block] | None = None,
                 rngs: nnx.Rngs):
        block = block or Block
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.layers = nnx.List([block(d, heads, f, dropout=dropout, rngs=rngs) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.head = nnx.Linear(d, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class ScannedTransformer(nnx.Module):
    """The same model with the blocks stacked by ``nnx.vmap`` and run by ``scan_layers``."""

    __remat_stacks__ = ("layers",)

    def __init__(self, *, vocab: int = VOCAB, d: int = D, heads: int = HEADS, f: int = F,
                 layers: int = LAYERS, dropout: float = 0.0, block: type[Block] | None = None,
                 rngs: nnx.Rngs):
        cls = block or Block
        self.embed = nnx.Embed(vocab, d, rngs=rngs)

        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> Block:
            return cls(d, heads, f, dropout=dropout, rngs=rngs)

        self.layers = create(rngs)
        self.norm = RMSNorm(d)
        self.head = nnx.Linear(d, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = frp.scan_layers(self.layers, self.embed(tokens))
        return self.head(self.norm(x))


def loss_fn(model: nnx.Module, tokens: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(model(tokens), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def batch(seed: int = 0, *, batch: int = BATCH, seq: int = SEQ,
          vocab: int = VOCAB) -> tuple[jax.Array, jax.Array]:
    tokens = jax.random.randint(jax.random.key(seed), (batch, seq + 1), 0, vocab)
    return tokens[:, :-1], tokens[:, 1:]


def split_loss(model: nnx.Module, tokens: jax.Array, targets: jax.Array) -> tuple[Any, Any]:
    """``(loss(params), params)``: the loss as a function of the model's parameters only."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params: Any) -> jax.Array:
        return loss_fn(nnx.merge(graphdef, params, rest, copy=True), tokens, targets)

    return loss, params


#: XLA:CPU options that cut compile time several-fold for the gradient-equality tests (both sides
#: of every comparison are compiled alike). Memory/FLOP measurements use the default options.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def fast_jit(fun: Any) -> Any:
    return jax.jit(fun, compiler_options=FAST_COMPILE)


def assert_trees_close(actual: Any, expected: Any, *, exact: bool = False) -> None:
    """Same structure, and every leaf equal to round-off (``tests/tolerance.py``), or bit for bit."""
    import numpy as np

    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    def raw(x: Any) -> Any:
        is_key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(x) if is_key else x)

    for a, b in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True):
        if exact:
            np.testing.assert_array_equal(raw(a), raw(b))
        else:
            assert_close(raw(a), raw(b))
