"""``remat report CONFIG``: measure a model under each plan of a config file, print and plot it."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..._errors import RematError, short, sorted_list
from ..measurement._measure import MeasureEvent, Report, measure
from ..._shipped import doc_url
from ..accelerators._units import fmt_bytes, parse_bytes
from ._args import NON_NEGATIVE
from ._config import ConfigError, ReportConfig, check_output, parse_size
from ._config import writing as _writing


def with_target(config: ReportConfig, accelerator: str | None, mesh: str | None) -> ReportConfig:
    """The config with ``--accelerator``/``--mesh`` in place of its own keys (checked now, before
    anything is built: an unknown name or a missing compiler fails at once). A target-config file
    the config names (``accelerator: my_gpu.txtpb``) is found next to the config, as its target
    and plans are; one given with ``--accelerator`` is relative to the working directory."""
    from ..accelerators._accelerators import device_count, parse_accelerator, relative_to
    from ..accelerators._meshes import parse_mesh
    from ..accelerators._compilers import quiet_libtpu

    acc = accelerator if accelerator is not None else config.accelerator
    if accelerator is None and acc is not None:  # a config's file: next to the config
        acc = relative_to(acc, Path(config.source).parent)
    m = mesh if mesh is not None else (config.mesh if accelerator is None else None)
    with quiet_libtpu():  # a TPU's topology starts libtpu, whose start-up lines read as failures
        a = parse_accelerator(acc)
        n = device_count(a) if a.platform == "tpu" else None
    if m is not None:
        parse_mesh(m, n if n is not None else device_count(a))
    if a.is_local:
        return dataclasses.replace(config, accelerator=None, mesh=m)
    return dataclasses.replace(config, accelerator=a.name, mesh=m)



class Heartbeat:
    """Progress without a bar (``--no-progress``): a line to ``console`` (``"remat tune:
    compiling save (1 of at most 7), 3 s"``) at each :meth:`update`, and the current one again
    every ``interval`` seconds while it lasts, so a long compile never looks like a hang."""

    def __init__(self, console: Any, command: str, interval: float = 30.0) -> None:
        import threading

        self.console, self.command, self.interval = console, command, interval
        self.t0 = time.monotonic()
        self.current = "starting"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="remat-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _line(self) -> None:
        with self._lock:
            self.console.print(f"{self.command}: {self.current}, {time.monotonic() - self.t0:.0f} s",
                               highlight=False, markup=False)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._line()

    def update(self, current: str) -> None:
        """Says what runs now (and again every ``interval`` seconds while it does)."""
        self.current = current
        self._line()


@contextlib.contextmanager
def progress(err: Any, command: str, label: str, bar: bool
             ) -> Iterator[Callable[[str, int | None, int | None], None]]:
    """``show(text, done, total)`` for a long run: a transient bar on ``err`` (``label`` until the
    first update), or without ``bar`` (``--no-progress``) a :class:`Heartbeat` line per update."""
    if not bar:
        with Heartbeat(err, command) as beat:
            yield lambda text, done, total: beat.update(text)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as shown:
        task = shown.add_task(label, total=None)
        yield lambda text, done, total: shown.update(task, total=total, completed=done,
                                                     description=text)


def measure_stage(e: MeasureEvent) -> str:
    """What the measurement is doing, for the progress bar and the heartbeat."""
    return f"{e.plan}: {e.stage}" if e.plan else ("timing steps" if e.stage == "time" else e.stage)


def run_report(config: ReportConfig, *, steps: int | None = None, warmup: int | None = None,
               progress: Callable[[MeasureEvent], None] | None = None) -> Report:
    """Measures every plan of ``config`` (see :func:`remat_common.measurement.measure`). An
    exception raised in the target's own code (its loss or step, traced or run) is a
    :class:`ConfigError` naming the plan, the file and line, the error and the fix."""
    kwargs: dict[str, Any] = {}
    steps = steps if steps is not None else config.steps
    warmup = warmup if warmup is not None else config.warmup
    if steps is not None:
        kwargs["steps"] = steps
    if warmup is not None:
        kwargs["warmup"] = warmup
    at: list[MeasureEvent] = []

    def on_event(e: MeasureEvent) -> None:
        at[:] = [e]
        if progress is not None:
            progress(e)

    with users_code(config, lambda: (at[0].plan, at[0].stage if at[0].plan else measure_stage(at[0]))
                    if at else (None, "")):
        report = measure(config.builder(), config.plan_objects(), baseline=config.baseline,
                         progress=on_event, accelerator=config.accelerator, mesh=config.mesh,
                         **kwargs)
    return dataclasses.replace(report, sizes=config.kwargs())


def _library_dirs() -> tuple[str, ...]:
    """Where code that is not the user's lives: the standard library, installed packages, and
    this distribution's packages (an editable install keeps them outside site-packages)."""
    import sysconfig

    core = Path(__file__).resolve().parents[2]
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {str(core), *(str(core.parent / a) for a in ("flax_remat_plugin", "equinox_remat_plugin"))}
    return tuple(str(Path(d).resolve()) + os.sep for d in dirs)


def users_frame(e: BaseException) -> str | None:
    """``file.py:12`` of the deepest frame of ``e``'s traceback in the user's code (not the
    standard library, an installed package or this distribution), or None."""
    library = _library_dirs()
    tb, found = e.__traceback__, None
    while tb is not None:
        file = tb.tb_frame.f_code.co_filename
        if not file.startswith("<") and not str(Path(file).resolve()).startswith(library):
            found = f"{file}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _head(e: BaseException, limit: int = 300) -> str:
    """The start of an exception's message (what it says first is what it is about), bounded.

    >>> _head(ValueError("Cannot mutate RngCount from a different trace level " + "x" * 400))[:30]
    "'Cannot mutate RngCount from a"
    """
    text = " ".join(str(e).split())
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


@contextlib.contextmanager
def users_code(config: ReportConfig, where: Callable[[], tuple[str | None, str]]) -> Iterator[None]:
    """Turns an exception raised in the target's own code while plans are measured (``where()``:
    the plan and the stage then) into a :class:`ConfigError`: the plan, the file and line, the
    error and the fix. The library's own errors, and exceptions raised outside the user's code
    (whose traceback is the useful part), pass through."""
    try:
        yield
    except Exception as e:
        line = None if isinstance(e, RematError | OSError) else users_frame(e)
        if line is None:
            raise
        plan, stage = where()
        what = (f"plan {plan!r} ({stage})" if plan else stage or
                "the model before any plan (its first build and trace, no plan)")
        raise ConfigError(
            f"{config.source}: the target's code raised while measuring {what}: {line}: "
            f"{type(e).__name__}: {_head(e)}. Fix: make the target's loss and step run "
            f"on their own: t = {config.function}(plan) (plan=None first), then t.loss_fn("
            "*t.loss_args), jax.grad(t.loss_fn)(*t.loss_args) (measuring differentiates the loss "
            "with JAX's own transforms, not your framework's) and jax.jit(t.step_fn)(*t.step_args), "
            "which show the full traceback."
        ) from e


_MSG_NO_MATPLOTLIB = """\
{what} draws its figures with matplotlib, which cannot be imported here ({error}).
Fix: pip install 'jax-remat-plan[report]' (or: pip install 'matplotlib>=3.9'), or leave --plot out:
the tables, --json and --html need no matplotlib."""


def require_matplotlib(what: str) -> None:
    """Raises :class:`ConfigError` with the install line where matplotlib cannot be imported (only
    the figures need it: checked before anything is measured)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ConfigError(_MSG_NO_MATPLOTLIB.format(what=what, error=str(e)[:200])) from None


def _threshold(text: str) -> float:
    """``--threshold``: a percentage (``5``, ``5%``, ``0.5``) as a fraction."""
    try:
        v = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (5 or 5%%)") from None
    if not 0 <= v < 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: a percentage from 0 to below 1000 (5 or 5%%)")
    return v / 100


#: The options that measure or write something: meaningless when --compare reads two files.
_MEASURING = ("json", "timeline_json", "plot", "html", "steps", "warmup", "baseline",
              "accelerator", "mesh", "budget", "check")


def _compare_options(args: argparse.Namespace) -> None:
    """``--compare`` and ``--threshold`` against the other options, before anything is read."""
    if args.compare is None:
        if args.threshold is not None:
            raise ConfigError(f"--threshold {100 * args.threshold:g}% is used by --compare, which "
                              "is not given, so it would be ignored. Fix: add --compare OLD.json, "
                              "or leave --threshold out.")
        if args.config is None:
            raise ConfigError("no report config given. Fix: remat report CONFIG (a YAML file, "
                              "or example:nnx_gpt), or remat report --compare OLD.json NEW.json "
                              "to compare two reports without compiling.")
        return
    if len(args.compare) > 2:
        raise ConfigError(f"--compare takes one report (compared with CONFIG measured now) or two "
                          f"(OLD.json NEW.json, nothing compiled), got {len(args.compare)}. Fix: "
                          "give at most two files.")
    if args.check is not None:
        raise ConfigError("--check and --compare: both compare a stored report (--check: do its "
                          "figures still hold here, within 1 %; --compare: which figures moved "
                          "more than --threshold). Fix: give one of them.")
    if len(args.compare) == 2:
        if args.config is not None:
            raise ConfigError(f"--compare {' '.join(args.compare)} compares two reports without "
                              f"compiling, so CONFIG {args.config!r} would not be measured. Fix: "
                              "drop CONFIG, or give --compare one report to compare with CONFIG "
                              "measured now.")
        given = [f"--{k.replace('_', '-')}" for k in _MEASURING
                 if getattr(args, k) not in (None, False)] + (["--size"] if args.size else [])
        if given:
            raise ConfigError(f"--compare OLD.json NEW.json reads two reports and measures "
                              f"nothing, so {', '.join(given)} would be ignored. Fix: leave "
                              f"{'it' if len(given) == 1 else 'them'} out (--plans picks the "
                              "plans compared).")
    elif args.config is None:
        raise ConfigError(f"--compare {args.compare[0]}: one report is compared with CONFIG "
                          "measured now, and no CONFIG is given. Fix: remat report CONFIG "
                          f"--compare {args.compare[0]}, or --compare OLD.json NEW.json.")


def _print_drift(drift: Any) -> int:
    for line in drift.lines():
        print(line)
    return 0 if drift.holds else 1


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..report._drift import THRESHOLD, report_drift
    from ..report._render import fit_lines, print_report
    from ..report._plots import plot_report, plot_timeline, timeline_path

    _compare_options(args)
    threshold = THRESHOLD if args.threshold is None else args.threshold
    compared = ([load_stored(f, "--compare") for f in args.compare]
                if args.compare is not None else None)
    if compared is not None and len(compared) == 2:  # two files: nothing compiled
        return _print_drift(report_drift(*compared, threshold=threshold,
                                            old_name=args.compare[0], new_name=args.compare[1],
                                            plans=tuple(args.plans) if args.plans else None))
    out = Console() if sys.stdout.isatty() else Console(width=130)
    err = Console(stderr=True)
    config = ReportConfig.load(args.config).select(args.plans).with_sizes(parse_size(args.size))
    config = with_target(config, args.accelerator, args.mesh)
    # Check the outputs (and load every plan) before measuring, which can take minutes.
    inputs = config.inputs()
    # `is not None`: an empty path given is refused by check_output, not taken as no option
    json_out = check_output(args.json, "--json", inputs=inputs) if args.json is not None else None
    timeline_json = (check_output(args.timeline_json, "--timeline-json", inputs=inputs,
                                  example="timeline.json")
                     if args.timeline_json is not None else None)
    plot_out = (check_output(args.plot, "--plot", suffixes=(".png",), inputs=inputs)
                if args.plot is not None else None)
    html_out = (check_output(args.html, "--html", suffixes=(".html",), inputs=inputs)
                if args.html is not None else None)
    if plot_out is not None:
        require_matplotlib("remat report --plot")
    budget = parse_bytes(args.budget, "--budget") if args.budget is not None else None
    stored = load_stored(args.check) if args.check is not None else None
    config.plan_objects()
    if args.baseline is not None:
        if args.baseline not in dict(config.plans):
            raise ConfigError(f"--baseline {args.baseline!r} is not one of the plans "
                              f"{sorted_list(dict(config.plans))}.")
        config = dataclasses.replace(config, baseline=args.baseline)
    if len(config.plans) < 2 and not args.no_progress:
        report = run_report(config, steps=args.steps, warmup=args.warmup)
    else:  # with --no-progress a line per stage and at least every 30 s
        def stage_line(e: MeasureEvent) -> str:
            if not args.no_progress:
                return measure_stage(e)
            return ("done" if e.stage == "done"
                    else f"{measure_stage(e)} ({e.index + 1} of {e.total})")

        with progress(err, "remat report", "measuring", bar=not args.no_progress) as show:
            report = run_report(config, steps=args.steps, warmup=args.warmup,
                                progress=lambda e: show(stage_line(e), e.index, e.total))
    print_report(report, out)
    if budget is None and report.device_memory:  # compiled for a target: its device memory
        budget = report.device_memory
    elif budget is not None and report.device_memory and budget > report.device_memory:
        out.print(f"--budget {args.budget} is more than the device memory of "
                  f"{(report.accelerator or {}).get('description') or report.accelerator}: "
                  f"{fmt_bytes(report.device_memory)}, which XLA accepts or refuses a program "
                  f"by; fitting against that instead. Fix: a budget of "
                  f"{fmt_bytes(report.device_memory)} or less.", markup=False, highlight=False)
        budget = report.device_memory
    for line in fit_lines(report, budget) if budget is not None else ():
        out.print(line, markup=False, highlight=False)
    for option, out_path in (("--json", json_out), ("--timeline-json", timeline_json)):
        if out_path is not None:  # the JSON first: a failing plot must not lose the measurements
            with _writing(option, out_path):
                path = report.save(out_path, timeline=option == "--timeline-json")
            err.print(f"wrote {path}", highlight=False)
    if html_out is not None:
        from ..report._html import write_html

        with _writing("--html", html_out):
            written = write_html(report, html_out, by=args.timeline_by)
        err.print(f"wrote {written}", highlight=False)
    if plot_out is not None:
        with _writing("--plot", plot_out):
            timeline = plot_timeline(report, timeline_path(plot_out), by=args.timeline_by)
            paths = (*plot_report(report, plot_out), timeline)
        for path in paths:
            err.print(f"wrote {path}", highlight=False)
    if stored is not None:
        from ..report._recheck import check_report

        check = check_report(stored, report, source=args.check)
        for line in check.lines():
            out.print(line, markup=False, highlight=False)
        if not check.holds:
            return 1
    if compared is not None:
        drift = report_drift(compared[0], report, threshold=threshold,
                                old_name=args.compare[0], new_name="this run")
        for line in drift.lines():  # unwrapped: each figure that moved on one line
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        if not drift.holds:
            return 1
    if args.strict and report.problems:
        err.print(f"{len(report.problems)} verification problem(s); failing (--strict).",
                  highlight=False)
        return 1
    return 0


def load_stored(path: str, option: str = "--check") -> Report:
    """The report ``--check`` (or ``--compare``) compares against, read before anything is
    measured."""
    if not path.strip():
        raise ConfigError(f"{option} {path!r}: an empty path names no report. Fix: give a file "
                          "written by remat report --json.")
    try:
        return Report.load(path)
    except RematError as e:  # a report file that is not one, named by its field
        raise ConfigError(f"{option} {path!r}: {e}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{option} {path!r}: no report could be read from it ({type(e).__name__}: "
                          f"{short(str(e))}). Fix: give a file written by remat report --json."
                          ) from None


ABOUT = ("Compile a model's training step under each plan of CONFIG and report the "
         "residuals kept on device and host, compiled memory and FLOPs, whether "
         "offloads reach host in the program lowered for cuda, compile and step times.")


def register(p: Any) -> None:
    """``remat report``'s arguments (its parser made by the ``remat`` command line)."""
    p.add_argument("config", nargs="?", help="report config (YAML): target, model, batch, "
                   "plans; or a shipped example: example:nnx_gpt, example:eqx_gpt (left out with "
                   "--compare OLD.json NEW.json)")
    p.add_argument("--plans", nargs="+", metavar="NAME", help="measure only these plans")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON: every figure of the "
                   "tables and the peak breakdown")
    p.add_argument("--timeline-json", metavar="OUT",
                   help="write the report as JSON with each plan's timeline of live bytes too (a "
                        "point per buffer event: several times the size)")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write the trade-off figure (and OUT.layers.png, bytes per module; "
                        "OUT.timeline.png, live bytes over each plan's step by kind)")
    p.add_argument("--html", metavar="OUT.html",
                   help="write the interactive timeline (one file, opens from disk): live bytes "
                        "over each plan's step by kind, hover for the bytes, drag to zoom, the "
                        "peak's contents listed")
    p.add_argument("--timeline-by", choices=("kind", "module"), default="kind",
                   help="stack the timelines (--plot, --html) by kind (default), or with the "
                        "activations by module at layer depth (blocks.0)")
    p.add_argument("--steps", type=NON_NEGATIVE, metavar="N",
                   help="timed steps per plan (0: compile only)")
    p.add_argument("--warmup", type=NON_NEGATIVE, metavar="N", help="untimed steps per plan first")
    p.add_argument("--size", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override model sizes or the batch, e.g. --size n_layers=2 batch=2")
    p.add_argument("--baseline", metavar="NAME", help="plan that ratios are taken against")
    p.add_argument("--accelerator", metavar="NAME",
                   help="compile for this accelerator instead of this machine: h100x8, h200, b200, "
                        "a100-40g, a100-80g, v5p:2x2x2, v5e:2x2, a GPU target-config FILE.txtpb "
                        f"({doc_url('targets')}); nothing runs, no device is needed")
    p.add_argument("--mesh", metavar="AXIS=N,...",
                   help="lay the step out on the accelerator's devices: data=N, fsdp=N or both "
                        "(default: data parallel over all of them)")
    p.add_argument("--budget", metavar="SIZE",
                   help="device memory to fit (e.g. 16GiB; default with --accelerator: its device "
                        "memory): per plan, its peak in parameters, optimizer state, gradients, "
                        "residuals, temporaries against it, the three largest contributors and "
                        "the change that frees the most")
    p.add_argument("--check", metavar="STORED.json",
                   help="compare with a report written before (--json), on another machine or "
                        "compiler: says which compiler made each (jax, jaxlib, libtpu or the CUDA "
                        "plugin) and, per plan, whether its peak, temp and host temp still hold "
                        "(within 1%%); exit status 1 when one does not")
    p.add_argument("--compare", nargs="+", metavar="REPORT.json",
                   help="drift between compilers: OLD.json compared with CONFIG measured now, or "
                        "OLD.json NEW.json (no CONFIG: nothing compiled), plan by plan and figure "
                        "by figure (peak, temp, arguments, outputs, host memory, activations, "
                        "FLOPs); prints each that moved by more than --threshold with both "
                        "compilers named (jax, jaxlib, libtpu or the CUDA plugin); exit status 1 "
                        "when one did")
    p.add_argument("--threshold", type=_threshold, metavar="PCT",
                   help="how far a figure may move before --compare lists it (default 5%%)")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a plan fails verification")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: a line on stderr per stage of each plan, and every 30 s "
                        "while one runs")
    p.set_defaults(func=_run)
