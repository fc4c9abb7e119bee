"""Where training state lives between steps: a plan's ``state:`` entry, and the step that honours it.

A plan may keep the optimizer state and the parameters in host memory (``pinned_host``) between
training steps, as MaxText's ``optimizer_memory_host_offload`` and ``parameter_memory_host_offload``
do. The compiled step then takes them with host shardings, brings them to the device inside the
program, updates them there and writes them back to host: the device holds them only while the step
runs, and with :func:`stream_update` only a few arrays of them at a time during the update.
Gradients and values are the all-on-device step's.

This file knows nothing of Flax or Equinox: the adapters say which array of a training state is
what (``flax_remat_plugin.state_roles``, ``equinox_remat_plugin.state_roles``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import jax
import numpy as np

from ._errors import PlanError, short, sorted_list, type_error

#: What a plan's ``state:`` entry sets: where each part of the training state lives between steps.
STATE_KEYS: Final = ("optimizer", "params")
#: Where a part may live: ``host`` (``pinned_host`` memory) or ``device`` (the default).
STATE_PLACES: Final = ("device", "host")
#: The memory kind of each place.
MEMORY_KINDS: Final = {"device": "device", "host": "pinned_host"}
#: The role of an array of the training state that is neither parameter nor optimizer state
#: (loss-scale counters, a step count kept by the caller): it stays on the device.
OTHER: Final = "other"

_MSG_STATE = """\
{loc}{problem}
A plan says where training state lives between steps beside its rules, for example

    rules: {{"blocks.*": recompute}}
    state: {{optimizer: host, params: device}}   # host | device; default device

