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
    """Rotary position embedding of ``x`` (batch, time, heads, head dim), base 500,000 (Llama 3)."""
    t, d = x.shape[1], x.shape[-1]
    freq = 1.0 / (500_000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def _init(logical: tuple[str | None, ...]) -> Any:
    """The weights' initialiser, with the logical names of the array's axes as sharding metadata
    (``nnx.with_partitioning``); ``examples/scale.py`` maps them onto the mesh's axes."""
    return nnx.with_partitioning(nnx.initializers.normal(0.02), logical)


class CausalSelfAttention(nnx.Module):
    """Causal self-attention with separate query/key/value projections; ``n_kv_heads`` below
    ``n_heads`` shares each key/value head between ``n_heads // n_kv_heads`` query heads
    (grouped-query attention), ``rope`` rotates queries and keys by position."""

    def __init__(self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None,
                 rope: bool = False, dtype: Any = None, rngs: nnx.Rngs) -> None:
        n_kv_heads = n_kv_heads or n_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"CausalSelfAttention: d_model={d_model}, n_heads={n_heads}, "
                             f"n_kv_heads={n_kv_heads}: n_heads must divide d_model and n_kv_heads "
                             "must divide n_heads. Fix: choose heads that do.")
        self.n_heads, self.n_kv_heads, self.rope = n_heads, n_kv_heads, rope
        kv = d_model // n_heads * n_kv_heads
        init = _init(("embed", "heads"))
        self.query = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=init, dtype=dtype,
                                rngs=rngs)
        self.key = nnx.Linear(d_model, kv, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.value = nnx.Linear(d_model, kv, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, use_bias=False, kernel_init=_init(("heads", "embed")),
                              dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h, hkv = self.n_heads, self.n_kv_heads

        def heads(y: jax.Array, n: int) -> jax.Array:  # (b, t, n*hd) -> (b, h, t, hd)
            y = y.reshape(b, t, n, d // h)
            if self.rope and n:
                y = rotary(y)
            return (jnp.repeat(y, h // n, axis=2) if n != h else y).transpose(0, 2, 1, 3)

        q = checkpoint_name(self.query(x), "q")
        k = checkpoint_name(self.key(x), "k")
        v = checkpoint_name(self.value(x), "v")
        qh, kh = heads(q, h), heads(k, hkv)
        vh = v.reshape(b, t, hkv, d // h)
        vh = (jnp.repeat(vh, h // hkv, axis=2) if hkv != h else vh).transpose(0, 2, 1, 3)
        scale = jnp.sqrt(jnp.float32(d // h))
        scores = jnp.einsum("bhqd,bhkd->bhqk", qh, kh) / (scale if qh.dtype == jnp.float32
                                                           else scale.astype(qh.dtype))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        context = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), vh)
        context = checkpoint_name(context.transpose(0, 2, 1, 3).reshape(b, t, d), "context")
        return checkpoint_name(self.out(context), "attn_out")


class MLP(nnx.Module):
    """The gated (SwiGLU) feed-forward layer: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d_model: int, d_ff: int, *, dtype: Any = None, rngs: nnx.Rngs) -> None:
        init = _init(("embed", "mlp"))
        self.gate = nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=init, dtype=dtype,
                               rngs=rngs)
        self.up = nnx.Linear(d_model, d_ff, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, use_bias=False, kernel_init=_init(("mlp", "embed")),
                               dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = checkpoint_name(self.gate(x), "mlpwi_0"), checkpoint_name(self.up(x), "mlpwi_1")
        hidden = checkpoint_name(jax.nn.silu(gate) * up, "mlp_hidden")
        return checkpoint_name(self.down(hidden), "mlp_out")


class Block(nnx.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, n_kv_heads: int | None = None,
                 rope: bool = False, dtype: Any = None, rngs: nnx.Rngs) -> None:
        self.attn_norm = nnx.RMSNorm(d_model, dtype=dtype, rngs=rngs)
        self.attn = CausalSelfAttention(d_model, n_heads, n_kv_heads=n_kv_heads, rope=rope,
                                        dtype=dtype, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(d_model, dtype=dtype, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nnx.Module):
    """Token and learned position embeddings, ``n_layers`` blocks, a final norm and the logits.

    ``n_kv_heads`` (grouped-query attention), ``rope`` (rotary positions instead of the learned
    ones) and ``dtype`` (the compute dtype, e.g. ``"bfloat16"``; parameters stay float32) reach
    Llama 3's shapes (:data:`PRESETS`)."""

    def __init__(self, *, vocab: int = 256, d_model: int = 128, n_layers: int = 4, n_heads: int = 4,
                 seq_len: int = 128, d_ff: int | None = None, layout: str = "list",
                 n_kv_heads: int | None = None, rope: bool = False, dtype: str | None = None,
                 rngs: nnx.Rngs) -> None:
        if layout not in ("list", "scan"):
            raise ValueError(f"GPT: layout must be 'list' or 'scan', got {layout!r}.")
        check_sizes(vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                    seq_len=seq_len, d_ff=d_ff, n_kv_heads=n_kv_heads, layout=layout, rope=rope,
                    dtype=dtype)
        d_ff = d_ff or 4 * d_model
        self.seq_len = seq_len
        self.layout = layout
        self.rope = rope
        dt = None if dtype is None else jnp.dtype(dtype)
        extra = dict(n_kv_heads=n_kv_heads, rope=rope, dtype=dt)
        # The weights carry the logical names of their axes as metadata only (no mesh is needed
        # here); build() places the state on a mesh from nnx.get_partition_spec when asked.
        with nnx.use_eager_sharding(False):
            self.embed = nnx.Embed(vocab, d_model, embedding_init=_init(("vocab", "embed")),
                                   dtype=dt, rngs=rngs)
            if not rope:
                self.pos = nnx.Param(_init((None, "embed"))(rngs.params(), (seq_len, d_model)))
            if layout == "scan":  # one Block with stacked parameters, run by scan_layers
                @nnx.split_rngs(splits=n_layers)
                @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: None})
                def create(rngs: nnx.Rngs) -> Block:
                    return Block(d_model, n_heads, d_ff, **extra, rngs=rngs)

                self.blocks: Any = create(rngs)
            else:
                self.blocks = nnx.List([Block(d_model, n_heads, d_ff, **extra, rngs=rngs)
                                        for _ in range(n_layers)])
            self.norm = nnx.RMSNorm(d_model, dtype=dt, rngs=rngs)
            self.head = nnx.Linear(d_model, vocab, use_bias=False, kernel_init=_init(("embed", "vocab")),
                                   dtype=dt, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        t = tokens.shape[-1]
        if t > self.seq_len:
            raise ValueError(f"GPT: got {t} tokens, more than seq_len={self.seq_len}. Fix: crop the "
                             "input or build the model with a larger seq_len.")
        x = self.embed(tokens)
        if not self.rope:
            x = x + self.pos[...][:t]
        if self.layout == "scan":
            x = flax_remat_plugin.scan_layers(self.blocks, x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.head(self.norm(x))


def loss_fn(model: GPT, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over a batch of ``seq_len + 1`` token windows."""
    logits = model(tokens[:, :-1]).astype(jnp.float32)
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
          abstract: bool = False, **model: Any
          ) -> tuple[nnx.GraphDef[Any], nnx.State, remat_common.CompiledPlan | None]:
    """The model (annotated with ``plan``) and its optimiser, split into a graph and a state.

    ``abstract``: built with ``nnx.eval_shape``, the state's leaves are ``jax.ShapeDtypeStruct``
    and nothing the size of the model is allocated (a 70B model compiles on a laptop)."""
    if not abstract:
        check_concrete(**model)
    def make() -> tuple[GPT, nnx.Optimizer[GPT]]:
        gpt = GPT(**model, rngs=nnx.Rngs(seed))
        return gpt, nnx.Optimizer(gpt, tx, wrt=nnx.Param)

    gpt, opt = nnx.eval_shape(make) if abstract else make()
    compiled = annotate(gpt, plan)
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


def state_roles(state: Any) -> tuple[str, ...]:
    """What each array of the training state is, for a plan's ``state:`` entry (host or device
    between steps): the ``nnx.Optimizer``'s ``OptState`` variables are optimizer state, the ``nnx.Param``\n    variables parameters (``flax_remat_plugin.state_roles``)."""
    return flax_remat_plugin.state_roles(state)


def checkpoint_view(state: nnx.State) -> nnx.State:
    """The training state as checkpoints hold it: the state itself (``annotate`` leaves the NNX
    state unchanged, so checkpoints are interchangeable between plans as they are)."""
    return state


def from_checkpoint_view(like: nnx.State, saved: nnx.State) -> nnx.State:
    """The inverse of :func:`checkpoint_view`: ``saved`` itself."""
    return saved


def train_step_fn(
    graphdef: nnx.GraphDef[Any], tx: optax.GradientTransformation | None = None, *,
    stream: bool = False,
) -> Callable[[nnx.State, jax.Array], tuple[nnx.State, jax.Array]]:
    """``step(state, tokens) -> (state, loss)``: one AdamW step as a pure, jit-able function.

    ``tx`` is not needed (the ``nnx.Optimizer`` in the state holds it); it is accepted so that both
    examples' steps are made the same way. ``stream``: parameters kept on host stream through the
    scanned blocks a layer at a time (default ``False``: all of them fetched at the step's start,
    which is faster where the model fits that way: 2.87 s against 3.46 s a step at 64 layers on a
    v5e chip; streaming buys device memory,
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md).
    """

    def step(state: nnx.State, tokens: jax.Array) -> tuple[nnx.State, jax.Array]:
        gpt, _ = nnx.merge(graphdef, jax.tree.map(lambda x: x, state))  # `state` kept as it is
        # a plan may keep parameters and optimizer state on host between steps: the parameters
        # come to the device for the forward and backward passes (the scanned blocks' a layer at
        # a time, by scan_layers), and the update streams the host-resident state through the
        # device a few arrays at a time once the gradients are there (on device both change
        # nothing)
        stacks = ("blocks",) if stream and gpt.layout == "scan" else ()
        nnx.update(gpt, remat_common.state.fetch(nnx.state(gpt, nnx.Param), stream=stacks))
        loss, grads = nnx.value_and_grad(loss_fn)(gpt, tokens)
        return remat_common.state.stream_update(update, state, grads, after=grads), loss

    def update(state: nnx.State, grads: nnx.State) -> nnx.State:
        gpt, opt = nnx.merge(graphdef, state)
        opt.update(gpt, grads)
        return nnx.state((gpt, opt))

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
                   preset: str = "", abstract: bool = False,
                   **model: Any) -> remat_common.measurement.MeasureTarget:
    """The training step of a freshly initialised model under ``plan``, for ``remat report``.

    Args:
      plan: the plan (``None``: the model as written, nothing annotated).
      batch: sequences per step.
      seed: parameter initialisation and token seed.
      preset: a model size of :data:`PRESETS` (``llama3-8b``); ``model`` keys given beside it win.
      abstract: build from shapes only (``nnx.eval_shape``; tokens as a ``jax.ShapeDtypeStruct``):
        the step compiles (``remat report --steps 0``, ``--accelerator``) but cannot run.
      **model: :class:`GPT` keyword arguments (``vocab``, ``d_model``, ``n_layers``, ``n_heads``,
        ``seq_len``, ``d_ff``, ``layout``, ``n_kv_heads``, ``rope``, ``dtype``).

    Returns:
      ``loss_fn(params, tokens)`` with ``params`` the model's ``nnx.Param`` state, and
      ``step_fn(state, tokens) -> (state, loss)``, one AdamW step on model and optimiser state.
    """
    check_sizes(abstract=abstract, vocab=1, d_model=1, n_layers=1, n_heads=1, seq_len=1)
    model = model_kwargs(preset, model)
    graphdef, state, compiled = build(plan, seed=seed, tx=optimizer(), abstract=abstract, **model)
    gpt, _ = nnx.merge(graphdef, state)
    model_def, params, rest = nnx.split(gpt, nnx.Param, ...)
    seq_len = model.get("seq_len", 128)
    tokens: Any
    if abstract:
        tokens = jax.ShapeDtypeStruct((batch, seq_len + 1), jnp.int32)
    else:
        tokens = np.random.default_rng(seed).integers(0, model.get("vocab", 256),
                                                      (batch, seq_len + 1), dtype=np.int32)

    def loss(params: nnx.State, tokens: jax.Array) -> jax.Array:
        return loss_fn(nnx.merge(model_def, params, rest), tokens)

    target = remat_common.measurement.MeasureTarget(
        loss_fn=loss, loss_args=(params, tokens),
        step_fn=train_step_fn(graphdef), step_args=(state, tokens), plan=compiled,
    )
    # the plan's state: (host parts as pinned_host arguments), as the training step keeps it
    return remat_common.measurement.with_state(target, plan, state_roles(state))

