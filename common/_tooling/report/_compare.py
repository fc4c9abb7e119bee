"""The same plans compiled two ways (a real device and its target config, or this machine and a
target), side by side: what ``scripts/device_check`` prints on a TPU or GPU
(https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..accelerators._units import fmt_bytes
from ..measurement._report import Report


#: The compiled memory figures two compiles of one plan are compared by, per device.
COMPARED = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "host_temp_size_in_bytes", "peak_memory_in_bytes")


@dataclasses.dataclass(frozen=True)
class CompiledBothWays:
    """One plan's compiled figures per device from two compilers, and their differences.

    Attributes:
      plan: the plan's name.
      first, second: what each report was compiled by (``cuda`` on a real GPU, ``cpu``, ``h200``).
      peak, temp, host_temp: ``(first, second)`` per device: compiled peak
        (``MemoryFigures.device_total``), temporaries, host temporaries (``None``: not reported).
      identical: whether the two compiles account the same bytes in every field of
        :data:`COMPARED` (what a device's compile and the deviceless one for its topology, by the
        same compiler, do byte for byte).
    """

    plan: str
    first: str
    second: str
    peak: tuple[int | None, int | None]
    temp: tuple[int | None, int | None]
    host_temp: tuple[int | None, int | None]
    identical: bool = False

    @staticmethod
    def _diff(pair: tuple[int | None, int | None]) -> int | None:
        a, b = pair
        return None if a is None or b is None else b - a

    @property
    def peak_diff(self) -> int | None:
        """Second minus first."""
        return self._diff(self.peak)

    @property
    def temp_diff(self) -> int | None:
        """Second minus first."""
        return self._diff(self.temp)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "peak_diff": self.peak_diff,
                "temp_diff": self.temp_diff}


def _compiler(report: Report) -> str:
    acc = report.accelerator
    return str(acc["name"]) if acc else report.capabilities.backend


def compare_reports(first: Report, second: Report) -> tuple[CompiledBothWays, ...]:
    """The plans both reports hold, in ``first``'s order, with their figures side by side.

    >>> import jax, jax.numpy as jnp
    >>> from remat_common.measurement import MeasureTarget, measure
    >>> def build(plan):
    ...     loss = lambda w: jnp.sum(jnp.tanh(w) ** 2)
    ...     args = (jnp.ones((8, 8)),)
    ...     return MeasureTarget(loss, args, lambda w: w - jax.grad(loss)(w), args)
    >>> rep = measure(build, {"none": None}, steps=0)
    >>> [(r.peak_diff, r.identical) for r in compare_reports(rep, rep)]
    [(0, True)]
    """
    a, b = _compiler(first), _compiler(second)
    theirs = {p.name: p for p in second.plans}
    out = []
    for p in first.plans:
        q = theirs.get(p.name)
        if q is None:
            continue
        out.append(CompiledBothWays(
            p.name, a, b, (p.memory.device_total, q.memory.device_total),
            (p.memory.temp_size_in_bytes, q.memory.temp_size_in_bytes),
            (p.memory.host_temp_size_in_bytes, q.memory.host_temp_size_in_bytes),
            all(getattr(p.memory, f) == getattr(q.memory, f) for f in COMPARED)))
    return tuple(out)


def _signed(n: int | None) -> str:
    if n is None:
        return "-"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


def both_ways_table(rows: tuple[CompiledBothWays, ...]) -> str:
    """A plain-text table of :func:`compare_reports`' rows (peak and temp both ways, differences)."""
    if not rows:
        return "(no plan compiled both ways)"
    a, b = rows[0].first, rows[0].second
    head = ("plan", f"peak {a}", f"peak {b}", "diff", f"temp {a}", f"temp {b}", "diff",
            f"host temp {b}")
    body = [head] + [(r.plan, fmt_bytes(r.peak[0]), fmt_bytes(r.peak[1]), _signed(r.peak_diff),
                      fmt_bytes(r.temp[0]), fmt_bytes(r.temp[1]), _signed(r.temp_diff),
                      fmt_bytes(r.host_temp[1])) for r in rows]
    widths = [max(len(row[i]) for row in body) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body)


