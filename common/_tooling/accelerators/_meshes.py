"""Meshes: the ``--mesh`` axes (``data``, ``fsdp``) parsed against a device count
(:func:`parse_mesh`), the mesh over a target's devices, and the abstract arguments laid out on
it (:func:`abstract_args`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..._errors import RematError, short, sorted_list
from ._accelerators import Accelerator, topology


_MSG_MESH = """\
--mesh {text}: {why}.
Give AXIS=N,... with the axes data (batch split, parameters replicated) and fsdp (batch split,
parameters split along their largest dimension), whose sizes multiply to the accelerator's {n}
devices, e.g. --mesh data={n} or --mesh fsdp={n} or --mesh data=2,fsdp={half}."""

MESH_AXES = ("data", "fsdp")


def parse_mesh(text: str | Mapping[str, int] | None, n: int) -> dict[str, int]:
    """``{axis: size}`` from ``data=2,fsdp=4`` (default: ``{"data": n}``), checked against ``n``.

    >>> parse_mesh("fsdp=8", 8), parse_mesh(None, 4)
    ({'fsdp': 8}, {'data': 4})
    """
    if text is None:
        return {"data": n}
    err = lambda why: RematError(_MSG_MESH.format(text=short(text), why=why, n=n,  # noqa: E731
                                                  half=max(1, n // 2)))
    if isinstance(text, str) and not text.strip():  # was read as not given: data over all
        raise err("an empty mesh names no axis (leave --mesh out for data parallel over all "
                  "the devices)")
    items: list[tuple[str, Any]]
    if isinstance(text, Mapping):
        items = [(str(k), v) for k, v in text.items()]
    elif isinstance(text, str):
        items = []
        for part in text.split(","):
            axis, sep, size = part.strip().partition("=")
            if not sep:
                raise err(f"{part.strip()!r} is not AXIS=N")
            items.append((axis.strip(), size.strip()))
    else:
        raise err(f"a {type(text).__name__} is not a mesh")
    out: dict[str, int] = {}
    for axis, size in items:
        v: int
        if axis not in MESH_AXES:
            raise err(f"unknown axis {axis!r} (axes: {sorted_list(MESH_AXES)})")
        if axis in out:
            raise err(f"axis {axis!r} given twice")
        if isinstance(size, str):
            try:
                v = int(size)
            except ValueError:
                raise err(f"size {short(size)} of {axis!r} is not an integer") from None
        elif isinstance(size, int) and not isinstance(size, bool):
            v = size
        else:  # int(4.5) was 4: a float, a bool or anything else is refused, never truncated
            raise err(f"size {short(size)} of {axis!r} is a {type(size).__name__}, not an integer")
        if v < 1:
            raise err(f"size {short(size)} of {axis!r} must be a positive integer")
        out[axis] = v
    if math.prod(out.values()) != n:
        raise err(f"the sizes multiply to {math.prod(out.values())}, not {n}")
    return out


def target_mesh(acc: Accelerator, axes: Mapping[str, int]) -> jax.sharding.Mesh:
    """A mesh of ``acc``'s compile-only devices with ``axes`` (``{name: size}``)."""
    from jax.experimental import topologies

    topo = topology(acc)
    if acc.platform == "tpu" and len({d.core_on_chip for d in topo.devices}) > 1:
        # a device per TensorCore (v4): jax's mesh maker wants one per chip ("megacore"), so the
        # devices in topology order, each chip's cores side by side
        return jax.sharding.Mesh(np.array(topo.devices).reshape(tuple(axes.values())),
                                 tuple(axes))
    return topologies.make_mesh(topo, tuple(axes.values()), tuple(axes))


def _spec_for(shape: tuple[int, ...], batch: bool, mesh: jax.sharding.Mesh) -> Any:
    from jax.sharding import PartitionSpec as P

    sizes = dict(mesh.shape)
    if batch:
        axes = tuple(a for a in MESH_AXES if a in sizes)
        n = math.prod(sizes[a] for a in axes)
        if not shape or shape[0] % n:
            raise RematError(
                f"the batch {tuple(shape)} does not split over the mesh's {n} devices "
                f"({', '.join(f'{a}={sizes[a]}' for a in axes)}): its leading dimension must be a "
                f"multiple of {n}. Fix: choose a batch that is (--size batch={n * max(1, (shape[0] if shape else 1) // n or 1)}), "
                "or lay the step out on fewer devices (--mesh).")
        return P(axes if len(axes) > 1 else axes[0])
    f = sizes.get("fsdp", 1)
    if f > 1 and shape:
        dims = sorted(range(len(shape)), key=lambda d: -shape[d])
        for d in dims:
            if shape[d] % f == 0:
                return P(*([None] * d + ["fsdp"]))
    return P()


def abstract_args(args: Sequence[Any], batch: Sequence[bool], mesh: jax.sharding.Mesh
                  ) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Each array (or ``ShapeDtypeStruct``) as a ``ShapeDtypeStruct`` sharded on ``mesh``: the
    ones flagged in ``batch`` split along their leading dimension over the mesh's axes, the others
    replicated (``data``) or split along their largest divisible dimension (``fsdp``). An input
    in host memory (a plan's state on host: ``pinned_host``) stays in that memory kind."""
    from jax.sharding import NamedSharding

    out = []
    for a, is_batch in zip(args, batch):
        shape = tuple(a.shape)
        kind = getattr(getattr(a, "sharding", None), "memory_kind", None)
        s = NamedSharding(mesh, _spec_for(shape, is_batch, mesh))
        if kind not in (None, "device"):
            s = s.with_memory_kind(kind)
        out.append(jax.ShapeDtypeStruct(shape, a.dtype, sharding=s))
    return tuple(out)
