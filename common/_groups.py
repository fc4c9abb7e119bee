"""Layer groups of one stack, nested or not, scanned one after the other with one gradient for the
stack.

A plan that treats a stack's layers differently (``layers.[0-3]: recompute``, ``layers.[4-7]:
save``) runs one scan per group, and a ``nested`` stack (``{remat: recompute, nested: 4}``) runs
each group as checkpointed blocks of layers. Differentiated by JAX, each scan's backward pass
builds a gradient of the whole stack (the stack is a loop-invariant input of every scan, and JAX
starts each scan's gradient of it at zero), and the groups' gradients are added: one stack-sized
buffer per group beyond the first. A plain AD of a layer that keeps everything also keeps the
layer's weights, read out of the stack, as residuals: one copy of the group's parameters. And a
block's layers, differentiated together, hold every layer's weight slice and weight gradient of
the block at once.

:func:`scan_groups` runs the groups under one ``jax.custom_vjp`` instead. The forward pass scans
each group. A plain group takes each layer's VJP (``jax.vjp`` of the layer's call, its remat
boundary included, so the plan keeps what it says) and keeps its residuals, except the values the
backward pass can read again in place: the layer's parameters (read out of the stack), its
per-layer inputs and the arguments shared by every layer. A nested group keeps only each block's
input. The backward pass runs the groups in reverse; a nested group runs one block again at a time
(a scan taking each layer's VJP, keeping what the layer's plan keeps and its output; where the
layers keep only their input, ``recompute``, all but the last layer, whose output is not needed),
then its layers in reverse. Every layer's parameter gradient is written into the one gradient of
the stack (``dynamic_update_index``: in place, one layer at a time).

A stack in host memory (a plan's ``state: {params: host}``, the parameters typed ``pinned_host``)
is streamed: each scan brings the next layer's parameters to the device while this one computes
(two layers on the device, never the stack), the backward pass brings each layer again, and each
layer's gradient goes back into a gradient of the stack in host memory. The adapters run every
host-resident stack through here, one group or many.

Forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``) of a ``custom_vjp`` is not supported by
JAX: :func:`scan_groups` refuses it with :class:`~remat_common.RematError` naming the stack and the
fix (one annotation for the whole stack, without ``nested``: one plain scan). ``jax.linearize``
fails only when its linear function is called, outside this function, with JAX's own error;
forward over reverse (``jax.hessian``) works.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._errors import RematError
from ._state import in_host

#: ``step(carry, layer_params, layer_x, shared) -> (carry, y)``: one layer of a group.
Step = Callable[[Any, Any, Any, Any], tuple[Any, Any]]


class Group(NamedTuple):
    """Layers ``start..stop-1`` of a stack, each run by ``step``.

    ``block``: nested checkpointing, the group run as blocks of ``block`` layers that keep only
    their input (a first block of ``(stop - start) % block`` layers when it does not divide);
    ``None``: each layer keeps what its own boundary keeps.
    """

    step: Step
    start: int
    stop: int
    block: int | None = None


_MSG_JVP = """\
{fn}: forward-mode differentiation (jax.jvp, jax.jacfwd) of the stack at {stack!r}, which the plan
runs as {layout}. Those run under one jax.custom_vjp (one gradient buffer for the whole stack, each
layer's gradient written into it), and JAX has no forward-mode rule for a custom_vjp (forward over
reverse, jax.hessian, works). Fix: give every layer of {stack!r} one annotation without 'nested'
(e.g. {stack!r}: recompute), which runs one plain scan that forward mode differentiates; or
differentiate in reverse mode (jax.grad, jax.vjp, jax.jacrev)."""

_JAX_JVP_ERROR = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"


_MSG_FETCH_WHOLE = """\
{fn}: the parameters of the stack at {stack!r} are in host memory (a plan's state: {{params:
host}}), but {why}, so they cannot be streamed to the device layer by layer: they are brought to
the device whole for this call (the device holds the stack, as with remat_common.state.fetch).
Fix: {fix}"""


class StreamWarning(UserWarning):
    """A scanned stack in host memory brought to the device whole instead of layer by layer."""


def streams(stacked: Any) -> bool:
    """Whether any array of ``stacked`` (a stack's parameters) is typed as living in host memory:
    :func:`scan_groups` streams such a stack to the device layer by layer."""
    return any(in_host(a) for a in jax.tree_util.tree_leaves(stacked))


def fetch_whole(stacked: Any, *, stack: str, fn: str, why: str, fix: str) -> Any:
    """``stacked`` with its host-memory arrays brought to the device whole, with a
    :class:`StreamWarning` saying why the stack is not streamed (an adapter's fallback)."""
    if not streams(stacked):
        return stacked
    warnings.warn(_MSG_FETCH_WHOLE.format(fn=fn, stack=stack or "<root>", why=why, fix=fix),
                  StreamWarning, stacklevel=3)
    return jax.tree_util.tree_map(_device, stacked)


def _take(tree: Any, i: Any) -> Any:
    """Layer ``i`` of ``tree``; of an array in host memory, brought to the device (streamed)."""
    return jax.tree_util.tree_map(lambda a: _device(a[i]), tree)


def _device(x: Any) -> Any:
    return jax.device_put(x, jax.memory.Space.Device) if in_host(x) else x


def _layers(stacked: Any, body: Callable[[Any, Any, Any, Any], tuple[Any, Any]], carry: Any,
            start: Any, size: int, xs: Any, reverse: bool = False) -> tuple[Any, Any]:
    """``jax.lax.scan`` of ``body(carry, p, i, x)`` over layers ``i = start .. start + size - 1``
    (``reverse``: last first), ``p`` layer ``i`` of ``stacked``, ``x`` of ``xs``.

    A stack in host memory is streamed: each iteration starts bringing the next layer's
    parameters to the device (``p`` of the iteration after, carried) while this layer computes,
    so the device holds two layers of it, never the stack; in the backward pass, each layer is
    brought again (nothing of it is kept between the passes)."""
    idx = start + jnp.arange(size)
    if not streams(stacked):
        return jax.lax.scan(lambda c, inp: body(c, _take(stacked, inp[0]), *inp), carry,
                            (idx, xs), reverse=reverse)

    def step(cp: Any, inp: Any) -> tuple[Any, Any]:
        (c, p), (i, x) = cp, inp
        nxt = jnp.clip(i - 1 if reverse else i + 1, start, start + size - 1)
        c, y = body(c, p, i, x)
        return (c, _take(stacked, nxt)), y
    (carry, _), ys = jax.lax.scan(step, (carry, _take(stacked, idx[-1] if reverse else start)),
                                  (idx, xs), reverse=reverse)
    return carry, ys


def _ct_zeros(tree: Any) -> Any:
    def zero(a: Any) -> Any:
        if jnp.issubdtype(a.dtype, jnp.inexact):
            z = jnp.zeros(a.shape, a.dtype)  # of a stack in host memory, in host memory
            return jax.device_put(z, jax.memory.Space.Host) if in_host(a) else z
        return jnp.zeros(a.shape, jax.dtypes.float0)
    return jax.tree_util.tree_map(zero, tree)


@jax.custom_batching.custom_vmap
def _ct_of(ct: Any, primal: Any) -> Any:
    """``ct``, a cotangent of one layer's slice of ``primal`` (the stack, or its per-layer
    inputs). Under ``vmap`` (an Equinox model vmapped over its batch) with ``primal`` unbatched,
    the sum of ``ct`` over the batch, unbatched: what JAX would sum after the backward pass,
    summed per layer instead. Summed at the end, the stack's gradient was accumulated per
    example, a whole stack per example on each device (Llama-3-8B in two layer groups, fsdp=8:
    31 GiB more per device)."""
    return ct


@_ct_of.def_vmap
def _ct_of_vmap(axis_size: int, in_batched: list[Any], ct: Any, primal: Any) -> tuple[Any, Any]:
    ct_b, primal_b = in_batched
    if ct_b and not primal_b:
        return ct.sum(0), False
    return ct, ct_b


def _layout(groups: Sequence[Group]) -> str:
    nested = [g for g in groups if g.block is not None]
    if nested:
        blocks = sorted({g.block for g in nested if g.block is not None})
        return (f"nested blocks of {'/'.join(map(str, blocks))} layers"
                + (f" in {len(groups)} layer groups" if len(groups) > 1 else ""))
    return f"{len(groups)} layer groups ({', '.join(f'{g.start}-{g.stop - 1}' for g in groups)})"


def scan_groups(groups: Sequence[Group | tuple[Any, ...]], carry: Any, stacked: Any, xs: Any,
                shared: Any, *, stack: str = "", fn: str = "scan_layers") -> tuple[Any, list[Any]]:
    """Runs layers ``start..stop-1`` of each group with ``step`` (one scan per group, in order).

    Args:
      groups: a :class:`Group` (or ``(step, start, stop[, block])``) per group, contiguous, in
        layer order.
      carry: the activation threaded through the layers.
      stacked: the stacked parameters (arrays with a leading layer axis); layer ``i`` gets
        ``stacked[i]``.
      xs: other per-layer inputs with a leading layer axis (rng counts and keys, layer state);
        layer ``i`` gets ``xs[i]``.
      shared: arrays every layer gets as they are (masks, positions).
      stack, fn: the stack's module path and the public function running it, for messages.

    Returns:
      ``(carry, ys)``: the last carry, and per group the stacked ``y`` of its layers.

    >>> import jax, jax.numpy as jnp
    >>> step = lambda c, w, x, s: (jnp.tanh(c @ w) * s, None)
    >>> ws, h = jnp.ones((5, 3, 3)) / 3, jnp.ones((2, 3))
    >>> f = lambda ws: scan_groups([(step, 0, 2), (jax.checkpoint(step), 2, 5, 2)], h, ws, None,
    ...                            jnp.float32(0.5))[0].sum()
    >>> g = lambda ws: jax.lax.scan(lambda c, w: step(c, w, None, 0.5), h, ws)[0].sum()
    >>> bool(jnp.allclose(jax.grad(f)(ws), jax.grad(g)(ws)))
    True
    """
    parts: tuple[Group, ...] = tuple(Group(*g) for g in groups)
    # Per group (and block kind): the pullback's tree, and where each of its leaves comes from.
    structure: dict[Any, tuple[Any, list[tuple[int, int] | None]]] = {}

    def plain(env: Any, step: Step, c: Any, start: Any, size: int, x: Any) -> tuple[Any, Any]:
        """Layers ``start .. start + size - 1``, no VJP (a forward pass, a nested block's)."""
        stacked, shared = env

        return _layers(stacked, lambda c, p, i, x: step(c, p, x, shared), c, start, size, x)

    def forward(env: Any, key: Any, step: Step, c: Any, start: Any, size: int, x: Any,
                carry_known: bool = False) -> tuple[Any, Any, Any]:
        """Layers ``start .. start + size - 1`` taking each layer's VJP: ``(carry, ys, kept)``,
        ``kept`` the residuals of each layer's pullback but those read again in place (and the
        layer's input, with ``carry_known``; ``ys`` are then the layers' outputs)."""
        def body(c: Any, p: Any, i: Any, x: Any) -> tuple[Any, Any]:
            out, y, kept, structure[key] = _vjp_layer(env, step, c, p, x, carry_known)
            return out, (out if carry_known else y, kept)
        c, (ys, kept) = _layers(env[0], body, c, start, size, x)
        return c, ys, kept

    def backward(env: Any, key: Any, acc: Any, start: Any, size: int, x: Any, ct_ys: Any,
                 kept: Any) -> Any:
        """The layers of :func:`forward` in reverse: each pullback applied, its parameter (and
        per-layer input) gradient written into the stack's at the layer's index."""
        tree, where = structure[key]

        def body(acc: Any, p: Any, i: Any, inp: Any) -> tuple[Any, None]:
            x, ct_y, kept = inp
            return _apply(acc, i, _pullback(env, tree, where, p, x, None, kept), ct_y), None

        acc, _ = _layers(env[0], body, acc, start, size, (x, ct_ys, kept), reverse=True)
        return acc

    def replay(env: Any, key: Any, step: Step, acc: Any, c0: Any, start: Any, size: int,
               x: Any, ct_ys: Any) -> Any:
        """The backward pass of one nested block of ``size`` layers from its input ``c0``: its
        layers again, each layer's VJP taken, keeping each layer's output (the next layer's
        input) and what the layer's own plan keeps; then the layers in reverse, each pullback
        rebuilt and applied. Layers that keep nothing but their input (``recompute``) run all
        but the last layer again (the last one's output is not needed)."""
        _, outs, kept = forward(env, key, step, c0, start, max(size - 1, 1),
                                _rows(x, 0, max(size - 1, 1)), carry_known=True)
        if size > 1 and jax.tree_util.tree_leaves(kept):  # the last layer's residuals too
            _, outs, kept = forward(env, key, step, c0, start, size, x, carry_known=True)
        tree, where = structure[key]

        def body(acc: Any, p: Any, i: Any, inp: Any) -> tuple[Any, None]:
            x, ct_y, kept = inp
            j = i - start
            c = jax.tree_util.tree_map(  # layer j's input: the block's, or layer j - 1's output
                lambda o, a: jnp.where(j == 0, a, jax.lax.dynamic_index_in_dim(
                    o, jnp.maximum(j - 1, 0), keepdims=False)), outs, c0)
            return _apply(acc, i, _pullback(env, tree, where, p, x, c, kept), ct_y), None

        acc, _ = _layers(env[0], body, acc, start, size, (x, ct_ys, kept), reverse=True)
        return acc

    def primal(carry: Any, stacked: Any, xs: Any, shared: Any) -> tuple[Any, list[Any]]:
        ys = []
        for g in parts:
            carry, y = plain((stacked, shared), g.step, carry, g.start, g.stop - g.start,
                             _rows(xs, g.start, g.stop))
            ys.append(y)
        return carry, ys

    def fwd(carry: Any, stacked: Any, xs: Any, shared: Any) -> tuple[Any, Any]:
        env = (stacked, shared)
        ys, saved = [], []
        for n, g in enumerate(parts):
            x = _rows(xs, g.start, g.stop)
            if g.block is None:
                carry, y, kept = forward(env, n, g.step, carry, g.start, g.stop - g.start, x)
                ys.append(y)
                saved.append(kept)
                continue
            nb, head = divmod(g.stop - g.start, g.block)
            first = carry  # the input of the first block (of ``head`` layers, when there is one)
            y_head = None
            if head:
                carry, y_head = plain(env, g.step, carry, g.start, head, _rows(x, 0, head))

            def block(c: Any, inp: Any, g: Group = g) -> tuple[Any, Any]:
                start, x = inp
                c_out, y = plain(env, g.step, c, start, g.block or 0, x)
                return c_out, (c, y)
            starts = g.start + head + g.block * jnp.arange(nb)
            carry, (inputs, y) = jax.lax.scan(block, carry, (starts, _blocks(x, head, g.block)))
            y = _unblock(y)
            if y_head is not None:
                y = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), y_head, y)
            ys.append(y)
            saved.append((first if head else None, inputs))
        return (carry, ys), (stacked, xs, shared, saved)

    def bwd(res: Any, cts: Any) -> tuple[Any, Any, Any, Any]:
        stacked, xs, shared, saved = res
        env = (stacked, shared)
        ct_carry, ct_ys = cts
        acc = (ct_carry, _ct_zeros(stacked), _ct_zeros(xs), _ct_zeros(shared))
        for n in reversed(range(len(parts))):
            g = parts[n]
            x = _rows(xs, g.start, g.stop)
            if g.block is None:
                acc = backward(env, n, acc, g.start, g.stop - g.start, x, ct_ys[n], saved[n])
                continue
            nb, head = divmod(g.stop - g.start, g.block)
            first, inputs = saved[n]

            def block(acc: Any, inp: Any, g: Group = g, n: int = n) -> tuple[Any, None]:
                c, start, x, ct_y = inp
                return replay(env, (n, "block"), g.step, acc, c, start, g.block or 0, x,
                              ct_y), None
            starts = g.start + head + g.block * jnp.arange(nb)
            acc, _ = jax.lax.scan(block, acc, (inputs, starts, _blocks(x, head, g.block),
                                               _blocks(ct_ys[n], head, g.block)), reverse=True)
            if head:
                acc = replay(env, (n, "head"), g.step, acc, first, g.start, head,
                             _rows(x, 0, head), _rows(ct_ys[n], 0, head))
        return acc

    run = jax.custom_vjp(primal)
    run.defvjp(fwd, bwd)
    try:
        carry, ys = run(carry, stacked, xs, shared)
    except TypeError as e:
        if _JAX_JVP_ERROR not in str(e):
            raise
        raise RematError(_MSG_JVP.format(fn=fn, stack=stack or "<root>",
                                         layout=_layout(parts))) from e
    return carry, ys


