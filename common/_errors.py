"""Error types and the shared message helpers of the core."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from typing import Final

GUIDE_URL = "https://docs.jax.dev/en/latest/gradient-checkpointing.html"


class RematError(ValueError):
    """Base class of every error this project raises about a remat plan or annotation."""


class AnnotationError(RematError):
    """An annotation value that is not part of the vocabulary, or is malformed."""


class PlanError(RematError):
    """A plan (rules, defaults, file) that cannot be loaded, resolved or compiled."""


class PlanTypeError(PlanError, TypeError):
    """A wrong type passed to the API (also a :class:`TypeError`)."""


class CapabilityError(RematError):
    """The installed JAX (or backend) cannot do what a plan asks for."""


class VerificationError(RematError):
    """What JAX really keeps for the backward pass differs from what the plan says."""


def sorted_list(values: Iterable[object]) -> str:
    """``a, b, c`` with each value repr()'d, sorted; for 'allowed values' lists."""
    items = sorted(values, key=str)
    text = ", ".join(short(v, 60) for v in items[:20])
    return text + (f", ... ({len(items) - 20} more)" if len(items) > 20 else "")


def where(path: str | None, source: str | None = None) -> str:
    """A short prefix that locates an error: module path and file:line when known."""
    parts = []
    if path is not None:
        parts.append(f"module {path or '<root>'!r}")
    if source:
        parts.append(f"({source})")
    return (" ".join(parts) + ": ") if parts else ""


_REPR: Final = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = 6
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlong = 40

#: The longest value an error message quotes.
SHORT_LIMIT: Final = 120


def short(value: object, limit: int = SHORT_LIMIT) -> str:
    """``repr(value)`` bounded in size and cost, for quoting a user's value in an error message.

    Nested and long values are elided (``[1, 2, ...]``) without building the full repr, so a huge
    or self-referencing value (a YAML alias bomb) costs no more than a small one.

    >>> short("x" * 500)[:20], len(short("x" * 500)) <= SHORT_LIMIT
    ("'xxxxxxxxxxxxxxxxxxx", True)
    >>> short([[[[1]]]])
    '[[[[...]]]]'
    """
    try:
        text = _REPR.repr(value)
    except Exception:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text: str, limit: int = 300) -> str:
    """A message (another error's text) at most ``limit`` characters, shortened at the end of its
    first part, never in the middle of a word list, and keeping its ``Fix:`` whole.

    >>> clip("a" * 40 + ". Fix: do b.", 30)
    'aaaaaaaaaaaaaaaa... Fix: do b.'
    >>> clip("short. Fix: none.")
    'short. Fix: none.'
    """
    text = " ".join(text.split())  # one line: a traceback's newlines read as separate messages
    if len(text) <= limit:
        return text
    head, sep, fix = text.partition(" Fix: ")
    if sep and len(fix) < limit - 20:
        keep = max(16, limit - len(sep) - len(fix) - 4)
        return head[:keep].rstrip() + "..." + sep + fix
    return text[: limit - 3].rstrip() + "..."


def check_bool(function: str, argument: str, value: object) -> bool:
    """``value`` if it is a bool, else a :class:`PlanTypeError`: ``bool('no')`` is True, so a string
    (or any other truthy object) must not stand for a flag.

    >>> check_bool("annotate", "share_alike_layers", True)
    True
    """
    if not isinstance(value, bool):
        raise type_error(function, argument, value, "True or False",
                         "pass a bool (strings such as 'no' or 'false' are not read as booleans).")
    return value


def check_count(function: str, argument: str, value: object, least: int) -> int:
    """``value`` if it is an int (not a bool, not a float) of at least ``least``, else a
    :class:`RematError` naming the function, the argument and what was given.

    >>> check_count("remat_common.tune", "max_compiles", 40, 1)
    40
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise RematError(f"{function}: {argument} must be an integer >= {least}, got "
                         f"{type(value).__name__} {short(value)}.")
    return value


def type_error(function: str, argument: str, value: object, allowed: str,
               fix: str = "") -> PlanTypeError:
    """A TypeError for a wrong argument type: names the function, what was given and what is allowed."""
    return PlanTypeError(
        f"{function}: {argument} must be {allowed}; got {type(value).__name__} {short(value)}."
        + (f" Fix: {fix}" if fix else "")
    )
