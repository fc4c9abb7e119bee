"""Rendering a measurement :class:`Report` (plain data, ``_report.py``): rich tables, plain text and
matplotlib figures. Functions of a report; the report imports none of them.

rich and matplotlib come with the ``examples`` extra; they are imported only when rendering.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from ..._errors import CapabilityError
from ..._paths import in_subtree
from ..._verify import Residual
from ..targets._profiles import fmt_bytes
from ..measurement._report import PlanReport, Report

#: The row of what no module made: the loss, the optimizer, constants (outside the model).
NO_MODULE = "(no module)"


def _need(module: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CapabilityError(
            f"{what} needs the {module.split('.')[0]!r} package, which is not installed. "
            "Fix: pip install 'jax-remat-plan[examples]' (or the package alone)."
        ) from None


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _fmt_flops(f: float | None) -> str:
    if f is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f}"


def _fmt_seconds(s: float | None, ms: bool = False) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if ms else f"{s:.2f} s"


def _flop_cell(p: PlanReport) -> str:
    """The FLOP ratio, or ``unknown`` when this plan's FLOPs could not be made right."""
    if p.flop_ratio is None and p.flops_unknown:
        return "unknown"
    return _fmt_ratio(p.flop_ratio)


def _placement(p: PlanReport) -> str:
    c = p.placement
    if c is None:
        return "-"
    if c.error is not None:
        return "export failed"
    word = "yes" if c.placed else "NO"
    return f"{word} ({c.to_host}/{c.to_device})" if c.offloaded else word


def _verify(p: PlanReport) -> str:
    if p.plan is None:
        return "-"
    return "ok" if not p.problems else f"{len(p.problems)} problem(s)"


def _natural(path: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path))


def residual_module(r: Residual) -> str | None:
    """The module a residual was made in: its name's path, else the module scope it was traced
    in (``""``: the root's own code); ``None`` outside every module."""
    return r.path if r.path is not None else r.module


def stacked_label(r: Residual) -> str:
    """A residual's row in the per-module table: its module path, with ``(stacked xN)`` when it
    holds the N iterations of a scan (a scanned layer group is named after its first layer)."""
    module = residual_module(r)
    if module is None:
        return NO_MODULE
    label = module or "<root>"
    return f"{label} (stacked x{r.layers})" if r.layers > 1 else label


def shared_label(label: str, path: str | None, shared: tuple[tuple[str, tuple[str, ...]], ...]
                 ) -> str:
    """``label`` with ``(shared xN: layers ...)`` when ``path`` is inside the first layer of a group
    of list layers that share its trace: the row then counts every layer of the group."""
    for first, layers in shared:
        if path is not None and in_subtree(path, first):
            shown = (", ".join(layers) if len(layers) <= 6
                     else f"{', '.join(layers[:3])}, ..., {layers[-1]}")
            return f"{label} (shared x{len(layers)}: {shown})"
    return label


def layer_bytes(report: Report) -> tuple[list[str], dict[str, dict[str, tuple[int, int]]]]:
    """Module paths (naturally sorted, :data:`NO_MODULE` last) and per plan ``{path: (device,
    host)}``."""
    table: dict[str, dict[str, tuple[int, int]]] = {}
    paths: set[str] = set()
    for p in report.plans:
        row: dict[str, tuple[int, int]] = {}
        for r in p.residuals:
            if r.kind == "argument":
                continue
            label = shared_label(stacked_label(r), residual_module(r), p.shared)
            dev, host = row.get(label, (0, 0))
            row[label] = (dev + r.nbytes, host) if r.placement == "device" else (dev, host + r.nbytes)
        table[p.name] = row
        paths |= set(row)
    ordered = sorted(paths - {NO_MODULE}, key=_natural) + ([NO_MODULE] if NO_MODULE in paths else [])
    return ordered, table


def compiled_by(report: Report) -> str:
    """``compiled by XLA:TPU, libtpu 0.0.48, jax 0.11.2 / jaxlib 0.11.2`` (a report from before
    reports recorded their compiler: its jax version only)."""
    if report.compiler is None:
        return f"compiler not recorded (jax {report.capabilities.jax})"
    return f"compiled by {report.compiler.describe()}"


