"""Figures people can read: no label over another (their boxes measured by matplotlib's renderer),
axes that frame the points with a far budget marked at the edge, and no CPU step time presented
as a speed result."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from matplotlib.text import Annotation  # noqa: E402

from remat_common.measurement import TunePoint, TuneResult, measure  # noqa: E402
from remat_common.internal import fmt_bytes  # noqa: E402

# matplotlib's figures; the figures plotted are tests/test_report.py's
pytestmark = pytest.mark.lock_only

DATA = Path(__file__).parent / "data"
MIB = 2**20


def _labels(fig: Any, ax: Any) -> list[tuple[str, Any]]:
    """Each point label of ``ax`` (annotations, the budget's excepted) and its box, as drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts
            if isinstance(t, Annotation) and not t.get_text().startswith("budget")]


def _assert_apart(fig: Any, ax: Any) -> list[str]:
    labels = _labels(fig, ax)
    for (a, ba), (b, bb) in itertools.combinations(labels, 2):
        assert not ba.overlaps(bb), f"label {a!r} overlaps {b!r}"
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    for name, box in labels:
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and \
            box.y1 <= frame.y1, f"label {name!r} leaves the axes"
    return [name for name, _ in labels]


def _result(budget: int) -> TuneResult:
    """A tuning run's points as CPU compiles them for a small model: the offload plans and full
    recompute at one place (offload's peak an estimate), several plans close together."""
    rows = [("save", 30.0, 1.000, ("save",) * 4), ("dots", 25.0, 1.10, None),
            ("dots_no_batch", 25.0, 1.12, None), ("names", 27.0, 1.05, None),
            ("offload", 20.0, 1.25, None), ("offload_dots_no_batch", 20.0, 1.25, None),
            ("recompute", 20.0, 1.25, None), ("savex1", 29.0, 1.0, None),
            ("tuned-1", 22.0, 1.15, None), ("tuned-2", 21.0, 1.2, None)]
    points = tuple(TunePoint(n, {"blocks.*": "save"}, a, int(peak * MIB), n.startswith("offload"),
                             0, 0, f * 1e9, f * 1e9) for n, peak, f, a in rows)
    return TuneResult(budget, "flops", None, "blocks", 4, (), points, "tuned-1", None, 10, 1.0, "")


@pytest.mark.parametrize("budget", [800 * MIB, 23 * MIB], ids=["far", "near"])
def test_tune_figure_labels_apart_and_axes_frame_the_points(budget: int) -> None:
    r = _result(budget)
    fig = r.figure()
    (ax,) = fig.axes
    names = _assert_apart(fig, ax)
    assert sorted(n.rstrip("*") for n in names) == sorted(p.name for p in r.points)
    lo, hi = ax.get_xlim()
    peaks = [p.peak / MIB for p in r.points]
    assert lo < min(peaks) and max(peaks) < hi < max(peaks) + 0.5 * (max(peaks) - min(peaks))
    marks = [t.get_text() for t in ax.texts if t.get_text().startswith("budget")]
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("budget")]
    if budget > hi * MIB:  # far: an arrow at the right edge, the points keep the width
        assert marks == [f"budget {fmt_bytes(budget)} →"] and not lines
    else:  # near: a line in the frame
        assert not marks and lines and lo < lines[0].get_xdata()[0] < hi


def test_report_figure_leaves_cpu_step_times_out_and_labels_apart() -> None:
    """The report's scatter ranked plans by CPU step time (recompute 'fastest' at 0.92x with
    1.25x FLOPs). On CPU the figure uses the FLOP ratio, draws no step-time line, and says why."""
    sys.path.insert(0, str(DATA))
    import report_target

    from remat_common.internal import tradeoff_figure

    plans = {"none": None, "recompute": {"layers.*": "recompute"},
             "offload": {"layers.*": "offload"}, "names": {"layers.*": {"save": ["hidden"]}}}
    rep = measure(lambda p: report_target.measure_target(p, batch=8, d_model=16, n_layers=2),
                  plans, steps=1, warmup=0)
    assert all(p.step_time_ratio is not None for p in rep.plans)  # timed ...
    fig = tradeoff_figure(rep)
    bars, scatter = fig.axes[0], fig.axes[1]
    names = _assert_apart(fig, scatter)
    assert {n.split(" (")[0] for n in names} == set(plans)
    if rep.capabilities.backend == "cpu":  # ... but not shown as a speed result
        assert scatter.get_xlabel() == "FLOP ratio vs 'none'"
        legend = [t.get_text() for ax in fig.axes if ax.get_legend() for t in
                  ax.get_legend().get_texts()]
        assert "step-time ratio" not in legend and "FLOP ratio" in legend
        assert "step times measured on cpu left out" in fig._suptitle.get_text()
    assert bars.get_ylabel() == "activation residuals (MiB)"
    assert scatter.get_ylim()[0] == 0.0  # bytes: no negative axis below a plan that keeps ~0


def test_labels_without_a_free_place_become_numbers_named_below() -> None:
    """Forty plans compiled to one peak and one FLOP count: the labels that find no free place
    are numbers at the point, named in a line below the axes; still none over another."""
    points = tuple(TunePoint(f"plan-{i}", {"blocks.*": "save"}, ("save",) * 4 if i == 0 else None,
                             20 * MIB, False, 0, 0, 1e9, 1e9) for i in range(40))
    r = TuneResult(20 * MIB, "flops", None, "blocks", 4, (), points, "plan-0", None, 40, 1.0, "")
    fig = r.figure()
    (ax,) = fig.axes
    names = _assert_apart(fig, ax)
    numbered = [n for n in names if n[0].isdigit()]  # "12" or "12,13" or "12-30"
    (footnote,) = [t.get_text().replace("\n", " ") for t in fig.texts if t.get_gid() == "footnote"]
    fig.canvas.draw()
    box = fig.texts[-1].get_window_extent(fig.canvas.get_renderer())
    assert box.y0 >= 0 and box.y1 < ax.get_window_extent().y0  # on the figure, below the axes
    entries = dict(e.split(": ") for e in footnote.split("; "))
    assert numbered and set(entries) == {str(i) for i in range(1, len(entries) + 1)}
    covered = set()
    for n in numbered:
        a, _, b = n.partition("-")
        covered |= set(n.split(",")) if not b else {str(i) for i in range(int(a), int(b) + 1)}
    assert covered == set(entries)  # every number is at its point
    named = {n for n in names if not n[0].isdigit()}
    assert named | set(entries.values()) == {p.name for p in points} and not named & set(entries.values())
