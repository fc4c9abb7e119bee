"""What the capacity and device checks share so that neither takes the machine down nor leaves a
lie behind: a signal (Ctrl-C, SIGTERM) turned into an exception the check stops on, and JSON
written whole or not at all; and where the repository's examples are, which both train and
measure. Host memory is budgeted before anything is allocated (``over_memory``,
``beyond_machine``: ``measurement/_host_memory.py``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from ..._errors import RematError
from ..._shipped import EXAMPLES as _SHIPPED
from ..accelerators._units import parse_bytes

#: The example GPTs the checks grow, train and measure (``examples/NAME/``).
EXAMPLES = tuple(_SHIPPED)


def checkout() -> Path:
    """The repository whose ``examples`` package the checks import (the scripts put it first on
    ``sys.path``; tests run in it)."""
    spec = importlib.util.find_spec("examples")
    if spec is None or not spec.submodule_search_locations:
        raise RematError("the capacity and device checks train this repository's examples: "
                         "`examples` is not importable here. Fix: run ./scripts/capacity_check "
                         "or ./scripts/device_check from a checkout.")
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def byte_size(text: str) -> int:
    """An argparse type: bytes, or a number with a unit (30GiB), more than 0."""
    try:
        return parse_bytes(text, "size")
    except RematError as e:  # its message: what is wrong, and the forms allowed
        raise argparse.ArgumentTypeError(" ".join(str(e).splitlines()[:2])) from None


class Stopped(BaseException):
    """A signal asked the check to stop (SIGINT: Ctrl-C; SIGTERM); ``status``: 128 + its number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name
        self.status = 128 + signum


def stop_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM raise :class:`Stopped` (in the main thread); while the check stops, a
    second signal is ignored, so that what it writes is whole. Returns the handlers replaced,
    for :func:`restore_signals` (a check run in a process of its caller's, a test)."""
    def stop(signum: int, frame: Any) -> None:
        ignore_signals()
        raise Stopped(signum)

    before: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in before:
        signal.signal(s, stop)
    return before


def ignore_signals() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def restore_signals(handlers: dict[int, Any]) -> None:
    for s, h in handlers.items():
        signal.signal(s, h)


def write_json(path: str | Path, doc: Any, indent: int = 1) -> None:
    """``doc`` as JSON at ``path``, whole or not at all: written beside it under a temporary name
    and renamed; the temporary file is removed whatever stops the write (a signal included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, indent=indent, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