Fix: {fix}"""


@dataclasses.dataclass(frozen=True)
class StatePlacement:
    """Where the training state lives between steps (a plan's ``state:`` entry).

    Attributes:
      optimizer: ``"device"`` (default) or ``"host"``: the optimizer state (AdamW's moments).
      params: ``"device"`` (default) or ``"host"``: the model's parameters.

    >>> StatePlacement(optimizer="host").describe()
    'optimizer state on host (pinned_host), parameters on device'
    """

    optimizer: str = "device"
    params: str = "device"

    def __post_init__(self) -> None:
        for key in STATE_KEYS:
            _check_place(key, getattr(self, key), None)

    @classmethod
    def coerce(cls, value: Any, source: str | None = None) -> StatePlacement:
        """A placement from ``None`` (all on device), a :class:`StatePlacement`, or a mapping
        ``{optimizer: host | device, params: host | device}`` (missing keys: device)."""
        if value is None:
            return cls()
        if isinstance(value, StatePlacement):
            return value
        loc = f"{source}: " if source else ""
        if not isinstance(value, Mapping):
            raise PlanError(_MSG_STATE.format(
                loc=loc, problem=f"'state' must be a mapping, got {type(value).__name__} "
                                 f"{short(value)}.",
                fix="write state: {optimizer: host} (or leave 'state' out: all on device)."))
        bad = sorted(set(map(str, value)) - set(STATE_KEYS))
        if bad:
            near = {"optimiser": "optimizer", "opt": "optimizer", "opt_state": "optimizer",
                    "optimizer_state": "optimizer", "param": "params", "parameters": "params",
                    "weights": "params"}
            fix = "; ".join(f"write {near[k]!r} for {k!r}" for k in bad if k in near)
            raise PlanError(_MSG_STATE.format(
                loc=loc, problem=f"unknown state key(s) {sorted_list(bad)} (value "
                                 f"{short(value[bad[0]])}). Allowed keys: {sorted_list(STATE_KEYS)}.",
                fix=(fix + "." if fix else f"use only {sorted_list(STATE_KEYS)}.")))
        for key in STATE_KEYS:
            if key in value:
                _check_place(key, value[key], source)
        return cls(**{k: value[k] for k in STATE_KEYS if k in value})

    @property
    def on_host(self) -> tuple[str, ...]:
        """The parts kept on host, in :data:`STATE_KEYS` order (``()``: everything on device)."""
        return tuple(k for k in STATE_KEYS if getattr(self, k) == "host")

    @property
    def is_default(self) -> bool:
        return not self.on_host

    def memory_kind(self, role: str) -> str:
        """The memory kind an array of ``role`` (``optimizer``, ``params``, ``other``) lives in."""
        return MEMORY_KINDS[getattr(self, role) if role in STATE_KEYS else "device"]

    def to_config(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in STATE_KEYS}

    def describe(self) -> str:
        def one(key: str, what: str) -> str:
            place = getattr(self, key)
            return f"{what} on {place}" + (" (pinned_host)" if place == "host" else "")
        return f"{one('optimizer', 'optimizer state')}, {one('params', 'parameters')}"


def _check_place(key: str, value: Any, source: str | None) -> None:
    if isinstance(value, str) and value in STATE_PLACES:
        return
    loc = f"{source}: " if source else ""
    hint = ""
    if isinstance(value, bool):
        hint = " (YAML reads unquoted yes/no/on/off/true/false as booleans)"
    elif isinstance(value, str) and value in ("pinned_host", "unpinned_host", "cpu"):
        hint = " (a memory kind; the plan says host, which is pinned_host)"
    raise PlanError(_MSG_STATE.format(
        loc=loc, problem=f"state.{key}: {short(value)} is not a place{hint}. Allowed: "
                         f"{sorted_list(STATE_PLACES)}.",
        fix=f"write state: {{{key}: host}} or state: {{{key}: device}}."))


# -- the step that honours it -------------------------------------------------------------------

def as_placement(value: Any, function: str) -> StatePlacement:
    """``value`` as a :class:`StatePlacement`: one already, a plan's ``state:`` mapping
    (``{"optimizer": "host"}``, as :meth:`StatePlacement.coerce` reads it), ``None`` (all on
    device), a ``Plan`` or a ``CompiledPlan`` (its plan's ``state``); anything else is a :class:`TypeError` naming
    ``function`` (a mapping raised ``AttributeError: 'dict' object has no attribute
    'memory_kind'`` deep inside)."""
    if isinstance(value, StatePlacement):
        return value
    if value is None or isinstance(value, Mapping):
        return StatePlacement.coerce(value, f"{function}: placement")
    if isinstance(getattr(value, "state", None), StatePlacement):
        return value.state  # a Plan, or a CompiledPlan (its plan's)
    raise type_error(function, "placement", value,
                     "a StatePlacement, a plan's state: mapping ({'optimizer': 'host'}), a Plan "
                     "or a CompiledPlan", "pass plan.state, or StatePlacement(optimizer='host').")


def _is_sharding(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding)


def check_roles(roles: Sequence[str], n: int, what: str = "roles") -> tuple[str, ...]:
    """``roles`` as a tuple, checked: one per array of the state, each a known role."""
    roles = tuple(roles)
    allowed = {*STATE_KEYS, OTHER}
    if len(roles) != n or not set(roles) <= allowed:
        raise PlanError(
            f"state placement: {len(roles)} {what} for a state of {n} arrays "
            f"(unknown: {sorted_list(set(roles) - allowed) or 'none'}). Fix: one role per array, "
            f"each one of {sorted_list(allowed)}: the adapter's state_roles(state) gives them.")
    return roles


def state_shardings(shardings: Any, roles: Sequence[str],
                    placement: StatePlacement | Mapping[str, str]) -> tuple[Any, Any]:
    """``(stored, compute)``: ``shardings`` (one ``jax.sharding.Sharding`` per array of the
    training state, in any pytree) with each array's memory kind between steps (``stored``:
    ``pinned_host`` for the parts ``placement`` keeps on host) and during the step (``compute``:
    ``device``). Same layout over the mesh either way; only the memory differs."""
    placement = as_placement(placement, "remat_common.state.state_shardings")
    leaves, treedef = jax.tree.flatten(shardings, is_leaf=_is_sharding)
    roles = check_roles(roles, len(leaves))
    leaves = [memory_typed(s) for s in leaves]
    stored = [s.with_memory_kind(placement.memory_kind(r)) for s, r in zip(leaves, roles)]
    compute = [s.with_memory_kind("device") for s in leaves]
    return jax.tree.unflatten(treedef, stored), jax.tree.unflatten(treedef, compute)


def memory_typed(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """``sharding``, as one whose memory kind a jitted function sees in its arguments' types.

    JAX 0.11 types an argument of a ``NamedSharding`` in ``pinned_host`` as living on host
    (``jax.typeof(x).memory_space``), but one of a ``SingleDeviceSharding`` in ``pinned_host`` as
    on the device: a step given the latter could not tell its host arrays apart and would bring
    them to the device whole (:func:`stream_update` saw no host array). A ``SingleDeviceSharding``
    becomes the ``NamedSharding`` of a one-device mesh (the same placement); others are kept."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (dev,) = sharding.device_set
        mesh = jax.sharding.Mesh(np.array([dev]), ("device",))
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(),
                                          memory_kind=sharding.memory_kind)
    return sharding


def default_shardings(state: Any, device: jax.Device | None = None) -> Any:
    """One device's sharding for every array of ``state`` (training without a mesh): the
    ``NamedSharding`` of a one-device mesh, whose memory kind the step sees
    (:func:`memory_typed`)."""
    one = memory_typed(jax.sharding.SingleDeviceSharding(device or jax.devices()[0]))
    return jax.tree.map(lambda _: one, state)


def to_memory(tree: Any, shardings: Any, roles: Sequence[str], moved: Sequence[str]) -> Any:
    """The arrays of ``tree`` whose role is in ``moved`` put in their sharding's memory (inside a
    jitted function this is a transfer in the compiled program); the others as they are."""
    leaves, treedef = jax.tree.flatten(tree)
    targets = jax.tree.leaves(shardings, is_leaf=_is_sharding)
    roles = check_roles(roles, len(leaves))
    out = [jax.device_put(x, s) if r in moved else x for x, s, r in zip(leaves, targets, roles)]
    return jax.tree.unflatten(treedef, out)


def on_device(fn: Callable[..., Any], compute: Any, roles: Sequence[str],
              placement: StatePlacement | Mapping[str, str], *, returns_state: bool,
              fetches: bool = False) -> Callable[..., Any]:
    """``fn(state, *args)`` that first brings the host-resident parts of ``state`` to the device
    (``compute``: the device shardings; ``None``: device memory in whatever layout the caller's
    ``jit`` gives, as a measured step compiled for another machine needs) and, when
    ``returns_state`` (``fn`` returns ``(state, *rest)``), writes the updated parts back to host
    (``stored`` memory kinds). ``fetches``: ``fn`` brings the host-resident parts itself
    (:func:`fetch`, :func:`stream_update`), so they are left on host. The training step
    (:func:`jit_state_step`) and the measured one (``remat_common.measurement.with_state``) both
    run through it."""
    placement = as_placement(placement, "remat_common.state.on_device")
    moved = placement.on_host
    first = () if fetches else moved
    back = None if compute is None else jax.tree.unflatten(
        jax.tree.structure(compute, is_leaf=_is_sharding), [
            s.with_memory_kind(placement.memory_kind(r))
            for s, r in zip(jax.tree.leaves(compute, is_leaf=_is_sharding), roles)])

    def wrapped(state: Any, *args: Any) -> Any:
        state = (to_memory(state, compute, roles, first) if compute is not None
                 else _to_space(state, roles, first, jax.memory.Space.Device))
        out = fn(state, *args)
        if not returns_state or not moved:
            return out
        new_state, *rest = out
        return (to_memory(new_state, back, roles, moved) if back is not None
                else _to_space(new_state, roles, moved, jax.memory.Space.Host), *rest)

    return wrapped


def _to_space(tree: Any, roles: Sequence[str], moved: Sequence[str], space: Any) -> Any:
    """The arrays of ``tree`` whose role is in ``moved`` put in memory ``space`` (layout kept)."""
    leaves, treedef = jax.tree.flatten(tree)
    roles = check_roles(roles, len(leaves))
    return jax.tree.unflatten(treedef, [jax.device_put(x, space) if r in moved else x
                                        for x, r in zip(leaves, roles)])


def fetch(tree: Any, *, after: Any = None) -> Any:
    """``tree``'s arrays in device memory, for use in a training step that keeps them on host
    between steps: those in host memory are moved inside the compiled program (the others are
    left as they are), not before ``after`` (the gradients, say) has been computed.

    Call it on the parameters for the forward pass. For the update, :func:`stream_update` brings
    the host-resident state a few arrays (or rows of an array) at a time; ``fetch`` on the whole
    optimizer state (with the gradients as ``after``) keeps it off the device through the forward
    and backward passes but brings all of it for the update, where the device then holds it whole.
    :func:`jit_state_step` with ``fetches=True`` leaves the host parts in host memory for the
    step to fetch; without it, it moves them at the start of the step, which XLA may schedule as
    early as it likes.
    """
    if after is not None:
        tree, _ = jax.lax.optimization_barrier((tree, after))
    return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device), tree)