def _fits(report: Report, p: PlanReport) -> str:
    over = report.exceeds_by(p.name)
    if over is None:
        return "?"
    return "yes" if over == 0 else f"NO (+{fmt_bytes(over)})"


def sizes_line(report: Report) -> str | None:
    """``sizes measured: d_model=4096 n_layers=32 ... batch=1`` (``None``: the report names none)."""
    if not report.sizes:
        return None
    return "sizes measured: " + " ".join(f"{k}={v}" for k, v in report.sizes.items())


def target_table(report: Report) -> Any:
    """A report compiled for an accelerator: per device figures of its compiler, fits or not."""
    rich_table = _need("rich.table", "rendering a report table")
    acc = report.accelerator or {}
    mesh = ",".join(f"{k}={v}" for k, v in (acc.get("mesh") or {}).items())
    t = rich_table.Table(title=f"remat plans compiled for {acc.get('description')} (mesh {mesh}), "
                               f"per device; ratios (x) vs {report.baseline!r}; "
                               f"{compiled_by(report)}", title_justify="left",
                         caption=sizes_line(report), caption_justify="left")
    for col, just in (("plan", "left"), ("device act.", "right"), ("host act.", "right"),
                      ("peak/device", "right"), ("temp", "right"), ("host temp", "right"),
                      ("FLOPs", "right"), ("fits", "left"), ("XLA remat", "left"),
                      ("on host", "left"), ("compile", "right"), ("check", "left")):
        t.add_column(col, justify=just)
    for p in report.plans:
        t.add_row(
            p.name, fmt_bytes(p.device_bytes), fmt_bytes(p.host_bytes),
            fmt_bytes(p.memory.device_total), fmt_bytes(p.memory.temp_size_in_bytes),
            fmt_bytes(p.memory.host_temp_size_in_bytes), _flop_cell(p), _fits(report, p),
            "YES" if p.xla_remat else "no", _placement(p),
            _fmt_seconds(p.timing.lower_s + p.timing.compile_s), _verify(p))
    for r in report.refused:
        t.add_row(r.name, *("-",) * 6, "NO (refused)", "-", "-", _fmt_seconds(r.compile_s),
                  "refused")
    return t


def report_table(report: Report) -> Any:
    """One row per plan: activation bytes, compiled memory, FLOPs, placement, times."""
    if report.accelerator is not None:
        return target_table(report)
    rich_table = _need("rich.table", "rendering a report table")
    t = rich_table.Table(title=f"remat plans: ratios (x) vs {report.baseline!r}, measured on "
                               f"{report.capabilities.backend}; {compiled_by(report)}",
                         title_justify="left", caption=sizes_line(report), caption_justify="left")
    for col, just in (("plan", "left"), ("device act.", "right"), ("host act.", "right"),
                      ("xfer/step", "right"), ("temp", "right"), ("FLOPs", "right"),
                      ("on host (cuda)", "left"), ("compile", "right"), ("step", "right"),
                      ("check", "left")):
        t.add_column(col, justify=just)
    for p in report.plans:
        t.add_row(
            p.name, fmt_bytes(p.device_bytes), fmt_bytes(p.host_bytes),
            fmt_bytes(p.host_transfer_bytes), fmt_bytes(p.memory.temp_size_in_bytes),
            _flop_cell(p), _placement(p),
            _fmt_seconds(p.timing.lower_s + p.timing.compile_s),
            _fmt_seconds(p.timing.median_s, ms=True) + (
                "" if p.step_time_ratio is None else f" {_fmt_ratio(p.step_time_ratio)}"),
            _verify(p),
        )
    return t


