"""Which array of an Equinox training state is what: the roles a plan's ``state:`` entry places."""

from __future__ import annotations

from typing import Any

import jax


def state_roles(state: tuple[Any, Any]) -> tuple[str, ...]:
    """Per array of a training state ``(params, opt_state)`` (``jax.tree.leaves`` order):
    ``"params"`` for the model's arrays (``eqx.partition(model, eqx.is_inexact_array)[0]``),
    ``"optimizer"`` for the optax state beside it. What
    ``remat_common.state.jit_state_step`` takes to honour a plan's ``state:``.

    >>> import equinox as eqx, optax
    >>> params = eqx.filter(eqx.nn.Linear(2, 3, key=jax.random.key(0)), eqx.is_inexact_array)
    >>> state_roles((params, optax.sgd(0.1).init(params)))
    ('params', 'params')
    >>> state_roles((params, optax.adam(0.1).init(params)))[2:]
    ('optimizer', 'optimizer', 'optimizer', 'optimizer', 'optimizer')
    """
    if not isinstance(state, tuple) or len(state) != 2:
        raise TypeError(
            "equinox_remat_plugin.state_roles: expected the training state as a pair "
            f"(params, opt_state), got {type(state).__name__}. Fix: pass (params, tx.init(params)) "
            "with params = eqx.filter(model, eqx.is_inexact_array).")
    params, opt_state = state
    return (("params",) * len(jax.tree.leaves(params))
            + ("optimizer",) * len(jax.tree.leaves(opt_state)))
