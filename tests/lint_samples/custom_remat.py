"""RM005: jax.custom_remat functions with no visible enclosing checkpoint."""
from functools import partial

import jax
import jax.numpy as jnp
import remat_common
from flax import nnx


def f(x):
    return jnp.tanh(x)


def f_fwd(policy, x):
    return f(x), None


def f_rem(res, x):
    return f(x), x


def f_bwd(x, g):
    return (g * (1 - jnp.tanh(x) ** 2),)


bare = jax.custom_remat(f, f_fwd, f_rem, f_bwd)
grad_bare = jax.grad(lambda x: jnp.sum(bare(x)))  # grad with no checkpoint: NotImplementedError


@partial(jax.custom_remat, f_fwd=f_fwd, f_rem=f_rem, f_bwd=f_bwd)
def decorated(x):
    return f(x)


# Covered: used inside a checkpoint, directly, through a lambda, a decorated or a wrapped function.
direct = jax.custom_remat(f, f_fwd, f_rem, f_bwd)
in_lambda = jax.custom_remat(f, f_fwd, f_rem, f_bwd)
in_decorated = jax.custom_remat(f, f_fwd, f_rem, f_bwd)
in_helper = jax.custom_remat(f, f_fwd, f_rem, f_bwd)
ckpt1 = jax.checkpoint(direct)
ckpt2 = jax.checkpoint(lambda x: in_lambda(x) * 2)


@nnx.remat
def block(x):
    return in_decorated(x)


def helper(x):
    return in_helper(x) + 1


ckpt3 = remat_common.checkpoint(helper, "recompute")
ckpt4 = jax.checkpoint(jax.custom_remat(f, f_fwd, f_rem, f_bwd))


class Layer(nnx.Module):
    def __init__(self):
        self.rule = jax.custom_remat(f, f_fwd, f_rem, f_bwd)

    def __remat_custom__(self, x):
        return self.rule(x)
