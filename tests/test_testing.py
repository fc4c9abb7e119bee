"""remat_common.testing.poison_empty: a CPU suite sees reads of uninitialised jnp.empty buffers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from remat_common.testing import poison_empty, poison_value
from fixtures.tolerance import assert_close

pytestmark = pytest.mark.compat


def _half_written(x: jax.Array) -> jax.Array:
    buf = jnp.empty((4, x.shape[0]), x.dtype)  # a bug: rows 2 and 3 are never written
    buf = buf.at[:2].set(x)
    return buf.sum()


def _fully_written(x: jax.Array) -> jax.Array:
    buf = jnp.empty((4, x.shape[0]), x.dtype)
    buf = jax.lax.fori_loop(0, 4, lambda i, b: b.at[i].set(x * i), buf)
    return buf.sum()


@pytest.mark.cpu_figures(
    "jnp.empty is zeros on XLA:CPU only (uninitialised on a TPU: the bug shows "
    "without poison)")
def test_cpu_hides_the_bug_and_poison_shows_it() -> None:
    x = jnp.arange(3.0)
    assert float(_half_written(x)) == 6.0  # CPU: zeros, the bug is invisible
    with poison_empty():
        assert np.isnan(float(jax.jit(_half_written)(x)))
        assert float(jax.jit(_fully_written)(x)) == 18.0  # correct code is unaffected
    assert float(jax.jit(_half_written)(jnp.arange(3.0) + 0)) == 6.0  # restored


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.uint8, jnp.bool_])
def test_every_dtype_is_poisoned_and_keeps_shape_and_dtype(dtype) -> None:
    with poison_empty():
        a, b = jnp.empty((2, 3), dtype), jnp.empty_like(jnp.zeros((5,), dtype))
    for arr, shape in ((a, (2, 3)), (b, (5,))):
        assert arr.shape == shape and arr.dtype == jnp.dtype(dtype)
        got = np.asarray(arr)
        if jnp.issubdtype(dtype, jnp.inexact):  # NumPy compares bfloat16 NaNs as unequal
            assert np.isnan(got.astype(np.float32)).all()
        else:
            np.testing.assert_array_equal(got, np.full(shape, poison_value(dtype), got.dtype))


def test_restored_after_an_error() -> None:
    original = jnp.empty
    with pytest.raises(ZeroDivisionError):
        with poison_empty():
            assert jnp.empty is not original
            1 / 0  # noqa: B018
    assert jnp.empty is original


def test_a_plan_under_poison_gives_the_plain_gradients(poisoned_empty) -> None:
    """The core's boundaries allocate no buffer they read before writing (fixture form)."""
    def layer(w, x):
        h = rc.checkpoint_name(x @ w, "h")
        return jnp.sum(jnp.tanh(h) ** 2)

    w, x = jnp.eye(4) * 0.5, jnp.ones((2, 4))
    for annotation in ("recompute", {"save": ["h"]}, {"offload": ["h"]}):
        g = jax.grad(rc.checkpoint(layer, annotation))(w, x)
        np.testing.assert_array_equal(np.isfinite(g), True)
        assert_close(g, jax.grad(layer)(w, x))
