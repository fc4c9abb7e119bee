"""The Equinox boundary: a filtered ``jax.checkpoint`` as the core's ``checkpoint_impl``.

It has ``eqx.filter_checkpoint``'s semantics (array leaves of the arguments are traced, every other
leaf is a Python constant; outputs may hold non-array leaves; ``policy`` and ``prevent_cse`` go to
``jax.checkpoint`` unchanged) but it never hands the non-array leaves to JAX as a static argument: it
closes over them. ``eqx.filter_checkpoint`` passes them as one static argument (a tuple holding the
keyword dict), which jax 0.11.0 with ``jax_remat3`` on hashes and fails on
(``TypeError: unhashable type: 'dict'``; docs/jax_behaviour.md, "Equinox boundaries"). Closing over
them works on every supported version with ``jax_remat3`` off and on.
"""

from __future__ import annotations

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
    if static_argnums:
        raise TypeError(
            "equinox_remat_plugin: the Equinox boundary treats every non-array argument as static, so "
            f"static_argnums={static_argnums!r} is not supported. Fix: pass those values as Python "
            "objects (not arrays), or drop static_argnums."
        )

    def call(*args: Any, **kwargs: Any) -> Any:
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)

        def body(dynamic: Any) -> tuple[Any, _Static]:
            inner_args, inner_kwargs = eqx.combine(dynamic, static)
            out = fun(*inner_args, **inner_kwargs)
            dynamic_out, static_out = eqx.partition(out, eqx.is_array)
            return dynamic_out, _Static(static_out)

        dynamic_out, static_out = jax.checkpoint(body, prevent_cse=prevent_cse, policy=policy)(dynamic)
        return eqx.combine(dynamic_out, static_out.value)

    return call
