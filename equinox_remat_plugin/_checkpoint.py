"""The Equinox boundary: a filtered ``jax.checkpoint`` as the core's ``checkpoint_impl``.

It has ``eqx.filter_checkpoint``'s semantics (array leaves of the arguments are traced, every other
leaf is a Python constant; outputs may hold non-array leaves; ``policy`` and ``prevent_cse`` go to
``jax.checkpoint`` unchanged) but it never hands the non-array leaves to JAX as a static argument: it
closes over them. ``eqx.filter_checkpoint`` passes them as one static argument (a tuple holding the
keyword dict), which jax 0.11.0 with ``jax_remat3`` on hashes and fails on
(``TypeError: unhashable type: 'dict'``;
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#equinox-boundaries).
Closing over them works on every supported version with ``jax_remat3`` off and on.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax


class _Static(eqx.Module):
    """The non-array part of a boundary's output, carried through ``jax.checkpoint`` as tree
    structure (no leaves), as ``eqx.filter_checkpoint`` does."""

    value: Any = eqx.field(static=True)


def filter_checkpoint_impl(fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                           static_argnums: tuple[int, ...]) -> Callable[..., Any]:
    """The core's ``CheckpointImpl`` for Equinox modules: a filtered ``jax.checkpoint``.

    Non-array arguments (flags, ``None`` keys, Python numbers, functions) are constants of the
    boundary automatically, so ``static_argnums`` is not needed and must be empty.

    >>> import jax.numpy as jnp
    >>> f = filter_checkpoint_impl(lambda x, *, scale: x * scale, policy=None, prevent_cse=True,
    ...                            static_argnums=())
    >>> float(jax.grad(lambda x: f(x, scale=3.0))(jnp.float32(2.0)))
    3.0
    """
    _check_static_argnums(static_argnums)

    def call(*args: Any, **kwargs: Any) -> Any:
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
        dynamic_out, static_out = _checkpointed(fun, static, policy, prevent_cse)(dynamic)
        return eqx.combine(dynamic_out, static_out.value)

    return call


def _check_static_argnums(static_argnums: tuple[int, ...]) -> None:
    if static_argnums:
        raise TypeError(
            "equinox_remat_plugin: the Equinox boundary treats every non-array argument as static, so "
            f"static_argnums={static_argnums!r} is not supported. Fix: pass those values as Python "
            "objects (not arrays), or drop static_argnums."
        )


def _checkpointed(fun: Callable[..., Any], static: Any, policy: Any,
                  prevent_cse: bool) -> Callable[..., Any]:
    """``jax.checkpoint`` of ``fun`` as a function of the arrays of its arguments, the rest
    (``static``) closed over."""
    def body(dynamic: Any) -> tuple[Any, _Static]:
        inner_args, inner_kwargs = eqx.combine(dynamic, static)
        out = fun(*inner_args, **inner_kwargs)
        dynamic_out, static_out = eqx.partition(out, eqx.is_array)
        return dynamic_out, _Static(static_out)

    return jax.checkpoint(body, prevent_cse=prevent_cse, policy=policy)


def _static_key(static: Any) -> Any:
    """The non-array part of a call as a cache key (its tree structure, and each leaf by type and
    value: ``1``, ``1.0``, ``True`` are equal Python values but trace differently; so are ``0.0``
    and ``-0.0``), or None when it cannot be hashed."""
    leaves, treedef = jax.tree_util.tree_flatten(static)
    key = (treedef, tuple((type(v), v, repr(v)) if isinstance(v, float | complex) else (type(v), v)
                          for v in leaves))
    try:
        hash(key)
    except TypeError:
        return None
    return key


#: How many static variants of one shared boundary keep their checkpointed body.
_SHARED_VARIANTS = 64


def shared_filter_checkpoint_impl(fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                                  static_argnums: tuple[int, ...]) -> Callable[..., Any]:
    """:func:`filter_checkpoint_impl` that reuses one ``jax.checkpoint``-wrapped body per value of
    the non-array part of the call (tree structure and leaves, which are still closed over, never
    passed as a static argument), so that JAX reuses its trace when alike layers call it in turn
    (``annotate(..., share_alike_layers=True)``). A call whose non-array part cannot be hashed gets
    a body of its own (no sharing)."""
    _check_static_argnums(static_argnums)
    cache: collections.OrderedDict[Any, Callable[..., Any]] = collections.OrderedDict()

    def call(*args: Any, **kwargs: Any) -> Any:
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
        key = _static_key(static)
        checkpointed = None if key is None else cache.get(key)
        if checkpointed is None:
            checkpointed = _checkpointed(fun, static, policy, prevent_cse)
            if key is not None:
                cache[key] = checkpointed
                if len(cache) > _SHARED_VARIANTS:
                    cache.popitem(last=False)
        elif key is not None:
            cache.move_to_end(key)
        dynamic_out, static_out = checkpointed(dynamic)
        return eqx.combine(dynamic_out, static_out.value)

    return call
