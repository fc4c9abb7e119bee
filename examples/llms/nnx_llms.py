"""jax-ml/bonsai's Qwen3 and Llama 3.2 (Flax NNX), unmodified, as `remat report` targets.

The models are the vendored upstream files (``examples/third_party/``); nothing in them names an
activation. Plans opt them in from outside: a rule's ``{"tag": NAME}`` names a module's output
(``layers.*.self_attn.q_proj: {tag: query_proj}``), so MaxText's vocabulary (``query_proj``,
``key_proj``, ``value_proj``, ``out_proj``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``, and the layer's
input through its first norm for ``decoder_layer_input``) reaches them without code
(``plans/``). Module paths, as plans name them::

    embedder  layers.{i}  layers.{i}.input_layernorm  layers.{i}.{attn|self_attn}.{q,k,v,o}_proj
    layers.{i}.post_attention_layernorm  layers.{i}.mlp.{gate,up,down}_proj  final_norm  lm_head

Precision: float32 parameters and optimizer state, bfloat16 compute (every matrix is cast to
bfloat16 in the loss, as bonsai's checkpoints hold them), as MaxText's ``weight_dtype=float32,
dtype=bfloat16``. Qwen3 at bonsai's commit runs only with its key/value cache (its attention writes
the cache on every call), so the loss passes a fresh cache of the sequence's length, as bonsai's
own ``forward`` does; Llama 3.2 runs without one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax_remat_plugin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import remat_common
from flax import nnx

from examples.third_party.bonsai_llama3_2 import modeling as llama3_2
from examples.third_party.bonsai_qwen3 import modeling as qwen3

FAMILIES = ("qwen3", "llama3_2")


def _config(family: str, *, vocab: int, d_model: int, n_layers: int, n_heads: int,
            n_kv_heads: int, head_dim: int, d_ff: int) -> Any:
    if family == "qwen3":
        return qwen3.ModelConfig(
            num_layers=n_layers, vocab_size=vocab, emb_dim=d_model, mlp_dim=d_ff,
            num_heads=n_heads, head_dim=head_dim, num_kv_heads=n_kv_heads,
            rope_theta=1_000_000, rope_scaling_factor=8, local_rope_theta=1e4, norm_eps=1e-6,
            tie_word_embeddings=False)
    if family == "llama3_2":
        return llama3_2.ModelConfig(
            vocab_size=vocab, hidden_size=d_model, intermediate_size=d_ff,
            num_hidden_layers=n_layers, num_attention_heads=n_heads, head_dim=head_dim,
            num_key_value_heads=n_kv_heads, max_position_embeddings=131072, rms_norm_eps=1e-5,
            rope_theta=500000.0, rope_scaling=llama3_2.RopeScalingConfig(factor=32.0),
            tie_word_embeddings=False, shd_cfg=llama3_2.LlamaShardCfg.no_sharding(),
            dtype=jnp.float32)
    raise ValueError(f"family {family!r}: not one of {FAMILIES}. Fix: family=qwen3 or family=llama3_2.")


def _model(family: str, cfg: Any, seed: int) -> nnx.Module:
    cls = qwen3.Qwen3 if family == "qwen3" else llama3_2.Llama
    model = cls(cfg, rngs=nnx.Rngs(seed))
    # float32 master weights (bonsai's Qwen3 embeds in bfloat16 storage; its table is kept float32)
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.float32), nnx.state(model, nnx.Param)))
    return model


def compute_dtype(x: Any) -> Any:
    """bfloat16 for a floating-point array (a norm's scale too: a float32 one would promote the
    activations), the array itself otherwise."""
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.bfloat16)
    return x


def logits_fn(family: str, cfg: Any) -> Callable[[nnx.Module, jax.Array], jax.Array]:
    """``logits(model, tokens)`` the way each upstream model is called."""

    def logits(model: nnx.Module, tokens: jax.Array) -> jax.Array:
        b, t = tokens.shape
        segments = jnp.ones((b, t), jnp.int32)
        if family == "qwen3":
            cache = qwen3.init_cache(cfg, b, t, 0, dtype=jnp.bfloat16)
            return model(tokens, cache=cache, segment_ids=segments)
        return model(tokens, segments, None)

    return logits


def measure_target(plan: remat_common.Plan | None, *, batch: int, family: str = "qwen3",
                   learning_rate: float = 1e-4,
                   seed: int = 0, abstract: bool = False, vocab: int = 256, d_model: int = 128,
                   n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
                   head_dim: int | None = None, d_ff: int | None = None, seq_len: int = 128
                   ) -> remat_common.measurement.MeasureTarget:
    """The AdamW training step of a freshly initialised bonsai model under ``plan``.

    Args:
      plan: the plan (``None``: the model as written).
      batch: sequences per step.
      family: ``qwen3`` or ``llama3_2``.
      learning_rate: AdamW's (constant) learning rate.
      abstract: build from shapes only (the step compiles for ``--accelerator`` but cannot run).
      vocab, d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, seq_len: the model's sizes
        (``head_dim`` default ``d_model // n_heads``, ``d_ff`` default ``4 * d_model``).
    """
    head_dim = head_dim or d_model // n_heads
    cfg = _config(family, vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                  n_kv_heads=n_kv_heads, head_dim=head_dim, d_ff=d_ff or 4 * d_model)
    tx = optax.adamw(learning_rate, b1=0.9, b2=0.95, weight_decay=0.1)

    model = nnx.eval_shape(lambda: _model(family, cfg, seed)) if abstract else _model(family, cfg, seed)
    if plan is not None:
        flax_remat_plugin.annotate(model, plan)
    compiled = flax_remat_plugin.compiled_plan(model) if plan is not None else None
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    logits = logits_fn(family, cfg)

    def loss(params: nnx.State, tokens: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, jax.tree.map(compute_dtype, params), rest)
        out = logits(m, tokens[:, :-1]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(out, tokens[:, 1:]).mean()

    return adamw_target(loss, params, tx, compiled, batch=batch, seq_len=seq_len, vocab=vocab,
                        seed=seed, abstract=abstract)


def adamw_target(loss: Callable[[Any, jax.Array], jax.Array], params: Any,
                 tx: optax.GradientTransformation, compiled: remat_common.CompiledPlan | None, *,
                 batch: int, seq_len: int, vocab: int, seed: int, abstract: bool
                 ) -> remat_common.measurement.MeasureTarget:
    """The measure target of ``loss`` over ``params``: one AdamW step on random tokens (shapes
    only where ``abstract``); the third-party models' targets share it."""
    opt_state = jax.eval_shape(tx.init, params) if abstract else tx.init(params)

    def step(params: Any, opt_state: Any, tokens: jax.Array) -> tuple[Any, Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    tokens: Any
    if abstract:
        tokens = jax.ShapeDtypeStruct((batch, seq_len + 1), jnp.int32)
    else:
        tokens = np.random.default_rng(seed).integers(0, vocab, (batch, seq_len + 1), dtype=np.int32)
    return remat_common.measurement.MeasureTarget(
        loss_fn=loss, loss_args=(params, tokens), step_fn=step,
        step_args=(params, opt_state, tokens), plan=compiled)
