"""Bytes and seconds, written and read the one way the library prints them."""

from __future__ import annotations

import math
import re
from typing import Any

from ..._errors import RematError, short, sorted_list

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

_MSG_BYTES = """\
{what} {value}: {why}.
Give bytes or a number with a unit: 12GiB, 800MiB, 1.5GB, 3e9. Units: {units} (KiB = 1024 bytes,
KB = 1000 bytes; K, M, G, T alone mean KiB, MiB, GiB, TiB)."""


def fmt_bytes(n: float | None) -> str:
    """``1536`` → ``1.5 KiB``; ``None`` → ``-``.

    >>> fmt_bytes(3 * 2**20)
    '3.00 MiB'
    >>> fmt_bytes(0)
    '0 B'
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_bytes(value: Any, what: str = "budget") -> int:
    """A byte count from an int or a string with a unit (``12GiB``, ``800MiB``, ``1.5GB``).

    Raises:
      RematError: the value is not a size, has an unknown unit, or is zero or negative.

    >>> parse_bytes("12GiB"), parse_bytes("1.5GB"), parse_bytes(4096)
    (12884901888, 1500000000, 4096)
    """
    units = sorted_list({"B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"})
    if isinstance(value, bool):
        raise RematError(_MSG_BYTES.format(what=what, value=short(value), why="not a size",
                                           units=units))
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise RematError(_MSG_BYTES.format(what=what, value=short(value),
                                               why="a size cannot be negative", units=units))
        m = _SIZE.match(text)
        if m is None:
            raise RematError(_MSG_BYTES.format(what=what, value=short(value),
                                               why="not a number with a unit", units=units))
        number, unit = float(m.group(1)), m.group(2)
        if unit.lower() not in _UNITS:
            raise RematError(_MSG_BYTES.format(what=what, value=short(value),
                                               why=f"unknown unit {unit!r}", units=units))
    else:
        raise RematError(_MSG_BYTES.format(what=what, value=short(value),
                                           why=f"a {type(value).__name__} is not a size",
                                           units=units))
    n = number * _UNITS[unit.lower()]
    if not math.isfinite(n):
        raise RematError(_MSG_BYTES.format(what=what, value=short(value), why="not finite",
                                           units=units))
    if n < 0:
        raise RematError(_MSG_BYTES.format(what=what, value=short(value),
                                           why="a size cannot be negative", units=units))
    if int(n) <= 0:
        raise RematError(_MSG_BYTES.format(what=what, value=short(value),
                                           why="a budget must be at least one byte", units=units))
    return int(n)


def fmt_seconds(s: float | None, ms: bool = False) -> str:
    """``5.29 s``; under a second, or with ``ms``, ``348.2 ms``; ``None`` → ``-``.

    >>> fmt_seconds(5.2913), fmt_seconds(0.34817), fmt_seconds(2.5, ms=True), fmt_seconds(None)
    ('5.29 s', '348.2 ms', '2500 ms', '-')
    """
    if s is None:
        return "-"
    return f"{s * 1e3:.4g} ms" if ms or s < 1 else f"{s:.3g} s"
