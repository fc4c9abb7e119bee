"""Rendering a measurement :class:`Report` (plain data, ``_report.py``): rich tables, plain text and
matplotlib figures. Functions of a report; the report imports none of them.

rich and matplotlib come with the ``examples`` extra; they are imported only when rendering.
"""

from __future__ import annotations

import io
import re
from typing import Any

from ..._errors import CapabilityError
from ..._paths import in_subtree
from ..._residuals import Residual
from ..accelerators._units import fmt_bytes, fmt_seconds
from ..measurement._mfu import device_peak, throughput
from ..measurement._report import PlanReport, Report

#: The row of what no module made: the loss, the optimizer, constants (outside the model).
NO_MODULE = "(no module)"


def need(module: str, what: str) -> Any:
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


def natural(path: str) -> tuple[Any, ...]:
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
    ordered = sorted(paths - {NO_MODULE}, key=natural) + ([NO_MODULE] if NO_MODULE in paths else [])
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


def _state_cell(p: PlanReport) -> str:
    """The state a plan keeps on host: bytes per device, and over the host link per step."""
    st = p.state
    if st is None:
        return "-"
    return (f"{fmt_bytes(st.host_argument_bytes)} ({fmt_bytes(st.transfer_bytes)}/step, "
            f"{1e3 * st.transfer_s:.2f} ms)")


def _has_state(report: Report) -> bool:
    return any(p.state is not None for p in report.plans)


def sizes_line(report: Report) -> str | None:
    """``sizes measured: d_model=4096 n_layers=32 ... batch=1`` (``None``: the report names none)."""
    if not report.sizes:
        return None
    return "sizes measured: " + " ".join(f"{k}={v}" for k, v in report.sizes.items())


def target_table(report: Report) -> Any:
    """A report compiled for an accelerator: per device figures of its compiler, fits or not."""
    rich_table = need("rich.table", "rendering a report table")
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
    state = _has_state(report)
    if state:
        t.add_column("state on host", justify="right")
    for p in report.plans:
        t.add_row(
            p.name, fmt_bytes(p.device_bytes), fmt_bytes(p.host_bytes),
            fmt_bytes(p.device_peak), fmt_bytes(p.memory.temp_size_in_bytes),
            fmt_bytes(p.memory.host_temp_size_in_bytes), _flop_cell(p), _fits(report, p),
            "YES" if p.xla_remat else "no", _placement(p),
            fmt_seconds(p.timing.lower_s + p.timing.compile_s), _verify(p),
            *((_state_cell(p),) if state else ()))
    for r in report.refused:
        t.add_row(r.name, *("-",) * 6, "NO (refused)", "-", "-", fmt_seconds(r.compile_s),
                  "refused", *(("-",) if state else ()))
    return t


def report_table(report: Report) -> Any:
    """One row per plan: activation bytes, compiled memory, FLOPs, placement, times."""
    if report.accelerator is not None:
        return target_table(report)
    rich_table = need("rich.table", "rendering a report table")
    t = rich_table.Table(title=f"remat plans: ratios (x) vs {report.baseline!r}, measured on "
                               f"{report.capabilities.backend}; {compiled_by(report)}",
                         title_justify="left", caption=sizes_line(report), caption_justify="left")
    for col, just in (("plan", "left"), ("device act.", "right"), ("host act.", "right"),
                      ("xfer/step", "right"), ("temp", "right"), ("FLOPs", "right"),
                      ("on host (cuda)", "left"), ("compile", "right"), ("step", "right"),
                      ("check", "left")):
        t.add_column(col, justify=just)
    state = _has_state(report)
    if state:
        t.add_column("state on host", justify="right")
    caps = report.capabilities
    peak = device_peak(caps.device_kind, caps.device_count)
    rates = [throughput(report.sizes, p.timing.median_s, peak) for p in report.plans]
    if any(rates):  # model FLOPs from the sizes (ModelFlops), not the compiler's count
        t.add_column("tokens/s (MFU)", justify="right")
    for p, rate in zip(report.plans, rates):
        t.add_row(
            p.name, fmt_bytes(p.device_bytes), fmt_bytes(p.host_bytes),
            fmt_bytes(p.host_transfer_bytes), fmt_bytes(p.memory.temp_size_in_bytes),
            _flop_cell(p), _placement(p),
            fmt_seconds(p.timing.lower_s + p.timing.compile_s),
            fmt_seconds(p.timing.median_s, ms=True) + (
                "" if p.step_time_ratio is None else f" {_fmt_ratio(p.step_time_ratio)}"),
            _verify(p), *((_state_cell(p),) if state else ()),
            *((_rate_cell(rate),) if any(rates) else ()),
        )
    return t


