"""A small decoder-only transformer in Equinox, its AdamW training step, and its measure target.

The model is written as any Equinox user would write it (modules act on one sequence; the loss
``vmap``s over the batch); the only remat-specific lines are the ``remat_common.checkpoint_name``
tags on the activations a plan may want to keep by name (``q``, ``k``, ``v``, ``attn_out`` in
the attention, ``mlp_hidden``, ``mlp_out`` in the MLP). Which of them survive the forward pass is
decided by a plan file, applied from outside with ``equinox_remat_plugin.annotate``, which
returns a new model with the same array leaves. Module paths, as plans name them::

    embed  blocks.{i}  blocks.{i}.attn_norm  blocks.{i}.attn  blocks.{i}.mlp_norm  blocks.{i}.mlp
    norm  head

This file imports nothing from the rest of the example, so ``remat report`` can load it alone
(``report.yaml`` points at :func:`measure_target`).

``GPT(layout="scan")`` builds the same blocks as an ``equinox_remat_plugin.Stacked`` run by ``jax.lax.scan``
(``remat report report.yaml --size layout=scan``); plans read the same paths in both layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import equinox_remat_plugin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import remat_common
from remat_common import checkpoint_name

#: Tags the model produces, per module kind (for plans and docs).
TAGS = {"attn": ("q", "k", "v", "attn_out"), "mlp": ("mlp_hidden", "mlp_out")}

#: The logical names of each weight's axes, by the end of its key path (``eqx.nn.Linear`` weights
#: are ``(out, in)``); ``examples/scale.py`` maps them onto the mesh's axes. Any other array (the
#: norms' weights, the optimiser's step count) is replicated; a stacked layer axis is not split.
LOGICAL_AXES: dict[tuple[str, ...], tuple[str | None, ...]] = {
    ("embed", "weight"): ("vocab", "embed"),
    ("pos",): (None, "embed"),
    ("attn", "query", "weight"): ("heads", "embed"),
    ("attn", "key", "weight"): ("heads", "embed"),
    ("attn", "value", "weight"): ("heads", "embed"),
    ("attn", "out", "weight"): ("embed", "heads"),
    ("mlp", "gate", "weight"): ("mlp", "embed"),
    ("mlp", "up", "weight"): ("mlp", "embed"),
    ("mlp", "down", "weight"): ("embed", "mlp"),
    ("head", "weight"): ("vocab", "embed"),
}


#: Model sizes of public models (``--size preset=llama3-8b``): Llama 3's published shapes
#: (grouped-query attention, SwiGLU, RMSNorm, rotary positions, a 128,256-token vocabulary), bf16
#: compute on float32 parameters, the scanned layout. Any key given beside the preset wins here;
#: ``remat report`` composes its layers by one rule (a preset sets every size it names, the rest
#: come from the config, a size given beside it on one command line must agree with it).
PRESETS: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(vocab=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                      d_ff=14336, seq_len=4096, rope=True, dtype="bfloat16", layout="scan"),
    "llama3-70b": dict(vocab=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                       d_ff=28672, seq_len=4096, rope=True, dtype="bfloat16", layout="scan"),
}


#: The most layers the unrolled ``list`` layout builds: each layer is traced and compiled on its
#: own, so time and memory grow with the count (200 layers: 165 s and 2.7 GB on a 2-core CPU,
#: where ``layout="scan"`` takes 7.7 s for any count).
MAX_LIST_LAYERS = 128

_MSG_UNROLLED = (
    "GPT: n_layers={n} in layout 'list' builds, traces and compiles each layer on its own, which "
    "takes minutes and gigabytes from a few hundred layers (the list layout allows up to "
    "{most}). Fix: layout='scan' (remat report --size layout=scan), which traces one block for "
    "any number of layers, or n_layers <= {most}.")


def check_sizes(**sizes: Any) -> None:
    """Refuses sizes the model cannot be built with (ValueError naming the size and the fix):
    a size that is not a positive integer (``d_model=0``, ``seq_len=64.0``), and more layers than
    the unrolled layout builds in reasonable time (:data:`MAX_LIST_LAYERS`)."""
    for key in ("vocab", "d_model", "n_layers", "n_heads", "seq_len", "d_ff", "n_kv_heads"):
        v = sizes.get(key)
        if v is None and key in ("d_ff", "n_kv_heads"):
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"GPT: {key}={v!r} must be a positive integer. Fix: --size {key}=N "
                             "with an integer N >= 1.")
    for key in ("rope", "abstract"):  # `--size rope=maybe` was read as true
        if key in sizes and not isinstance(sizes[key], bool):
            raise ValueError(f"GPT: {key}={sizes[key]!r} must be true or false. Fix: --size "
                             f"{key}=true or {key}=false.")
    if sizes.get("dtype") is not None and sizes["dtype"] not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"GPT: dtype={sizes['dtype']!r} is not a compute dtype; allowed: "
                         "'bfloat16', 'float16', 'float32'. Fix: --size dtype=bfloat16, or leave "
                         "it out (float32).")
    if sizes.get("layout", "list") == "list" and sizes["n_layers"] > MAX_LIST_LAYERS:
        raise ValueError(_MSG_UNROLLED.format(n=sizes["n_layers"], most=MAX_LIST_LAYERS))


#: The most bytes of parameters and AdamW state a concrete (not ``abstract``) build allocates.
MAX_CONCRETE_BYTES = 8 * 2 ** 30

_MSG_CONCRETE = (
    "GPT: these sizes hold about {gib:.1f} GiB of float32 parameters and AdamW state, which a "
    "concrete build allocates on this machine before anything compiles (at most {most} GiB). "
    "Fix: abstract=true (remat report --size abstract=true), which builds from shapes only.")


def check_concrete(**model: Any) -> None:
    """Refuses sizes whose parameters and optimiser state (three float32 copies) exceed
    :data:`MAX_CONCRETE_BYTES`: built for real, Llama 3 8B would allocate ~90 GiB."""
    check_sizes(**{"vocab": 256, "d_model": 128, "n_layers": 4, "n_heads": 4, "seq_len": 128,
                   **model})
    d, v, n = model.get("d_model", 128), model.get("vocab", 256), model.get("n_layers", 4)
    h = model.get("n_heads", 4)
    kv = model.get("n_kv_heads") or h
    ff = model.get("d_ff") or 4 * d
    params = 2 * v * d + model.get("seq_len", 128) * d + n * (2 * d * d + 2 * d * (d * kv // h)
                                                              + 3 * d * ff + 2 * d)
    if 12 * params > MAX_CONCRETE_BYTES:
        raise ValueError(_MSG_CONCRETE.format(gib=12 * params / 2 ** 30,
                                              most=MAX_CONCRETE_BYTES // 2 ** 30))


def model_kwargs(preset: str | None, model: dict[str, Any]) -> dict[str, Any]:
    """The :class:`GPT` keyword arguments of ``preset`` (``None``: none) updated with ``model``."""
    if not preset:
        return dict(model)
    if preset not in PRESETS:
        raise ValueError(f"GPT: unknown preset {preset!r}; presets: {', '.join(sorted(PRESETS))}. "
                         "Fix: give one of them, or the sizes themselves (d_model=..., ...).")
    return {**PRESETS[preset], **model}


def rotary(x: jax.Array) -> jax.Array:
    """Rotary position embedding of ``x`` (time, heads, head dim), base 500,000 (Llama 3)."""
    t, d = x.shape[0], x.shape[-1]
    freq = 1.0 / (500_000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def _per_token(layer: Callable[[jax.Array], jax.Array], x: jax.Array,
               dtype: str | None = None) -> jax.Array:
    """``layer`` on each token of ``x``; with a compute ``dtype``, a linear layer's weight and the
    input are cast to it first (the parameters stay float32)."""
    if dtype is not None and isinstance(layer, eqx.nn.Linear):
        return x.astype(dtype) @ layer.weight.T.astype(dtype)
    return jax.vmap(layer)(x)


class CausalSelfAttention(eqx.Module):
    """Causal self-attention on one sequence ``(t, d)``; ``n_kv_heads`` below ``n_heads`` shares
    each key/value head between ``n_heads // n_kv_heads`` query heads (grouped-query attention),
    ``rope`` rotates queries and keys by position, ``dtype`` is the compute dtype."""

    query: eqx.nn.Linear
    key: eqx.nn.Linear
    value: eqx.nn.Linear
    out: eqx.nn.Linear
    n_heads: int = eqx.field(static=True)
    n_kv_heads: int = eqx.field(static=True)
    rope: bool = eqx.field(static=True)
    dtype: str | None = eqx.field(static=True)

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None,
                 rope: bool = False, dtype: str | None = None, key: jax.Array) -> None:
        n_kv_heads = n_kv_heads or n_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"CausalSelfAttention: d_model={d_model}, n_heads={n_heads}, "
                             f"n_kv_heads={n_kv_heads}: n_heads must divide d_model and n_kv_heads "
                             "must divide n_heads. Fix: choose heads that do.")
        kq, kk, kv, ko = jax.random.split(key, 4)
        kv_dim = d_model // n_heads * n_kv_heads
        self.query = eqx.nn.Linear(d_model, d_model, use_bias=False, key=kq)
        self.key = eqx.nn.Linear(d_model, kv_dim, use_bias=False, key=kk)
        self.value = eqx.nn.Linear(d_model, kv_dim, use_bias=False, key=kv)
        self.out = eqx.nn.Linear(d_model, d_model, use_bias=False, key=ko)
        self.n_heads, self.n_kv_heads, self.rope, self.dtype = n_heads, n_kv_heads, rope, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        t, d = x.shape
        h, hkv, dt = self.n_heads, self.n_kv_heads, self.dtype

        def heads(y: jax.Array, n: int, rope: bool) -> jax.Array:  # (t, n*hd) -> (h, t, hd)
            y = y.reshape(t, n, d // h)
            if rope:
                y = rotary(y)
            return (jnp.repeat(y, h // n, axis=1) if n != h else y).transpose(1, 0, 2)

        q = checkpoint_name(_per_token(self.query, x, dt), "q")
        k = checkpoint_name(_per_token(self.key, x, dt), "k")
        v = checkpoint_name(_per_token(self.value, x, dt), "v")
        qh, kh = heads(q, h, self.rope), heads(k, hkv, self.rope)
        scale = jnp.sqrt(jnp.float32(d // h))
        scores = jnp.einsum("hqd,hkd->hqk", qh, kh) / (scale if qh.dtype == jnp.float32
                                                       else scale.astype(qh.dtype))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        context = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), heads(v, hkv, False))
        context = checkpoint_name(context.transpose(1, 0, 2).reshape(t, d), "context")
        return checkpoint_name(_per_token(self.out, context, dt), "attn_out")


class MLP(eqx.Module):
    """The gated (SwiGLU) feed-forward layer: ``down(silu(gate(x)) * up(x))``."""

    gate: eqx.nn.Linear
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    dtype: str | None = eqx.field(static=True)

    def __init__(self, d_model: int, d_ff: int, *, dtype: str | None = None,
                 key: jax.Array) -> None:
        kg, ku, kd = jax.random.split(key, 3)
        self.gate = eqx.nn.Linear(d_model, d_ff, use_bias=False, key=kg)
        self.up = eqx.nn.Linear(d_model, d_ff, use_bias=False, key=ku)
        self.down = eqx.nn.Linear(d_ff, d_model, use_bias=False, key=kd)
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = checkpoint_name(_per_token(self.gate, x, self.dtype), "mlpwi_0")
        up = checkpoint_name(_per_token(self.up, x, self.dtype), "mlpwi_1")
        hidden = jax.nn.silu(gate) * up
        hidden = checkpoint_name(hidden, "mlp_hidden")
        return checkpoint_name(_per_token(self.down, hidden, self.dtype), "mlp_out")


class Block(eqx.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    attn_norm: eqx.nn.RMSNorm
    attn: CausalSelfAttention
    mlp_norm: eqx.nn.RMSNorm
    mlp: MLP

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, n_kv_heads: int | None = None,
                 rope: bool = False, dtype: str | None = None, key: jax.Array) -> None:
        ka, km = jax.random.split(key)
        self.attn_norm = eqx.nn.RMSNorm(d_model, use_bias=False)
        self.attn = CausalSelfAttention(d_model, n_heads, n_kv_heads=n_kv_heads, rope=rope,
                                        dtype=dtype, key=ka)
        self.mlp_norm = eqx.nn.RMSNorm(d_model, use_bias=False)
        self.mlp = MLP(d_model, d_ff, dtype=dtype, key=km)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(_per_token(self.attn_norm, x))
        return x + self.mlp(_per_token(self.mlp_norm, x))


class GPT(eqx.Module):
    """Token and learned position embeddings, ``n_layers`` blocks, a final norm and the logits.

    Acts on one sequence of token ids ``(t,)`` and returns logits ``(t, vocab)``. ``n_kv_heads``
    (grouped-query attention), ``rope`` (rotary positions instead of the learned ones: ``pos`` is
    then ``None``) and ``dtype`` (the compute dtype, e.g. ``"bfloat16"``; parameters stay float32)
    reach Llama 3's shapes (:data:`PRESETS`).
    """

    embed: eqx.nn.Embedding
    pos: jax.Array | None
    blocks: list[Block] | equinox_remat_plugin.Stacked[Block]
    norm: eqx.nn.RMSNorm
    head: eqx.nn.Linear
    seq_len: int = eqx.field(static=True)
    dtype: str | None = eqx.field(static=True)

    def __init__(self, *, vocab: int = 256, d_model: int = 128, n_layers: int = 4, n_heads: int = 4,
                 seq_len: int = 128, d_ff: int | None = None, layout: str = "list",
                 n_kv_heads: int | None = None, rope: bool = False, dtype: str | None = None,
                 key: jax.Array) -> None:
        if layout not in ("list", "scan"):
            raise ValueError(f"GPT: layout must be 'list' or 'scan', got {layout!r}.")
        check_sizes(vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                    seq_len=seq_len, d_ff=d_ff, n_kv_heads=n_kv_heads, layout=layout, rope=rope,
                    dtype=dtype)
        d_ff = d_ff or 4 * d_model
        extra = dict(n_kv_heads=n_kv_heads, rope=rope, dtype=dtype)
        ke, kp, kh, *kb = jax.random.split(key, 3 + n_layers)
        self.embed = eqx.nn.Embedding(weight=0.02 * jax.random.normal(ke, (vocab, d_model)))
        self.pos = None if rope else 0.02 * jax.random.normal(kp, (seq_len, d_model))
        self.seq_len, self.dtype = seq_len, dtype
        if layout == "scan":  # one Block with stacked parameters, run by jax.lax.scan
            self.blocks = equinox_remat_plugin.Stacked.from_keys(
                lambda k: Block(d_model, n_heads, d_ff, **extra, key=k), jnp.stack(kb))
        else:
            self.blocks = [Block(d_model, n_heads, d_ff, **extra, key=k) for k in kb]
        self.norm = eqx.nn.RMSNorm(d_model, use_bias=False)
        self.head = eqx.nn.Linear(d_model, vocab, use_bias=False, key=kh)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        t = tokens.shape[-1]
        if t > self.seq_len:
            raise ValueError(f"GPT: got {t} tokens, more than seq_len={self.seq_len}. Fix: crop "
                             "the input or build the model with a larger seq_len.")
        x = _per_token(self.embed, tokens)
        if self.pos is not None:
            x = x + self.pos[:t]
        if self.dtype is not None:
            x = x.astype(self.dtype)
        if isinstance(self.blocks, equinox_remat_plugin.Stacked):
            x = self.blocks(x)
        else:
            for block in self.blocks:
                x = block(x)
        return _per_token(self.head, _per_token(self.norm, x), self.dtype)


def loss_fn(model: GPT, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over a batch of ``seq_len + 1`` token windows."""
    logits = jax.vmap(model)(tokens[:, :-1]).astype(jnp.float32)
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


