"""p-nordmann/eqx-llama (Equinox), unmodified, as a `remat report` target.

The model is the vendored upstream package (``examples/third_party/eqx_llama/``). It runs one
sequence at a time (``model(tokens) -> (logits, cache)``), so the batch is a ``jax.vmap``, and its
query, key and value projections are einsums inside the attention module's method, not modules
of their own: a plan can name what its modules return (the attention's output projection as
``out_proj``, the feed-forward's as ``mlpwo``) and offload a layer's input (``decoder_layer_input``,
the attention module's input), not the q/k/v projections. Module paths, as plans name them::

    embeddings  layers.{i}  layers.{i}.attention_module  layers.{i}.attention_module.norm
    layers.{i}.feed_forward_module  layers.{i}.feed_forward_module.norm  head

Precision: float32 parameters and optimizer state, bfloat16 compute (every floating-point array is
cast to bfloat16 in the loss), as in :mod:`examples.llms.nnx_llms`.
"""

from __future__ import annotations

import warnings
from typing import Any

import equinox as eqx
import equinox_remat_plugin
import jax
import jax.numpy as jnp
import optax
import remat_common

from examples.llms.nnx_llms import adamw_target, compute_dtype
from examples.third_party.eqx_llama.eqx_llama import LLaMA, LLaMAConfig


def measure_target(plan: remat_common.Plan | None, *, batch: int, seed: int = 0,
                   learning_rate: float = 1e-4, abstract: bool = False, vocab: int = 256,
                   d_model: int = 128, n_layers: int = 2, n_heads: int = 4,
                   d_ff: int | None = None, seq_len: int = 128
                   ) -> remat_common.measurement.MeasureTarget:
    """The AdamW training step of a freshly initialised eqx-llama model under ``plan``.

    Args:
      plan: the plan (``None``: the model as written).
      batch: sequences per step.
      learning_rate: AdamW's (constant) learning rate.
      abstract: build from shapes only (the step compiles for ``--accelerator`` but cannot run).
      vocab, d_model, n_layers, n_heads, d_ff, seq_len: the model's sizes (``d_ff`` default
        ``4 * d_model``; eqx-llama's heads are ``d_model // n_heads`` wide, with no grouped
        key/value heads).
    """
    cfg = LLaMAConfig(num_layers=n_layers, vocab_size=vocab, layer_dim=d_model,
                      attention_num_heads=n_heads, attention_head_dim=d_model // n_heads,
                      feed_forward_dim=d_ff or 4 * d_model)

    def make() -> LLaMA:
        return LLaMA(cfg, key=jax.random.key(seed), dtype="float32")

    model = eqx.filter_eval_shape(make) if abstract else make()
    compiled = None
    if plan is not None:
        model = equinox_remat_plugin.annotate(model, plan)
        compiled = equinox_remat_plugin.plan_of(model)
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.adamw(learning_rate, b1=0.9, b2=0.95, weight_decay=0.1)

    def loss(params: Any, tokens: jax.Array) -> jax.Array:
        m = eqx.combine(jax.tree.map(compute_dtype, params), static)
        with warnings.catch_warnings():
            # upstream's rotary embedding scatters float32 rotations into a bfloat16 array
            warnings.filterwarnings("ignore", "scatter inputs have incompatible types",
                                    FutureWarning)
            out = jax.vmap(lambda t: m(t)[0])(tokens[:, :-1]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(out, tokens[:, 1:]).mean()

    return adamw_target(loss, params, tx, compiled, batch=batch, seq_len=seq_len, vocab=vocab,
                        seed=seed, abstract=abstract)