def _rate_cell(rate: tuple[float, float | None] | None) -> str:
    if rate is None:
        return "-"
    tokens, util = rate
    return f"{tokens:,.0f}" + ("" if util is None else f" ({100 * util:.1f} %)")


def layers_table(report: Report) -> Any:
    """Residual bytes per module path (rows) and plan (columns); ``+ host`` where offloaded."""
    rich_table = need("rich.table", "rendering a report table")
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
                 "device (arguments + outputs + temp - aliased; on a TPU, with nothing on host, "
                 "its compiler's heap peak), temp and host temp, FLOP ratio, whether the peak fits the device, whether XLA rematerialized on its own, host "
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
        if p.state is not None:
            lines.append(f"{p.name}: state on host: {p.state.describe()}")
        if p.breakdown is not None and p.breakdown.accounting():  # a line, not a negative row
            lines.append(f"{p.name}: peak by kind: {p.breakdown.accounting()}")
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
    rich_console = need("rich.console", "printing a report")
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


def fit_lines(report: Report, budget: int) -> list[str]:
    """Will each plan fit ``budget`` bytes of device memory? Per plan, the answer and the parts
    of its peak (:meth:`MemoryBreakdown.will_it_fit`; training state kept on host is named and
    not counted), as ``remat report --budget`` prints them."""
    out: list[str] = []
    for p in report.plans:
        if p.breakdown is None:
            out.append(f"will {p.name} fit? no breakdown: XLA wrote no buffer assignment")
            continue
        st = p.state
        lines = p.breakdown.will_it_fit(
            budget, st.host_argument_bytes if st is not None and st.counted_on_device else 0
        ).lines()
        if st is not None:
            lines.insert(1, f"  state on host, not device memory: {st.describe()}")
        out += [f"will {p.name} fit? {lines[0]}", *lines[1:]]
    return out


def render_text(report: Report, width: int = 160, budget: int | None = None) -> str:
    """What :func:`print_report` prints, as plain text; with ``budget``, then :func:`fit_lines`."""
    rich_console = need("rich.console", "rendering a report")
    buf = io.StringIO()
    print_report(report, rich_console.Console(file=buf, width=width, color_system=None,
                                              force_terminal=False))
    return buf.getvalue() + "".join(f"{line}\n" for line in (
        fit_lines(report, budget) if budget is not None else ()))


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
            if not r.bytes:  # slack the compiler's peak leaves out (MemoryBreakdown.taken)
                continue
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
        key=lambda kv: (KINDS.index(kv[0][0]), natural(kv[0][1])))]


def peak_table(report: Report) -> Any:
    """Each plan's compiled peak by kind (activations by module), from XLA's buffer assignment;
    where a plan's program holds host memory, the host peak's rows after the device's."""
    rich_table = need("rich.table", "rendering a report table")
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
    if any(p.breakdown.over for p in plans if p.breakdown):  # the rows' whole is not the compiler's
        t.add_row("compiled peak (memory_analysis)", "", *(
            fmt_bytes(p.breakdown.peak) for p in plans if p.breakdown), style="bold")
    host = peak_rows(report, host=True)
    if host:
        for kind, module, row in host:
            t.add_row(f"host: {kind}", module,
                      *(fmt_bytes(row[p.name]) if p.name in row else "" for p in plans))
        t.add_row("host peak", "", *(fmt_bytes(sum(r.bytes for r in p.breakdown.host_rows))
                                     if p.breakdown and p.breakdown.host_rows else ""
                                     for p in plans), style="bold")
    return t


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
    ordered = sorted(labels - {NO_MODULE}, key=natural) + (
        [NO_MODULE] if NO_MODULE in labels else [])
    return ordered, table, save_all


def _per_layer(total: int, n: int) -> str:
    return f" ({fmt_bytes(total // n)} per layer)" if n > 1 else ""


def modules_table(report: Report) -> Any:
    """Per module and plan: the residuals the compiled step keeps, and the activations live at
    its peak; a scanned layer group (``blocks.0-3``) also per layer; and what the same layers
    keep under the report's save-all plan."""
    rich_table = need("rich.table", "rendering a report table")
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
