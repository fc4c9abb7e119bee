"""A small decoder-only transformer in Flax NNX, its AdamW training step, and its measure target.

The model is written as any NNX user would write it; the only remat-specific lines are the
``remat_common.checkpoint_name`` tags on the activations a plan may want to keep by name
(``q``, ``k``, ``v``, ``attn_out`` in the attention, ``mlp_hidden``, ``mlp_out`` in the MLP).
Which of them survive the forward pass is decided by a plan file, applied from outside with
``flax_remat_plugin.annotate``. Module paths, as plans name them::

    embed  pos  blocks.{i}  blocks.{i}.attn_norm  blocks.{i}.attn  blocks.{i}.mlp_norm
    blocks.{i}.mlp  norm  head

This file imports nothing from the rest of the example, so ``remat report`` can load it alone
(``report.yaml`` points at :func:`measure_target`).

``GPT(layout="scan")`` builds the same blocks as ``nnx.vmap``-stacked blocks run by ``flax_remat_plugin.scan_layers``
(``remat report report.yaml --size layout=scan``); plans read the same paths in both layouts.
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
from remat_common import checkpoint_name

#: Tags the model produces, per module kind (for plans and docs).
TAGS = {"attn": ("q", "k", "v", "attn_out"), "mlp": ("mlp_hidden", "mlp_out")}


def _init(logical: tuple[str | None, ...]) -> Any:
    """The weights' initialiser, with the logical names of the array's axes as sharding metadata
    (``nnx.with_partitioning``); ``examples/scale.py`` maps them onto the mesh's axes."""
    return nnx.with_partitioning(nnx.initializers.normal(0.02), logical)


