"""The update, streamed: host-resident training state brought through the device a few arrays, or
a few rows of an array, at a time (:func:`stream_update`).

A training step that keeps the optimizer state (and the parameters) in host memory between steps
needs them on the device only for the update, and the update of one array (AdamW's, say) reads
that array, its moments and its gradient, element by element. So the update is traced once and
run array by array of its result, each array's host inputs moved to the device just before they
are needed and its result written back to host as soon as it is computed; and an array larger
than ``window`` (a scanned stack's parameter, with its layers along the first axis) is run a few
rows at a time, in a loop that reads each row block from host memory and writes its result back
in place: the device then holds a few rows of it, not the whole stack. Values are the update's:
the same operations on the same values, in the same order per element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final

import jax

from ._errors import PlanError
from ._state import in_host

#: Bytes of one array (its rows along the first axis) that the update brings to the device at
#: once: a larger array is updated a block of rows at a time (default 64 MiB).
WINDOW: Final = 64 << 20

#: The lanes of a TPU vector register. XLA:TPU lays an array's last axis along them, or, where
#: that axis is narrower (``(256, 64)``, ``(64, 8, 4)``, a vector), it may lay the first axis
#: there instead, and it slices a laid-out lane axis only in multiples of this ("Slicing lane
#: dimension is only supported when the lane slice size is a multiple of LaneCount"). So an
#: array is updated by blocks of rows only where its last axis has this many entries or the
#: block has a multiple of this many rows; elsewhere it is updated whole, on every platform.
LANES: Final = 128

#: Primitives that compute each element from the same element of their operands: a result of
#: them, of an array's shape, can be computed a block of rows at a time.
_ELEMENTWISE: Final = frozenset({
    "abs", "add", "add_any", "and", "atan2", "cbrt", "ceil", "clamp", "convert_element_type",
    "copy", "copy_p", "cos", "div", "eq", "erf", "exp", "exp2", "expm1", "floor", "ge", "gt",
    "integer_pow", "is_finite", "le", "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne",
    "neg", "nextafter", "not", "or", "pow", "reduce_precision", "rem", "round", "rsqrt",
    "select_n", "sign", "sin", "sqrt", "square", "sub", "tan", "tanh", "xor"})


def _flatten(closed: Any) -> tuple[list[Any], list[Any], list[tuple[Any, list[Any], list[Any]]],
                                   dict[Any, Any]]:
    """``closed`` as one flat graph: ``(invars, outvars, steps, consts)``, each step
    ``(eqn, inputs, outputs)`` in variables of the flat graph (``jit`` calls inlined, each call with
    its own variables), so that one call over many arrays does not make them one group."""
    from jax.extend import core as jc

    steps: list[tuple[Any, list[Any], list[Any]]] = []
    consts: dict[Any, Any] = {}

    def walk(jaxpr: Any, inner_consts: Sequence[Any], ins: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v if isinstance(v, jc.Literal) else env[v]

        for v, c in zip(jaxpr.constvars, inner_consts):
            env[v] = jc.Var(v.aval)
            consts[env[v]] = c
        env.update(zip(jaxpr.invars, ins))
        for eqn in jaxpr.eqns:
            inner = eqn.params.get("jaxpr")
            args = [read(v) for v in eqn.invars]
            if eqn.primitive.name in ("jit", "pjit") and isinstance(inner, jc.ClosedJaxpr):
                outs = walk(inner.jaxpr, inner.consts, args)
            else:
                outs = [jc.Var(v.aval) for v in eqn.outvars]
                steps.append((eqn, args, outs))
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    invars = [jc.Var(v.aval) for v in closed.jaxpr.invars]
    outvars = walk(closed.jaxpr, closed.consts, invars)
    return invars, outvars, steps, consts


def _bind(eqn: Any, vals: Sequence[Any]) -> list[Any]:
    got = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = got if isinstance(got, tuple) else ((), got)  # older JAX: (subfuns, params)
    out = eqn.primitive.bind(*subfuns, *vals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def stream_update(update: Callable[..., Any], state: Any, *args: Any, after: Any = None,
                  window: int = WINDOW) -> Any:
    """``update(state, *args)`` (a new state of the same structure) with the arrays of ``state``
    that are in host memory brought to the device a few at a time, inside a jitted step.

    The update (an optax step, say) is traced once and run array by array of its result: for each
    array of the new state, the host arrays it needs are moved to the device (not before the
    previous arrays' results are back in host memory: an ``optimization_barrier`` ties each move
    to the last write-back), it is computed, and the new arrays whose input was in host memory are
    written back to host as soon as they are computed. The device then holds the host-resident
    state only a few arrays at a time, not all of it at once as with :func:`fetch`.

    A new array of more than ``window`` bytes computed element by element (AdamW's moments and
    parameters from the old ones and the gradient, with scalars such as the learning rate and the
    clipping factor computed first) is computed a block of rows at a time (along its first axis,
    the layers of a scanned stack; where its last axis is narrower than :data:`LANES`, blocks of
    a multiple of :data:`LANES` rows, else it is computed whole): a loop reads each block of its host inputs, computes the block
    of it and of every new array of its shape computed the same way, and writes them in place into
    their arrays (host or device). The device holds a few blocks of rows, not the stack. What is
    computed is the same operations on the same values: the result equals ``update``'s.

    ``after``: not before this (the gradients) is computed. With no array of ``state`` in host
    memory this is ``update(state, *args)``.
    """
    leaves, treedef = jax.tree.flatten(state)
    host = [in_host(x) for x in leaves]
    if not any(host):
        return update(state, *args)
    arg_leaves, arg_def = jax.tree.flatten(args)
    n = len(leaves)
    out_def: list[Any] = []

    def flat(*xs: Any) -> list[Any]:
        out = update(jax.tree.unflatten(treedef, xs[:n]), *jax.tree.unflatten(arg_def, xs[n:]))
        out_leaves, odef = jax.tree.flatten(out)
        if len(out_leaves) != n:
            raise PlanError(f"stream_update: the update returned {len(out_leaves)} arrays for a "
                            f"state of {n}. Fix: return the new state, in the state's structure.")
        out_def.append(odef)
        return out_leaves

    values = [*leaves, *arg_leaves]
    closed = jax.make_jaxpr(flat)(*(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in values))
    invars, outvars, steps, consts = _flatten(closed)
    from jax.extend import core as jc

    producer = {o: i for i, (_, _, outs) in enumerate(steps) for o in outs}
    env: dict[Any, Any] = dict(consts)
    pending: dict[Any, Any] = {}
    # arguments in host memory too: the gradients of parameters kept on host (a layer scan that
    # fetches each layer writes each layer's gradient back to host)
    for v, x, h in zip(invars, values, [*host, *(in_host(x) for x in arg_leaves)]):
        (pending if h else env)[v] = x
    source = dict(pending)  # every host input, also once brought whole
    token = [after]

    def known(v: Any) -> bool:
        return isinstance(v, jc.Literal) or v in env

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jc.Literal) else env[v]

    def need(v: Any) -> None:
        stack = [v]
        while stack:
            u = stack[-1]
            if known(u):
                stack.pop()
            elif u in pending:
                x = pending.pop(u)
                if token[0] is not None:
                    x, _ = jax.lax.optimization_barrier((x, token[0]))
                env[u] = jax.device_put(x, jax.memory.Space.Device)
                stack.pop()
            else:
                eqn, ins, outs = steps[producer[u]]
                missing = [w for w in ins if not known(w)]
                if missing:
                    stack.extend(missing)
                else:
                    env.update(zip(outs, _bind(eqn, [read(w) for w in ins])))
                    stack.pop()

    def rowwise(v: Any, shape: tuple[int, ...], cone: dict[Any, Any]) -> bool:
        """Whether ``v`` (of ``shape``) can be computed a block of rows at a time; ``cone`` gets
        what that needs: per variable ``"in"`` (an input, sliced), ``"scalar"`` (computed
        before the loop) or the index of the step computing it."""
        todo = [v]
        while todo:
            u = todo.pop()
            if isinstance(u, jc.Literal) or u in cone:
                continue
            if u.aval.shape == ():
                cone[u] = "scalar"
                continue
            if u.aval.shape != shape:
                return False
            if u in env or u in source or u in pending:
                cone[u] = "in"
                continue
            k = producer[u]
            eqn, ins, _ = steps[k]
            name = eqn.primitive.name
            if name == "broadcast_in_dim" and ins[0].aval.shape == ():
                cone[u] = k
                todo.append(ins[0])
            elif name in _ELEMENTWISE:
                cone[u] = k
                todo.extend(ins)
            else:
                return False
        return True

    result: list[Any] = [None] * n
    done = [False] * n

    def by_rows(k: int) -> bool:
        """Computes output ``k`` and every output of its shape computed the same way a block of
        rows at a time, when ``k`` is in host memory and larger than ``window``."""
        shape = tuple(outvars[k].aval.shape)
        row = outvars[k].aval.dtype.itemsize * math.prod(shape[1:])
        if not host[k] or len(shape) == 0 or shape[0] < 2 or row * shape[0] <= window:
            return False
        lanes = len(shape) > 1 and shape[-1] >= LANES  # else XLA:TPU may lay the rows on lanes
        rows = max((d for d in range(1, shape[0]) if shape[0] % d == 0 and d * row <= window
                    and (lanes or d % LANES == 0)), default=0)
        if not rows:  # no block XLA:TPU can slice under every layout: the array whole
            return False
        cone: dict[Any, Any] = {}
        family = []
        for j in range(n):
            if (done[j] or tuple(outvars[j].aval.shape) != shape or outvars[j] in pending
                    or outvars[j].aval.dtype != leaves[j].dtype):
                continue
            mine: dict[Any, Any] = {}
            if rowwise(outvars[j], shape, mine):
                family.append(j)
                cone.update(mine)
        if k not in family:
            return False
        for u, what in cone.items():
            if what == "scalar":
                need(u)
        order = sorted({what for what in cone.values() if isinstance(what, int)})
        inputs = [u for u, what in cone.items() if what == "in"]
        carried = {invars[j]: i for i, j in enumerate(family)}
        start = tuple(values[j] for j in family)
        if token[0] is not None:
            start, _ = jax.lax.optimization_barrier((start, token[0]))

        def body(b: Any, slots: tuple[Any, ...]) -> tuple[Any, ...]:
            at = b * rows
            local: dict[Any, Any] = {}
            for u in inputs:
                whole = (slots[carried[u]] if u in carried else env[u] if u in env
                         else pending[u] if u in pending else source[u])
                x = jax.lax.dynamic_slice_in_dim(whole, at, rows, 0)
                local[u] = jax.device_put(x, jax.memory.Space.Device) if in_host(x) else x
            for i in order:
                eqn, ins, outs = steps[i]
                vals = [read(w) if isinstance(w, jc.Literal) or w not in local else local[w]
                        for w in ins]
                if eqn.primitive.name == "broadcast_in_dim":
                    got = [jax.lax.broadcast_in_dim(vals[0], (rows, *shape[1:]), ())]
                else:
                    got = _bind(eqn, vals)
                local.update(zip(outs, got))
            new = list(slots)
            for i, j in enumerate(family):
                y = local[outvars[j]]
                if in_host(new[i]):
                    y = jax.device_put(y, jax.memory.Space.Host)
                new[i] = jax.lax.dynamic_update_slice_in_dim(new[i], y.astype(new[i].dtype), at, 0)
            return tuple(new)

        out = jax.lax.fori_loop(0, shape[0] // rows, body, start)
        for i, j in enumerate(family):
            result[j], done[j] = out[i], True
            (pending if host[j] else env)[outvars[j]] = out[i]
        token[0] = tuple(out[i] for i, j in enumerate(family) if host[j])
        return True

    for k in range(n):
        if done[k]:
            continue
        if outvars[k] in pending and host[k]:  # a host array the update leaves as it is
            result[k], done[k] = pending[outvars[k]], True
            continue
        if by_rows(k):
            continue
        need(outvars[k])
        written = []
        for j in range(n):
            if not done[j] and known(outvars[j]):
                val = read(outvars[j])
                if host[j]:
                    val = jax.device_put(val, jax.memory.Space.Host)
                    written.append(val)
                result[j], done[j] = val, True
        if written:
            token[0] = tuple(written)
    return jax.tree.unflatten(out_def[0], result)
