"""RM002: jax.numpy.empty / empty_like, however they are reached."""
import jax
import jax as j
import jax.numpy as jnp
from jax import numpy as np2
from jax.numpy import empty, empty_like as el

a = jnp.empty((3,))
b = jnp.empty_like(a)
c = jax.numpy.empty(4)
d = np2.empty(2) + empty(2) + el(a)
e = j.numpy.empty_like(a)
make = jnp.empty


def inner():
    from jax import numpy as xp
    return xp.empty(3)
