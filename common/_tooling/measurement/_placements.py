"""Host placements of a step as XLA would partition it for a GPU: memory kind, sharding, bytes per shard.

On CPU the compiled program drops offload placements
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#host-offload); the
program exported for ``cuda`` keeps them as ``annotate_device_placement`` ops. On a mesh those ops
carry no sharding until Shardy propagates the inputs' shardings (as XLA does before partitioning):
this module runs that propagation in-process and reads, per placement, the sharding of the value
moved and of the value it was computed as, so an offload that keeps its ``NamedSharding`` (memory
kind changed, spec the same) can be told from one that gathers or reshards on its way to host.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax

from ..._jaxcompat import device_placements

_PLACEMENT = re.compile(r'annotate_device_placement.*?_xla_buffer_placement\s*=\s*"([^"]+)"')
_MESH = re.compile(r'sdy\.mesh\s+@(\w+)\s*=\s*<\[([^\]]*)\]')
_AXIS = re.compile(r'"(\w+)"\s*=\s*(\d+)')
_DIMS = re.compile(r'\[((?:\s*\{[^}]*\}\s*,?)*)\]')


@dataclasses.dataclass(frozen=True)
class Placement:
    """One ``annotate_device_placement`` of the exported step, after sharding propagation.

    Attributes:
      kind: the memory kind the value is placed in (``pinned_host``, ``device``, ...).
      shape: the global shape; ``dtype`` its element type as MLIR writes it (``f32``, ``bf16``).
      sharding: the placed value's sharding (Shardy's text, ``<@mesh, [{"data"}, {}]>``), ``None``
        when it has none (a single device, or propagation left it unsharded).
      operand_sharding: the sharding of the value it moves, as computed (through any reshard).
      axes: the mesh axes each dimension is split over; ``shard_shape`` the shape on one device.
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str
    sharding: str | None
    operand_sharding: str | None
    axes: tuple[tuple[str, ...], ...]
    shard_shape: tuple[int, ...]

    @property
    def to_host(self) -> bool:
        return self.kind != "device"

    @property
    def keeps_sharding(self) -> bool:
        """The value is placed with the sharding it was computed with (only its memory kind changes)."""
        return _dims(self.sharding) == _dims(self.operand_sharding)

    @property
    def itemsize(self) -> int:
        m = re.search(r"(\d+)$", self.dtype)
        return max(1, int(m.group(1)) // 8) if m else 4

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def shard_nbytes(self) -> int:
        """Bytes of this value on one device (what one device moves)."""
        return math.prod(self.shard_shape) * self.itemsize


def _dims(sharding: str | None) -> tuple[tuple[str, ...], ...] | None:
    """Per dimension, the axes of a Shardy sharding text; ``None`` for no sharding."""
    if sharding is None:
        return None
    m = _DIMS.search(sharding)
    if m is None:
        return None
    return tuple(tuple(re.findall(r'"(\w+)"', d)) for d in re.findall(r"\{([^}]*)\}", m.group(1)))


def placements_in_module(mlir_text: str) -> tuple[Placement, ...] | None:
    """Every placement of an exported StableHLO module, with shardings propagated (``None`` when
    this jaxlib cannot propagate; :func:`placement_counts` still counts them)."""
    got = device_placements(mlir_text)
    if got is None:
        return None
    text, found = got
    meshes = {name: {a: int(n) for a, n in _AXIS.findall(body)} for name, body in _MESH.findall(text)}
    out = []
    for f in found:
        axes = _dims(f["sharding"]) or tuple(() for _ in f["shape"])
        mesh_name = re.search(r"@(\w+)", f["sharding"] or "")
        sizes = meshes.get(mesh_name.group(1), {}) if mesh_name else {}
        shard = tuple(-(-n // math.prod(sizes.get(a, 1) for a in ax)) for n, ax in zip(f["shape"], axes))
        out.append(Placement(f["kind"], tuple(f["shape"]), f["dtype"], f["sharding"],
                             f["operand_sharding"], axes, shard))
    return tuple(out)


def placement_counts(mlir_text: str) -> dict[str, int]:
    """``{memory kind: number of annotate_device_placement ops}`` of a module's text."""
    counts: dict[str, int] = {}
    for kind in _PLACEMENT.findall(mlir_text):
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def export_placements(fn: Any, *args: Any, platform: str = "cuda") -> tuple[Placement, ...]:
    """The host placements of ``jax.jit(fn)(*args)`` exported for ``platform``, shardings propagated.

    ``args`` may be sharded (``NamedSharding`` on a mesh of any size): each placement then says
    whether the offloaded value keeps its sharding and how many bytes one device moves.

    >>> import jax, jax.numpy as jnp, remat_common as rc
    >>> f = rc.checkpoint(lambda x: jnp.sin(rc.checkpoint_name(jnp.cos(x), "h")), {"offload": ["h"]})
    >>> ps = export_placements(jax.grad(lambda x: f(x).sum()), jnp.ones(4))
    >>> [(p.kind, p.shape) for p in ps]
    [('pinned_host', (4,)), ('device', (4,))]

    Raises:
      RuntimeError: when this jaxlib cannot propagate shardings (no Shardy pipeline in its MLIR
        bindings); the export itself raises what ``jax.export`` raises.
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    text = jax.export.export(jitted, platforms=[platform])(*args).mlir_module()
    found = placements_in_module(text)
    if found is None:
        raise RuntimeError(
            "remat_common.measurement.export_placements: this jaxlib cannot run Shardy's propagation "
            "(its MLIR bindings have no sdy-propagation-pipeline), so shardings of the placements are "
            "unknown. Fix: use jax/jaxlib 0.11.x, or count placements with placement_counts.")
    return found
