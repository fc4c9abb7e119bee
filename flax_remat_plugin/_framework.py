"""Flax NNX as the core knows it: the one record this adapter registers (``register_framework``).

Besides its modules, NNX has in-place objects that are not pytrees (``pytree=False``, the default
before Flax 0.12): measuring an in-place ``@nnx.jit`` step splits them with ``nnx.split`` and
rebuilds them with ``nnx.merge`` instead of updating the caller's objects from inside a trace.
"""

from __future__ import annotations

from typing import Any

from flax import nnx

import remat_common as rc

from ._annotate import bind_declared_models, check_verified_models
from ._paths import graph_paths, is_module

_BASE: type = getattr(nnx, "Pytree", None) or nnx.Object


def _split(objects: tuple[Any, ...]) -> tuple[Any, Any]:
    return nnx.split(objects)  # one split: references shared between objects stay shared


def _merge(static: Any, state: Any) -> tuple[Any, ...]:
    return nnx.merge(static, state)  # type: ignore[no-any-return]


def _state(objects: tuple[Any, ...]) -> Any:
    return nnx.split(objects)[1]


rc.adapter.register_framework(rc.adapter.Framework(
    "flax.nnx", is_module=is_module, paths=graph_paths,
    check_models=check_verified_models, bind_models=bind_declared_models,
    stateful=rc.adapter.StatefulKind(name="flax.nnx", claims=lambda x: isinstance(x, _BASE),
                                     split=_split, merge=_merge, state=_state)))
