"""Objects a framework updates in place, and how measurement turns them into arrays and back.

An in-place training step (``@nnx.jit def step(model, optimizer, batch)``) changes its arguments
instead of returning them. Measurement compiles it as a function of arrays: objects that flatten as
pytrees are rebuilt from their leaves, but an object that does not (a Flax NNX module declared
with ``pytree=False``, the default before Flax 0.12) would be captured whole and updated from inside
the trace. An adapter registers its framework's kind of such object here, with the framework's own
split/merge, so those objects become arrays too. The core never imports a framework.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class StatefulKind:
    """A framework's kind of in-place object.

    Attributes:
      name: the framework, for messages (``"flax.nnx"``).
      claims: whether a value (a pytree leaf) is such an object.
      split: ``split(objects) -> (static, state)``: a tuple of objects to a static description and
        a pytree of arrays, shared references kept.
      merge: ``merge(static, state) -> objects``: new objects from them.
      state: ``state(objects) -> state``: the objects' arrays now, in ``split``'s structure.
    """

    name: str
    claims: Callable[[Any], bool]
    split: Callable[[tuple[Any, ...]], tuple[Any, Any]]
    merge: Callable[[Any, Any], tuple[Any, ...]]
    state: Callable[[tuple[Any, ...]], Any]


_KINDS: dict[str, StatefulKind] = {}


def register_stateful(kind: StatefulKind) -> None:
    """Registers (or replaces, by name) a framework's kind of in-place object."""
    _KINDS[kind.name] = kind


def stateful_kind(x: Any) -> StatefulKind | None:
    """The registered kind that claims ``x``, if any."""
    for kind in _KINDS.values():
        if kind.claims(x):
            return kind
    return None
