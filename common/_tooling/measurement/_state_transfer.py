"""Training state a plan keeps on host, in the step a report compiles and in its figures.

A plan's ``state:`` keeps the optimizer state (and, when asked, the parameters) in host memory
between steps; each step brings them to the device and writes them back. :func:`with_state` makes
a :class:`MeasureTarget`'s step do so (the host parts as ``pinned_host`` arguments), so the
compiled figures are those of the program that trains; :func:`state_figures` reads what the
compiled step holds on host (:class:`StateFigures`, a report's ``PlanReport.state``), and
:func:`state_transfer` prices a placement's traffic from the state's bytes alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from ..._state import (STATE_KEYS, StatePlacement, as_placement, check_roles, host_roles,
                      memory_typed, on_device, state_bytes)
from ..accelerators._profiles import HostLink
from ..accelerators._units import fmt_bytes
from ._host_memory import check_host_memory
from ._target import MeasureTarget


@dataclasses.dataclass(frozen=True)
class StateTransfer:
    """The host traffic of a state placement, per step and per device.

    Attributes:
      placement: where the state lives between steps.
      host_bytes: bytes of state kept in host memory between steps.
      transfer_bytes: bytes moved over the host link per step: each host part to the device and
        back (twice ``host_bytes``).

    >>> t = state_transfer({"params": 100, "optimizer": 200}, StatePlacement(optimizer="host"))
    >>> t.host_bytes, t.transfer_bytes
    (200, 400)
    """

    placement: StatePlacement
    host_bytes: int
    transfer_bytes: int

    def seconds(self, link: HostLink) -> float:
        """Seconds the transfers take at ``link`` (each direction at its bandwidth, one after the
        other: an upper bound where the link carries both at once)."""
        return link.seconds(self.transfer_bytes)

    def describe(self, link: HostLink | None = None) -> str:
        if not self.host_bytes:
            return "training state on device (no host traffic)"
        text = (f"{self.placement.describe()}: {self.host_bytes / 2**20:,.1f} MiB on host, "
                f"{self.transfer_bytes / 2**20:,.1f} MiB over the host link per step")
        if link is not None:
            text += f" ({1e3 * self.seconds(link):.2f} ms at {link.bytes_per_s / 1e9:g} GB/s)"
        return text


def state_transfer(nbytes: Mapping[str, int], placement: StatePlacement) -> StateTransfer:
    """The traffic of ``placement`` for a state of ``nbytes`` (``{role: bytes}``, as
    ``remat_common.state.state_bytes`` gives them; for a part of a kind on host, give the bytes of
    the roles ``remat_common.state.host_roles`` resolves: the part's)."""
    host = sum(int(nbytes.get(k, 0)) for k in STATE_KEYS if k in placement.on_host)
    return StateTransfer(placement, host, 2 * host)


# -- the step a report measures, with the state where the plan keeps it -------------------------

@dataclasses.dataclass(frozen=True)
class StateFigures:
    """Training state kept on host between steps, as the compiled step holds it, per device.

    Attributes:
      placement: the plan's ``state:`` (``{optimizer: host | device, params: host | device}``).
      state_bytes: ``{role: bytes}`` of the whole training state (all devices together).
      host_state_bytes: ``{kind: bytes}`` of it kept on host between steps, per kind on host
        (all of it, or the part a fraction or patterns take; all devices together).
      host_argument_bytes: bytes of the step's arguments in host memory (``pinned_host``), per
        device: the compiler's ``host_argument_size_in_bytes`` (XLA:TPU pads small arrays to a
        tile), else, where the compiler drops the placements, the compiled step's input shardings
        say which arguments and their shards' sizes: they are not device memory.
      transfer_bytes: bytes over the host link per step and device: each host argument to the
        device and back (twice ``host_argument_bytes``).
      counted_on_device: the compiler dropped the host placements (XLA:CPU): its memory figures
        count these bytes as device arguments, and the device peak is its total less them.
      link: the host link the seconds are priced at (a profile's or the accelerator's name).
      link_bytes_per_s: that link's bandwidth per direction.
    """

    placement: dict[str, Any]
    state_bytes: dict[str, int]
    host_argument_bytes: int
    transfer_bytes: int
    counted_on_device: bool
    link: str
    link_bytes_per_s: float
    host_state_bytes: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def transfer_s(self) -> float:
        """Seconds the transfers take per step at :attr:`link_bytes_per_s`."""
        return self.transfer_bytes / self.link_bytes_per_s if self.link_bytes_per_s else 0.0

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / 2**20:,.1f} of {self.state_bytes.get(k, 0) / 2**20:,.1f} MiB"
                          for k, v in self.host_state_bytes.items())
        return (f"{StatePlacement.coerce(self.placement).describe()}"
                + (f" ({parts})" if parts else "") + ": "
                f"{self.host_argument_bytes / 2**20:,.1f} MiB on host per device, "
                f"{self.transfer_bytes / 2**20:,.1f} MiB over the host link per step "
                f"({1e3 * self.transfer_s:.2f} ms at {self.link_bytes_per_s / 1e9:g} GB/s, "
                f"{self.link})" + ("; the compiler here keeps them on device (it drops host "
                                   "placements), the device peak counts them apart"
                                   if self.counted_on_device else ""))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "transfer_s": self.transfer_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateFigures:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def host_argument_bytes(compiled: Any, args: Sequence[Any]) -> int:
    """Bytes per device of the compiled step's arguments that it takes in host memory (its input
    shardings' memory kind other than ``device``)."""
    try:
        shardings = compiled.input_shardings[0]
    except Exception:  # noqa: BLE001 - no shardings: nothing known on host
        return 0
    total = 0
    for a, s in zip(args, shardings):
        if s is None or getattr(s, "memory_kind", None) in (None, "device"):
            continue
        total += math.prod(s.shard_shape(tuple(a.shape))) * a.dtype.itemsize
    return total


