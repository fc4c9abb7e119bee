"""Module paths while a model runs, and path-qualified activation names."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any, TypeVar

import jax
from jax.ad_checkpoint import checkpoint_name as _jax_checkpoint_name

T = TypeVar("T")

_PATH: contextvars.ContextVar[str | None] = contextvars.ContextVar("remat_module_path", default=None)
_REWRITE: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "remat_path_rewrite", default=()
)
_NAMES: contextvars.ContextVar[Any] = contextvars.ContextVar("remat_boundary", default=None)
_COLLECTORS: contextvars.ContextVar[tuple[list[Tag], ...]] = contextvars.ContextVar(
    "remat_tag_collectors", default=()
)

#: The name under which a module's inputs are tagged when a plan offloads them.
INPUT_NAME = "__input__"
SEP = "/"


@dataclasses.dataclass(frozen=True)
class Tag:
    """One activation tagged during tracing: its qualified name, module path and abstract value."""

    name: str
    path: str | None
    shape: tuple[int, ...]
    dtype: str


def qualify(path: str | None, name: str) -> str:
    """``layers.3.attn`` + ``attn_out`` → ``layers.3.attn/attn_out``; no path → the bare name.

    >>> qualify("layers.3.attn", "attn_out")
    'layers.3.attn/attn_out'
    >>> qualify(None, "h")
    'h'
    """
    return f"{path}{SEP}{name}" if path else name


def current_module_path() -> str | None:
    """The dotted path of the module running now (set by the adapters), or None outside any."""
    return _PATH.get()


def effective_path(path: str) -> str:
    """``path`` as seen inside the scan body of a layer group (see :func:`layer_scope`).

    Stacked layers are one module at ``stack`` whose children are ``stack.attn`` ...; inside the
    scan body of the group starting at layer ``k`` they run as ``stack.k.attn``, the path the plan
    was resolved for.
    """
    for src, dst in reversed(_REWRITE.get()):
        if path == dst or path.startswith(dst + "."):
            return path
        if path == src:
            return dst
        if path.startswith(src + "."):
            return dst + path[len(src):]
    return path


@contextlib.contextmanager
def layer_scope(stack_path: str, layer_path: str) -> Iterator[str]:
    """Inside the block, module paths under ``stack_path`` read as under ``layer_path``."""
    token = _REWRITE.set(_REWRITE.get() + ((stack_path, layer_path),))
    try:
        with module_scope(layer_path):
            yield layer_path
    finally:
        _REWRITE.reset(token)


@contextlib.contextmanager
def module_scope(path: str) -> Iterator[str]:
    """Sets the module path that :func:`checkpoint_name` qualifies names with.

    The path is rewritten by an enclosing :func:`layer_scope`, if any.
    """
    token = _PATH.set(effective_path(path))
    try:
        yield _PATH.get()  # type: ignore[misc]
    finally:
        _PATH.reset(token)


@contextlib.contextmanager
def collect_tags() -> Iterator[list[Tag]]:
    """Records every :func:`checkpoint_name` call traced inside the block."""
    out: list[Tag] = []
    token = _COLLECTORS.set(_COLLECTORS.get() + (out,))
    try:
        yield out
    finally:
        _COLLECTORS.reset(token)


@contextlib.contextmanager
def boundary_names(boundary: Any) -> Iterator[None]:
    """Marks the block as running inside ``boundary`` (a CompiledBoundary), for :func:`tag`."""
    token = _NAMES.set(boundary)
    try:
        yield
    finally:
        _NAMES.reset(token)


def _check_batched_tag(qualified: str) -> None:
    boundary = _NAMES.get()
    if boundary is None or qualified not in boundary.spec.save | boundary.spec.offload:
        return
    from ._checkpoint import check_vmap

    check_vmap(boundary)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or SEP in name:
        raise ValueError(
            f"remat_common.checkpoint_name: name must be a non-empty string without {SEP!r} "
            f"(the module path is added for you), got {name!r}. Fix: checkpoint_name(x, 'attn_out')."
        )
    return name


def tag(x: T, qualified: str) -> T:
    """Tags every array leaf of ``x`` with an already qualified name."""
    collectors = _COLLECTORS.get()
    _check_batched_tag(qualified)

    def one(leaf: Any) -> Any:
        for c in collectors:
            c.append(Tag(qualified, current_module_path(), tuple(jax.numpy.shape(leaf)),
                         str(jax.numpy.result_type(leaf))))
        return _jax_checkpoint_name(leaf, qualified)

    return jax.tree_util.tree_map(one, x)


def checkpoint_name(x: T, name: str) -> T:
    """Tags ``x`` (an array or a pytree of arrays) for remat policies, qualified by module path.

    Inside a module run by an adapter the tag is ``<module path>/<name>`` (``layers.3.attn/attn_out``),
    so that a plan can treat two layers differently. Outside any module it is exactly
    ``jax.ad_checkpoint.checkpoint_name(x, name)``.

    Args:
      x: an array or pytree of arrays.
      name: the activation's name within its module, without ``/``.

    Returns:
      ``x``, unchanged in value.

    >>> import jax.numpy as jnp
    >>> checkpoint_name(jnp.ones(2), "h").shape
    (2,)
    """
    return tag(x, qualify(current_module_path(), _check_name(name)))
