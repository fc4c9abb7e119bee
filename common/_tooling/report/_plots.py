"""Figures of a measurement :class:`Report` (matplotlib, imported only when drawing): the trade-off
of memory against cost per plan (:func:`plot_report`), the timeline of live bytes over the step
(:func:`plot_timeline`), and the label placement both use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..accelerators._units import fmt_bytes
from ..measurement._report import Report
from ._render import NO_MODULE, need, natural, layer_bytes, compiled_by


#: Where a label may go, relative to its point (in points), nearest first: right, above, left,
#: below and the diagonals, on rings farther out.
_RING = ((1, 0.3), (1, -1.3), (-1, 0.3), (-1, -1.3), (0, 1.0), (0, -2.0), (1, 1.2), (-1, 1.2),
         (1, -2.2), (-1, -2.2))
_OFFSETS = tuple((dx * r, dy * r) for r in (6, 12, 20, 30, 44) for dx, dy in _RING)


def freeze_layout(fig: Any) -> Any:
    """Draws ``fig`` once (its layout engine places the axes) and turns the engine off, so that
    label boxes measured afterwards stay where they were measured. Returns the renderer."""
    fig.canvas.draw()
    fig.set_layout_engine("none")
    return fig.canvas.get_renderer()


def place_labels(ax: Any, points: list[tuple[float, float, str]], renderer: Any,
                 fontsize: Any = "small") -> list[Any]:
    """Annotates each ``(x, y, text)`` point where the label overlaps no other label, no point's
    marker, the legend or a text already there, and stays inside the axes: the first free place
    of :data:`_OFFSETS`. A label with no
    free place is written as a number at its point, and ``n: text`` goes below the axes.
    Call :func:`freeze_layout` first (the boxes are measured in display coordinates).

    Returns:
      The label artists (numbers included), for tests to measure.
    """
    frame = ax.get_window_extent(renderer)
    markers = _marker_boxes(ax)
    # what is there already: the legend and texts (a budget marked at the edge)
    boxes: list[Any] = [t.get_window_extent(renderer) for t in ax.texts]
    if ax.get_legend() is not None:
        boxes.append(ax.get_legend().get_window_extent(renderer))
    out: list[Any] = []
    missing: list[str] = []

    def put(x: float, y: float, text: str) -> Any:
        for dx, dy in _OFFSETS:
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                            fontsize=fontsize, ha="left" if dx > 0 else "right" if dx < 0 else
                            "center", va="bottom" if dy >= 0 else "top")
            bb = t.get_window_extent(renderer)
            inside = (bb.x0 >= frame.x0 and bb.x1 <= frame.x1 and bb.y0 >= frame.y0
                      and bb.y1 <= frame.y1)
            if inside and not any(bb.overlaps(o) for o in boxes + markers):
                boxes.append(bb)
                return t
            t.remove()
        return None

    later: dict[tuple[float, float], list[int]] = {}  # point -> the numbers of its lost labels
    for x, y, text in points:
        t = put(x, y, text)
        if t is None:
            missing.append(text)
            later.setdefault((x, y), []).append(len(missing))
        else:
            out.append(t)
    for (x, y), nums in later.items():  # one label of numbers per point: "3", "3,4" or "3-9"
        t = None
        for text in (",".join(map(str, nums)), f"{nums[0]}-{nums[-1]}"):
            t = t or put(x, y, text)
        out.append(t or ax.annotate(f"{nums[0]}-{nums[-1]}", (x, y), fontsize=fontsize))
    if missing:
        out.append(_footnote(ax.figure, "; ".join(f"{i}: {m}" for i, m in enumerate(missing, 1)),
                             renderer, fontsize))
    return out


def _footnote(fig: Any, text: str, renderer: Any, fontsize: Any) -> Any:
    """``text`` (wrapped) below everything: the figure grows by its height and the axes keep their
    size in pixels, so the labels placed on them stay where they were measured."""
    import textwrap

    note = fig.text(0.01, 0.005, textwrap.fill(text, 120), fontsize=fontsize, ha="left",
                    va="bottom", gid="footnote")
    w, h = fig.get_size_inches()
    dh = (note.get_window_extent(renderer).height + 8) / fig.dpi
    places = [a.get_position() for a in fig.axes]
    fig.set_size_inches(w, h + dh)
    for a, pos in zip(fig.axes, places):
        a.set_position([pos.x0, (pos.y0 * h + dh) / (h + dh), pos.width, pos.height * h / (h + dh)])
    return note


def _marker_boxes(ax: Any) -> list[Any]:
    """A box around every marker drawn in ``ax`` (plotted lines' markers and scatter points), as
    large as the marker (the chosen plan's star is larger than a point)."""
    import math

    scale = ax.figure.dpi / 72  # points to pixels
    out = []
    for ln in ax.get_lines():
        if ln.get_marker() in (None, "None", "none", "", " "):
            continue
        half = ln.get_markersize() * scale / 2 + 1
        for px, py in ln.get_transform().transform(ln.get_xydata()):
            out.append(_box(px - half, py - half, px + half, py + half))
    for coll in ax.collections:
        sizes = list(coll.get_sizes()) or [36.0]
        for i, (px, py) in enumerate(coll.get_offset_transform().transform(coll.get_offsets())):
            half = math.sqrt(sizes[i % len(sizes)]) * scale / 2 + 1
            out.append(_box(px - half, py - half, px + half, py + half))
    return out


def _box(x0: float, y0: float, x1: float, y1: float) -> Any:
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(x0, y0, x1, y1)


def frame_with_budget(ax: Any, xs: list[float], budget: float, label: str) -> None:
    """x limits that frame the points; the budget as a line where it falls near them, else as an
    arrow at the edge it lies beyond (a far budget squeezed every point into a corner)."""
    lo, hi = min(xs), max(xs)
    pad = (hi - lo) * 0.12 or abs(hi) * 0.05 or 1.0
    if lo - 3 * pad <= budget <= hi + 3 * pad:  # near: in the frame
        lo, hi = min(lo, budget), max(hi, budget)
        ax.set_xlim(lo - pad, hi + pad)
        ax.axvline(budget, color="tab:red", linestyle="--", linewidth=1, label=label)
        return
    ax.set_xlim(lo - pad, hi + pad)
    right = budget > hi
    ax.annotate(f"{label} {'→' if right else '←'}", xy=(1.0 if right else 0.0, 0.99),
                xycoords="axes fraction", ha="right" if right else "left", va="top",
                color="tab:red", fontsize="small")
    ax.plot([1.0 if right else 0.0], [0.5], marker=">" if right else "<", color="tab:red",
            transform=ax.transAxes, clip_on=False, linestyle="none")


def _mib(n: int) -> float:
    return n / 2**20


def layers_path(path: str | Path) -> Path:
    """Where :func:`plot_report` writes the per-layer figure next to ``path``."""
    p = Path(path)
    return p.with_name(p.stem + ".layers" + (p.suffix or ".png"))


def plot_report(report: Report, path: str | Path) -> tuple[Path, Path]:
    """Writes two PNG figures: the trade-off (``path``) and residual bytes per layer.

    The trade-off figure (:func:`tradeoff_figure`) has, per plan, device and host activation
    bytes (bars) with the FLOP and step-time ratios against the baseline, and activation bytes
    against step-time ratio (or FLOP ratio when the steps were not timed, or timed on CPU, whose
    step times rank nothing an accelerator does). The second figure (``OUT.layers.png``) has
    residual bytes per module path and plan. Uses matplotlib's Agg canvas directly, so the
    global backend is left alone.

    Returns:
      The two paths written.
    """
    figure = need("matplotlib.figure", "plotting a report")
    agg = need("matplotlib.backends.backend_agg", "plotting a report")
    out = Path(path)
    if out.suffix.lower() != ".png":
        out = out.with_suffix(out.suffix + ".png") if out.suffix else out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    names = list(report.names)
    tradeoff_figure(report).savefig(out, dpi=110)

    paths, table = layer_bytes(report)
    named = [q for q in paths if q != NO_MODULE]
    width_in = min(18.0, max(7.0, 0.5 * len(named) * max(1, len(names)) ** 0.5 + 4))
    fig = figure.Figure(figsize=(width_in, 4.8), layout="constrained")
    agg.FigureCanvasAgg(fig)
    ax, ax_un = fig.subplots(1, 2, width_ratios=[max(1, len(named)), 1.5])
    colors = [f"C{j % 10}" for j in range(len(names))]

    def bars(axis: Any, cols: list[str]) -> None:
        width = 0.8 / max(1, len(names))
        px = list(range(len(cols)))
        for j, name in enumerate(names):
            offs = [i - 0.4 + width * (j + 0.5) for i in px]
            d = [_mib(table[name].get(q, (0, 0))[0]) for q in cols]
            h = [_mib(table[name].get(q, (0, 0))[1]) for q in cols]
            axis.bar(offs, d, width, color=colors[j], label=name)
            if any(h):
                axis.bar(offs, h, width, bottom=d, color=colors[j], alpha=0.45, hatch="//",
                         label=f"{name} (host)")
        axis.set_xticks(px, cols, rotation=30, ha="right")
        top = max((_mib(sum(table[n].get(q, (0, 0)))) for n in names for q in cols), default=0.0)
        axis.set_ylim(0, top * 1.1 or 1.0)

    if named:
        bars(ax, named)
        ax.set_title("residuals per module (hatched: offloaded to host)")
    else:
        ax.text(0.5, 0.5, "no residual was made in a module: run the model's modules\n"
                "through an adapter (annotate) or remat_common.adapter.module_scope",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    ax.set_ylabel("activation residuals (MiB)")
    bars(ax_un, [NO_MODULE])
    ax_un.set_title("outside every module")
    handles, labels = ax_un.get_legend_handles_labels()
    (ax if named else ax_un).legend(*(ax.get_legend_handles_labels() if named else
                                      (handles, labels)), fontsize="small")
    second = layers_path(out)
    fig.savefig(second, dpi=110)
    return out, second


def tradeoff_figure(report: Report) -> Any:
    """The trade-off figure of :func:`plot_report` (a matplotlib ``Figure``): per plan, device
    and host activation bytes (bars) with the FLOP ratio (and, measured on an accelerator, the
    step-time ratio) against the baseline; and activation bytes against that ratio, every point
    labelled where no label overlaps another (:func:`place_labels`). Step times measured on CPU
    are left out of the figure: they rank nothing an accelerator does (the report's table has
    them, marked so)."""
    figure = need("matplotlib.figure", "plotting a report")
    agg = need("matplotlib.backends.backend_agg", "plotting a report")
    names = list(report.names)
    x = list(range(len(names)))
    dev = [_mib(p.device_bytes) for p in report.plans]
    host = [_mib(p.host_bytes) for p in report.plans]
    cpu = report.capabilities.backend == "cpu"
    fig = figure.Figure(figsize=(12, 4.8), layout="constrained")
    agg.FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(1, 2)
    ax.bar(x, dev, color="tab:blue", label="device activations")
    ax.bar(x, host, bottom=dev, color="tab:orange", hatch="//", label="host (offloaded)")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("activation residuals (MiB)")
    ax.set_title("what each plan keeps, and what it costs")
    rx = ax.twinx()
    fr = [p.flop_ratio for p in report.plans]
    sr = [None if cpu else p.step_time_ratio for p in report.plans]
    if any(v is not None for v in fr):
        rx.plot([i for i, v in zip(x, fr) if v is not None], [v for v in fr if v is not None],
                "kD-", label="FLOP ratio")
    if any(v is not None for v in sr):
        rx.plot([i for i, v in zip(x, sr) if v is not None], [v for v in sr if v is not None],
                "s--", color="tab:red", label="step-time ratio")
    rx.axhline(1.0, color="grey", lw=0.8, ls=":")
    rx.set_ylabel(f"ratio vs {report.baseline!r}")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = rx.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize="small")

    timed = all(v is not None for v in sr)
    xs = sr if timed else fr
    labels: list[tuple[float, float, str]] = []
    for p, xv, d, h in zip(report.plans, xs, dev, host):
        if xv is None:
            continue
        ax2.scatter([xv], [d], color="tab:blue", zorder=3, clip_on=False)  # 0 B sits on the axis
        if h:
            ax2.scatter([xv], [h], facecolors="none", edgecolors="tab:orange", zorder=3,
                        clip_on=False)
        label = p.name if p.flop_ratio is None or timed is False else \
            f"{p.name} ({p.flop_ratio:.2f}x FLOPs)"
        labels.append((xv, d, label))
    if labels:  # room around the points for their labels
        lx, ly = [v for v, _, _ in labels], [v for _, v, _ in labels]
        px = (max(lx) - min(lx)) * 0.25 or 0.05
        py = (max(ly) - min(ly)) * 0.25 or max(max(ly), 1.0) * 0.1
        ax2.set_xlim(min(lx) - px, max(lx) + 2 * px)
        ax2.set_ylim(0.0, max(ly) + 2 * py)  # bytes: the axis starts at 0
    ax2.set_xlabel(("step-time" if timed else "FLOP") + f" ratio vs {report.baseline!r}")
    ax2.set_ylabel("device activation residuals (MiB)")
    ax2.set_title("trade-off (lower left is better; hollow: host bytes)")
    ax2.grid(True, alpha=0.3)
    caps = report.capabilities
    timing = ("; step times measured on cpu left out: they rank nothing a GPU or TPU does"
              if cpu and any(p.step_time_ratio is not None for p in report.plans) else "")
    fig.suptitle(f"remat report: {caps.backend} ({caps.device_kind}), {compiled_by(report)}{timing}",
                 fontsize="medium")
    renderer = freeze_layout(fig)
    place_labels(ax2, labels, renderer)
    return fig

def timeline_path(path: str | Path) -> Path:
    """Where :func:`plot_timeline` writes next to ``path`` (``OUT.timeline.png``)."""
    p = Path(path)
    return p.with_name(p.stem + ".timeline" + (p.suffix or ".png"))


KIND_COLORS = {
    "parameter": "#4c72b0", "optimizer state": "#8172b3", "gradient": "#64b5cd",
    "input batch": "#937860", "saved residual": "#c44e52", "offloaded residual": "#dd8452",
    "temporary (forward)": "#55a868", "temporary (backward)": "#8de5a1",
    "temporary (optimizer)": "#b0b0b0", "output": "#da8bc3", "unwritten output": "#eeeeee",
    "allocator slack": "#ffffff", "other argument": "#999999", "compiler accounting": "#d9d9d9",
}
#: The other kinds in a timeline by module: greys, so the modules stand out.
KIND_GREYS = {
    "parameter": "#9a9a9a", "optimizer state": "#b4b4b4", "gradient": "#cfcfcf",
    "input batch": "#7f7f7f", "temporary (optimizer)": "#dadada", "output": "#c4c4c4",
    "unwritten output": "#eeeeee", "allocator slack": "#ffffff", "other argument": "#8c8c8c",
    "compiler accounting": "#d9d9d9",
}
#: How a timeline can be stacked: by kind, or with its activations by module at layer depth.
TIMELINE_BY = ("kind", "module")
#: Colors of the module series (a module has the same color in every plan's panel).
_MODULE_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                   "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
                   "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31",
                   "#843c39", "#7b4173", "#3182bd", "#e6550d")


def module_colors(labels: Any) -> dict[str, str]:
    """A color per module series label, in natural order (the same module, the same color, in
    every plan's panel)."""
    return {m: _MODULE_PALETTE[i % len(_MODULE_PALETTE)]
            for i, m in enumerate(sorted(set(labels), key=natural))}


def series_label(b: Any, module: str) -> str:
    """A timeline module series as shown: a layer group by its label (``blocks.0-3``), the
    root's own code as ``<root>``."""
    from ..breakdown._figures import NO_MODULE as NONE, OTHER_MODULES

    if module in (NONE, OTHER_MODULES):
        return module
    return b.layer_of(module)[0] or "<root>"


def timeline_series(b: Any, timeline: Any, by: str) -> list[tuple[str, bool, tuple[int, ...]]]:
    """``(label, is a module, bytes per point)`` stacked bottom up: by kind, or (``by="module"``)
    the activation kinds replaced by the modules' series, so the stack's total is the same."""
    from ..breakdown._figures import ACTIVATION_KINDS

    kinds = [(k, False, v) for k, v in zip(timeline.kinds, timeline.bytes)]
    if by == "kind" or not timeline.modules:
        return kinds
    first = ("parameter", "optimizer state", "gradient", "input batch")  # below the activations
    mods = [(series_label(b, m), True, v) for m, v in zip(timeline.modules, timeline.module_bytes)]
    return ([s for s in kinds if s[0] in first] + mods[::-1]
            + [s for s in kinds if s[0] not in first and s[0] not in ACTIVATION_KINDS])


def _check_by(by: str) -> None:
    if by not in TIMELINE_BY:
        raise ValueError(f"remat_common.measurement.plot_timeline: by must be one of "
                         f"{list(TIMELINE_BY)}, got {by!r}. Fix: by='module' stacks the "
                         "activations by module, by='kind' by kind.")


def plot_timeline(report: Report, path: str | Path, by: str = "kind") -> Path:
    """Writes a PNG: each plan's live device bytes over its schedule, stacked by kind (``by=
    "module"``: its activations by module at layer depth, the other kinds as they are), the
    backward pass shaded and the peak marked, plans side by side on one bytes axis; under them,
    where a plan's program holds host memory (offloaded residuals on a GPU/TPU), its host
    bytes the same way."""
    _check_by(by)
    figure = need("matplotlib.figure", "plotting a report")
    agg = need("matplotlib.backends.backend_agg", "plotting a report")
    plans = [p for p in report.plans if p.breakdown is not None and p.breakdown.timeline]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    host = any(p.breakdown is not None and p.breakdown.host_timeline is not None for p in plans)
    rows = 2 if host else 1
    fig = figure.Figure(figsize=(4.2 * max(1, len(plans)) + 2.2, 4.6 + 3.0 * (rows - 1)),
                        layout="constrained")
    agg.FigureCanvasAgg(fig)
    grid = fig.subplots(rows, max(1, len(plans)), sharey="row", squeeze=False,
                        height_ratios=[1.5, 1] if host else None)
    colors = module_colors(series_label(p.breakdown, m) for p in plans if p.breakdown
                           for tl in (p.breakdown.timeline, p.breakdown.host_timeline) if tl
                           for m in tl.modules)
    modules = list(colors)
    colors.update(KIND_GREYS if by == "module" else KIND_COLORS)
    seen: dict[str, Any] = {}
    for col, p in enumerate(plans):
        b = p.breakdown
        assert b is not None
        for row, tl in enumerate((b.timeline, b.host_timeline)[:rows]):
            ax = grid[row][col]
            if tl is None:
                ax.text(0.5, 0.5, "no host memory", ha="center", va="center",
                        transform=ax.transAxes, fontsize="small")
                ax.set_title(f"{p.name} (host)", fontsize="small")
                continue
            series = timeline_series(b, tl, by)
            xs = list(range(len(series[0][2]) if series else 0))
            polys = ax.stackplot(xs, *[[v / 2**20 for v in vals] for _, _, vals in series],
                                 colors=[colors.get(lab, "#cccccc") for lab, _, _ in series],
                                 edgecolor="#00000022", linewidth=0.3)
            for (lab, _, _), poly in zip(series, polys):
                seen.setdefault(lab, poly)
            if tl.backward is not None:
                ax.axvspan(*tl.backward, color="#000000", alpha=0.05, lw=0)
                ax.text(tl.backward[0], 0, " backward", fontsize="x-small", va="bottom")
            top = tl.max_bytes
            total = b.peak if row == 0 else sum(r.bytes for r in b.host_rows)
            ax.axvline(tl.peak, color="k", lw=0.8, ls="--")
            ax.annotate(f"peak {fmt_bytes(top)}\n(compiled {fmt_bytes(total)})",
                        (tl.peak, top / 2**20), textcoords="offset points", xytext=(4, -26),
                        fontsize="small")
            ax.set_title(p.name if row == 0 else f"{p.name} (host)")
            ax.set_xlabel("schedule point (forward, backward, optimizer)")
    grid[0][0].set_ylabel("live device memory (MiB)")
    if host:
        grid[1][0].set_ylabel("live host memory (MiB)")
    order = [k for k in KIND_COLORS if k in seen] + [m for m in modules if m in seen]
    fig.legend([seen[k] for k in order], order, loc="outside right center", fontsize="small",
               title="by module" if by == "module" else "by kind")
    caps = report.capabilities
    compilers = ", ".join(sorted({p.breakdown.compiler for p in plans if p.breakdown}))
    fig.suptitle(f"live bytes over each plan's compiled step ({compilers} compiler), jax "
                 f"{caps.jax}" + (", activations by module" if by == "module" else ""),
                 fontsize="medium")
    fig.savefig(out, dpi=110)
    return out