def annotate(model: GPT, plan: remat_common.Plan | None) -> tuple[GPT, remat_common.CompiledPlan | None]:
    """``model`` annotated with ``plan`` (no plan: the model as written) and the compiled plan.

    The annotated model has the same array leaves in the same order, so checkpoints and optimiser
    state are interchangeable with the un-annotated model's.
    """
    if plan is None:
        return model, None
    annotated = equinox_remat_plugin.annotate(model, plan)
    return annotated, equinox_remat_plugin.plan_of(annotated)


def logical_axes(path: tuple[Any, ...], leaf: jax.Array) -> tuple[str | None, ...]:
    """The logical names of the axes of the array at ``path`` (see :data:`LOGICAL_AXES`); the same
    for a weight and for the optimiser's moments of it, whose paths end the same way."""
    names = tuple(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)
    for suffix, axes in LOGICAL_AXES.items():
        if names[-len(suffix):] == suffix and leaf.ndim >= len(axes):
            return (None,) * (leaf.ndim - len(axes)) + axes
    return (None,) * leaf.ndim


def shardings(static: Any, state: Any, mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
              rules: tuple[tuple[str, Any], ...]) -> Any:
    """Where each array of the training state ``(params, opt_state)`` lives on ``mesh``: a
    ``NamedSharding`` per array from :func:`logical_axes` under ``rules`` (logical name -> mesh
    axes, ``examples/scale.py``), in the structure of ``state`` (what ``jax.jit``'s
    ``in_shardings`` and ``eqx.filter_shard`` take); ``state`` may be abstract
    (``eqx.filter_eval_shape``)."""
    to_mesh = dict(rules)

    def one(path: tuple[Any, ...], leaf: Any) -> Any:
        if not (eqx.is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)):  # also abstract
            return None
        spec = jax.sharding.PartitionSpec(*(None if a is None else to_mesh.get(a)
                                            for a in logical_axes(path, leaf)))
        return jax.sharding.NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, state)


