"""Rendering a measurement :class:`Report` (plain data, ``_report.py``): rich tables, plain text and
matplotlib figures. Functions of a report; the report imports none of them.

rich and matplotlib come with the ``examples`` extra; they are imported only when rendering.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from .._errors import CapabilityError
from .._paths import in_subtree
from .._verify import Residual
from ._report import PlanReport, Report

UNNAMED = "(unnamed)"


def _need(module: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CapabilityError(
            f"{what} needs the {module.split('.')[0]!r} package, which is not installed. "
            "Fix: pip install 'jax-remat-plan[examples]' (or the package alone)."
        ) from None


def fmt_bytes(n: float | None) -> str:
    """``1536`` → ``1.5 KiB``; ``None`` → ``-``.

    >>> fmt_bytes(3 * 2**20)
    '3.00 MiB'
    >>> fmt_bytes(0)
    '0 B'
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


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


def _path_label(path: str) -> str:
    return UNNAMED if path == "<other>" else path


def stacked_label(r: Residual) -> str:
    """A residual's row in the per-module table: its module path, with ``(stacked xN)`` when it
    holds the N iterations of a scan (a scanned layer group is named after its first layer)."""
    label = _path_label(r.path if r.path is not None else "<other>")
    return f"{label} (stacked x{r.layers})" if r.layers > 1 and r.path is not None else label


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
    """Module paths (naturally sorted, unnamed last) and per plan ``{path: (device, host)}``."""
    table: dict[str, dict[str, tuple[int, int]]] = {}
    paths: set[str] = set()
    for p in report.plans:
        row: dict[str, tuple[int, int]] = {}
        for r in p.residuals:
            if r.kind == "argument":
                continue
            label = shared_label(stacked_label(r), r.path, p.shared)
            dev, host = row.get(label, (0, 0))
            row[label] = (dev + r.nbytes, host) if r.placement == "device" else (dev, host + r.nbytes)
        table[p.name] = row
        paths |= set(row)
    ordered = sorted(paths - {UNNAMED}, key=_natural) + ([UNNAMED] if UNNAMED in paths else [])
    return ordered, table


def report_table(report: Report) -> Any:
    """One row per plan: activation bytes, compiled memory, FLOPs, placement, times."""
    rich_table = _need("rich.table", "rendering a report table")
    t = rich_table.Table(title=f"remat plans: ratios (x) vs {report.baseline!r}, measured on "
                               f"{report.capabilities.backend}", title_justify="left")
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


def notes_lines(report: Report) -> list[str]:
    """The backend notes and each plan's boundaries, problems and notes, as text lines."""
    caps = report.capabilities
    lines = [f"measured on {caps.backend} ({caps.device_kind}), jax {caps.jax}, "
             f"jax_remat3={caps.remat3}. Columns: activation residuals kept on device / moved to "
             "host, host transfer per step, compiled temp memory, FLOP and step-time ratios, "
             "offload placements (to host/back) in the step lowered for cuda, plan check."]
    for f in report.figures:
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
        if p.placement is not None and p.placement.error:
            lines.append(f"{p.name}: placement check failed: {p.placement.error}")
        if p.placement is not None and p.placement.resharded:
            lines.append(f"{p.name}: {p.placement.resharded} host placement(s) change the sharding of "
                         "the value they move (an offload should change only its memory kind)")
        if p.flops_unknown:
            lines.append(f"{p.name}: FLOPs unknown: {p.flops_unknown}")
    for msg, names in shared.items():
        lines.append(f"note ({', '.join(names)}): {msg}")
    return lines


def print_report(report: Report, console: Any = None) -> None:
    """Prints both tables and the notes to ``console`` (a ``rich.console.Console``)."""
    rich_console = _need("rich.console", "printing a report")
    console = console or rich_console.Console()
    console.print(report_table(report))
    console.print(layers_table(report))
    for line in notes_lines(report):
        console.print(line, markup=False, highlight=False)


def render_text(report: Report, width: int = 160) -> str:
    """What :func:`print_report` prints, as plain text."""
    rich_console = _need("rich.console", "rendering a report")
    buf = io.StringIO()
    print_report(report, rich_console.Console(file=buf, width=width, color_system=None,
                                              force_terminal=False))
    return buf.getvalue()


def _mib(n: int) -> float:
    return n / 2**20


def layers_path(path: str | Path) -> Path:
    """Where :func:`plot_report` writes the per-layer figure next to ``path``."""
    p = Path(path)
    return p.with_name(p.stem + ".layers" + (p.suffix or ".png"))


def plot_report(report: Report, path: str | Path) -> tuple[Path, Path]:
    """Writes two PNG figures: the trade-off (``path``) and residual bytes per layer.

    The trade-off figure has, per plan, device and host activation bytes (bars) with the FLOP
    and step-time ratios against the baseline, and activation bytes against step-time ratio
    (or FLOP ratio when the steps were not timed). The second figure (``OUT.layers.png``) has
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
    x = list(range(len(names)))
    dev = [_mib(p.device_bytes) for p in report.plans]
    host = [_mib(p.host_bytes) for p in report.plans]

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
    sr = [p.step_time_ratio for p in report.plans]
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
    for p, xv, d, h in zip(report.plans, xs, dev, host):
        if xv is None:
            continue
        ax2.scatter([xv], [d], color="tab:blue", zorder=3)
        if h:
            ax2.scatter([xv], [h], facecolors="none", edgecolors="tab:orange", zorder=3)
        label = p.name if p.flop_ratio is None or timed is False else \
            f"{p.name} ({p.flop_ratio:.2f}x FLOPs)"
        ax2.annotate(label, (xv, d), textcoords="offset points", xytext=(5, 5), fontsize="small")
    ax2.set_xlabel(("step-time" if timed else "FLOP") + f" ratio vs {report.baseline!r}")
    ax2.set_ylabel("device activation residuals (MiB)")
    ax2.set_title("trade-off (lower left is better; hollow: host bytes)")
    ax2.grid(True, alpha=0.3)
    caps = report.capabilities
    fig.suptitle(f"remat report: {caps.backend} ({caps.device_kind}), jax {caps.jax}",
                 fontsize="medium")
    fig.savefig(out, dpi=110)

    paths, table = layer_bytes(report)
    named = [q for q in paths if q != UNNAMED]
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
        ax.set_title("named residuals per module (hatched: offloaded to host)")
    else:
        ax.text(0.5, 0.5, "no named residuals: tag activations with\n"
                "remat_common.checkpoint_name to see them per module",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    ax.set_ylabel("activation residuals (MiB)")
    bars(ax_un, [UNNAMED])
    ax_un.set_title("unnamed")
    handles, labels = ax_un.get_legend_handles_labels()
    (ax if named else ax_un).legend(*(ax.get_legend_handles_labels() if named else
                                      (handles, labels)), fontsize="small")
    second = layers_path(out)
    fig.savefig(second, dpi=110)
    return out, second
