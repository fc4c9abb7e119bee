"""RM003 (policies remat3 silently changes) and RM004 (save_anything_except_these_names)."""
import functools
from functools import partial

import equinox as eqx
import jax
from flax import nnx

cp = jax.checkpoint_policies


def my_policy(prim, *_, **params):
    return prim.name == "dot_general"


def f(x):
    return x


g1 = jax.checkpoint(f, policy=cp.save_from_both_policies(cp.dots_saveable, cp.nothing_saveable))
g2 = jax.checkpoint(f, policy=lambda prim, *_, **__: True)
g3 = jax.remat(f, policy=my_policy)
g4 = partial(jax.checkpoint, policy=my_policy)(f)
g5 = nnx.remat(f, policy=lambda *_, **__: False)
g6 = eqx.filter_checkpoint(f, policy=functools.partial(my_policy))
g7 = jax.checkpoint(f, policy=jax.checkpoint_policies.save_anything_except_these_names("h"))
both = cp.save_from_both_policies


@functools.partial(jax.checkpoint, policy=lambda *_, **__: True)
def h(x):
    return x


# Not flagged: name-based policies, a policy received as a parameter, non-remat calls.
ok1 = jax.checkpoint(f, policy=cp.SaveOnlyTheseNames(frozenset({"h"})))
ok2 = jax.checkpoint(f, policy=cp.dots_saveable)
ok3 = sorted([3, 1], key=lambda v: v)


def wrap(fun, policy):
    return jax.checkpoint(fun, policy=policy)


def retry(fun, policy=None):
    return fun


ok4 = retry(f, policy=lambda: 0)