class CausalSelfAttention(nnx.Module):
    """Multi-head causal self-attention with separate query/key/value projections."""

    def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs) -> None:
        if d_model % n_heads:
            raise ValueError(f"CausalSelfAttention: d_model={d_model} is not divisible by "
                             f"n_heads={n_heads}. Fix: choose n_heads that divides d_model.")
        self.n_heads = n_heads
        init = _init(("embed", "heads"))
        self.query = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=_init(("heads", "embed")),
                              rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h = self.n_heads

        def heads(y: jax.Array) -> jax.Array:  # (b, t, d) -> (b, h, t, d/h)
            return y.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)

        q = checkpoint_name(self.query(x), "q")
        k = checkpoint_name(self.key(x), "k")
        v = checkpoint_name(self.value(x), "v")
        scores = jnp.einsum("bhqd,bhkd->bhqk", heads(q), heads(k)) / jnp.sqrt(jnp.float32(d // h))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        context = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), heads(v))
        context = checkpoint_name(context.transpose(0, 2, 1, 3).reshape(b, t, d), "context")
        return checkpoint_name(self.out(context), "attn_out")


class MLP(nnx.Module):
    """The gated (SwiGLU) feed-forward layer: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d_model: int, d_ff: int, *, rngs: nnx.Rngs) -> None:
        init = _init(("embed", "mlp"))
        self.gate = nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=init, rngs=rngs)
        self.up = nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=init, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, use_bias=False, kernel_init=_init(("mlp", "embed")),
                               rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = checkpoint_name(self.gate(x), "mlpwi_0"), checkpoint_name(self.up(x), "mlpwi_1")
        hidden = checkpoint_name(jax.nn.silu(gate) * up, "mlp_hidden")
        return checkpoint_name(self.down(hidden), "mlp_out")


class Block(nnx.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, rngs: nnx.Rngs) -> None:
        self.attn_norm = nnx.RMSNorm(d_model, rngs=rngs)
        self.attn = CausalSelfAttention(d_model, n_heads, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(d_model, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nnx.Module):
    """Token and learned position embeddings, ``n_layers`` blocks, a final norm and the logits."""

    def __init__(self, *, vocab: int = 256, d_model: int = 128, n_layers: int = 4, n_heads: int = 4,
                 seq_len: int = 128, d_ff: int | None = None, layout: str = "list",
                 rngs: nnx.Rngs) -> None:
        if layout not in ("list", "scan"):
            raise ValueError(f"GPT: layout must be 'list' or 'scan', got {layout!r}.")
        d_ff = d_ff or 4 * d_model
        self.seq_len = seq_len
        self.layout = layout
        # The weights carry the logical names of their axes as metadata only (no mesh is needed
        # here); build() places the state on a mesh from nnx.get_partition_spec when asked.
        with nnx.use_eager_sharding(False):
            self.embed = nnx.Embed(vocab, d_model, embedding_init=_init(("vocab", "embed")), rngs=rngs)
            self.pos = nnx.Param(_init((None, "embed"))(rngs.params(), (seq_len, d_model)))
            if layout == "scan":  # one Block with stacked parameters, run by scan_layers
                @nnx.split_rngs(splits=n_layers)
                @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: None})
                def create(rngs: nnx.Rngs) -> Block:
                    return Block(d_model, n_heads, d_ff, rngs=rngs)

                self.blocks: Any = create(rngs)
            else:
                self.blocks = nnx.List([Block(d_model, n_heads, d_ff, rngs=rngs)
                                        for _ in range(n_layers)])
            self.norm = nnx.RMSNorm(d_model, rngs=rngs)
            self.head = nnx.Linear(d_model, vocab, use_bias=False, kernel_init=_init(("embed", "vocab")),
                                   rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        t = tokens.shape[-1]
        if t > self.seq_len:
            raise ValueError(f"GPT: got {t} tokens, more than seq_len={self.seq_len}. Fix: crop the "
                             "input or build the model with a larger seq_len.")
        x = self.embed(tokens) + self.pos[...][:t]
        if self.layout == "scan":
            x = flax_remat_plugin.scan_layers(self.blocks, x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.head(self.norm(x))


def loss_fn(model: GPT, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over a batch of ``seq_len + 1`` token windows."""
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def optimizer(*, learning_rate: float = 3e-3, warmup_steps: int = 20, decay_steps: int = 300,
              weight_decay: float = 0.1, clip_norm: float = 1.0) -> optax.GradientTransformation:
    """AdamW with linear warm-up and cosine decay, weight decay on matrices only, gradient clipping."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup_steps, max(decay_steps, warmup_steps + 1), learning_rate * 0.1)
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay,
                    mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)),
    )


def annotate(model: GPT, plan: remat_common.Plan | None) -> remat_common.CompiledPlan | None:
    """Applies ``plan`` to ``model`` in place (no plan: the model stays as written).

    Returns the compiled plan (``None`` without a plan). The parameters are not touched: the same
    checkpoint restores with and without a plan.
    """
    if plan is None:
        return None
    flax_remat_plugin.annotate(model, plan, stacks=("blocks",) if model.layout == "scan" else ())
    return flax_remat_plugin.compiled_plan(model)


def build(plan: remat_common.Plan | None, *, seed: int = 0, tx: optax.GradientTransformation,
          **model: Any) -> tuple[nnx.GraphDef[Any], nnx.State, remat_common.CompiledPlan | None]:
    """The model (annotated with ``plan``) and its optimiser, split into a graph and a state."""
    gpt = GPT(**model, rngs=nnx.Rngs(seed))
    compiled = annotate(gpt, plan)
    opt = nnx.Optimizer(gpt, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((gpt, opt))
    return graphdef, state, compiled


def shardings(graphdef: nnx.GraphDef[Any], state: nnx.State,
              mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
              rules: tuple[tuple[str, Any], ...]) -> nnx.State:
    """Where each array of the training state lives on ``mesh``: the ``NamedSharding`` of the
    weights' logical axis names (their ``nnx.with_partitioning`` metadata; the optimiser's moments
    inherit it) under ``rules`` (logical name -> mesh axes, ``examples/scale.py``); the rest, such
    as the norms' scales and the step count, is replicated."""
    with nnx.logical_axis_rules(rules):
        return nnx.get_named_sharding(state, mesh)  # type: ignore[arg-type]  # abstract too


def checkpoint_view(state: nnx.State) -> nnx.State:
    """The training state as checkpoints hold it: the state itself (``annotate`` leaves the NNX
    state unchanged, so checkpoints are interchangeable between plans as they are)."""
    return state


def from_checkpoint_view(like: nnx.State, saved: nnx.State) -> nnx.State:
    """The inverse of :func:`checkpoint_view`: ``saved`` itself."""
    return saved


def train_step_fn(
    graphdef: nnx.GraphDef[Any], tx: optax.GradientTransformation | None = None,
) -> Callable[[nnx.State, jax.Array], tuple[nnx.State, jax.Array]]:
    """``step(state, tokens) -> (state, loss)``: one AdamW step as a pure, jit-able function.

    ``tx`` is not needed (the ``nnx.Optimizer`` in the state holds it); it is accepted so that both
    examples' steps are made the same way.
    """

    def step(state: nnx.State, tokens: jax.Array) -> tuple[nnx.State, jax.Array]:
        gpt, opt = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(gpt, tokens)
        opt.update(gpt, grads)
        return nnx.state((gpt, opt)), loss

    return step


def eval_loss_fn(graphdef: nnx.GraphDef[Any]) -> Callable[[nnx.State, jax.Array], jax.Array]:
    """``eval_loss(state, tokens)``: the loss without a gradient."""

    def eval_loss(state: nnx.State, tokens: jax.Array) -> jax.Array:
        gpt, _ = nnx.merge(graphdef, state)
        return loss_fn(gpt, tokens)

    return eval_loss


def next_token_fn(graphdef: nnx.GraphDef[Any]) -> Callable[..., jax.Array]:
    """``next_token(state, window, position, key, temperature)``: samples the token after
    ``window[position]`` (``window`` is ``seq_len`` tokens long, so one compile serves every call)."""

    def next_token(state: nnx.State, window: jax.Array, position: jax.Array, key: jax.Array,
                   temperature: float) -> jax.Array:
        gpt, _ = nnx.merge(graphdef, state)
        logits = gpt(window[None])[0, position]
        return jax.random.categorical(key, logits / temperature)

    return next_token


def measure_target(plan: remat_common.Plan | None, *, batch: int, seed: int = 0,
                   **model: Any) -> remat_common.measurement.MeasureTarget:
    """The training step of a freshly initialised model under ``plan``, for ``remat report``.

    Args:
      plan: the plan (``None``: the model as written, nothing annotated).
      batch: sequences per step.
      seed: parameter initialisation and token seed.
      **model: :class:`GPT` keyword arguments (``vocab``, ``d_model``, ``n_layers``, ``n_heads``,
        ``seq_len``, ``d_ff``).

    Returns:
      ``loss_fn(params, tokens)`` with ``params`` the model's ``nnx.Param`` state, and
      ``step_fn(state, tokens) -> (state, loss)``, one AdamW step on model and optimiser state.
    """
    graphdef, state, compiled = build(plan, seed=seed, tx=optimizer(), **model)
    gpt, _ = nnx.merge(graphdef, state)
    model_def, params, rest = nnx.split(gpt, nnx.Param, ...)
    seq_len = model.get("seq_len", 128)
    tokens = np.random.default_rng(seed).integers(0, model.get("vocab", 256), (batch, seq_len + 1),
                                                  dtype=np.int32)

    def loss(params: nnx.State, tokens: jax.Array) -> jax.Array:
        return loss_fn(nnx.merge(model_def, params, rest), tokens)

    return remat_common.measurement.MeasureTarget(
        loss_fn=loss, loss_args=(params, tokens),
        step_fn=train_step_fn(graphdef), step_args=(state, tokens), plan=compiled,
    )