def state_figures(target: MeasureTarget, compiled: Any, args: Sequence[Any], host_argument_size: int | None,
                  link: HostLink) -> StateFigures | None:
    """The :class:`StateFigures` of a measured step whose target keeps state on host
    (``MeasureTarget.state``), else ``None``. ``host_argument_size``: the compiler's own figure
    (``memory_analysis().host_argument_size_in_bytes``; 0 where it drops the placements)."""
    placement = target.state
    if placement is None or placement.is_default:
        return None
    declared = host_argument_bytes(compiled, args)
    host = host_argument_size or declared  # the compiler's own figure (padded) where it has one
    return StateFigures(placement.to_config(), dict(target.state_bytes or {}), host, 2 * host,
                        bool(declared) and not host_argument_size, link.name, link.bytes_per_s,
                        dict(target.host_state_bytes or {}))


def with_state(target: MeasureTarget, placement: StatePlacement | Any, roles: Sequence[str],
               argnum: int = 0, *, fetches: bool = True) -> MeasureTarget:
    """``target`` (a :class:`MeasureTarget` whose ``step_args[argnum]`` is the training state and
    whose step returns ``(state, *rest)``) with the state where ``placement`` (a
    :class:`StatePlacement`, a plan's ``state:`` mapping, or a ``Plan``) keeps it between steps:
    its host parts given to the step in ``pinned_host`` memory, brought to the device inside the
    step and returned to host, as ``remat_common.state.jit_state_step`` trains. ``roles``: per
    array of the state (the adapter's ``state_roles``). ``fetches``: the step brings the host parts
    to the device itself (``remat_common.state.fetch`` for the parameters, ``stream_update`` for
    the update), as the examples' steps do, so they are
    left on host until then; without it they are moved at the start of the step.
    The target's ``state`` and ``state_bytes`` are set (a report counts the host part apart).
    A concrete state's host part is budgeted before it is copied to host
    (``remat_common.internal.check_host_memory``: ``HostMemoryError`` over the budget)."""
    placement = as_placement(placement, "remat_common.measurement.with_state")
    state = target.step_args[argnum]
    leaves, treedef = jax.tree.flatten(state)
    roles = check_roles(roles, len(leaves))
    nbytes = state_bytes(state, roles)
    if placement.is_default:
        return dataclasses.replace(target, state=placement, state_bytes=nbytes)
    roles = host_roles(state, roles, placement)
    host = state_bytes(state, roles)
    if not all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):  # allocated here: budgeted
        part = sum(host[k] for k in placement.on_host)
        check_host_memory(2 * part, f"the state on host ({placement.describe()}), "
                          f"{fmt_bytes(part)}, and the measured step's copy of it (its arguments "
                          "and results)", "a smaller model, less of the state on host, or an "
                          "abstract target (compiled from shapes, nothing allocated)")
    placed = jax.tree.unflatten(treedef, [_on_host(x) if r in placement.on_host else x
                                          for x, r in zip(leaves, roles)])
    step_fn = target.step_fn
    # the training step's wrapper (remat_common.state.on_device, which jit_state_step compiles),
    # with memory spaces for shardings: the measurement lays the step out for its machine
    body = on_device(lambda st, *others: step_fn(*others[:argnum], st, *others[argnum:]), None,
                     roles, placement, returns_state=True, fetches=fetches)

    def step(*args: Any) -> Any:
        return body(args[argnum], *args[:argnum], *args[argnum + 1:])

    step.__name__ = getattr(step_fn, "__name__", "step")
    step_args = (*target.step_args[:argnum], placed, *target.step_args[argnum + 1:])
    return dataclasses.replace(target, step_fn=step, step_args=step_args, state=placement,
                               state_bytes=nbytes,
                               host_state_bytes={k: host[k] for k in placement.on_host})


def _on_host(x: Any) -> Any:
    """``x`` (an array or a ``jax.ShapeDtypeStruct``) in ``pinned_host`` memory of its device."""
    if isinstance(x, jax.ShapeDtypeStruct):
        s = memory_typed(x.sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s.with_memory_kind("pinned_host"))
    s = memory_typed(getattr(x, "sharding", None)
                     or jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    return jax.device_put(x, s.with_memory_kind("pinned_host"))
