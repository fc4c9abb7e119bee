"""Layer groups of one stack, scanned one group after the other, with one gradient for the stack.

A plan that treats a stack's layers differently (``layers.[0-3]: recompute``, ``layers.[4-7]:
save``) runs one scan per group. Differentiated by JAX, each scan's backward pass builds a gradient
of the whole stack (the stack is a loop-invariant input of every scan, and JAX starts each scan's
gradient of it at zero), and the groups' gradients are added: one stack-sized buffer per group
beyond the first. A plain AD of a layer that keeps everything also keeps the layer's weights, read
out of the stack, as residuals: one copy of the group's parameters.

:func:`scan_groups` runs the groups under one ``jax.custom_vjp`` instead. The forward pass scans
each group, taking each layer's VJP (``jax.vjp`` of the layer's call, its remat boundary included,
so the plan keeps what it says) and keeping its residuals, except the values the backward pass can
read again in place: the layer's parameters (sliced out of the stack), its per-layer inputs and the
arguments shared by every layer. The backward pass scans the groups in reverse and writes each
layer's parameter gradient into one gradient of the stack (``dynamic_update_slice``, in place).

Forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``) of a ``custom_vjp``
is not supported by JAX: for it, plan one annotation for the whole stack (one plain scan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

#: ``step(carry, layer_params, layer_x, shared) -> (carry, y)``: one layer of a group.
Step = Callable[[Any, Any, Any, Any], tuple[Any, Any]]


def _take(tree: Any, i: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a[i], tree)


def _ct_zeros(tree: Any) -> Any:
    def zero(a: Any) -> Any:
        if jnp.issubdtype(a.dtype, jnp.inexact):
            return jnp.zeros_like(a)
        return jnp.zeros(a.shape, jax.dtypes.float0)
    return jax.tree_util.tree_map(zero, tree)


def scan_groups(groups: Sequence[tuple[Step, int, int]], carry: Any, stacked: Any, xs: Any,
                shared: Any) -> tuple[Any, list[Any]]:
    """Runs layers ``start..stop-1`` of each group with ``step`` (one scan per group, in order).

    Args:
      groups: ``(step, start, stop)`` per group, contiguous, in layer order.
      carry: the activation threaded through the layers.
      stacked: the stacked parameters (arrays with a leading layer axis); layer ``i`` gets
        ``stacked[i]``.
      xs: other per-layer inputs with a leading layer axis (rng counts and keys, layer state);
        layer ``i`` gets ``xs[i]``.
      shared: arrays every layer gets as they are (masks, positions).

    Returns:
      ``(carry, ys)``: the last carry, and per group the stacked ``y`` of its layers.

    >>> import jax, jax.numpy as jnp
    >>> step = lambda c, w, x, s: (jnp.tanh(c @ w) * s, None)
    >>> ws, h = jnp.ones((4, 3, 3)) / 3, jnp.ones((2, 3))
    >>> f = lambda ws: scan_groups([(step, 0, 2), (jax.checkpoint(step), 2, 4)], h, ws, None,
    ...                            jnp.float32(0.5))[0].sum()
    >>> g = lambda ws: jax.lax.scan(lambda c, w: step(c, w, None, 0.5), h, ws)[0].sum()
    >>> bool(jnp.allclose(jax.grad(f)(ws), jax.grad(g)(ws)))
    True
    """
    groups = tuple(groups)
    structure: dict[int, tuple[Any, list[tuple[int, int] | None]]] = {}

    def primal(carry: Any, stacked: Any, xs: Any, shared: Any) -> tuple[Any, list[Any]]:
        ys = []
        for step, start, stop in groups:
            def body(c: Any, inp: Any, step: Step = step) -> tuple[Any, Any]:
                i, x = inp
                return step(c, _take(stacked, i), x, shared)
            carry, y = jax.lax.scan(body, carry, (jnp.arange(start, stop), _rows(xs, start, stop)))
            ys.append(y)
        return carry, ys

    def fwd(carry: Any, stacked: Any, xs: Any, shared: Any) -> tuple[Any, Any]:
        ys, saved = [], []
        for g, (step, start, stop) in enumerate(groups):
            def body(c: Any, inp: Any, step: Step = step, g: int = g) -> tuple[Any, Any]:
                i, x = inp
                p = _take(stacked, i)
                (c, y), pullback = jax.vjp(lambda c, p, x, s: step(c, p, x, s), c, p, x, shared)
                leaves, tree = jax.tree_util.tree_flatten(pullback)
                # Residuals the backward pass reads again in place: not kept per layer.
                known = [jax.tree_util.tree_leaves(t) for t in (p, x, shared)]
                where = [next(((k, j) for k, ls in enumerate(known) for j, q in enumerate(ls)
                               if leaf is q), None) for leaf in leaves]
                structure[g] = (tree, where)
                return c, (y, [leaf for leaf, w in zip(leaves, where) if w is None])
            carry, (y, res) = jax.lax.scan(body, carry, (jnp.arange(start, stop),
                                                         _rows(xs, start, stop)))
            ys.append(y)
            saved.append(res)
        return (carry, ys), (stacked, xs, shared, saved)

    def bwd(res: Any, cts: Any) -> tuple[Any, Any, Any, Any]:
        stacked, xs, shared, saved = res
        ct_carry, ct_ys = cts
        ct_stacked, ct_xs, ct_shared = _ct_zeros(stacked), _ct_zeros(xs), _ct_zeros(shared)
        for g in reversed(range(len(groups))):
            _, start, stop = groups[g]
            tree, where = structure[g]

            def body(acc: Any, inp: Any, tree: Any = tree, where: Any = where) -> tuple[Any, None]:
                ct_c, ct_p_all, ct_x_all, ct_s = acc
                i, x, ct_y, kept = inp
                known = [jax.tree_util.tree_leaves(t) for t in (_take(stacked, i), x, shared)]
                it = iter(kept)
                leaves = [next(it) if w is None else known[w[0]][w[1]] for w in where]
                pullback = jax.tree_util.tree_unflatten(tree, leaves)
                ct_c, ct_p, ct_x, ct_s_i = pullback((ct_c, ct_y))
                put = lambda full, part: jax.tree_util.tree_map(  # noqa: E731
                    lambda a, u: jax.lax.dynamic_update_index_in_dim(a, u.astype(a.dtype), i, 0),
                    full, part)
                ct_s = jax.tree_util.tree_map(_add_ct, ct_s, ct_s_i)
                return (ct_c, put(ct_p_all, ct_p), put(ct_x_all, ct_x), ct_s), None

            (ct_carry, ct_stacked, ct_xs, ct_shared), _ = jax.lax.scan(
                body, (ct_carry, ct_stacked, ct_xs, ct_shared),
                (jnp.arange(start, stop), _rows(xs, start, stop), ct_ys[g], saved[g]),
                reverse=True)
        return ct_carry, ct_stacked, ct_xs, ct_shared

    run = jax.custom_vjp(primal)
    run.defvjp(fwd, bwd)
    carry, ys = run(carry, stacked, xs, shared)
    return carry, ys


def _add_ct(a: Any, b: Any) -> Any:
    return a if a.dtype == jax.dtypes.float0 else a + b


def _rows(xs: Any, start: int, stop: int) -> Any:
    return jax.tree_util.tree_map(lambda a: a[start:stop], xs)
