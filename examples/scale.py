"""Sharded and multi-process training for the GPT examples: the mesh, shardings, batches, processes.

Nothing here depends on Flax or Equinox. Each example's ``model.py`` names the axes of its
parameters with *logical* names (``embed``, ``heads``, ``mlp``, ``vocab``; ``None`` for a
replicated axis) through its framework's own tools (``nnx.with_partitioning`` for NNX, a table of
key paths for Equinox); :func:`logical_rules` maps them onto the axes of the mesh given with
``--mesh data=2,fsdp=2,tensor=2`` (any subset, in any order):

==========  =====================  =========================================================
logical     mesh axes              what is split
==========  =====================  =========================================================
``batch``   ``data``, ``fsdp``     the sequences of a batch (data parallel; FSDP is data
                                   parallel too, over the same devices that share the weights)
``embed``   ``fsdp``               the model width of every weight matrix (ZeRO-3 style)
``heads``   ``tensor``             attention projections (Megatron-style tensor parallel)
``mlp``     ``tensor``             the MLP's hidden width
``vocab``   ``tensor``             the embedding and output rows
==========  =====================  =========================================================

An axis the mesh does not have is replicated. See ``docs/scale.md``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import remat_common
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

#: The mesh axes the examples know, in the order the mesh is laid out (outermost first).
MESH_AXES = ("data", "fsdp", "tensor")

#: Logical axis name -> the mesh axes it is split over (those the mesh has).
LOGICAL_TO_MESH: Mapping[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "mlp": ("tensor",),
    "vocab": ("tensor",),
}


class ScaleError(ValueError):
    """A mesh, a batch or a process setting that cannot work, with the fix in its message."""


MSG_MESH_SYNTAX = """\
--mesh {text!r}: {problem}. Write AXIS=SIZE pairs separated by commas, each axis one of
{axes} at most once, sizes positive integers whose product is the device count: for example
--mesh data=2,fsdp=2,tensor=2 on 8 devices, or --mesh data={n} on this machine's {n}."""

MSG_MESH_DEVICES = """\
--mesh {text!r} needs {want} devices (the product of the sizes) but JAX sees {have}
({kind}, {procs} process(es)). Fix: choose sizes whose product is {have}; on CPU, start Python with
XLA_FLAGS=--xla_force_host_platform_device_count={want} to get {want} CPU devices."""

MSG_DIVISIBLE = """\
{what} {name} has shape {shape}; its axis {axis} (size {size}) is split over mesh axes {mesh_axes}
({parts} parts), which does not divide it. Fix: choose a model size divisible by {parts}
(--d-model, --n-heads, --d-ff, --batch), or smaller mesh axes."""

MSG_PROCESS_ARGS = """\
--num-processes {n} and --process-id {i}: {problem}. Fix: start N processes with the same
--coordinator HOST:PORT and --num-processes N, and --process-id 0 ... N-1, one each; or
--coordinator auto on a cluster that jax.distributed.initialize() detects (SLURM, Open MPI,
Kubernetes, Cloud TPU)."""


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=2,tensor=2"`` -> ``{"data": 2, "tensor": 2}``, checked against :data:`MESH_AXES`.

    >>> parse_mesh("fsdp=2, data=4")
    {'data': 4, 'fsdp': 2}
    """
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, size = part.partition("=")
        name = name.strip()
        problem = None
        if not eq or not name:
            problem = f"{part!r} is not AXIS=SIZE"
        elif name not in MESH_AXES:
            problem = f"unknown axis {name!r}"
        elif name in sizes:
            problem = f"axis {name!r} given twice"
        elif not size.strip().isdigit() or int(size) < 1:
            problem = f"size {size.strip()!r} of {name!r} is not a positive integer"
        if problem:
            raise ScaleError(MSG_MESH_SYNTAX.format(text=text, problem=problem, axes=list(MESH_AXES),
                                                    n=jax.device_count()))
        sizes[name] = int(size)
    return {a: sizes[a] for a in MESH_AXES if a in sizes}


def make_mesh(text: str | None) -> Mesh | None:
    """The device mesh that ``--mesh`` describes (``None``: no mesh, one device as before).

    Its axes are ``Auto`` (the compiler propagates shardings from the inputs, as in the GSPMD
    guides), laid out over every device of every process (``jax.devices()``), so in a multi-process
    run each process holds the shards of its own devices.
    """
    if text is None or not text.strip() or text.strip().lower() == "none":
        return None
    sizes = parse_mesh(text)
    want, have = math.prod(sizes.values()), jax.device_count()
    if want != have:
        raise ScaleError(MSG_MESH_DEVICES.format(text=text, want=want, have=have,
                                                 kind=jax.devices()[0].platform,
                                                 procs=jax.process_count()))
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))


def logical_rules(mesh: Mesh | AbstractMesh) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """``(logical, mesh axes)`` pairs for ``mesh``: :data:`LOGICAL_TO_MESH` without the axes the
    mesh lacks (``None``: replicated). The form Flax's ``nnx.logical_axis_rules`` takes."""
    rules: list[tuple[str, str | tuple[str, ...] | None]] = []
    for logical, axes in LOGICAL_TO_MESH.items():
        present = tuple(a for a in axes if a in mesh.axis_names)
        rules.append((logical, present if len(present) > 1 else (present[0] if present else None)))
    return tuple(rules)


