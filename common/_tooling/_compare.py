"""The same plans compiled two ways (a real device and its target config, or this machine and a
target), side by side: what ``scripts/gpu_check`` prints when a GPU is lent (``remat docs gpu``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._accelerators import GPUS
from ._profiles import fmt_bytes
from ._report import Report


@dataclasses.dataclass(frozen=True)
class CompiledBothWays:
    """One plan's compiled figures per device from two compilers, and their differences.

    Attributes:
      plan: the plan's name.
      first, second: what each report was compiled by (``cuda`` on a real GPU, ``cpu``, ``h200``).
      peak, temp, host_temp: ``(first, second)`` per device: compiled peak (arguments + outputs +
        temp - aliased), temporaries, host temporaries (``None``: not reported).
    """

    plan: str
    first: str
    second: str
    peak: tuple[int | None, int | None]
    temp: tuple[int | None, int | None]
    host_temp: tuple[int | None, int | None]

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
    >>> [r.peak_diff for r in compare_reports(rep, rep)]
    [0]
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
            (p.memory.host_temp_size_in_bytes, q.memory.host_temp_size_in_bytes)))
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


#: ``device_kind`` fragments of the GPUs a target config ships for, most specific first; a
#: superchip (GH200, GB200) has other memory than the GPU it is named after: no match.
_KINDS = (("gh200", None), ("gb200", None), ("h200", "h200"), ("h100", "h100"),
          ("b200", "b200"), ("a100", "a100"))


def accelerator_for(device_kind: str) -> str | None:
    """The shipped GPU target config for a device's ``device_kind`` (``NVIDIA H200`` -> ``h200``,
    ``NVIDIA A100-SXM4-40GB`` -> ``a100-40g``), ``None`` where none ships.

    >>> accelerator_for("NVIDIA H100 80GB HBM3"), accelerator_for("NVIDIA A100-SXM4-40GB")
    ('h100', 'a100-40g')
    >>> accelerator_for("NVIDIA GH200 480GB") is None
    True
    """
    kind = device_kind.lower()
    for frag, name in _KINDS:
        if frag in kind:
            if name == "a100":
                name = "a100-80g" if "80g" in kind.replace(" ", "") else "a100-40g"
            return name if name is None or name in GPUS else None
    return None
