"""NNX objects that are not pytrees (``pytree=False``, the default before Flax 0.12), registered
with the core so that measuring an in-place ``@nnx.jit`` step splits them with ``nnx.split`` and
rebuilds them with ``nnx.merge`` instead of updating the caller's objects from inside a trace."""

from __future__ import annotations

from typing import Any

from flax import nnx

import remat_common as rc

_BASE: type = getattr(nnx, "Pytree", None) or nnx.Object


def _split(objects: tuple[Any, ...]) -> tuple[Any, Any]:
    return nnx.split(objects)  # one split: references shared between objects stay shared


def _merge(static: Any, state: Any) -> tuple[Any, ...]:
    return nnx.merge(static, state)  # type: ignore[no-any-return]


def _state(objects: tuple[Any, ...]) -> Any:
    return nnx.split(objects)[1]


rc.adapter.register_stateful(rc.adapter.StatefulKind(
    name="flax.nnx", claims=lambda x: isinstance(x, _BASE), split=_split, merge=_merge, state=_state))
