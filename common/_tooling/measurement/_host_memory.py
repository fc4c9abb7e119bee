"""Host memory, budgeted before anything is put there: no tool takes the machine down.

A tool that puts training state on host (``remat report``, ``remat tune`` with state on host, the
examples' measured steps: :func:`~._state_transfer.with_state`; ``scripts/capacity_check`` and
``scripts/device_check``) predicts the host bytes it is about to allocate and refuses, with the
figures, a size over the budget: ``REMAT_HOST_MEMORY`` (or a script's ``--host-memory``) where
given, else :data:`SHARE` of what this machine has available (``MemAvailable``), the rest left to
what no prediction counts (the compiler, Python, the machine's other processes). A
``scripts/capacity_check --host-memory 36GiB`` on a 40 GiB host ran it out of RAM with no warning.
"""

from __future__ import annotations

import os
from typing import Final

from ..._errors import RematError
from ..accelerators._units import fmt_bytes, parse_bytes

#: The share of this machine's available memory a tool plans to fill.
SHARE: Final = 0.9
#: The environment variable that sets the host budget (bytes, or a size with a unit: 30GiB).
ENV: Final = "REMAT_HOST_MEMORY"


class HostMemoryError(RematError):
    """A run refused before it allocated: its host bytes would pass the budget."""


def available() -> int | None:
    """Bytes of memory this machine can give without swapping (``MemAvailable`` in
    /proc/meminfo); ``None`` where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def beyond_machine(limit: int) -> str | None:
    """Why a host budget of ``limit`` bytes (``--host-memory``, ``REMAT_HOST_MEMORY``) is more
    than this machine can give, or ``None``."""
    avail = available()
    if avail is None or limit <= SHARE * avail:
        return None
    return (f"{fmt_bytes(limit)} is more than this machine can give: {SHARE:.0%} of the "
            f"{fmt_bytes(avail)} it has available (MemAvailable), the rest left to the compiler "
            f"and Python. Fix: at most {fmt_bytes(SHARE * avail)}, or leave it out")


def over_memory(need: int, what: str, fix: str, limit: int | None = None) -> str | None:
    """Why ``need`` bytes of host memory (``what`` holds them) are refused, or ``None``: over
    ``limit`` (``None``: ``REMAT_HOST_MEMORY`` where set), else over :data:`SHARE` of what this
    machine has available. A limit over what the machine can give is refused itself."""
    said = f"--host-memory {fmt_bytes(limit)}" if limit is not None else ""
    if limit is None and os.environ.get(ENV):
        limit = parse_bytes(os.environ[ENV], ENV)
        said = f"{ENV}={os.environ[ENV]}"
    if limit is not None and (why := beyond_machine(limit)) is not None:
        return f"host memory: {said}: {why}"
    avail = available()
    if limit is None and avail is not None:
        limit, said = int(SHARE * avail), (f"{SHARE:.0%} of the {fmt_bytes(avail)} this machine "
                                           "has available (MemAvailable)")
    if limit is None or need <= limit:
        return None
    return (f"host memory: {what}: {fmt_bytes(need)}, over {said}; run, it would be killed, or "
            f"take the machine down. Fix: {fix}")


def host_budget() -> int | None:
    """The host bytes a tool may fill: ``REMAT_HOST_MEMORY`` where set, else :data:`SHARE` of what
    this machine has available; ``None`` where neither is known."""
    if os.environ.get(ENV):
        return parse_bytes(os.environ[ENV], ENV)
    avail = available()
    return None if avail is None else int(SHARE * avail)


def check_host_memory(need: int, what: str, fix: str, limit: int | None = None) -> None:
    """Raises :class:`HostMemoryError` where :func:`over_memory` refuses ``need`` bytes."""
    if (why := over_memory(need, what, fix, limit)) is not None:
        raise HostMemoryError(why)
