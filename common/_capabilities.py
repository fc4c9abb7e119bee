"""What the installed JAX really ships and what is active now."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import sys
from typing import Any

import jax
from packaging.version import Version

from ._jaxcompat import (
    has_custom_remat,
    has_policy_classes,
    parse_version,
    remat3_on,
)


def distribution_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (its metadata), or None if not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable_policies_module() -> bool:
    """``import jax.checkpoint_policies`` works (on 0.11.x it is a namespace attribute only)."""
    try:
        importlib.import_module("jax.checkpoint_policies")
    except ImportError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """A frozen record of what is installed and active; see :func:`capabilities`."""

    python: str
    jax: str
    jaxlib: str | None
    numpy: str | None
    scipy: str | None
    backend: str
    device_kind: str
    device_count: int
    memory_kinds: tuple[str, ...]
    remat3: bool
    custom_remat: bool
    policy_classes: bool
    inline: bool
    checkpoint_policies_importable: bool

    @property
    def jax_version(self) -> Version:
        """The exact installed JAX version (``packaging.version.Version``)."""
        return parse_version(self.jax)

    @property
    def custom_remat_usable(self) -> bool:
        """``jax.custom_remat`` exists and its forward rule really runs (it needs remat3 on)."""
        return self.custom_remat and self.remat3

    @property
    def custom_path(self) -> str:
        """How rule sets run now: ``custom_remat`` where its forward rule really runs (0.11.x
        with remat3 on), else the portable ``custom_vjp`` path (remat3 off, 0.12)."""
        return "custom_remat" if self.custom_remat_usable else "custom_vjp"

    @property
    def host_offload_placed(self) -> bool:
        """Whether the active backend really places offloaded values on host (not CPU)."""
        return self.backend in ("gpu", "cuda", "rocm", "tpu") and "pinned_host" in self.memory_kinds

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["memory_kinds"] = list(self.memory_kinds)
        d["custom_remat_usable"] = self.custom_remat_usable
        d["custom_path"] = self.custom_path
        d["host_offload_placed"] = self.host_offload_placed
        return d


def capabilities() -> Capabilities:
    """Probes the installed JAX now. Never cached: ``jax_remat3`` is read at every call.

    Returns:
      A :class:`Capabilities` record: versions, backend and memory kinds, the ``jax_remat3``
      value, and whether ``jax.custom_remat``, the 0.11 policy classes, ``jax.Inline``, an
      importable ``jax.checkpoint_policies`` module and JAX's residual introspection exist.

    >>> caps = capabilities()
    >>> caps.remat3 in (True, False)
    True
    """
    dev = jax.devices()[0]
    try:
        kinds = tuple(sorted({m.kind for m in dev.addressable_memories()}))
    except Exception:  # noqa: BLE001 - some PJRT plugins do not implement memories
        kinds = ()
    return Capabilities(
        python=".".join(map(str, sys.version_info[:3])),
        jax=jax.__version__,
        jaxlib=distribution_version("jaxlib"),
        numpy=distribution_version("numpy"),
        scipy=distribution_version("scipy"),
        backend=jax.default_backend(),
        device_kind=dev.device_kind,
        device_count=jax.device_count(),
        memory_kinds=kinds,
        remat3=remat3_on(),
        custom_remat=has_custom_remat(),
        policy_classes=has_policy_classes(),
        inline=hasattr(jax, "Inline"),
        checkpoint_policies_importable=_importable_policies_module(),
    )
