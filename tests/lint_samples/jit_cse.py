"""RM006 (jit inline=True) and RM007 (prevent_cse=False)."""
import functools

import equinox as eqx
import jax
from flax import nnx


def f(x):
    return x


a = jax.jit(f, inline=True)
b = functools.partial(jax.jit, inline=True)(f)
c = nnx.jit(f, inline=True)
d = eqx.filter_jit(f, inline=True)
e = jax.checkpoint(f, prevent_cse=False)
g = nnx.remat(f,
              prevent_cse=False)
h = eqx.filter_checkpoint(f, prevent_cse=False)

# Not flagged: an explicit Inline value, inline=False, prevent_cse=True, another API's inline=.
ok1 = jax.jit(f, inline=jax.Inline.JAX_LATE)
ok2 = jax.jit(f, inline=False)
ok3 = jax.checkpoint(f, prevent_cse=True)


def render(text, inline=False):
    return text


ok4 = render("x", inline=True)