def in_host(x: Any) -> bool:
    """Whether ``x`` (an array or a tracer) is typed as living in host memory."""
    space = getattr(jax.typeof(x), "memory_space", None)
    return space is not None and space != jax.memory.Space.Device


def jit_state_step(step: Callable[..., tuple[Any, Any]], shardings: Any, roles: Sequence[str],
                   placement: StatePlacement | Mapping[str, str], *, batch: Any = None,
                   result: Any = None, donate: bool = True, fetches: bool = False) -> Any:
    """``jax.jit(step)`` for ``step(state, tokens) -> (state, loss)`` with the training state
    where ``placement`` says between steps.

    The state comes in and goes out with ``shardings`` in the memory kinds of ``placement``
    (``pinned_host`` for the host parts), is moved to device memory inside the compiled program
    for the step, and back to host for the result; donated (``donate``: the updated state takes the
    old buffers, on host as on device). ``batch`` and ``result``: the shardings of the batch and
    of the loss (``None``: the batch's and the result's are left to JAX, on one device).

    Args:
      step: the training step.
      shardings: one ``jax.sharding.Sharding`` per array of the state (a mesh's
        ``NamedSharding`` or :func:`default_shardings`).
      roles: per array of the state (``jax.tree.leaves`` order) ``"params"``, ``"optimizer"`` or
        ``"other"``: the adapter's ``state_roles(state)``.
      placement: the plan's ``state`` (:class:`StatePlacement`).
      fetches: ``step`` brings the host parts to the device itself (the examples' steps do:
        :func:`fetch` on the parameters for the forward pass, :func:`stream_update` for the
        update): they are left in host memory until then.
    """
    placement = as_placement(placement, "remat_common.state.jit_state_step")
    stored, compute = state_shardings(shardings, roles, placement)
    roles = tuple(roles)
    body = on_device(step, compute, roles, placement, returns_state=True, fetches=fetches)
    donate_argnums = (0,) if donate else ()
    if batch is None:
        return jax.jit(body, in_shardings=(stored, None), out_shardings=(stored, result),
                       donate_argnums=donate_argnums)
    return jax.jit(body, in_shardings=(stored, batch), out_shardings=(stored, result),
                   donate_argnums=donate_argnums)


