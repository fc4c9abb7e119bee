"""Which compiler makes a figure: XLA:CPU in jaxlib, XLA:TPU in libtpu, XLA:GPU in the CUDA plugin.

The same plan compiled by two versions of one compiler can differ: on a TPU v5e chip, libtpu 0.0.48
(what ``jax[tpu]==0.11.2`` installs) and 0.0.42.1 (what the chip's host runs) gave one plan's temp as
4,613.6 and 3,714.3 MiB. Every figure therefore names its compiler (:func:`compiler_identity`), and
a stored figure read under another compiler says so (:func:`compiler_change`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import mmap
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

#: XLA's name of each platform's compiler.
_XLA = {"cpu": "XLA:CPU", "tpu": "XLA:TPU", "cuda": "XLA:GPU", "rocm": "XLA:GPU"}

#: The distributions that carry each GPU platform's compiler (the PJRT plugin first).
_GPU_DISTS = {"cuda": (("jax-cuda12-pjrt", "jax-cuda12-plugin"), ("jax-cuda13-pjrt", "jax-cuda13-plugin")),
              "rocm": (("jax-rocm7-pjrt", "jax-rocm7-plugin"), ("jax-rocm60-pjrt", "jax-rocm60-plugin"))}

_BUILT = re.compile(rb"Built on [A-Z][a-z]{2} [ 0-9]{2} [0-9]{4} [0-9:]{8}(?: \([0-9]+\))?")


@dataclasses.dataclass(frozen=True)
class Compiler:
    """The compiler of a figure: its platform, jax and jaxlib, and the plugin that holds it.

    Attributes:
      platform: ``cpu``, ``tpu``, ``cuda`` or ``rocm``.
      jax, jaxlib: their versions in the process that compiled.
      plugins: ``(distribution, version)`` of what holds the compiler besides jaxlib: ``libtpu``
        for a TPU, ``jax-cuda12-pjrt`` and ``jax-cuda12-plugin`` for a CUDA GPU; empty on CPU
        (XLA:CPU is part of jaxlib). A version is ``None`` where it could not be found.
      found: how the plugin's version was found (package metadata, the ``dist-info`` beside
        ``TPU_LIBRARY_PATH``, the library's build string), or why it was not.
      build: the library's own build string (``Built on Jun 17 2026 11:08:48 (1781719728)``)
        where no version was found, else ``None``.
    """

    platform: str
    jax: str
    jaxlib: str | None
    plugins: tuple[tuple[str, str | None], ...] = ()
    found: str = ""
    build: str | None = None

    @property
    def name(self) -> str:
        """XLA's name of the compiler (``XLA:TPU``)."""
        return _XLA.get(self.platform, f"XLA:{self.platform.upper()}")

    def _plugins(self) -> list[str]:
        out = []
        for dist, version in self.plugins:
            if version is not None:
                out.append(f"{dist} {version}")
            elif self.build is not None:
                out.append(f"{dist} ({self.build})")
            else:
                out.append(f"{dist} unknown ({self.found})")
        return out

    def describe(self) -> str:
        """``XLA:TPU, libtpu 0.0.48, jax 0.11.2 / jaxlib 0.11.2``."""
        return ", ".join([self.name, *self._plugins(), f"jax {self.jax} / jaxlib {self.jaxlib}"])

    @property
    def key(self) -> tuple[Any, ...]:
        """What tells two compilers apart (not how their versions were found)."""
        return (self.platform, self.jax, self.jaxlib, self.plugins, self.build)

    def to_json(self) -> dict[str, Any]:
        return {"platform": self.platform, "name": self.name, "jax": self.jax, "jaxlib": self.jaxlib,
                "plugins": {d: v for d, v in self.plugins}, "found": self.found,
                "build": self.build, "description": self.describe()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Compiler:
        plugins = data.get("plugins") or {}
        return cls(platform=str(data["platform"]), jax=str(data["jax"]),
                   jaxlib=None if data.get("jaxlib") is None else str(data["jaxlib"]),
                   plugins=tuple((str(d), None if v is None else str(v)) for d, v in plugins.items()),
                   found=str(data.get("found") or ""),
                   build=None if data.get("build") is None else str(data["build"]))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _build_string(path: str, size: int, mtime: float) -> str | None:
    """The ``Built on ...`` string compiled into the library at ``path`` (read, never loaded)."""
    del size, mtime  # the cache key: a replaced library is read again
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            hit = _BUILT.search(m)  # type: ignore[call-overload]
            return None if hit is None else bytes(hit.group(0)).decode("ascii")
    except (OSError, ValueError):
        return None


def _libtpu_dist_beside(library: Path) -> str | None:
    """The version of the ``libtpu`` distribution installed beside ``library`` (``.../libtpu/
    libtpu.so`` with ``.../libtpu-0.0.42.1.dist-info``), without importing anything."""
    for dist in importlib.metadata.distributions(path=[str(library.parent.parent)]):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        files = dist.files or ()
        if name in ("libtpu", "libtpu-nightly") and any(
                str(f).replace("\\", "/").endswith(f"{library.parent.name}/{library.name}")
                for f in files):
            return dist.version
    return None


def _tpu() -> tuple[tuple[tuple[str, str | None], ...], str, str | None]:
    """libtpu's version, the way JAX finds the library (``TPU_LIBRARY_PATH`` first, else the
    ``libtpu`` package), and how it was found; nothing is loaded or opened."""
    env = os.environ.get("TPU_LIBRARY_PATH")
    library: Path | None = None
    how = ""
    if env and os.path.isfile(env):
        library, how = Path(env), f"the library at TPU_LIBRARY_PATH={env}"
    else:
        spec = importlib.util.find_spec("libtpu")  # never imported: importing sets TPU_LIBRARY_PATH
        if spec is not None and spec.origin is not None:
            p = Path(spec.origin).parent / "libtpu.so"
            library, how = (p if p.is_file() else None), "the libtpu package"
    if library is None:
        return (("libtpu", None),), "not found: no TPU_LIBRARY_PATH, no libtpu package", None
    version = _libtpu_dist_beside(library)
    if version is not None:
        return (("libtpu", version),), f"package metadata of {how}", None
    st = library.stat()
    build = _build_string(str(library), st.st_size, st.st_mtime)
    if build is not None:
        return (("libtpu", None),), f"the build string of {how} (no package metadata beside it)", build
    return (("libtpu", None),), f"{how}: no package metadata beside it, no build string", None


def _gpu(platform: str) -> tuple[tuple[tuple[str, str | None], ...], str]:
    for dists in _GPU_DISTS.get(platform, ()):
        versions = tuple((d, _version(d)) for d in dists)
        if any(v is not None for _, v in versions):
            return tuple((d, v) for d, v in versions if v is not None), "package metadata"
    first = _GPU_DISTS.get(platform, ((f"jax-{platform}-plugin",),))[0][0]
    return ((first, None),), f"no {platform} plugin installed"


def _local_platform() -> str:
    backend = jax.default_backend()
    if backend != "gpu":
        return backend
    return "rocm" if any(_version(d[0]) for d in _GPU_DISTS["rocm"]) else "cuda"


def compiler_identity(platform: str | None = None) -> Compiler:
    """The compiler that compiles for ``platform`` in this process, and its versions.

    Args:
      platform: ``cpu``, ``tpu``, ``cuda`` or ``rocm`` (a target compiled for from shapes: no
        device is opened, nothing is loaded); ``None`` or ``local``: this process's default
        backend (the one a step runs on).

    Returns:
      A :class:`Compiler`: jax and jaxlib; for a TPU libtpu's version, from the ``dist-info``
      beside the library JAX loads (``TPU_LIBRARY_PATH`` first, as JAX finds it), else the
      library's own build string, else ``unknown``; for a GPU the PJRT plugin's and the CUDA
      plugin's versions.

    >>> c = compiler_identity("cpu")
    >>> c.describe() == f"XLA:CPU, jax {c.jax} / jaxlib {c.jaxlib}"
    True
    """
    if platform in (None, "local"):
        platform = _local_platform()
    platform = {"gpu": "cuda"}.get(platform, platform)
    plugins: tuple[tuple[str, str | None], ...] = ()
    build = None
    if platform == "cpu":
        found = "XLA:CPU is part of jaxlib"
    elif platform == "tpu":
        plugins, found, build = _tpu()
    else:
        plugins, found = _gpu(platform)
    return Compiler(platform, jax.__version__, _version("jaxlib"), plugins, found, build)


def _differing(a: Compiler, b: Compiler) -> tuple[str, str]:
    """The parts of two compilers' descriptions that differ (each side's)."""
    if a.platform != b.platform:
        return a.describe(), b.describe()
    left, right = [], []
    pa, pb = dict(a.plugins), dict(b.plugins)
    for dist in dict.fromkeys([*pa, *pb]):
        one = Compiler(a.platform, a.jax, a.jaxlib, ((dist, pa.get(dist)),), a.found, a.build)
        two = Compiler(b.platform, b.jax, b.jaxlib, ((dist, pb.get(dist)),), b.found, b.build)
        if (pa.get(dist), a.build) != (pb.get(dist), b.build):
            left += one._plugins()
            right += two._plugins()
    if (a.jax, a.jaxlib) != (b.jax, b.jaxlib):
        left.append(f"jax {a.jax} / jaxlib {a.jaxlib}")
        right.append(f"jax {b.jax} / jaxlib {b.jaxlib}")
    return ", ".join(left) or a.describe(), ", ".join(right) or b.describe()


def compiler_change(before: Compiler | None, now: Compiler) -> str | None:
    """A sentence saying that figures from ``before`` are read under another compiler, ``now``;
    ``None`` when both are the same compiler.

    >>> a = Compiler("tpu", "0.11.2", "0.11.2", (("libtpu", "0.0.48"),))
    >>> compiler_change(a, Compiler("tpu", "0.11.2", "0.11.2", (("libtpu", "0.0.42.1"),)))
    'these figures came from libtpu 0.0.48; this process compiles with libtpu 0.0.42.1'
    """
    if before is None:
        return ("these figures do not name the compiler that made them (written before reports "
                f"recorded it); this process compiles with {now.describe()}")
    if before.key == now.key:
        return None
    was, is_ = _differing(before, now)
    return f"these figures came from {was}; this process compiles with {is_}"
