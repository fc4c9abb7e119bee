"""Drift between two reports of the same plans: which figures moved, and by how much, between the
compilers that made them (``remat report --compare OLD.json [NEW.json]``).

The same plan compiled by two versions of one compiler can differ (libtpu 0.0.42.1 and 0.0.48 gave
the example GPT's recompute plan on a TPU v5e a temp of 3,714.3 and 4,613.6 MiB, +24 %; its other
plans were identical). :func:`report_drift` lists, plan by plan and figure by figure, each
compiled figure that moved by more than a threshold (default :data:`THRESHOLD`), with both
compilers named. Unlike ``--check`` (:func:`~._recheck.check_report`: do a stored report's
figures still hold here, within rounding), it compares any two reports, every compiled figure,
and reads without compiling when both are files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..measurement._report import PlanReport, Report
from ..accelerators._units import fmt_bytes

#: How far (relative) a figure may move before the comparison flags it.
THRESHOLD = 0.05

#: The figures compared, per plan: ``(label, value of a plan's report, bytes or a count)``.
FIGURES: tuple[tuple[str, Callable[[PlanReport], float | None], bool], ...] = (
    ("peak/device", lambda p: p.device_peak, True),
    ("temp", lambda p: p.memory.temp_size_in_bytes, True),
    ("arguments", lambda p: p.memory.argument_size_in_bytes, True),
    ("outputs", lambda p: p.memory.output_size_in_bytes, True),
    ("aliased", lambda p: p.memory.alias_size_in_bytes, True),
    ("heap peak", lambda p: p.memory.peak_memory_in_bytes, True),
    ("host temp", lambda p: p.memory.host_temp_size_in_bytes, True),
    ("host arguments", lambda p: p.memory.host_argument_size_in_bytes, True),
    ("host outputs", lambda p: p.memory.host_output_size_in_bytes, True),
    ("device activations", lambda p: p.device_bytes, True),
    ("host activations", lambda p: p.host_bytes, True),
    ("FLOPs", lambda p: p.flops, False),
)


@dataclasses.dataclass(frozen=True)
class Moved:
    """One figure of one plan that moved: ``then`` in the old report, ``now`` in the new one.

    >>> Moved("recompute", "temp", 3894679040, 4837710233).line()
    'recompute: temp 3.63 GiB -> 4.51 GiB (+24.2%)'
    """

    plan: str
    figure: str
    then: float | None
    now: float | None
    nbytes: bool = True

    @property
    def change(self) -> float | None:
        """``now / then - 1`` (``None`` where ``then`` is 0 or a figure is missing)."""
        if self.then is None or self.now is None or not self.then:
            return None
        return self.now / self.then - 1

    def line(self) -> str:
        def fmt(v: float | None) -> str:
            if v is None:
                return "none"
            return fmt_bytes(v) if self.nbytes else f"{v:,.4g}"
        rel = self.change
        return (f"{self.plan}: {self.figure} {fmt(self.then)} -> {fmt(self.now)}"
                + ("" if rel is None else f" ({rel:+.1%})"))

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "figure": self.figure, "then": self.then, "now": self.now,
                "change": self.change}


@dataclasses.dataclass(frozen=True)
class Drift:
    """Two reports of the same plans compared (:func:`report_drift`).

    Attributes:
      old, new: how to name each report (its file, or ``measured now``).
      old_compiler, new_compiler: the compiler that made each (``compiler not recorded`` for a
        report written before reports named it).
      threshold: how far (relative) a figure moved to be listed.
      moved: each figure that moved more than ``threshold`` (a plan compiled in one report and
        refused in the other: its peak, ``none`` on the refused side).
      steady: the plans compared whose every figure stayed within ``threshold``.
      unmatched: plans in one report only, each with the report it is in.
      layout: that the reports were compiled for other devices, meshes or sizes (their figures
        need not agree), else ``None``.
    """

    old: str
    new: str
    old_compiler: str
    new_compiler: str
    threshold: float
    moved: tuple[Moved, ...]
    steady: tuple[str, ...]
    unmatched: tuple[tuple[str, str], ...] = ()
    layout: str | None = None

    @property
    def holds(self) -> bool:
        """No figure moved more than the threshold (plans in one report only aside)."""
        return not self.moved

    def lines(self) -> list[str]:
        """What the comparison found, as text lines: the two reports and their compilers, each
        figure that moved, the plans that did not, and a verdict."""
        same = self.old_compiler == self.new_compiler
        out = [f"compare {self.old} ({self.old_compiler}) with {self.new} ("
               + ("the same compiler" if same else self.new_compiler) + "):"]
        if self.layout:
            out.append(f"  {self.layout}")
        out += [f"  MOVED {m.line()}" for m in self.moved]
        if self.steady:
            out.append(f"  within {self.threshold:.0%}: {', '.join(self.steady)}")
        out += [f"  {name}: only in {where}" for name, where in self.unmatched]
        plans = sorted({m.plan for m in self.moved})
        a, b = self.old_compiler.split(", "), self.new_compiler.split(", ")
        if len(a) == len(b) and a[0] == b[0]:  # the same kind: name what differs only
            a, b = [x for x, y in zip(a, b) if x != y], [y for x, y in zip(a, b) if x != y]
        between = ("the same compiler" if same else f"{', '.join(a)} and {', '.join(b)}")
        if self.moved:
            out.append(f"{len(self.moved)} figure(s) of {len(plans)} plan(s) ({', '.join(plans)}) "
                       f"moved more than {self.threshold:.0%} between {between}.")
        else:
            out.append(f"no figure of the {len(self.steady)} plan(s) compared moved more than "
                       f"{self.threshold:.0%} between {between}.")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new, "old_compiler": self.old_compiler,
                "new_compiler": self.new_compiler, "threshold": self.threshold,
                "holds": self.holds, "moved": [m.to_json() for m in self.moved],
                "steady": list(self.steady), "unmatched": [list(u) for u in self.unmatched],
                "layout": self.layout}


def _compiler(r: Report) -> str:
    return r.compiler.describe() if r.compiler is not None else "compiler not recorded"


def _where(r: Report) -> str:
    acc = r.accelerator
    sizes = "" if not r.sizes else ", sizes " + " ".join(f"{k}={v}" for k, v in r.sizes.items())
    if acc is None:
        return f"this machine's {r.capabilities.backend}{sizes}"
    mesh = ",".join(f"{k}={v}" for k, v in (acc.get("mesh") or {}).items())
    return f"{acc.get('name')}" + (f" (mesh {mesh})" if mesh else "") + sizes


def _moved(a: float | None, b: float | None, threshold: float) -> bool:
    if a is None and b is None:
        return False
    if a is None or b is None:
        return True
    return abs(b - a) > threshold * max(abs(a), 1)


def report_drift(old: Report, new: Report, *, threshold: float = THRESHOLD,
                    old_name: str = "the old report", new_name: str = "the new report",
                    plans: tuple[str, ...] | None = None) -> Drift:
    """Each compiled figure of each plan of ``old`` against the same plan in ``new``.

    Args:
      old, new: two reports (:meth:`Report.load`, or ``new`` measured now), by any compilers.
      threshold: how far (relative, of the old figure) a figure may move unlisted.
      old_name, new_name: how to name the reports (their files).
      plans: only these plans (``None``: every plan of either report).

    Returns:
      A :class:`Drift`: both compilers, each figure of :data:`FIGURES` that moved more than
      ``threshold``, a plan compiled in one and refused (out of device memory) in the other,
      the plans that held, and those in one report only.
    """
    if not 0 <= threshold < 10:
        raise ValueError(f"report_drift: threshold={threshold!r} must be a fraction from 0 "
                         "(0.05 is 5 %). Fix: threshold=0.05.")
    then = {p.name: p for p in old.plans}
    now = {p.name: p for p in new.plans}
    then_refused = {r.name for r in old.refused}
    now_refused = {r.name for r in new.refused}
    names = list(dict.fromkeys([*then, *then_refused, *now, *now_refused]))
    if plans is not None:
        names = [n for n in names if n in plans]
    moved: list[Moved] = []
    steady: list[str] = []
    unmatched: list[tuple[str, str]] = []
    for n in names:
        in_old, in_new = n in then or n in then_refused, n in now or n in now_refused
        if not (in_old and in_new):
            unmatched.append((n, old_name if in_old else new_name))
            continue
        a, b = then.get(n), now.get(n)
        if a is None or b is None:  # refused (out of device memory) by one compiler or both
            if a is not None or b is not None:
                moved.append(Moved(n, "peak/device (none: refused as out of device memory)",
                                   None if a is None else a.device_peak,
                                   None if b is None else b.device_peak))
            else:
                steady.append(n)
            continue
        got = [Moved(n, label, get(a), get(b), nbytes) for label, get, nbytes in FIGURES
               if _moved(get(a), get(b), threshold)]
        moved += got
        if not got:
            steady.append(n)
    layout = None
    if _where(old) != _where(new):
        layout = (f"the reports were compiled for other devices or sizes ({_where(old)}; "
                  f"{_where(new)}): their figures need not agree.")
    return Drift(old_name, new_name, _compiler(old), _compiler(new), threshold, tuple(moved),
                 tuple(steady), tuple(unmatched), layout)
