"""What ``scripts/device_check`` and ``scripts/capacity_check`` share so that neither takes the
machine down nor leaves a lie behind: host memory budgeted before anything is allocated, a signal
(Ctrl-C, SIGTERM) turned into an exception the script stops on, and JSON written whole or not at
all."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

#: The share of this machine's available memory (``MemAvailable``) a check plans to fill: the rest
#: is left to what no prediction counts (the compiler, Python, the machine's other processes).
SHARE = 0.9


def available() -> int | None:
    """Bytes of memory this machine can give without swapping (``MemAvailable`` in
    /proc/meminfo); ``None`` where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


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


def beyond_machine(limit: int) -> str | None:
    """Why a ``--host-memory`` of ``limit`` bytes is more than this machine can give (runs that
    planned to fill 36 GiB of a 40 GiB host were killed), or ``None``."""
    avail = available()
    if avail is None or limit <= SHARE * avail:
        return None
    return (f"{gib(limit)} is more than this machine can give: {SHARE:.0%} of the {gib(avail)} it "
            f"has available (MemAvailable), the rest left to the compiler and Python. Fix: at most "
            f"{gib(SHARE * avail)}, or leave it out")


def over_memory(need: int, what: str, fix: str, limit: int | None = None) -> str | None:
    """Why ``need`` bytes of host memory (``what`` holds them) are refused: over ``limit`` (a
    ``--host-memory``), else over :data:`SHARE` of what this machine has available; or ``None``."""
    avail = available()
    if limit is not None:
        said = f"--host-memory {gib(limit)}"
    elif avail is not None:
        limit, said = int(SHARE * avail), (f"{SHARE:.0%} of the {gib(avail)} this machine has "
                                           "available (MemAvailable)")
    if limit is None or need <= limit:
        return None
    return (f"host memory: {what}: {gib(need)}, over {said}; run, it would be killed, or take the "
            f"machine down. Fix: {fix}")


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
