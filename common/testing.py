"""Test helpers for code that runs under remat plans.

``jnp.empty``/``jnp.empty_like`` return uninitialised memory on GPU and TPU since JAX 0.11, but zeros
on CPU (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#jaxnumpyempty),
so a CPU test suite cannot see code that reads a buffer before writing all of it. :func:`poison_empty` makes them return poison on every backend for the duration: NaN for
inexact dtypes, the dtype's largest value for integers, ``True`` for booleans. A test that would
read stale memory on an accelerator then fails on CPU.

It replaces the attributes ``jax.numpy.empty`` and ``jax.numpy.empty_like``, so it reaches every
``jnp.empty(...)`` call made while it is active, traced ones included. JAX caches traces, so it
clears them (``jax.clear_caches()``) on entry and on exit: a function jitted before the block is
traced again inside it, and one traced inside it does not keep the poison after. A name bound earlier with
``from jax.numpy import empty`` is not reached; ``remat lint`` (rule RM002) finds those.

Use it as a context manager, or as the pytest fixture ``poisoned_empty``::

    # conftest.py
    from remat_common.testing import poisoned_empty  # noqa: F401  (makes the fixture available)

    # test_model.py
    def test_step_reads_no_uninitialised_memory(poisoned_empty):
        ...

>>> import jax.numpy as jnp
>>> with poison_empty():
...     bool(jnp.isnan(jnp.empty(3)).all()), int(jnp.empty_like(jnp.arange(2))[0]) == 2**31 - 1
(True, True)
>>> bool((jnp.empty(3) == 0).all())  # restored on exit (CPU: zeros)
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_LOCK = threading.Lock()


def poison_value(dtype: Any) -> Any:
    """What :func:`poison_empty` fills a buffer of ``dtype`` with."""
    dt = np.dtype(dtype)
    if jnp.issubdtype(dt, jnp.inexact):  # bfloat16 and the float8 types included
        return np.nan
    if jnp.issubdtype(dt, jnp.bool_):
        return True
    if jnp.issubdtype(dt, jnp.integer):
        return jnp.iinfo(dt).max
    raise TypeError(f"remat_common.testing.poison_empty: no poison for dtype {dt}")


def _poisoned(original: Callable[..., Any]) -> Callable[..., Any]:
    def empty(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)  # shape, dtype, device and sharding exactly as asked
        return jnp.full_like(out, poison_value(out.dtype))

    empty.__name__ = original.__name__
    empty.__doc__ = original.__doc__
    return empty


@contextlib.contextmanager
def poison_empty() -> Iterator[None]:
    """Within the block, ``jnp.empty``/``jnp.empty_like`` return poison-filled arrays (see the
    module docstring). Not re-entrant across threads: one block at a time."""
    with _LOCK:
        saved = jnp.empty, jnp.empty_like
        jax.clear_caches()
        jnp.empty, jnp.empty_like = _poisoned(saved[0]), _poisoned(saved[1])  # type: ignore[misc]
        try:
            yield
        finally:
            jnp.empty, jnp.empty_like = saved  # type: ignore[misc]
            jax.clear_caches()


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is only needed for the fixture
    __all__ = ["poison_empty", "poison_value"]
else:
    __all__ = ["poison_empty", "poison_value", "poisoned_empty"]

    @pytest.fixture
    def poisoned_empty() -> Iterator[None]:
        """pytest fixture: the test runs inside :func:`poison_empty`."""
        with poison_empty():
            yield
