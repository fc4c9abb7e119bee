"""The NNX boundary: ``nnx.remat`` as the core's ``CheckpointImpl``, over a function that takes the
module as an argument (unbound form), so rng streams and batch statistics updated inside survive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax import nnx


def nnx_checkpoint(fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                   static_argnums: tuple[int, ...]) -> Callable[..., Any]:
    """The NNX boundary: ``nnx.remat`` over a function that takes the module as an argument."""
    if static_argnums:  # call_module never asks for them; the packing below keeps statics closed over
        raise ValueError(f"flax_remat_plugin: unexpected static_argnums {static_argnums!r}.")

    def boundary(module: nnx.Module, nodes: list[Any], arrays: list[Any]) -> Any:
        # ``module`` and ``nodes`` go by keyword, passed through untagged (they are not inputs).
        return fun(arrays, module=module, nodes=nodes)

    def alone(module: nnx.Module, *arrays: Any) -> Any:
        return fun(list(arrays), module=module, nodes=())

    rematted = nnx.remat(boundary, policy=policy, prevent_cse=prevent_cse)
    # A call without graph-node arguments (the common case) passes the module and its arrays as
    # hand-written nnx.remat code does: no containers for NNX to walk besides.
    rematted_alone = nnx.remat(alone, policy=policy, prevent_cse=prevent_cse)

    def call(arrays: list[Any], *, module: nnx.Module, nodes: list[Any]) -> Any:
        return rematted(module, nodes, arrays) if nodes else rematted_alone(module, *arrays)

    return call