def layers_table(report: Report) -> Any:
    """Residual bytes per module path (rows) and plan (columns); ``+ host`` where offloaded."""
    rich_table = _need("rich.table", "rendering a report table")
    paths, table = layer_bytes(report)
    t = rich_table.Table(title="activation residuals by module", title_justify="left")
    t.add_column("module")
    for p in report.plans:
        t.add_column(p.name, justify="right")
    for path in paths:
        cells = []
        for p in report.plans:
            dev, host = table[p.name].get(path, (0, 0))
            cell = fmt_bytes(dev) if dev else ""
            if host:
                cell = (cell + " + " if cell else "") + f"{fmt_bytes(host)} host"
            cells.append(cell)
        t.add_row(path, *cells)
    return t


def _note_applies(figure: str, report: Report) -> bool:
    """Whether a figure's caveat speaks of something this report shows: host figures only when a
    plan offloads, placements only when checked, step times only when timed, CPU's
    ``peak_memory_in_bytes`` only when no breakdown gives the peak."""
    plans = report.plans
    offloads = any(p.host_bytes or p.placement is not None for p in plans)
    if figure in ("host_*", "host_transfer_bytes"):
        return offloads
    if figure == "placement":
        return any(p.placement is not None for p in plans)
    if figure == "step_time":
        return any(p.timing.steps for p in plans) or report.accelerator is not None
    if figure == "peak_memory_in_bytes":
        return any(p.breakdown is None for p in plans)
    return True


def notes_lines(report: Report) -> list[str]:
    """The backend notes and each plan's boundaries, problems and notes, as text lines."""
    caps = report.capabilities
    acc = report.accelerator
    if acc is not None:
        lines = [f"compiled for {acc['description']} on this {caps.backend} machine (nothing ran), "
                 f"{compiled_by(report)}, jax_remat3={caps.remat3}; device memory "
                 f"{fmt_bytes(acc['memory_bytes'])} per device. Figures: {acc['source']}. Columns: "
                 "activation residuals kept on device / moved to host, the compiled step's peak per "
                 "device (arguments + outputs + temp - aliased), temp and host temp, FLOP ratio, "
                 "whether the peak fits the device, whether XLA rematerialized on its own, host "
                 "placements (to host/back) in the compiled program, plan check."]
    else:
        lines = [f"measured on {caps.backend} ({caps.device_kind}), {compiled_by(report)}, "
                 f"jax_remat3={caps.remat3}. Columns: activation residuals kept on device / moved "
                 "to host, host transfer per step, compiled temp memory, FLOP and step-time "
                 "ratios, offload placements (to host/back) in the step lowered for cuda, plan "
                 "check."]
    for f in report.figures:
        if _note_applies(f.figure, report):
            lines.append(f"  {f.figure}: {'' if f.meaningful else '(not meaningful here) '}{f.note}")
    shared: dict[str, list[str]] = {}
    for p in report.plans:
        for msg in p.notes:
            shared.setdefault(msg, []).append(p.name)
    for p in report.plans:
        for b in p.boundaries:
            lines.append(f"{p.name}: boundary {b}")
        for msg in p.problems:
            lines.append(f"{p.name}: PROBLEM: {msg}")
        lines.extend(f"{p.name}: {c.note()}" for c in p.layout if not c.flagged)
        if p.placement is not None and p.placement.error:
            lines.append(f"{p.name}: placement check failed: {p.placement.error}")
        if p.placement is not None and p.placement.resharded:
            lines.append(f"{p.name}: {p.placement.resharded} host placement(s) change the sharding of "
                         "the value they move (an offload should change only its memory kind)")
        if p.flops_unknown:
            lines.append(f"{p.name}: FLOPs unknown: {p.flops_unknown}")
        over = report.exceeds_by(p.name)
        if over:
            lines.append(f"{p.name}: DOES NOT FIT: the peak per device exceeds the device memory "
                         f"by {fmt_bytes(over)}")
        if p.xla_remat:
            lines.append(f"{p.name}: XLA CHANGED THE PROGRAM: the target compiler rematerialized "
                         f"on its own to fit the device ({p.xla_remat}); the figures are those of "
                         "its program, not of the plan as written")
    for r in report.refused:
        lines.append(f"{r.name}: REFUSED: the {acc['name'] if acc else 'target'} compiler refused "
                     "the step as out of its device memory, so it does not fit and has no "
                     f"figures (the ratios are against {report.baseline!r}): {r.error}")
    for msg, names in shared.items():
        lines.append(f"note ({', '.join(names)}): {msg}")
    return lines


