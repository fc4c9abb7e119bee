"""What counts as an array, and as a differentiated (floating-point) one, everywhere in the project."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def is_array(x: Any) -> bool:
    """A JAX or NumPy array (tracers included).

    >>> is_array(np.ones(2)), is_array(2.0)
    (True, False)
    """
    return isinstance(x, jax.Array | np.ndarray)


def is_float(x: Any) -> bool:
    """A floating-point (or complex) array: what reverse-mode AD differentiates, and what a plan may
    tag as a module input. Integer, bool and typed PRNG key arrays are not.

    >>> is_float(np.ones(2)), is_float(np.ones(2, dtype=np.int32))
    (True, False)
    """
    return is_array(x) and jax.dtypes.issubdtype(x.dtype, np.inexact)
