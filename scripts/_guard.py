"""What ``scripts/device_check`` and ``scripts/capacity_check`` share so that neither takes the
machine down nor leaves a lie behind: a signal (Ctrl-C, SIGTERM) turned into an exception the
script stops on, and JSON written whole or not at all. Host memory is budgeted before anything is
allocated by the package's guard (``remat_common.internal.over_memory``, ``beyond_machine``)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any


def gib(n: float) -> str:
    from remat_common.internal import fmt_bytes

    return str(fmt_bytes(int(n)))


def count(least: int = 1) -> Any:
    """An argparse type: an integer, ``least`` or more (``--start 0`` was read as not given)."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < least:
            raise argparse.ArgumentTypeError(
                f"{v} is {'not a positive integer' if least == 1 else 'negative'}; give {least} "
                "or more")
        return v
    return parse


def byte_size(text: str) -> int:
    """An argparse type: bytes, or a number with a unit (30GiB), more than 0."""
    import argparse

    from remat_common.internal import parse_bytes

    try:
        v = parse_bytes(text, "size")
    except Exception as e:  # noqa: BLE001 - its message: what is wrong, and the forms allowed
        raise argparse.ArgumentTypeError(" ".join(str(e).splitlines()[:2])) from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no memory; give more than 0 bytes (30GiB)")
    return v


class Stopped(BaseException):
    """A signal asked the script to stop (SIGINT: Ctrl-C; SIGTERM); ``status``: 128 + its number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name
        self.status = 128 + signum


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise :class:`Stopped` (in the main thread); while the script stops, a
    second signal is ignored, so that what it writes is whole."""
    def stop(signum: int, frame: Any) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop)


def unwritable(path: str | Path) -> str | None:
    """Why a file cannot be written at ``path`` (checked before any work; it was found after a
    whole search), or ``None``."""
    p = Path(path)
    if p.is_dir():
        return f"{str(p)!r} is a directory. Fix: a file in it ({str(p / 'out.json')!r})"
    folder = p.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{str(folder)!r} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {str(folder)!r} is not writable"
    return None


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