def print_report(report: Report, console: Any = None) -> None:
    """Prints both tables and the notes to ``console`` (a ``rich.console.Console``)."""
    rich_console = _need("rich.console", "printing a report")
    console = console or rich_console.Console()
    console.print(report_table(report))
    console.print(layers_table(report))
    if any(p.breakdown is not None for p in report.plans):
        console.print(peak_table(report))
        console.print(modules_table(report))
        note = save_all_note(report)
        if note is not None:
            console.print(note, markup=False, highlight=False)
    for line in notes_lines(report):
        console.print(line, markup=False, highlight=False)


def render_text(report: Report, width: int = 160) -> str:
    """What :func:`print_report` prints, as plain text."""
    rich_console = _need("rich.console", "rendering a report")
    buf = io.StringIO()
    print_report(report, rich_console.Console(file=buf, width=width, color_system=None,
                                              force_terminal=False))
    return buf.getvalue()


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
    figure = _need("matplotlib.figure", "plotting a report")
    agg = _need("matplotlib.backends.backend_agg", "plotting a report")
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
    figure = _need("matplotlib.figure", "plotting a report")
    agg = _need("matplotlib.backends.backend_agg", "plotting a report")
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


def _module_label(module: str | None, note: str | None = None) -> str:
    if module is None:
        where = (note or "").rpartition("; made in ")[2] if "; made in " in (note or "") else ""
        return f"{NO_MODULE} {where}".strip()
    return module or "<root>"


def _peak_cells(report: Report, host: bool, depth: int
                ) -> dict[tuple[str, str], dict[str, int]]:
    from ..breakdown._figures import ACTIVATION_KINDS

    cells: dict[tuple[str, str], dict[str, int]] = {}
    for p in report.plans:
        if p.breakdown is None:
            continue
        for r in (p.breakdown.host_rows if host else p.breakdown.rows):
            module = ""
            if r.kind in ACTIVATION_KINDS:
                cut = None if r.module is None else (
                    ".".join(r.module.split(".")[:depth]) if r.module else "")
                module = _module_label(p.breakdown.layer_of(cut)[0] if cut else cut, r.note)
            row = cells.setdefault((r.kind, module), {})
            row[p.name] = row.get(p.name, 0) + r.bytes
    return cells


def peak_rows(report: Report, depth: int = 2, *, host: bool = False
              ) -> list[tuple[str, str, dict[str, int]]]:
    """``(kind, module, {plan: bytes})``: each plan's bytes at its compiled peak by kind, and the
    activation kinds by module (cut to ``depth`` path segments), in table order; ``host``: the
    same for host memory at the host peak (what the compiler placed there: offloaded residuals)."""
    from ..breakdown._figures import KINDS

    return [(k, m, v) for (k, m), v in sorted(
        _peak_cells(report, host, depth).items(),
        key=lambda kv: (KINDS.index(kv[0][0]), _natural(kv[0][1])))]


def peak_table(report: Report) -> Any:
    """Each plan's compiled peak by kind (activations by module), from XLA's buffer assignment;
    where a plan's program holds host memory, the host peak's rows after the device's."""
    rich_table = _need("rich.table", "rendering a report table")
    t = rich_table.Table(title="at the compiled peak, by kind and module (XLA's buffer assignment "
                               "of each plan's step)", title_justify="left")
    t.add_column("kind")
    t.add_column("module")
    plans = [p for p in report.plans if p.breakdown is not None]
    for p in plans:
        t.add_column(p.name, justify="right")
    for kind, module, row in peak_rows(report):
        t.add_row(kind, module, *(fmt_bytes(row[p.name]) if p.name in row else "" for p in plans))
    t.add_row("peak", "", *(fmt_bytes(p.breakdown.total) for p in plans if p.breakdown), style="bold")
    host = peak_rows(report, host=True)
    if host:
        for kind, module, row in host:
            t.add_row(f"host: {kind}", module,
                      *(fmt_bytes(row[p.name]) if p.name in row else "" for p in plans))
        t.add_row("host peak", "", *(fmt_bytes(sum(r.bytes for r in p.breakdown.host_rows))
                                     if p.breakdown and p.breakdown.host_rows else ""
                                     for p in plans), style="bold")
    return t


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
            for i, m in enumerate(sorted(set(labels), key=_natural))}


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
    figure = _need("matplotlib.figure", "plotting a report")
    agg = _need("matplotlib.backends.backend_agg", "plotting a report")
    plans = [p for p in report.plans if p.breakdown is not None]
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
            total = b.total if row == 0 else sum(r.bytes for r in b.host_rows)
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


