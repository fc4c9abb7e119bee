"""The distribution's version, read from the installed metadata."""

import importlib.metadata

try:
    __version__ = importlib.metadata.version("jax-remat-plan")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0+unknown"
