"""Ready rule sets: attention (flash-attention memory pattern), gated MLP, RMSNorm and LayerNorm.

Each factory returns a :class:`~remat_common.rules.RuleSet` whose value is the plain function (also
exported, for baselines) and whose rules keep only what the ambient policy allows: kept names stay
on device, offloaded names go to host memory, everything else is recomputed in the backward pass.
Array layouts follow ``jax.nn.dot_product_attention``: ``[..., T, H, D]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

from ._custom import Ambient, RuleSet
from ._errors import RematError

Array = jax.Array

_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}


# -- attention ---------------------------------------------------------------------------------------

def _attn_scores(q: Array, k: Array, scale: float, causal: bool) -> Array:
    s = jnp.einsum("...qhd,...khd->...hqk", q, k) * jnp.asarray(scale, q.dtype)
    if causal:
        t, n = q.shape[-3], k.shape[-3]
        mask = jnp.arange(n)[None, :] <= jnp.arange(t)[:, None] + (n - t)
        s = jnp.where(mask, s, jnp.asarray(jnp.finfo(s.dtype).min, s.dtype))
    return s


def _attn_scale(q: Array, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def attention(q: Array, k: Array, v: Array, *, causal: bool = False,
              scale: float | None = None) -> Array:
    """Multi-head scaled dot-product attention, plain JAX (the baseline the rule set matches).

    Args:
      q: queries ``[..., T, H, D]``; k, v: keys and values ``[..., S, H, D]``.
      causal: query ``i`` attends keys ``j <= i + S - T``.
      scale: score scale; default ``1 / sqrt(D)``.

    >>> import jax.numpy as jnp
    >>> attention(jnp.ones((2, 4, 1, 8)), jnp.ones((2, 4, 1, 8)), jnp.ones((2, 4, 1, 8))).shape
    (2, 4, 1, 8)
    """
    s = _attn_scores(q, k, _attn_scale(q, scale), causal)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("...hqk,...khd->...qhd", p, v)


def attention_rules(*, causal: bool = False, scale: float | None = None,
                    prefix: str = "attn") -> RuleSet:
    """Attention that keeps only its output and the softmax statistics (flash attention's memory
    pattern, in plain JAX): the ``[..., H, T, S]`` scores and probabilities are never residuals; the
    backward pass recomputes them from ``q``, ``k`` and the row log-sum-exp.

    Residuals (qualified with the module path): ``{prefix}_out`` (the output, ``[..., T, H, D]``)
    and ``{prefix}_lse`` (log-sum-exp per query row, ``[..., H, T]``), both kept by default. Inside
    a boundary that recomputes them, the rule keeps neither and recomputes both.

    Args:
      causal, scale: as in :func:`attention`.
      prefix: the residual names' prefix.

    >>> import jax, jax.numpy as jnp
    >>> attn = attention_rules(causal=True)
    >>> q = jnp.ones((1, 4, 2, 8))
    >>> bool(jnp.allclose(jax.jit(attn)(q, q, q), attention(q, q, q, causal=True)))
    True
    """
    out_n, lse_n = f"{prefix}_out", f"{prefix}_lse"

    def fun(q: Array, k: Array, v: Array) -> Array:
        return attention(q, k, v, causal=causal, scale=scale)

    def fwd(ambient: Ambient, q: Array, k: Array, v: Array) -> tuple[Array, dict[str, Array]]:
        s = _attn_scores(q, k, _attn_scale(q, scale), causal)
        m = jnp.max(s, axis=-1, keepdims=True)
        e = jnp.exp(s - m)
        den = jnp.sum(e, axis=-1, keepdims=True)
        o = jnp.einsum("...hqk,...khd->...qhd", e / den, v)
        lse = (m + jnp.log(den))[..., 0]
        return o, {out_n: o, lse_n: lse}

    def rem(res: Mapping[str, Array | None], q: Array, k: Array,
            v: Array) -> tuple[Array, tuple[Array, ...]]:
        s = _attn_scores(q, k, _attn_scale(q, scale), causal)
        lse = res[lse_n]
        if lse is None:
            lse = jax.nn.logsumexp(s, axis=-1)
        p = jnp.exp(s - lse[..., None])
        o = res[out_n]
        if o is None:
            o = jnp.einsum("...hqk,...khd->...qhd", p, v)
        return o, (q, k, v, o, p)

    def bwd(res2: tuple[Array, ...], do: Array) -> tuple[Array, Array, Array]:
        q, k, v, o, p = res2
        sc = jnp.asarray(_attn_scale(q, scale), q.dtype)
        dv = jnp.einsum("...hqk,...qhd->...khd", p, do)
        dp = jnp.einsum("...qhd,...khd->...hqk", do, v)
        delta = jnp.einsum("...qhd,...qhd->...hq", do, o)
        ds = p * (dp - delta[..., None]) * sc
        dq = jnp.einsum("...hqk,...khd->...qhd", ds, k)
        dk = jnp.einsum("...hqk,...qhd->...khd", ds, q)
        return dq, dk, dv

    return RuleSet("attention", fun, fwd, rem, bwd, residuals=(out_n, lse_n),
                   keep=frozenset({out_n, lse_n}))


# -- gated MLP ---------------------------------------------------------------------------------------

def _activation(name: str) -> Callable[[Array], Array]:
    if name not in _ACTIVATIONS:
        raise RematError(
            f"gated_mlp_rules: unknown activation {name!r}. Allowed: "
            f"{', '.join(repr(a) for a in sorted(_ACTIVATIONS))} ('silu' gives SwiGLU, 'gelu' "
            "GeGLU)."
        )
    return _ACTIVATIONS[name]


def gated_mlp(x: Array, w_gate: Array, w_up: Array, w_down: Array, *,
              activation: str = "silu") -> Array:
    """``(act(x @ w_gate) * (x @ w_up)) @ w_down``: SwiGLU (``silu``) or GeGLU (``gelu``).

    >>> import jax.numpy as jnp
    >>> gated_mlp(jnp.ones((3, 4)), jnp.ones((4, 8)), jnp.ones((4, 8)), jnp.ones((8, 4))).shape
    (3, 4)
    """
    act = _activation(activation)
    return (act(x @ w_gate) * (x @ w_up)) @ w_down


def gated_mlp_rules(*, activation: str = "silu", prefix: str = "mlp") -> RuleSet:
    """A gated MLP that keeps its two pre-activations, or nothing, as the ambient policy says.

    Plain autodiff keeps the pre-activations, the activation's intermediates and the gated hidden
    state (all ``[..., F]``); this rule keeps ``{prefix}_gate`` (``x @ w_gate``) and ``{prefix}_up``
    (``x @ w_up``) by default and recomputes the rest; inside a boundary that recomputes them it
    keeps neither and recomputes the two matmuls in the backward pass.

    Args:
      activation: ``silu`` (SwiGLU), ``gelu`` (GeGLU) or ``gelu_tanh``.
      prefix: the residual names' prefix.

    >>> import jax, jax.numpy as jnp
    >>> mlp = gated_mlp_rules()
    >>> w = jnp.full((4, 4), 0.1)
    >>> g = jax.jit(jax.grad(lambda x: mlp(x, w, w, w).sum()))(jnp.ones((2, 4)))
    >>> want = jax.jit(jax.grad(lambda x: gated_mlp(x, w, w, w).sum()))(jnp.ones((2, 4)))
    >>> bool(jnp.allclose(g, want))
    True
    """
    act = _activation(activation)
    gate_n, up_n = f"{prefix}_gate", f"{prefix}_up"

    def fun(x: Array, w_gate: Array, w_up: Array, w_down: Array) -> Array:
        return gated_mlp(x, w_gate, w_up, w_down, activation=activation)

    def fwd(ambient: Ambient, x: Array, w_gate: Array, w_up: Array,
            w_down: Array) -> tuple[Array, dict[str, Array]]:
        g, u = x @ w_gate, x @ w_up
        return (act(g) * u) @ w_down, {gate_n: g, up_n: u}

    def rem(res: Mapping[str, Array | None], x: Array, w_gate: Array, w_up: Array,
            w_down: Array) -> tuple[Array, tuple[Array, ...]]:
        g = res[gate_n]
        g = x @ w_gate if g is None else g
        u = res[up_n]
        u = x @ w_up if u is None else u
        return (act(g) * u) @ w_down, (x, w_gate, w_up, w_down, g, u)

    def bwd(res2: tuple[Array, ...], dy: Array) -> tuple[Array, Array, Array, Array]:
        x, w_gate, w_up, w_down, g, u = res2
        a, act_vjp = jax.vjp(act, g)
        h = a * u
        dh = dy @ w_down.T
        dw_down = jnp.einsum("...f,...o->fo", h, dy)
        du = dh * a
        (dg,) = act_vjp(dh * u)
        dx = dg @ w_gate.T + du @ w_up.T
        dw_gate = jnp.einsum("...i,...f->if", x, dg)
        dw_up = jnp.einsum("...i,...f->if", x, du)
        return dx, dw_gate, dw_up, dw_down

    return RuleSet(f"gated_mlp[{activation}]", fun, fwd, rem, bwd, residuals=(gate_n, up_n),
                   keep=frozenset({gate_n, up_n}))


# -- norms -------------------------------------------------------------------------------------------

def rms_norm(x: Array, scale: Array, *, eps: float = 1e-6) -> Array:
    """``x / sqrt(mean(x**2) + eps) * scale`` over the last axis.

    >>> import jax.numpy as jnp
    >>> rms_norm(jnp.ones((2, 4)), jnp.ones(4)).shape
    (2, 4)
    """
    inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + jnp.asarray(eps, x.dtype))
    return x * inv * scale


def rms_norm_rules(*, eps: float = 1e-6, prefix: str = "norm") -> RuleSet:
    """RMSNorm that keeps only the inverse scale ``{prefix}_inv`` (``[..., 1]``), not the normalised
    activations; the backward pass rebuilds them from the input.

    >>> import jax, jax.numpy as jnp
    >>> norm = rms_norm_rules()
    >>> x = jnp.arange(8.0).reshape(2, 4)
    >>> g = jax.jit(jax.grad(lambda x: norm(x, jnp.ones(4))[0, 1]))(x)
    >>> bool(jnp.allclose(g, jax.jit(jax.grad(lambda x: rms_norm(x, jnp.ones(4))[0, 1]))(x)))
    True
    """
    inv_n = f"{prefix}_inv"

    def fun(x: Array, scale: Array) -> Array:
        return rms_norm(x, scale, eps=eps)

    def _inv(x: Array) -> Array:
        return jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + jnp.asarray(eps, x.dtype))

    def fwd(ambient: Ambient, x: Array, scale: Array) -> tuple[Array, dict[str, Array]]:
        inv = _inv(x)
        return x * inv * scale, {inv_n: inv}

    def rem(res: Mapping[str, Array | None], x: Array,
            scale: Array) -> tuple[Array, tuple[Array, ...]]:
        inv = res[inv_n]
        inv = _inv(x) if inv is None else inv
        return x * inv * scale, (x, scale, inv)

    def bwd(res2: tuple[Array, ...], dy: Array) -> tuple[Array, Array]:
        x, scale, inv = res2
        xhat = x * inv
        dscale = jnp.sum(dy * xhat, axis=tuple(range(dy.ndim - 1)))
        dxhat = dy * scale
        dx = inv * (dxhat - xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True))
        return dx, dscale

    return RuleSet("rms_norm", fun, fwd, rem, bwd, residuals=(inv_n,), keep=frozenset({inv_n}))


def layer_norm(x: Array, scale: Array, bias: Array, *, eps: float = 1e-6) -> Array:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis.

    >>> import jax.numpy as jnp
    >>> layer_norm(jnp.ones((2, 4)), jnp.ones(4), jnp.zeros(4)).shape
    (2, 4)
    """
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    inv = jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + jnp.asarray(eps, x.dtype))
    return xc * inv * scale + bias