def logical_spec(logical: tuple[str | None, ...], mesh: Mesh | AbstractMesh) -> PartitionSpec:
    """A ``PartitionSpec`` on ``mesh`` for an array whose axes have the logical names ``logical``.

    >>> mesh = jax.make_mesh((1,), ("tensor",), axis_types=(AxisType.Auto,))
    >>> tuple(logical_spec(("embed", "mlp"), mesh))
    (None, 'tensor')
    """
    rules = dict(logical_rules(mesh))
    return PartitionSpec(*(rules.get(name) if name is not None else None for name in logical))


def check_divisible(name: str, shape: tuple[int, ...], sharding: NamedSharding, *,
                    what: str = "parameter") -> None:
    """A clear error when ``sharding`` splits an axis of ``shape`` into unequal parts."""
    mesh_shape = dict(sharding.mesh.shape)
    for axis, entry in enumerate(tuple(sharding.spec)):
        if entry is None:
            continue
        axes = (entry,) if isinstance(entry, str) else tuple(entry)
        parts = math.prod(mesh_shape[a] for a in axes)
        if axis < len(shape) and shape[axis] % parts:
            raise ScaleError(MSG_DIVISIBLE.format(what=what, name=name, shape=shape, axis=axis,
                                                  size=shape[axis], mesh_axes=list(axes), parts=parts))


def place(tree: Any, shardings: Any) -> Any:
    """Every array of ``tree`` on the devices of its sharding in ``shardings`` (the same structure).

    Each process gives the shards of its own devices from its copy of the value (every process
    built the same initial state from the same seed), so this works across processes too.
    """
    def put(path: Any, x: Any, sharding: NamedSharding) -> jax.Array:
        value = np.asarray(x)
        check_divisible(jax.tree_util.keystr(path), value.shape, sharding)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree_util.tree_map_with_path(put, tree, shardings)


def batch_sharding(mesh: Mesh | AbstractMesh) -> NamedSharding:
    """Token batches ``(batch, seq_len + 1)``: rows split over the ``batch`` axes (data, fsdp)."""
    return NamedSharding(mesh, logical_spec(("batch", None), mesh))


def replicated(mesh: Mesh | AbstractMesh) -> NamedSharding:
    """A value every device holds whole (the loss, a PRNG key, a sampling window)."""
    return NamedSharding(mesh, PartitionSpec())


def process_rows(sharding: NamedSharding, global_shape: tuple[int, ...]) -> slice:
    """The rows of a global batch whose shards live on this process's devices (a contiguous range
    on the meshes :func:`make_mesh` builds: ``jax.devices()`` lists each process's devices
    together)."""
    spans = {(rows.start or 0, global_shape[0] if rows.stop is None else rows.stop)
             for index in sharding.addressable_devices_indices_map(global_shape).values()
             for rows in [index[0] if index else slice(None)]}
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    covered = np.zeros(hi - lo, bool)
    for s, e in spans:
        covered[s - lo:e - lo] = True
    if not covered.all():
        raise ScaleError(f"process {jax.process_index()} holds rows {sorted(spans)} of the batch, "
                         "not one contiguous range. Fix: build the mesh with examples.scale.make_mesh.")
    return slice(lo, hi)


