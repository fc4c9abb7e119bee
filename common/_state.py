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
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import jax
import numpy as np

from ._errors import PlanError, short, sorted_list, type_error
from ._pattern import compiled, compiled_or_error, is_index, parse_pattern

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

_MSG_PART = """\
{loc}state.{key}: {problem}
A part of a kind goes to host as a fraction of the layer stack's layers (whole layers: the last
ceil(f * L) of L) or as module path patterns, for example

    state: {{optimizer: {{host: 0.5}}}}          # 0 is device, 1 is host
    state: {{params: {{host: "blocks.*"}}}}      # or a list of patterns

Fix: {fix}"""

#: What one kind of a :class:`StatePlacement` holds: ``"device"``, ``"host"``, a fraction of the
#: layer stack in (0, 1), or module path patterns.
Place = str | float | tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StatePlacement:
    """Where the training state lives between steps (a plan's ``state:`` entry).

    Attributes:
      optimizer: where the optimizer state (AdamW's moments) lives: ``"device"`` (default),
        ``"host"``, a part on host: a fraction in (0, 1) of the layer stack's layers (the last
        ``ceil(f * L)`` of ``L``, whole layers: :func:`host_roles`), or a tuple of module path
        patterns (the arrays under the modules they match).
      params: the same for the model's parameters.
      source: where it was read (a plan file), for errors; not compared.

    >>> StatePlacement(optimizer="host").describe()
    'optimizer state on host (pinned_host), parameters on device'
    >>> StatePlacement.coerce({"params": {"host": 0.5}}).describe()
    'optimizer state on device, parameters: the last 50% of the layers on host (pinned_host)'
    """

    optimizer: Place = "device"
    params: Place = "device"
    source: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for key in STATE_KEYS:
            object.__setattr__(self, key, _check_place(key, getattr(self, key), self.source))

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
        return cls(**{k: value[k] for k in STATE_KEYS if k in value}, source=source)

    @property
    def on_host(self) -> tuple[str, ...]:
        """The kinds kept on host, whole or in part, in :data:`STATE_KEYS` order (``()``:
        everything on device)."""
        return tuple(k for k in STATE_KEYS if getattr(self, k) != "device")

    @property
    def partial(self) -> tuple[str, ...]:
        """The kinds of which only a part is on host (a fraction or patterns)."""
        return tuple(k for k in STATE_KEYS if getattr(self, k) not in STATE_PLACES)

    @property
    def is_default(self) -> bool:
        return not self.on_host

    def memory_kind(self, role: str) -> str:
        """The memory kind an array of ``role`` (``optimizer``, ``params``, ``other``) lives in
        (for a kind in :attr:`partial`, an array :func:`host_roles` keeps in its role)."""
        return MEMORY_KINDS["device" if getattr(self, role, "device") == "device" else "host"]

    def to_config(self) -> dict[str, Any]:
        def one(place: Place) -> Any:
            if isinstance(place, tuple):
                return {"host": place[0] if len(place) == 1 else list(place)}
            return place if isinstance(place, str) else {"host": place}
        return {k: one(getattr(self, k)) for k in STATE_KEYS}

    def describe(self) -> str:
        def one(key: str, what: str) -> str:
            place = getattr(self, key)
            if isinstance(place, float):
                return f"{what}: the last {100 * place:.4g}% of the layers on host (pinned_host)"
            if isinstance(place, tuple):
                return f"{what} under {', '.join(place)} on host (pinned_host)"
            return f"{what} on {place}" + (" (pinned_host)" if place == "host" else "")
        return f"{one('optimizer', 'optimizer state')}, {one('params', 'parameters')}"


def _check_place(key: str, value: Any, source: str | None) -> Place:
    """``value`` as a :data:`Place` (``{host: 0}`` is ``device``, ``{host: 1}`` is ``host``)."""
    if isinstance(value, float | tuple):  # a part already read (StatePlacement(params=0.5))
        value = {"host": value}
    if isinstance(value, Mapping):
        return _check_part(key, value, source)
    if isinstance(value, str) and value in STATE_PLACES:
        return value
    loc = f"{source}: " if source else ""
    hint = ""
    if isinstance(value, bool):
        hint = " (YAML reads unquoted yes/no/on/off/true/false as booleans)"
    elif isinstance(value, str) and value in ("pinned_host", "unpinned_host", "cpu"):
        hint = " (a memory kind; the plan says host, which is pinned_host)"
    raise PlanError(_MSG_STATE.format(
        loc=loc, problem=f"state.{key}: {short(value)} is not a place{hint}. Allowed: "
                         f"{sorted_list(STATE_PLACES)}.",
        fix=f"write state: {{{key}: host}}, {{{key}: device}} or a part, "
            f"{{{key}: {{host: 0.5}}}}."))