def layer_norm_rules(*, eps: float = 1e-6, prefix: str = "norm") -> RuleSet:
    """LayerNorm that keeps only the inverse scale ``{prefix}_inv`` (``[..., 1]``); the mean and
    the normalised activations are rebuilt from the input in the backward pass.

    >>> import jax, jax.numpy as jnp
    >>> norm = layer_norm_rules()
    >>> x = jnp.arange(8.0).reshape(2, 4)
    >>> s, b = jnp.ones(4), jnp.zeros(4)
    >>> g = jax.jit(jax.grad(lambda x: norm(x, s, b)[0, 1]))(x)
    >>> bool(jnp.allclose(g, jax.jit(jax.grad(lambda x: layer_norm(x, s, b)[0, 1]))(x), atol=1e-6))
    True
    """
    inv_n = f"{prefix}_inv"

    def fun(x: Array, scale: Array, bias: Array) -> Array:
        return layer_norm(x, scale, bias, eps=eps)

    def _inv(xc: Array) -> Array:
        return jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + jnp.asarray(eps, xc.dtype))

    def fwd(ambient: Ambient, x: Array, scale: Array,
            bias: Array) -> tuple[Array, dict[str, Array]]:
        xc = x - jnp.mean(x, axis=-1, keepdims=True)
        inv = _inv(xc)
        return xc * inv * scale + bias, {inv_n: inv}

    def rem(res: Mapping[str, Array | None], x: Array, scale: Array,
            bias: Array) -> tuple[Array, tuple[Array, ...]]:
        xc = x - jnp.mean(x, axis=-1, keepdims=True)
        inv = res[inv_n]
        inv = _inv(xc) if inv is None else inv
        return xc * inv * scale + bias, (xc, scale, inv)

    def bwd(res2: tuple[Array, ...], dy: Array) -> tuple[Array, Array, Array]:
        xc, scale, inv = res2
        xhat = xc * inv
        lead = tuple(range(dy.ndim - 1))
        dxhat = dy * scale
        dx = inv * (dxhat - jnp.mean(dxhat, axis=-1, keepdims=True)
                    - xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True))
        return dx, jnp.sum(dy * xhat, axis=lead), jnp.sum(dy, axis=lead)

    return RuleSet("layer_norm", fun, fwd, rem, bwd, residuals=(inv_n,), keep=frozenset({inv_n}))