def state_roles(state: Any) -> tuple[str, ...]:
    """What each array of the training state is, for a plan's ``state:`` entry (host or device
    between steps): ``params`` are parameters, ``opt_state`` the optimizer state (``equinox_remat_plugin.state_roles``)."""
    return equinox_remat_plugin.state_roles(state)


def checkpoint_view(state: Any) -> Any:
    """The training state as checkpoints hold it: the plain model's structure and paths.

    ``annotate`` gives the modules a plan names annotated subclasses of their classes, which
    changes the tree structure (those classes) but neither the key paths, the array leaves nor
    their order; saving the unwrapped state keeps checkpoints interchangeable between plans and
    with the un-annotated model.
    """
    return equinox_remat_plugin.unwrap(state)


def from_checkpoint_view(like: Any, saved: Any) -> Any:
    """The inverse of :func:`checkpoint_view`: ``saved``'s arrays in the structure of ``like``."""
    return jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(saved))


def build(plan: remat_common.Plan | None, *, seed: int = 0, tx: optax.GradientTransformation,
          abstract: bool = False, **model: Any
          ) -> tuple[Any, tuple[Any, optax.OptState], remat_common.CompiledPlan | None]:
    """The model (annotated with ``plan``) split into its static part and the training state
    ``(params, opt_state)``.

    ``abstract``: built with ``eqx.filter_eval_shape``, the state's leaves are
    ``jax.ShapeDtypeStruct`` and nothing the size of the model is allocated."""
    if not abstract:
        check_concrete(**model)
    if abstract:
        gpt = eqx.filter_eval_shape(lambda: GPT(**model, key=jax.random.key(seed)))
    else:
        gpt = GPT(**model, key=jax.random.key(seed))
    gpt, compiled = annotate(gpt, plan)
    is_param = (lambda x: isinstance(x, jax.ShapeDtypeStruct)
                and jnp.issubdtype(x.dtype, jnp.inexact)) if abstract else eqx.is_inexact_array
    params, static = eqx.partition(gpt, is_param)
    opt_state = jax.eval_shape(tx.init, params) if abstract else tx.init(params)
    return static, (params, opt_state), compiled