def _check_part(key: str, value: Mapping[Any, Any], source: str | None) -> Place:
    loc = f"{source}: " if source else ""
    if set(value) != {"host"}:
        raise PlanError(_MSG_PART.format(
            loc=loc, key=key, problem=f"{short(dict(value))} has key(s) {sorted_list(value)}; "
                                      "a part has one key, 'host'.",
            fix=f"write {{{key}: {{host: 0.5}}}} or {{{key}: {{host: 'blocks.*'}}}}."))
    part = value["host"]
    if isinstance(part, int | float) and not isinstance(part, bool):
        if not 0 <= part <= 1:  # also NaN
            raise PlanError(_MSG_PART.format(
                loc=loc, key=key, problem=f"host: {short(part)} is not a fraction in [0, 1].",
                fix=f"write a fraction of the layers between 0 and 1, {{{key}: {{host: 0.5}}}}."))
        return "device" if part == 0 else "host" if part == 1 else float(part)
    patterns = [part] if isinstance(part, str) else part if isinstance(part, list | tuple) else None
    if isinstance(part, str) and _number(part):
        raise PlanError(_MSG_PART.format(
            loc=loc, key=key, problem=f"host: {part!r} is a string, not a fraction.",
            fix=f"write the number unquoted, {{{key}: {{host: {part}}}}}."))
    if not patterns or not all(isinstance(p, str) for p in patterns):
        why = " (YAML reads unquoted yes/no/on/off/true/false as booleans)" if isinstance(
            part, bool) else ""
        raise PlanError(_MSG_PART.format(
            loc=loc, key=key, problem=f"host: {short(part)} ({type(part).__name__}) is neither a "
                                      f"fraction nor module path patterns{why}.",
            fix=f"write {{{key}: {{host: 0.5}}}} (a number) or {{{key}: {{host: 'blocks.*'}}}}."))
    for p in patterns:
        parse_pattern(p, f"{loc}state.{key}.host")
    return tuple(patterns)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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


def host_roles(tree: Any, roles: Sequence[str],
               placement: StatePlacement | Mapping[str, Any]) -> tuple[str, ...]:
    """``roles`` (one per array of ``tree``, a training state or its shardings) with the arrays
    that a part of a kind (:attr:`StatePlacement.partial`) leaves on device made ``"other"``: what
    the functions here place, once resolved. A part is whole arrays:

    - a fraction ``f`` of the layer stack: the last ``ceil(f * L)`` of its ``L`` layers. The stack
      is the name with the most numbered children (``blocks.0``, ``blocks.1``, ...) among the
      parameters' paths; each kind's arrays under one of those layers are taken (AdamW's moments
      ``mu.blocks.3...`` beside ``blocks.3...``), the rest (embeddings, head, counters) stays.
      The last layers, because the forward pass needs the first ones first: the step starts on the
      layers already on device.
    - patterns: the arrays under a module they match, anywhere in the array's path.

    >>> state = {"blocks": [{"w": np.zeros(2)} for _ in range(4)], "head": np.zeros(2)}
    >>> host_roles(state, ["params"] * 5, {"params": {"host": 0.5}})
    ('other', 'other', 'params', 'params', 'other')
    """
    placement = as_placement(placement, "remat_common.state.host_roles")
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_sharding)[0]
    roles = check_roles(roles, len(flat))
    if not placement.partial:
        return roles
    paths = [jax.tree_util.keystr(p, simple=True, separator=".").split(".") for p, _ in flat]
    out = list(roles)
    for kind in placement.partial:
        part, mine = getattr(placement, kind), [i for i, r in enumerate(roles) if r == kind]
        model = [paths[i] for i, r in enumerate(roles) if r == "params"] or [paths[i] for i in mine]
        if isinstance(part, float):
            name, layers = _stack(model, kind, part, placement.source)
            on = {str(i) for i in sorted(layers)[len(layers) - math.ceil(part * len(layers)):]}
            taken = {i for i in mine if any(a == name and b in on
                                            for a, b in zip(paths[i], paths[i][1:]))}
        else:
            taken = set()
            for pattern in part:
                hits = {i for i in mine if pattern == "." or compiled(f"**.{pattern}.**").matches(
                    ".".join(paths[i]))}
                if not hits:
                    raise PlanError(_MSG_PART.format(
                        loc=f"{placement.source}: " if placement.source else "", key=kind,
                        problem=f"host: {pattern!r} matches no array of the {kind} state "
                                f"(the model's modules: {sorted_list(set(map(_module, model)))}).",
                        fix="name a module of the model, as the plan's rules do (blocks.*, "
                            "blocks.[0-3].mlp), or a fraction of the layers."))
                taken |= hits
        for i in set(mine) - taken:
            out[i] = OTHER
    return tuple(out)


