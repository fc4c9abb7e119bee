"""Error types and the shared message helpers of the core."""

from __future__ import annotations

from collections.abc import Iterable

GUIDE_URL = "https://docs.jax.dev/en/latest/gradient-checkpointing.html"


class RematError(ValueError):
    """Base class of every error this project raises about a remat plan or annotation."""


class AnnotationError(RematError):
    """An annotation value that is not part of the vocabulary, or is malformed."""


class PlanError(RematError):
    """A plan (rules, defaults, file) that cannot be loaded, resolved or compiled."""


class CapabilityError(RematError):
    """The installed JAX (or backend) cannot do what a plan asks for."""


class VerificationError(RematError):
    """What JAX really keeps for the backward pass differs from what the plan says."""


def sorted_list(values: Iterable[object]) -> str:
    """``a, b, c`` with each value repr()'d, sorted; for 'allowed values' lists."""
    return ", ".join(repr(v) for v in sorted(values, key=str))


def where(path: str | None, source: str | None = None) -> str:
    """A short prefix that locates an error: module path and file:line when known."""
    parts = []
    if path is not None:
        parts.append(f"module {path or '<root>'!r}")
    if source:
        parts.append(f"({source})")
    return (" ".join(parts) + ": ") if parts else ""
