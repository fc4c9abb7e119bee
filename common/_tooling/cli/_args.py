"""The numeric argument types the subcommands share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def bounded(cast: Callable[[str], float], what: str, *, zero: bool = False,
            message: str | None = None) -> Callable[[str], Any]:
    """An argparse type: ``cast(text)``, more than 0 (``zero``: 0 or more), else its message
    (``message``: one for both failures, ``{text}`` the argument as given)."""
    def parse(text: str) -> Any:
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or not (v >= 0 if zero else v > 0):
            raise argparse.ArgumentTypeError(
                message.format(text=text) if message is not None
                else f"{text!r} is not {what}" if v is None
                else f"{v} is negative; give 0 or more" if zero
                else f"{v} is not a positive integer; give 1 or more" if cast is int
                else f"{v} is not positive")
        return v
    return parse


#: ``--measure 3``, ``--max-compiles 40``: 1 or more.
POSITIVE = bounded(int, "an integer")
#: ``--steps 0``: 0 or more.
NON_NEGATIVE = bounded(int, "an integer", zero=True)
#: ``--time-limit 90``: seconds, more than 0.
SECONDS = bounded(float, "a number of seconds")