def _vjp_layer(env: Any, step: Step, c: Any, p: Any, x: Any, carry_known: bool
               ) -> tuple[Any, Any, list[Any], tuple[Any, list[tuple[int, int] | None]]]:
    """The VJP of the layer of parameters ``p``: ``(carry, y, kept, (tree, where))``, ``kept`` the
    leaves of its pullback that are not the layer's parameters, per-layer input, shared arguments
    (or, with ``carry_known``, its input carry): ``where`` says where each other leaf is found
    again."""
    _, shared = env
    (out, y), pullback = jax.vjp(lambda c, p, x, s: step(c, p, x, s), c, p, x, shared)
    leaves, tree = jax.tree_util.tree_flatten(pullback)
    known = [jax.tree_util.tree_leaves(t) for t in (p, x, shared, c if carry_known else ())]
    where = [next(((k, j) for k, ls in enumerate(known) for j, q in enumerate(ls) if leaf is q),
                  None) for leaf in leaves]
    return out, y, [leaf for leaf, w in zip(leaves, where) if w is None], (tree, where)


def _pullback(env: Any, tree: Any, where: list[tuple[int, int] | None], p: Any, x: Any, c: Any,
              kept: list[Any]) -> Any:
    """The pullback of the layer of parameters ``p`` (read again out of the stack) rebuilt from
    ``kept`` and the values it reads again in place."""
    _, shared = env
    known = [jax.tree_util.tree_leaves(t) for t in (p, x, shared, c)]
    it = iter(kept)
    return jax.tree_util.tree_unflatten(
        tree, [next(it) if w is None else known[w[0]][w[1]] for w in where])


