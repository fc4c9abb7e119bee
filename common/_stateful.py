"""Objects a framework updates in place, and how measurement turns them into arrays and back.

An in-place training step (``@nnx.jit def step(model, optimizer, batch)``) changes its arguments
instead of returning them. Measurement compiles it as a function of arrays: objects that flatten as
pytrees are rebuilt from their leaves, but an object that does not (a Flax NNX module declared
with ``pytree=False``, the default before Flax 0.12) would be captured whole and updated from inside
the trace. An adapter's :class:`~remat_common.adapter.Framework` names its framework's kind of such
object (``stateful``), with the framework's own split/merge, so those objects become arrays too.
The core never imports a framework.
"""

from __future__ import annotations

from typing import Any

from ._framework import StatefulKind, frameworks


def stateful_kind(x: Any) -> StatefulKind | None:
    """The registered kind that claims ``x``, if any."""
    for fw in frameworks():
        if fw.stateful is not None and fw.stateful.claims(x):
            return fw.stateful
    return None