def module_rows(report: Report, depth: int = 2
                ) -> tuple[list[str], dict[str, dict[str, tuple[int, int, int]]], dict[str, int]]:
    """Module labels (naturally sorted, :data:`NO_MODULE` last), per plan ``{label: (kept, at
    the peak, layers)}`` (:meth:`MemoryBreakdown.per_layer`) and ``{label: bytes kept under the
    report's save-all plan}`` for the same layers (empty without one: :attr:`Report.save_all`)."""
    table: dict[str, dict[str, tuple[int, int, int]]] = {}
    save_all: dict[str, int] = {}
    labels: set[str] = set()
    for p in report.plans:
        if p.breakdown is None:
            continue
        row: dict[str, tuple[int, int, int]] = {}
        for r in report.per_layer(p.name):
            label = NO_MODULE if r["module"] is None else r["module"] or "<root>"
            row[label] = (r["saved"], r["peak"], r["layers"])
            if r["save_all"] is not None:
                save_all.setdefault(label, r["save_all"])
        table[p.name] = row
        labels |= set(row)
    ordered = sorted(labels - {NO_MODULE}, key=_natural) + (
        [NO_MODULE] if NO_MODULE in labels else [])
    return ordered, table, save_all


def _per_layer(total: int, n: int) -> str:
    return f" ({fmt_bytes(total // n)} per layer)" if n > 1 else ""


def modules_table(report: Report) -> Any:
    """Per module and plan: the residuals the compiled step keeps, and the activations live at
    its peak; a scanned layer group (``blocks.0-3``) also per layer; and what the same layers
    keep under the report's save-all plan."""
    rich_table = _need("rich.table", "rendering a report table")
    labels, table, save_all = module_rows(report)
    ref = report.save_all
    t = rich_table.Table(title="activations per module: kept for the backward pass / live at the "
                               "peak (compiled)", title_justify="left")
    t.add_column("module")
    plans = [p.name for p in report.plans if p.name in table]
    for name in plans:
        t.add_column(name, justify="right")
    if ref is not None:
        t.add_column(f"kept if all saved ({ref.name})", justify="right")
    for label in labels:
        cells = []
        n_max = 1
        for name in plans:
            kept, peak, n = table[name].get(label, (0, 0, 1))
            n_max = max(n_max, n)
            cell = f"{fmt_bytes(kept)} / {fmt_bytes(peak)}" if kept or peak else ""
            if cell and n > 1:
                cell += f" ({fmt_bytes(kept // n)} / {fmt_bytes(peak // n)} per layer)"
            cells.append(cell)
        if ref is not None:
            value = save_all.get(label)
            cells.append("" if value is None else fmt_bytes(value) + _per_layer(value, n_max))
        t.add_row(label, *cells)
    return t


def save_all_note(report: Report) -> str | None:
    """Why the per-module table has no save-all column, and how to add one; ``None`` when it has."""
    if report.save_all is not None or not any(p.breakdown for p in report.plans):
        return None
    return ("activations per module: no plan of this report keeps every activation, so what each "
            "layer would keep if all were saved is not shown. Fix: measure the un-annotated model "
            "with the others (a plan 'none: null' in the config, and --plans none ...), or a plan "
            "whose rules all say save (the examples' plans/save.yaml).")
