"""Which array of an NNX training state is what: the roles a plan's ``state:`` entry places."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def state_roles(state: Any) -> tuple[str, ...]:
    """Per array of an NNX state (``jax.tree.leaves`` order): ``"optimizer"`` for the
    ``nnx.Optimizer``'s state (its ``nnx.OptState`` variables: the moments, the step count),
    ``"params"`` for the model's ``nnx.Param``\\ s, ``"other"`` for any other variable (it stays on
    the device). What ``remat_common.state.jit_state_step`` takes to honour a plan's ``state:``.

    >>> import optax
    >>> model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> _, state = nnx.split((model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)))
    >>> state_roles(state)
    ('params', 'params', 'optimizer')
    """
    roles: list[str] = []
    for leaf in jax.tree.leaves(state, is_leaf=_is_variable):
        n = len(jax.tree.leaves(leaf))
        if isinstance(leaf, nnx.OptState):
            role = "optimizer"
        elif isinstance(leaf, nnx.Param):
            role = "params"
        elif _is_variable(leaf):
            role = "other"
        else:  # a bare array: NNX state without its Variable boxes (nnx.State.to_pure_dict)
            raise TypeError(
                "flax_remat_plugin.state_roles: a leaf of the state is a bare "
                f"{type(leaf).__name__}, not an nnx.Variable, so its role is unknown. Fix: pass the "
                "state of nnx.split((model, optimizer)) (its Variables say what each array is).")
        roles.extend([role] * n)
    return tuple(roles)