def _module(segs: Sequence[str]) -> str:
    """An array's path up to its first numbered module (``0.blocks.3``), or its first two names."""
    for i, seg in enumerate(segs[1:], 1):
        if is_index(seg) and not is_index(segs[i - 1]):
            return ".".join(segs[:i + 1])
    return ".".join(segs[:2])


def _stack(paths: Sequence[Sequence[str]], kind: str, part: float,
           source: str | None) -> tuple[str, set[int]]:
    """The name with the most numbered children in ``paths``, and their numbers."""
    found: dict[str, set[int]] = {}
    for segs in paths:
        for a, b in zip(segs, segs[1:]):
            if not is_index(a) and is_index(b):
                found.setdefault(a, set()).add(int(b))
    name = max(found, key=lambda k: len(found[k]), default=None)
    if name is None or len(found[name]) < 2:
        raise PlanError(_MSG_PART.format(
            loc=f"{source}: " if source else "", key=kind,
            problem=f"host: {part} is a fraction of the layers, but the state has no stack of "
                    f"numbered layers (blocks.0, blocks.1, ...) to take it from. A scanned stack "
                    f"holds its layers in one array each, which lives in one memory: it cannot be "
                    f"split between host and device.",
            fix=f"build the model with one module per layer (a list), or name modules with "
                f"patterns, {{{kind}: {{host: 'blocks.*'}}}}, or put the whole kind on host."))
    return name, found[name]


def state_shardings(shardings: Any, roles: Sequence[str],
                    placement: StatePlacement | Mapping[str, str]) -> tuple[Any, Any]:
    """``(stored, compute)``: ``shardings`` (one ``jax.sharding.Sharding`` per array of the
    training state, in any pytree) with each array's memory kind between steps (``stored``:
    ``pinned_host`` for the parts ``placement`` keeps on host) and during the step (``compute``:
    ``device``). Same layout over the mesh either way; only the memory differs."""
    placement = as_placement(placement, "remat_common.state.state_shardings")
    leaves, treedef = jax.tree.flatten(shardings, is_leaf=_is_sharding)
    roles = host_roles(shardings, roles, placement)
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
    run through it. ``roles``: as the adapter gives them, resolved here from ``compute``'s paths
    (:func:`host_roles`); with ``compute=None``, already resolved."""
    placement = as_placement(placement, "remat_common.state.on_device")
    roles = roles if compute is None else host_roles(compute, roles, placement)
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


def fetch(tree: Any, *, after: Any = None, stream: str | Sequence[str] = ()) -> Any:
    """``tree``'s arrays in device memory, for use in a training step that keeps them on host
    between steps: those in host memory are moved inside the compiled program (the others are
    left as they are), not before ``after`` (the gradients, say) has been computed.

    ``stream``: module path patterns (``"blocks"``) of the model's scanned stacks, whose arrays
    are left in host memory: the layer scan (``flax_remat_plugin.scan_layers``,
    ``equinox_remat_plugin.Stacked``) brings them to the device a layer at a time, the next
    layer's while this one computes, in the forward and the backward pass, and writes each
    layer's gradient back to host (``remat_common.adapter.scan_groups``).

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
    kept = [compiled_or_error(f"**.{p}.**", "remat_common.state.fetch: stream")
            for p in ([stream] if isinstance(stream, str) else stream)]

    def one(path: Any, x: Any) -> Any:
        if any(k.matches(jax.tree_util.keystr(path, simple=True, separator=".")) for k in kept):
            return x
        return jax.device_put(x, jax.memory.Space.Device)
    return jax.tree_util.tree_map_with_path(one, tree)


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

