"""Suppression comments."""
import jax
import jax.numpy as jnp

a = jnp.empty(3)  # remat: ignore[RM002]
b = jnp.empty(3)  # remat: ignore
c = jnp.empty(3)  # remat: ignore[uninitialized-empty]
d = jnp.empty(3)  # remat: ignore[RM001]
e = jax.jit(jnp.empty, inline=True)  # remat: ignore[RM002, RM006]
f = jax.jit(jnp.empty, inline=True)  # noqa: E731  # remat: ignore[RM006]
g = "# remat: ignore"; h = jnp.empty(3)
