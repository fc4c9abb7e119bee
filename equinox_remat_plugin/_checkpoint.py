"""The Equinox boundary: ``eqx.filter_checkpoint`` as the core's ``checkpoint_impl``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from remat_common import CapabilityError

_MSG_REMAT3_STATIC = """\
equinox_remat_plugin: module {path!r} ({annotation}) runs inside eqx.filter_checkpoint, which hands the
call's non-array arguments to jax.checkpoint as one static argument (a tuple holding the keyword
dict). jax {version} with jax_remat3 on hashes static arguments and fails on it
(TypeError: unhashable type: 'dict'); jax 0.11.1 and newer do not.
Fix: upgrade jax (pip install 'jax>=0.11.1'), or turn remat3 off:
jax.config.update("jax_remat3", False)."""

#: The first JAX release whose remat3 accepts the static arguments ``eqx.filter_checkpoint`` passes.
FIXED_IN = (0, 11, 1)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:3])


def static_args_unhashable(jax_version: str | tuple[int, ...], remat3: bool) -> bool:
    """Whether ``eqx.filter_checkpoint`` fails on this JAX version with this ``jax_remat3`` value.

    JAX 0.11.0's remat3 hashes ``jax.checkpoint``'s static arguments; ``eqx.filter_checkpoint``
    passes an unhashable one (see JAX_FACTS.md in the design notes).

    >>> static_args_unhashable("0.11.0", True), static_args_unhashable("0.11.0", False)
    (True, False)
    >>> static_args_unhashable("0.11.2", True)
    False
    """
    version = _version_tuple(jax_version) if isinstance(jax_version, str) else tuple(jax_version)
    return remat3 and version < FIXED_IN


def check_filter_checkpoint(path: str, annotation: object, *, jax_version: str | None = None,
                            remat3: bool | None = None) -> None:
    """Raises :class:`~remat_common.CapabilityError` with the remedy when
    :func:`static_args_unhashable` holds for the installed JAX and the current ``jax_remat3``.

    ``jax_version`` and ``remat3`` default to the installed version and the flag's value now.
    """
    version = jax.__version__ if jax_version is None else jax_version
    flag = bool(jax.config.jax_remat3) if remat3 is None else remat3
    if static_args_unhashable(version, flag):
        raise CapabilityError(_MSG_REMAT3_STATIC.format(
            path=path or "<root>", annotation=annotation, version=version))


def filter_checkpoint_impl(fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                           static_argnums: tuple[int, ...]) -> Callable[..., Any]:
    """The core's ``CheckpointImpl`` built on ``eqx.filter_checkpoint``.

    Non-array arguments (flags, ``None`` keys, Python numbers) are static automatically, so
    ``static_argnums`` is not needed and must be empty.
    """
    if static_argnums:
        raise TypeError(
            "equinox_remat_plugin: eqx.filter_checkpoint treats every non-array argument as static, so "
            f"static_argnums={static_argnums!r} is not supported. Fix: pass those values as Python "
            "objects (not arrays), or drop static_argnums."
        )
    return eqx.filter_checkpoint(fun, policy=policy, prevent_cse=prevent_cse)
