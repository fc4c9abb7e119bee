"""Shared fixtures: strict dtype promotion (standard where optax needs it), a PRNG key, the
jax_remat3 flag (off and on, or on), and float32 matrix products at full precision on a TPU/GPU."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(autouse=True, scope="session")
def _full_matmul_precision() -> Iterator[None]:
    """On an accelerator, every test's matrix products at ``"highest"`` precision: a TPU runs
    float32 products in bf16 passes by default, where remat and baseline values agree to about
    1e-3 relative (1e-7 at "highest"), beyond the suite's tolerances. On the CPU nothing changes.
    Session-scoped, so that it is in force before any module-scoped fixture computes a baseline
    (a function-scoped one came after them: on a TPU every baseline was bf16-pass)."""
    if jax.default_backend() == "cpu":
        yield
        return
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture
def key() -> jax.Array:
    return jax.random.key(0)


@pytest.fixture(params=[False, True], ids=["remat3-off", "remat3-on"])
def remat3(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Runs the test with ``jax_remat3`` off and on, restoring the previous value after."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", request.param)
    try:
        yield request.param
    finally:
        jax.config.update("jax_remat3", old)


@pytest.fixture(scope="module")
def standard_promotion() -> Iterator[None]:
    """Standard dtype promotion for a module that builds the examples' optax steps: optax's AdamW
    bias correction raises a float to an int32 power (``decay ** count``), which the suite's
    strict promotion refuses. Module-scoped fixtures that build such a step request it."""
    old = jax.config.jax_numpy_dtype_promotion
    jax.config.update("jax_numpy_dtype_promotion", "standard")
    try:
        yield
    finally:
        jax.config.update("jax_numpy_dtype_promotion", old)


@pytest.fixture
def remat3_on() -> Iterator[None]:
    """Runs the test with ``jax_remat3`` on only, restoring the previous value after."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", True)
    try:
        yield
    finally:
        jax.config.update("jax_remat3", old)


from remat_common.testing import poisoned_empty  # noqa: E402,F401  (the fixture, for every test)
