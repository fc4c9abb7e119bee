"""Float comparisons that hold on any CPU: tolerances derived from the dtype, never fixed numbers.

XLA:CPU's codegen (vector width, fusion, thread count) changes the order of float reductions, so two
equal programs can differ in the last bits, and a scanned chain of matmuls amplifies that. A plan only
changes *where* values are computed, never *what*, so results may differ by round-off alone:
``|actual - expected| <= ulps * eps * (|expected| + max|expected|)`` elementwise, where ``eps`` is the
machine epsilon of the compared dtype. The ``max|expected|`` term is what makes it hold for elements
that are small next to the rest of the array (the cancellation that a fixed ``rtol`` misses).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

#: Round-off allowance in units of the dtype's epsilon: 256 eps is 3.1e-5 in float32, 5.7e-14 in
#: float64; a plan that changed a value would be off by far more than that.
ULPS = 256


def tolerance(dtype: Any, ulps: int = ULPS) -> float:
    """``ulps`` machine epsilons of ``dtype`` (float32 when it is not a float type)."""
    dt = np.dtype(dtype)
    return float(ulps * np.finfo(dt if np.issubdtype(dt, np.floating) else np.float32).eps)


def assert_close(actual: Any, expected: Any, *, ulps: int = ULPS, err_msg: str = "") -> None:
    """Asserts two arrays (or two pytrees of arrays, leaf by leaf) agree to round-off."""
    la, lb = jax.tree.leaves(actual), jax.tree.leaves(expected)
    assert len(la) == len(lb), f"{len(la)} leaves != {len(lb)} leaves"
    for a, b in zip(la, lb, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if not np.issubdtype(b.dtype, np.inexact):
            np.testing.assert_array_equal(a, b, err_msg=err_msg)
            continue
        tol = tolerance(b.dtype, ulps)
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, err_msg=err_msg)