def _update(tx: optax.GradientTransformation) -> Callable[..., Any]:
    def update(state: tuple[Any, Any], grads: Any) -> tuple[Any, Any]:
        params, opt_state = state
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state

    return update


def train_step_fn(static: Any, tx: optax.GradientTransformation, *,
                  stream: bool = False) -> Callable[..., Any]:
    """``step(state, tokens) -> (state, loss)``: one AdamW step as a pure, jit-able function.

    ``stream``: parameters kept on host stream through the stacked blocks a layer at a time
    (default ``False``: all of them fetched at the step's start, which is faster where the model
    fits that way: 2.87 s against 3.46 s a step at 64 layers on a v5e chip; streaming buys device
    memory, https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md)."""

    def step(state: tuple[Any, Any], tokens: jax.Array) -> tuple[tuple[Any, Any], jax.Array]:
        params, opt_state = state
        # a plan may keep parameters and optimizer state on host between steps: the parameters
        # come to the device for the forward and backward passes (the scanned blocks' a layer at
        # a time, by the Stacked), and the update streams the host-resident state through the
        # device a few arrays at a time once the gradients are there (on device both change
        # nothing)
        stacks = ("blocks",) if stream and isinstance(
            params.blocks, equinox_remat_plugin.Stacked) else ()
        model = eqx.combine(remat_common.state.fetch(params, stream=stacks), static)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens)
        state = remat_common.state.stream_update(_update(tx), state, grads, after=grads)
        return state, loss

    return step