def place_state(state: Any, shardings: Any, roles: Sequence[str],
                placement: StatePlacement | Mapping[str, str]) -> Any:
    """``state`` put where ``placement`` keeps it between steps (``pinned_host`` for the host
    parts), with ``shardings``' layouts: what the first step of :func:`jit_state_step` takes.
    ``placement``: a :class:`StatePlacement`, a plan's ``state:`` mapping (``{"optimizer":
    "host"}``) or a ``Plan``."""
    placement = as_placement(placement, "remat_common.state.place_state")
    stored, _ = state_shardings(shardings, roles, placement)
    leaves, treedef = jax.tree.flatten(state)
    targets = jax.tree.leaves(stored, is_leaf=_is_sharding)
    return jax.tree.unflatten(treedef, [jax.device_put(x, s) for x, s in zip(leaves, targets)])


def state_bytes(state: Any, roles: Sequence[str]) -> dict[str, int]:
    """``{role: bytes}`` of a training state (arrays or ``ShapeDtypeStruct``), per role."""
    leaves = jax.tree.leaves(state)
    roles = check_roles(roles, len(leaves))
    out = dict.fromkeys((*STATE_KEYS, OTHER), 0)
    for x, r in zip(leaves, roles):
        out[r] += int(x.size) * x.dtype.itemsize
    return out

