"""A stored report's figures against the same plans compiled again now: do they still hold?

The same plan compiled by two versions of one compiler can differ (libtpu 0.0.48 and 0.0.42.1 gave
one plan's temp on a TPU v5e as 4,613.6 and 3,714.3 MiB), so a report made on one machine is
checked where the step runs (``remat report CONFIG --check STORED.json``): which compiler made
each, and each plan's compiled memory then and now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..._compiler import compiler_change, compiler_identity
from ..accelerators._units import fmt_bytes
from ..measurement._report import MemoryFigures, Report

#: How far a figure may move and still hold (relative): XLA is deterministic, so one compiler
#: gives the same bytes again; this leaves room for rounding only.
TOLERANCE = 0.01

_FIGURES: tuple[tuple[str, Callable[[MemoryFigures], int | None]], ...] = (
    ("peak/device", lambda m: m.device_total),
    ("temp", lambda m: m.temp_size_in_bytes),
    ("host temp", lambda m: m.host_temp_size_in_bytes),
)


@dataclasses.dataclass(frozen=True)
class PlanCheck:
    """One plan's stored figures against its figures now.

    Attributes:
      name: the plan.
      holds: every figure within the tolerance (``None``: the plan is in one report only).
      changes: each figure that moved, ``temp 4.51 GiB then, 3.63 GiB now (-19.5 %)``, or why
        the plan cannot be compared.
    """

    name: str
    holds: bool | None
    changes: tuple[str, ...] = ()

    def line(self) -> str:
        if self.holds is None:
            return f"{self.name}: not compared: {'; '.join(self.changes)}"
        if self.holds:
            return (f"{self.name}: holds ({', '.join(n for n, _ in _FIGURES)} within "
                    f"{TOLERANCE:.0%})")
        return f"{self.name}: DOES NOT HOLD: {'; '.join(self.changes)}"


@dataclasses.dataclass(frozen=True)
class ReportCheck:
    """A stored report checked against the same plans compiled now (:func:`check_report`).

    Attributes:
      source: where the stored report came from (its file).
      compiler: the compiler that makes the figures now (its description).
      change: that the stored figures came from another compiler (:func:`compiler_change`),
        ``None`` when they came from this one.
      layout: that the stored figures were compiled for another accelerator or mesh, else
        ``None``.
      plans: one :class:`PlanCheck` per plan of either report.
    """

    source: str
    compiler: str
    change: str | None
    layout: str | None
    plans: tuple[PlanCheck, ...]

    @property
    def holds(self) -> bool:
        """Every plan of the stored report has its figures now (within :data:`TOLERANCE`)."""
        return all(p.holds is not False for p in self.plans)

    def lines(self) -> list[str]:
        """What the check found, as text lines (first: which compilers; last: the verdict)."""
        head = (f"{self.change}: re-measured, figures below." if self.change else
                f"these figures came from this process's compiler ({self.compiler}): re-measured.")
        out = [f"check against {self.source}: {head}"]
        if self.layout:
            out.append(f"  {self.layout}")
        out += [f"  {p.line()}" for p in self.plans]
        differ = [p.name for p in self.plans if p.holds is False]
        compared = [p for p in self.plans if p.holds is not None]
        if differ:
            out.append(f"the stored figures do not hold for {len(differ)} of {len(compared)} "
                       f"plan(s) ({', '.join(differ)}): use the figures above"
                       + (", made by the compiler the step runs with." if self.change else "."))
        else:
            out.append(f"the stored figures hold for all {len(compared)} plan(s) compared"
                       + (" despite the other compiler." if self.change else "."))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "compiler": self.compiler, "change": self.change,
                "layout": self.layout, "holds": self.holds,
                "plans": [dataclasses.asdict(p) for p in self.plans]}


def _where(r: Report) -> str:
    acc = r.accelerator
    if acc is None:
        return f"this machine's {r.capabilities.backend} ({r.capabilities.device_kind})"
    mesh = ",".join(f"{k}={v}" for k, v in (acc.get("mesh") or {}).items())
    return f"{acc.get('name')}" + (f" (mesh {mesh})" if mesh else "")


def _compare(name: str, then: MemoryFigures, now: MemoryFigures, tolerance: float) -> PlanCheck:
    changes = []
    for label, get in _FIGURES:
        a, b = get(then), get(now)
        if a is None or b is None or abs(b - a) <= tolerance * max(abs(a), 1):
            continue
        rel = f" ({(b - a) / a:+.1%})" if a else ""
        changes.append(f"{label} {fmt_bytes(a)} then, {fmt_bytes(b)} now{rel}")
    return PlanCheck(name, not changes, tuple(changes))


def check_report(stored: Report, fresh: Report, *, source: str = "the stored report",
                 tolerance: float = TOLERANCE) -> ReportCheck:
    """Whether ``stored``'s figures hold for ``fresh``, the same plans compiled now.

    Args:
      stored: a report read back (:meth:`Report.load`), made by any compiler.
      fresh: the same config measured in this process (``remat report CONFIG``).
      source: how to name the stored report (its file).
      tolerance: how far (relative) a figure may move and still hold.

    Returns:
      A :class:`ReportCheck`: whether the compilers differ (jax, jaxlib, libtpu or the CUDA
      plugin), whether the layouts differ, and per plan each memory figure (peak per device,
      temp, host temp) that moved, or a plan refused by one compiler and not the other.
    """
    now = fresh.compiler or compiler_identity()
    change = compiler_change(stored.compiler, now)
    layout = None
    if _where(stored) != _where(fresh):
        layout = (f"the stored figures were compiled for {_where(stored)}, these for "
                  f"{_where(fresh)}: figures of another device or layout need not agree.")
    then = {p.name: p for p in stored.plans}
    now_plans = {p.name: p for p in fresh.plans}
    then_refused = {r.name: r for r in stored.refused}
    now_refused = {r.name: r for r in fresh.refused}
    names = list(dict.fromkeys([*then, *then_refused, *now_plans, *now_refused]))
    checks = []
    for n in names:
        if n in then and n in now_plans:
            checks.append(_compare(n, then[n].memory, now_plans[n].memory, tolerance))
        elif n in then and n in now_refused:
            checks.append(PlanCheck(n, False, (f"compiled then, refused now as out of device "
                                               f"memory: {now_refused[n].error}",)))
        elif n in then_refused and n in now_plans:
            peak = now_plans[n].memory.device_total
            checks.append(PlanCheck(n, False, (f"refused then as out of device memory, compiles "
                                               f"now (peak/device {fmt_bytes(peak)})",)))
        elif n in then_refused and n in now_refused:
            checks.append(PlanCheck(n, True))
        else:
            checks.append(PlanCheck(n, None, ("not in the stored report" if n not in then and
                                              n not in then_refused else "not measured now",)))
    return ReportCheck(source, now.describe(), change, layout, tuple(checks))