def eval_loss_fn(static: Any) -> Callable[[Any, jax.Array], jax.Array]:
    """``eval_loss(state, tokens)``: the loss without a gradient."""

    def eval_loss(state: tuple[Any, Any], tokens: jax.Array) -> jax.Array:
        return loss_fn(eqx.combine(state[0], static), tokens)

    return eval_loss


def next_token_fn(static: Any) -> Callable[..., jax.Array]:
    """``next_token(state, window, position, key, temperature)``: samples the token after
    ``window[position]`` (``window`` is ``seq_len`` tokens long, so one compile serves every call)."""

    def next_token(state: tuple[Any, Any], window: jax.Array, position: jax.Array, key: jax.Array,
                   temperature: float) -> jax.Array:
        logits = eqx.combine(state[0], static)(window)[position]
        return jax.random.categorical(key, logits / temperature)

    return next_token


def measure_target(plan: remat_common.Plan | None, *, batch: int, seed: int = 0,
                   preset: str = "", abstract: bool = False,
                   **model: Any) -> remat_common.measurement.MeasureTarget:
    """The training step of a freshly initialised model under ``plan``, for ``remat report``.

    Args:
      plan: the plan (``None``: the model as written, nothing annotated).
      batch: sequences per step.
      seed: parameter initialisation and token seed.
      preset: a model size of :data:`PRESETS` (``llama3-8b``); ``model`` keys given beside it win.
      abstract: build from shapes only (``eqx.filter_eval_shape``; tokens as a
        ``jax.ShapeDtypeStruct``): the step compiles (``--steps 0``, ``--accelerator``) but cannot run.
      **model: :class:`GPT` keyword arguments (``vocab``, ``d_model``, ``n_layers``, ``n_heads``,
        ``seq_len``, ``d_ff``, ``layout``, ``n_kv_heads``, ``rope``, ``dtype``).

    Returns:
      ``loss_fn(params, tokens)`` with ``params`` the model's floating-point arrays, and
      ``step_fn(state, tokens) -> (state, loss)``, one AdamW step on ``(params, opt_state)``.
    """
    tx = optimizer()
    check_sizes(abstract=abstract, vocab=1, d_model=1, n_layers=1, n_heads=1, seq_len=1)
    model = model_kwargs(preset, model)
    static, state, compiled = build(plan, seed=seed, tx=tx, abstract=abstract, **model)
    seq_len = model.get("seq_len", 128)
    tokens: Any
    if abstract:
        tokens = jax.ShapeDtypeStruct((batch, seq_len + 1), jnp.int32)
    else:
        tokens = np.random.default_rng(seed).integers(0, model.get("vocab", 256),
                                                      (batch, seq_len + 1), dtype=np.int32)

    def loss(params: Any, tokens: jax.Array) -> jax.Array:
        return loss_fn(eqx.combine(params, static), tokens)

    target = remat_common.measurement.MeasureTarget(
        loss_fn=loss, loss_args=(state[0], tokens),
        step_fn=train_step_fn(static, tx), step_args=(state, tokens), plan=compiled,
    )
    # the plan's state: (host parts as pinned_host arguments), as the training step keeps it
    return remat_common.measurement.with_state(target, plan, state_roles(state))
