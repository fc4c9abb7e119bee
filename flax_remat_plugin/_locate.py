"""How a measurement recognises NNX modules when they are called, to trace the ones no plan
wraps in a named scope of their path (:func:`remat_common.adapter.register_module_locator`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx
from remat_common.adapter import ModuleLocator, join, register_module_locator

from ._binding import binding_of


def _is_module(obj: Any) -> bool:
    return isinstance(obj, nnx.Module)


def _scoped(module: Any) -> bool:
    return binding_of(module) is not None  # a swapped class runs its call through call_module


def _paths(module: Any, path: str) -> Mapping[int, str]:
    """``id -> path`` of ``module`` (at ``path``) and every module in its graph, as NNX's graph
    traversal names them (``nnx.List`` indices, ``nnx.Dict`` keys)."""
    out: dict[int, str] = {}
    for keys, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Module) and id(node) not in out:
            out[id(node)] = join(path, *map(str, keys))
    return out


register_module_locator(ModuleLocator(_is_module, _scoped, _paths))
