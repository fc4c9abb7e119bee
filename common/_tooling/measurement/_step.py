"""The training step as a training loop runs it: compiled with its state donated, run with each
step's outputs fed back as the next step's inputs.

A loop writes ``state, loss = step(state, batch)`` under ``jax.jit(step, donate_argnums=0)``: the
updated state takes the old state's buffers (XLA aliases them), and XLA schedules the step around
that. Compiled without donation, the same step is another program: on a TPU v5e chip the example
GPT's temporaries differed by up to 34 %, and two plans that train there were refused
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md). Every step this project
measures, on this machine or for a target, is lowered by :func:`lower_step` and run by
:class:`FedSteps`.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ..._errors import RematError


def _key(x: Any) -> tuple[tuple[int, ...], str]:
    return tuple(x.shape), str(x.dtype)


def pair_outputs(inputs: Sequence[Any], outputs: Sequence[Any],
                 donated: Sequence[int]) -> dict[int, int]:
    """``{input index: output index}``: which output takes the buffer of each donated input.

    JAX's rule (``jax.jit`` with ``donate_argnums``): the outputs in order, each taking the first
    donated input not yet taken with its shape and dtype. An input no output takes is left out.

    >>> import jax.numpy as jnp
    >>> w, b, x = jnp.ones((2, 2)), jnp.ones(2), jnp.ones(3)
    >>> pair_outputs([w, b, x], [jnp.ones(()), w, b], donated=[0, 1])
    {0: 1, 1: 2}
    """
    free: dict[tuple[tuple[int, ...], str], deque[int]] = defaultdict(deque)
    for i in donated:
        free[_key(inputs[i])].append(i)
    out: dict[int, int] = {}
    for k, y in enumerate(outputs):
        q = free.get(_key(y))
        if q:
            out[q.popleft()] = k
    return out


def lower_step(fn: Callable[..., Any], args: Sequence[Any], state: Sequence[int]) -> Any:
    """``fn`` lowered as a training loop runs it: the inputs in ``state`` (parameters, optimizer
    state: every input but the batch) donated, so each updated value takes its input's buffer.

    ``args`` are arrays or ``jax.ShapeDtypeStruct`` (sharded ones lay the step out on their mesh).
    Only inputs that an output can take are donated (:func:`pair_outputs`), as a loop that gets
    its state back donates it; JAX would warn of the others ("Some donated buffers were not
    usable") and XLA could use them as scratch. Returns the ``jax.stages.Lowered``, whose
    attribute ``donated`` holds the donated input indices.
    """
    state = tuple(state)
    traced = jax.jit(fn, donate_argnums=state).trace(*args)
    paired = tuple(sorted(pair_outputs(args, traced.out_info, state)))
    if paired != state:
        traced = jax.jit(fn, donate_argnums=paired).trace(*args)
    lowered = traced.lower()
    lowered.donated = paired
    return lowered


_MSG_LOST = """\
remat_common.measurement.measure: plan {name!r}: the compiled step deleted its input {i} ({what})
but returns no output of that shape and dtype to take its place, so the next step has nothing to
run on. This is a bug of the measurement (it donates only inputs an output can take): please report
it with the step's signature."""


class FedSteps:
    """Runs a compiled, state-donating step again and again, as a loop does: each step's outputs
    that took a donated input's buffer (:func:`pair_outputs`) are the next step's inputs.

    The caller's arrays are never donated: the first step runs on copies placed as the compiled
    step expects them (its ``input_shardings``), made by :meth:`place`, which :meth:`release`
    drops again so that a device holds one plan's state at a time.
    """

    def __init__(self, name: str, compiled: Any, args: Sequence[Any], donated: Sequence[int]
                 ) -> None:
        self.name, self.compiled, self.donated = name, compiled, tuple(donated)
        self.source = tuple(args)
        #: as the compiled step takes each input (``None``: an input it does not use)
        self.shardings = tuple(compiled.input_shardings[0])
        self.args: list[Any] | None = None
        self.pairs: dict[int, int] | None = None

    def place(self) -> None:
        """Copies of the inputs, placed as the compiled step takes them (nothing when placed)."""
        if self.args is not None:
            return
        self.args = [x if s is None else jax.device_put(x, s, may_alias=False)
                     for x, s in zip(self.source, self.shardings)]

    def run(self) -> float:
        """One step (placing the inputs first when needed); its seconds, outputs ready."""
        self.place()
        assert self.args is not None
        t0 = time.perf_counter()
        outs = self.compiled(*self.args)
        jax.block_until_ready(outs)
        dt = time.perf_counter() - t0
        outs = jax.tree_util.tree_leaves(outs)
        if self.pairs is None:
            self.pairs = pair_outputs(self.args, outs, self.donated)
        for i in self.donated:
            x = self.args[i]
            if not x.is_deleted():
                continue
            k = self.pairs.get(i)
            if k is None:
                raise RematError(_MSG_LOST.format(name=self.name, i=i,
                                                  what=f"{x.dtype}{list(x.shape)}"))
            y, want = outs[k], self.shardings[i]
            self.args[i] = y if want is None or y.sharding == want else jax.device_put(y, want)
        return dt

    def release(self) -> None:
        """Drops the placed inputs (the next :meth:`run` places fresh copies)."""
        self.args = None
