"""A module's children and their paths: the path segment of a key (:func:`segment`, :func:`join`),
the child modules of a module, and the check, when a module runs, that the children ``annotate``
bound still run the plan (:func:`check_children`)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import remat_common as rc

from ._binding import PlanRef, binding_of
from ._remat import Remat, Stacked


_MSG_DOT = """\
equinox_remat_plugin: the dict key {key!r} under {path!r} contains '.' or '/' (or is empty): '.'
separates module path segments and '/' a path from an activation name, so no plan pattern or
qualified name could address it unambiguously. Fix: use other keys for dicts that hold modules."""


def segment(key: Any, path: str) -> str:
    """One path segment from a JAX key-path entry: attribute name, list index or dict key."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        s = key.name
    elif isinstance(key, jax.tree_util.SequenceKey):
        s = str(key.idx)
    elif isinstance(key, jax.tree_util.DictKey):
        s = str(key.key)
        if not s or "." in s or rc.adapter.SEP in s:
            raise rc.PlanError(_MSG_DOT.format(key=key.key, path=rc.adapter.display(path)))
    elif isinstance(key, jax.tree_util.FlattenedIndexKey):
        s = str(key.key)
    else:  # pragma: no cover - every key type JAX has today is handled above
        s = str(key).strip(".[]'\"")
    return s


def join(path: str, keys: tuple[Any, ...]) -> str:
    for k in keys:
        s = segment(k, path)
        path = f"{path}.{s}" if path else s
    return path


def children(module: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """Every leaf of a module's fields with its key path; sub-modules are leaves."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(
        module, is_leaf=lambda x: x is not module and isinstance(x, eqx.Module))
    return leaves

_MSG_CHILD_REPLACED = """\
equinox_remat_plugin: module {path!r} (inside {parent!r}) was replaced after annotate (eqx.tree_at?)
and would run without its plan entry ({ann}). Fix: annotate the model again after the swap:
erp.annotate(model, plan, replace=True)."""


def check_children(module: Any, path: str, ref: PlanRef) -> None:
    """Refuses, when ``module`` runs, a direct child that ``annotate`` bound but that was swapped out
    since (the plan would silently not apply to it)."""
    inside = ref.touched_inside(path)
    if not inside:  # nothing annotate bound below this module (a list layer's usual case)
        return
    canonical = ref.plan.canonical_path
    for keys, child in children(module):
        if not isinstance(child, eqx.Module):
            continue
        at = join(path, keys)
        if at not in inside:
            continue
        node = child.layers if isinstance(child, Stacked) else child
        if isinstance(node, Remat) and node.path == canonical(at):
            continue
        bound = binding_of(node)
        if bound is not None and bound[0] == canonical(at) and bound[1].ref == ref:
            continue
        res = ref.plan.resolution
        ann = res.annotation(at) if at in res.paths else "inherit"
        raise rc.PlanError(_MSG_CHILD_REPLACED.format(path=at, parent=rc.adapter.display(path), ann=ann))