def global_batch(tokens: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """The global batch as one array sharded by ``sharding``, each process feeding only its rows.

    ``tokens`` is the global batch (the examples' batches are cheap and deterministic, so every
    process can cut its slice from it; a data loader would read only :func:`process_rows`).
    """
    check_divisible("the token batch", tokens.shape, sharding, what="batch")
    rows = process_rows(sharding, tokens.shape)
    return jax.make_array_from_process_local_data(sharding, tokens[rows], tokens.shape)


def init_distributed(coordinator: str | None, num_processes: int | None,
                     process_id: int | None) -> bool:
    """Joins a multi-process run (``jax.distributed.initialize``) when asked; returns whether it did.

    ``coordinator="auto"`` lets JAX read the cluster's environment (SLURM, Open MPI, Kubernetes,
    Cloud TPU; and ``JAX_COORDINATOR_ADDRESS``); otherwise all three are given. On CPU, the
    cross-process collectives are gloo's (``jax_cpu_collectives_implementation``), unless already
    chosen. Call it before anything touches a JAX device.
    """
    if coordinator is None and num_processes is None and process_id is None:
        return False
    problem = None
    if coordinator is None:
        problem = "no --coordinator HOST:PORT (or auto)"
    elif coordinator != "auto" and (num_processes is None or process_id is None):
        problem = "both are needed with --coordinator HOST:PORT"
    elif num_processes is not None and (num_processes < 1 or (
            process_id is not None and not 0 <= process_id < num_processes)):
        problem = "the id must be in 0 ... N-1"
    if problem:
        raise ScaleError(MSG_PROCESS_ARGS.format(n=num_processes, i=process_id, problem=problem))
    if jax.distributed.is_initialized():  # a second run in the same processes (tests, notebooks)
        if num_processes is not None and jax.process_count() != num_processes:
            raise ScaleError(MSG_PROCESS_ARGS.format(
                n=num_processes, i=process_id,
                problem=f"this Python process already joined a run of {jax.process_count()}"))
        return True
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=None if coordinator == "auto" else coordinator,
        num_processes=num_processes, process_id=process_id,
        initialization_timeout=int(os.environ.get("REMAT_EXAMPLES_INIT_TIMEOUT", "300")),
    )
    return True


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a training run's arrays live: one device (``mesh=None``, the examples' default), or
    a mesh, with ``state`` the shardings of the training state (an example's ``shardings``); and,
    between steps, in device or host memory (``placement``, the plan's ``state:`` entry).

    Attributes:
      mesh: the device mesh, or ``None``.
      state: ``Sharding``s in the structure of the training state (``None`` without a mesh, unless
        part of the state lives on host: then one device's, :func:`host_layout`).
      placement: where parameters and optimizer state live between steps.
      roles: per array of the state, ``"params"``, ``"optimizer"`` or ``"other"`` (the adapter's
        ``state_roles``); needed when ``placement`` keeps something on host.
    """

    mesh: Mesh | None = None
    state: Any = None
    placement: remat_common.StatePlacement = remat_common.StatePlacement()
    roles: tuple[str, ...] = ()

    @property
    def on_host(self) -> bool:
        """Whether part of the state lives in host memory between steps."""
        return not self.placement.is_default

    def put(self, state: Any) -> Any:
        """The training state on the mesh (as it is without one), the host parts in host memory."""
        if self.mesh is not None:
            state = place(state, self.state)
        if self.on_host:
            state = remat_common.state.place_state(state, self.state, self.roles, self.placement)
        return state

    def batch(self, tokens: np.ndarray) -> Any:
        """A global token batch, sharded over the batch axes; each process feeds its rows."""
        return tokens if self.mesh is None else global_batch(tokens, batch_sharding(self.mesh))

    def jit_step(self, step: Callable[[Any, Any], tuple[Any, Any]]) -> Any:
        """``jax.jit(step)`` with the state donated (the updated state takes its buffers: one copy
        of parameters and optimizer state on the device, not two; what ``remat report`` compiles);
        on a mesh with the state's and the batch's shardings in and out (the updated state keeps
        its layout, the loss is replicated)."""
        if self.on_host:  # the host parts come in and go out in host memory, used on device
            return remat_common.state.jit_state_step(
                step, self.state, self.roles, self.placement,
                batch=None if self.mesh is None else batch_sharding(self.mesh),
                result=None if self.mesh is None else replicated(self.mesh),
                fetches=True)  # the examples' steps bring the host parts themselves
        if self.mesh is None:
            return jax.jit(step, donate_argnums=0)
        return jax.jit(step, in_shardings=(self.state, batch_sharding(self.mesh)),
                       out_shardings=(self.state, replicated(self.mesh)), donate_argnums=0)

    def _read(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
        """``fn(state, ...)`` reading the host parts on device, and the state's shardings in."""
        if not self.on_host:
            return fn, self.state
        stored, compute = remat_common.state.state_shardings(self.state, self.roles, self.placement)
        return remat_common.state.on_device(fn, compute, self.roles, self.placement,
                                            returns_state=False), stored

    def jit_eval(self, fn: Callable[..., Any]) -> Any:
        """``jax.jit(fn)`` for ``fn(state, tokens)``; on a mesh with the state's and the batch's
        shardings in and a replicated result."""
        fn, state = self._read(fn)
        if self.mesh is None:
            return jax.jit(fn) if state is None else jax.jit(fn, in_shardings=(state, None))
        return jax.jit(fn, in_shardings=(state, batch_sharding(self.mesh)),
                       out_shardings=replicated(self.mesh))

    def jit_sample(self, fn: Callable[..., Any]) -> Any:
        """``jax.jit(fn)`` for ``fn(state, *small)``: the small arguments (a window of tokens, a
        position, a PRNG key, a temperature) and the result replicated on a mesh."""
        fn, state = self._read(fn)
        if self.mesh is None:
            return jax.jit(fn) if state is None else jax.jit(
                fn, in_shardings=(state, None, None, None, None))
        rep = replicated(self.mesh)
        return jax.jit(fn, in_shardings=(state, rep, rep, rep, rep), out_shardings=rep)


def host_layout(layout: Layout, state: Any, placement: remat_common.StatePlacement,
                roles: tuple[str, ...]) -> Layout:
    """``layout`` keeping the state where ``placement`` says between steps (the plan's
    ``state:``); without a mesh, on the first device (``remat_common.state.default_shardings``)."""
    if placement.is_default:
        return layout
    shardings = layout.state if layout.mesh is not None else \
        remat_common.state.default_shardings(state)
    return dataclasses.replace(layout, state=shardings, placement=placement, roles=tuple(roles))