def _apply(acc: Any, i: Any, pullback: Any, ct_y: Any) -> Any:
    """``acc`` (carry, stack, per-layer input and shared cotangents) after layer ``i``'s pullback:
    its parameter and per-layer input gradients written into the stack's at index ``i``."""
    ct_c, ct_p_all, ct_x_all, ct_s = acc
    ct_c, ct_p, ct_x, ct_s_i = pullback((ct_c, ct_y))

    def put(full: Any, part: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda a, u: a if a.dtype == jax.dtypes.float0 else
            jax.lax.dynamic_update_index_in_dim(a, _host_like(a, _ct_of(u, a).astype(a.dtype)),
                                                i, 0),
            full, part)
    return ct_c, put(ct_p_all, ct_p), put(ct_x_all, ct_x), jax.tree_util.tree_map(
        _add_ct, ct_s, ct_s_i)


def _host_like(full: Any, part: Any) -> Any:
    """``part``, in host memory where ``full`` is (a streamed layer's gradient going back)."""
    return jax.device_put(part, jax.memory.Space.Host) if in_host(full) else part


def _add_ct(a: Any, b: Any) -> Any:
    return a if a.dtype == jax.dtypes.float0 else a + b


def _rows(xs: Any, start: int, stop: int) -> Any:
    return jax.tree_util.tree_map(lambda a: a[start:stop], xs)


def _blocks(xs: Any, head: int, block: int) -> Any:
    """Rows ``head ..`` of ``xs`` as ``(blocks, block, ...)``."""
    return jax.tree_util.tree_map(lambda a: a[head:].reshape(-1, block, *a.shape[1:]), xs)


def _unblock(ys: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a.reshape(-1, *a.shape[2:]), ys)
