"""``remat tune CONFIG --budget B``: the cheapest plan that fits, the frontier, and the capacity."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._errors import PlanError, RematError
from ..._nested import block_size
from ..._plan import Plan
from ..._shipped import doc_url
from ._report import progress, require_matplotlib, users_code, with_target
from ._args import POSITIVE, SECONDS
from ._config import ConfigError, ReportConfig, check_output, parse_size
from ..measurement._target import MeasureTarget
from ..accelerators._units import parse_bytes
from ..accelerators._units import fmt_bytes
from ..tune._states import STATE_CHOICES, state_choices, tune_states
from ..tune._capacity import CapacityRow, NoFit, capacity, size_step
from ..tune._result import TuneEvent, TunePoint, TuneResult

#: ``--maximize`` axes: the model keyword (or ``batch``) each one changes. ``d_model`` and
#: ``n_layers`` grow the model itself (on configs whose model takes them), as training state on
#: host (``--state``) lets it.
AXES = {"batch": "batch", "seq": "seq_len", "d_model": "d_model", "n_layers": "n_layers"}


def _reserve(text: str) -> float | int:
    try:
        v = float(text)
    except ValueError:
        return _budget(text)
    if 0 <= v < 1:
        return v
    raise argparse.ArgumentTypeError(f"{text!r}: a fraction from 0 to below 1 (0.1), or bytes "
                                     "with a unit (4GiB)")


def _budget(text: str) -> int:
    try:
        return parse_bytes(text)
    except RematError as e:
        raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None


def _state(text: str) -> str:
    try:
        state_choices(text)
    except RematError as e:
        raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None
    return text




def tune_stage(e: TuneEvent) -> str:
    """What the search is doing, for the heartbeat: the compile it runs, or done."""
    if e.stage == "compiled":
        return f"{e.name}: {e.detail}"
    return (f"compiling {e.name} ({e.index + 1} of at most {e.total})" if e.name
            else f"done ({e.index} compiles)")


def points_table(result: TuneResult) -> Any:
    """Every compiled plan: peak, its predicted peak, FLOP ratio, host bytes, the step time the
    profile predicts (objective ``time``); frontier and choice marked."""
    from rich.table import Table

    front = {p.name for p in result.frontier()}
    t = Table(title=f"remat tune: {result.stack} ({result.layers} layers), budget "
                    f"{fmt_bytes(result.budget)}, objective {result.objective}")
    for col, just in (("", "left"), ("plan", "left"), ("compiled peak", "right"),
                      ("predicted", "right"), ("FLOP ratio", "right"), ("host act.", "right"),
                      ("transfer", "right"), ("step (model)", "right"), ("fits", "left"),
                      ("layers", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for p in result.points:
        mark = ">" if p.name == result.chosen else ("*" if p.name in front else "")
        ratio = result.flop_ratio(p)
        move = result.transfer_s(p)
        t.add_row(mark, p.name, fmt_bytes(p.peak) + ("*" if p.estimated else ""),
                  fmt_bytes(p.predicted_peak), "-" if ratio is None else f"{ratio:.3f}",
                  fmt_bytes(p.host_bytes), "-" if move is None else f"{move * 1e3:.3g} ms",
                  f"{p.cost * 1e3:,.1f} ms" if result.objective == "time" else "-",
                  "yes" if p.fits(result.budget) else
                  ("problems" if p.problems else "XLA remat" if p.xla_remat else "no"),
                  _layers(p, result.layers))
    return t


def step_times_table(result: TuneResult) -> Any:
    """The plans timed with ``--measure``: median step time, FLOP ratio, peak; the chosen marked."""
    from rich.table import Table

    t = Table(title=f"measured step times: {len(result.step_times)} plans (the best found and "
                    "the --plans that fit), steps interleaved (median)")
    for col in ("", "plan", "median step", "vs fastest", "FLOP ratio", "compiled peak"):
        t.add_column(col, justify="left" if col in ("", "plan") else "right")
    fastest = min(s for _, s in result.step_times)
    for name, sec in result.step_times:
        ratio = result.flop_ratio(result[name])
        t.add_row(">" if name == result.chosen else "", name, f"{sec * 1e3:.2f} ms",
                  f"{sec / fastest:.3f}", "-" if ratio is None else f"{ratio:.3f}",
                  fmt_bytes(result[name].peak))
    return t


def _layers(p: TunePoint, layers: int) -> str:
    """The layers' choices in layer order (``recomputex2 savex1``), or the blocks of a nested
    stack (``recompute, nested: 4 blocks of 4``)."""
    if p.source == "nested" and p.plan is not None:
        (ann,) = p.plan.values()
        k = block_size(ann["nested"], layers)
        blocks = f"{layers // k} blocks of {k}" + (f" + 1 of {layers % k}" if layers % k else "")
        return f"{ann['remat']}, nested: {blocks}"
    assign = p.assignment
    if assign is None:
        return "(extra plan)"
    out, i = [], 0
    while i < len(assign):
        j = i
        while j + 1 < len(assign) and assign[j + 1] == assign[i]:
            j += 1
        out.append(f"{assign[i]}x{j - i + 1}")
        i = j + 1
    return " ".join(out)


def capacity_table(rows: tuple[CapacityRow, ...], result: TuneResult, axis: str) -> Any:
    from rich.table import Table

    t = Table(title=f"capacity: the largest {axis} whose compiled step fits "
                    f"{fmt_bytes(result.budget)}" + ("" if result.state.is_default else
                                                     f" ({result.state.describe()})"))
    for col in ("plan", f"largest {axis}", "its peak", "gain vs save", "FLOP ratio",
                f"next {axis} peak", "predicted", "compiles"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    base = next((r.largest for r in rows if r.name == "save"), None)
    for r in rows:
        ratio = next((result.flop_ratio(p) for p in result.points if p.name == r.name), None)
        gain = f"{r.largest / base:.2f}x" if base else "-"
        why = r.next_why or ""
        nxt = ("-" if r.next is None else f"{r.next}: " + (
            "refused" if why.startswith("the compiler refused") else fmt_bytes(r.next_peak)
            + (" (XLA remat)" if why.startswith("XLA") else "")))
        t.add_row(r.name, str(r.largest), fmt_bytes(r.peak), gain,
                  "-" if ratio is None else f"{ratio:.3f}", nxt,
                  "-" if r.predicted is None else str(r.predicted), str(r.compiles))
    return t


def capacity_plans(result: TuneResult) -> dict[str, Any]:
    """The plans capacity is searched for: save-all, full recompute, the chosen plan and the rest
    of the frontier (each once)."""
    names = ["save", "recompute"] + ([result.chosen] if result.chosen else [])
    names += [p.name for p in result.frontier()]
    out: dict[str, Any] = {}
    for n in names:
        if n in out or n not in {p.name for p in result.points}:
            continue
        config = result[n].plan
        # the placement the search compiled them under (a plan's state:)
        out[n] = config if config is None or result.state.is_default else Plan.from_mapping(
            config, state=result.state)
    return out


#: The suffixes of plan files (``--plans`` takes these as files, anything else as a plan's name).
PLAN_SUFFIXES = (".json", ".toml", ".yaml", ".yml")


def _extra_plans(config: ReportConfig, names: list[str]) -> dict[str, Any]:
    """``--plans``: names of the config's plans, shipped presets (``maxtext:minimal``, named
    ``maxtext/minimal``; :func:`remat_common._plan.presets`), or plan files (``*.yaml``,
    ``*.toml``, ``*.json``, relative to the working directory, named by their stem)."""
    files = [n for n in names if n.lower().endswith(PLAN_SUFFIXES)]
    shipped = [n for n in names if n not in files and ":" in n]
    rest = [n for n in names if n not in files and n not in shipped]
    out: dict[str, Any] = dict(config.select(rest).plan_objects()) if rest else {}
    for n in shipped:
        try:
            out[n.replace(":", "/", 1)] = Plan.preset(n)
        except PlanError as e:
            raise ConfigError(f"--plans {n}: {e}") from None
    for f in files:
        path = Path(f)
        if not (path.is_file() or path.is_dir() or path.is_symlink()):  # Plan.load names the rest
            raise ConfigError(f"--plans {f}: no such plan file. Fix: give a plan file path (relative "
                              "to the working directory) or the name of a plan of the config.")
        name = path.stem if path.stem not in out else f"{path.parent.name}/{path.stem}"
        out[name] = Plan.load(path)
    return out


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    out = Console() if sys.stdout.isatty() else Console(width=150)
    err = Console(stderr=True)
    _check_options(args)
    config = ReportConfig.load(args.config).with_sizes(parse_size(args.size))
    config = with_target(config, args.accelerator, args.mesh)
    import jax

    if args.budget is None and config.accelerator is None and jax.default_backend() == "cpu":
        raise ConfigError("remat tune: --budget is required (bytes or units: 12GiB, 800MiB), or "
                          "--accelerator (its device memory minus a reserve is the default).")
    extra = _extra_plans(config, args.plans or [])
    tags = None
    if args.tags is not None:
        (tags,) = _extra_plans(config, [args.tags]).values()
    if args.maximize is not None:
        _capacity_start(config, args)  # a missing size or a --limit below it: before the search
    inputs = [*config.inputs(), *(Path(f) for f in [*(args.plans or []), args.tags or ""]
                                                     if f.lower().endswith(PLAN_SUFFIXES))]
    if args.profile and Path(args.profile).is_file():
        inputs.append(Path(args.profile))
    # `is not None`: an empty path given is refused by check_output, not taken as no option
    json_out = (check_output(args.json, "--json", inputs=inputs, example="tune.json")
                if args.json is not None else None)
    plot_out = (check_output(args.plot, "--plot", suffixes=(".png",), inputs=inputs,
                             example="tune.png") if args.plot is not None else None)
    plan_out = check_output(args.out, "--out", suffixes=(".json", ".yaml", ".yml"),
                            inputs=inputs, example="plan.yaml") if args.out is not None else None
    profile_out = (check_output(args.profile_out, "--profile-out", suffixes=(".yaml", ".yml"),
                                inputs=inputs, example="profile.yaml")
                   if args.profile_out is not None else None)
    if plot_out is not None:
        require_matplotlib("remat tune --plot")
    budget = args.budget
    build = config.builder()

    def go(on_event: Callable[[TuneEvent], None]) -> tuple[TuneResult, Any]:
        at: list[TuneEvent] = []

        def seen(e: TuneEvent) -> None:
            at[:] = [e]
            on_event(e)

        with users_code(config, lambda: (at[0].name, "compile") if at else (None, "")):
            result = tune_states(build, budget, state=args.state, layers=args.layers,
                          plans=extra or None, tags=tags,
                          accept_xla_remat=args.accept_xla_remat,
                          choices=args.choices, objective=args.objective, profile=args.profile,
                          max_compiles=args.max_compiles, time_limit=args.time_limit,
                          progress=seen, measure=args.measure or 0,
                          measure_steps=args.measure_steps or 10,
                          stop_when_save_fits=args.maximize is None,
                          accelerator=config.accelerator, mesh=config.mesh, reserve=args.reserve)
            rows = None
            if args.maximize is not None:
                rows = _capacity(config, result, args, seen)
        return result, rows

    def on_event(e: TuneEvent) -> None:  # with --no-progress a line per compile, every 30 s
        if args.no_progress:
            show(tune_stage(e), None, None)
        elif e.stage != "compiled":
            show(f"compiling {e.name}" if e.name else "done", e.index, e.total)

    with progress(err, "remat tune", "compiling", bar=not args.no_progress) as show:
        result, rows = go(on_event)
    out.print(points_table(result))
    if result.step_times:
        out.print(step_times_table(result))
    out.print(result.message, highlight=False, markup=False)
    if result.compiler is not None:
        out.print(f"peaks compiled by {result.compiler.describe()}.", highlight=False, markup=False)
    for note in result.notes:
        out.print(f"note: {note}", highlight=False, markup=False)
    for warning in result.warnings:
        out.print(f"warning: {warning}", highlight=False, markup=False)
    if result.plan is not None:
        out.print(result.yaml(), highlight=False, markup=False)
    if rows is not None:
        out.print(capacity_table(rows, result, args.maximize))
    if plan_out is not None and result.plan is not None:
        plan_out.write_text(_plan_text(result, plan_out))
        err.print(f"wrote {plan_out}", highlight=False)
    if json_out is not None:
        data = result.to_json()
        if rows is not None:
            data["capacity"] = {"axis": args.maximize, "rows": [r.to_json() for r in rows]}
        import json

        json_out.write_text(json.dumps(data, indent=2) + "\n")
        err.print(f"wrote {json_out}", highlight=False)
    if plot_out is not None:
        err.print(f"wrote {result.plot(plot_out)}", highlight=False)
    if profile_out is not None:
        _write_fitted(result, args.profile, profile_out, out)
        err.print(f"wrote {profile_out}", highlight=False)
    return 0 if result.plan is not None else 1


def _write_fitted(result: TuneResult, profile: str, path: Path, out: Any) -> None:
    """``--profile-out``: ``profile`` with the FLOP rate (and the exposed share of offload
    transfers, where a step offloads) fitted to ``--measure``'s steps (each
    plan's compiled FLOPs, its host residuals to host and back, its median step), written as the
    YAML ``--profile`` reads; each step's error under it printed."""
    from ..accelerators._profiles import fit_profile, load_profile, profile_yaml

    base = load_profile(profile)
    assert base is not None
    steps = [(result[n].flops or 0.0, 2.0 * (result[n].host_bytes or 0), s)
             for n, s in result.step_times]
    fitted, errors = fit_profile(base, steps)
    path.write_text(profile_yaml(fitted, comment=(
        f"remat tune --measure: {base.name} with the FLOP rate fitted to "
        f"{len(steps)} measured step(s) ({', '.join(n for n, _ in result.step_times)}); "
        f"compiled by {result.compiler.describe() if result.compiler else 'this machine'}")))
    share = (f", {100 * fitted.exposed_transfer_share:.0f} % of offload transfers exposed"
             if any(b for _, b, _ in steps) else "")
    out.print(f"fitted profile {fitted.name}: {fitted.flops_per_s / 1e12:.4g} TFLOP/s{share}, each "
              "measured step against it: " + ", ".join(
                  f"{n} {100 * e:+.1f} %" for (n, _), e in zip(result.step_times, errors)),
              highlight=False, markup=False)


def _plan_text(result: TuneResult, out: Path) -> str:
    """The chosen plan as ``--out`` names it: a YAML plan file (with the search's summary as a
    comment), or JSON for ``.json``; either loads back with ``Plan.load``."""
    if out.suffix.lower() == ".json":
        import json

        best = result.best
        assert best is not None and best.plan is not None
        state = {} if result.state.is_default else {"state": result.state.to_config()}
        return json.dumps({"rules": best.plan, **state}, indent=2) + "\n"
    return result.yaml()


def _check_options(args: argparse.Namespace) -> None:
    """Options that mean nothing without another one, and a missing budget: refused first."""
    if args.reserve is not None and args.budget is not None:
        raise ConfigError(f"remat tune: --reserve {args.reserve} and --budget "
                          f"{fmt_bytes(args.budget)}: the "
                          "reserve is what the default budget (the accelerator's device memory) "
                          "leaves free, and --budget replaces that default, so the reserve would "
                          "be ignored. Fix: give --budget alone (the bytes the plan may use), or "
                          "--accelerator with --reserve.")
    for flag, value, needs, given in (("--step", args.step, "--maximize", args.maximize),
                                      ("--limit", args.limit, "--maximize", args.maximize),
                                      ("--measure-steps", args.measure_steps, "--measure",
                                       args.measure),
                                      ("--profile-out", args.profile_out, "--measure",
                                       args.measure)):
        if value is not None and given is None:
            raise ConfigError(f"remat tune: {flag} {value} is used by {needs}, which is not given, "
                              f"so it would be ignored. Fix: add {needs}, or leave {flag} out.")
    if args.profile_out is not None and args.profile is None:
        raise ConfigError(f"remat tune: --profile-out {args.profile_out} writes a profile with "
                          "the FLOP rate fitted to the measured steps and the rest (host link, "
                          "memory) of --profile's, which is not given. Fix: add --profile NAME "
                          "(the device's data sheet, e.g. v5e) or --profile FILE.")


def _capacity_start(config: ReportConfig, args: argparse.Namespace) -> tuple[str, int]:
    """``--maximize``'s size and the config's value of it, checked against ``--limit``."""
    key = AXES[args.maximize]
    start = config.batch if key == "batch" else config.kwargs().get(key)
    if not isinstance(start, int) or isinstance(start, bool) or start < 1:
        raise ConfigError(f"--maximize {args.maximize}: the config sets no {key} to start from. "
                          f"Fix: set it in the config or with --size {key}=N.")
    if args.limit is not None and args.limit < start:
        raise ConfigError(f"--limit {args.limit} is below the {key} the search starts from "
                          f"({start}): it would report {start} as the largest that fits. Fix: "
                          f"--limit {start} or more, or a smaller --size {key}=N.")
    return key, start


def _capacity(config: ReportConfig, result: TuneResult, args: argparse.Namespace,
              on_event: Callable[[TuneEvent], None] | None) -> tuple[CapacityRow, ...]:
    key, start = _capacity_start(config, args)
    batch = key == "batch"
    # default 1, or the devices a batch is split over (a given step must split over them); a
    # width in steps of the config's heads, so that every width tried splits into them
    heads = config.kwargs().get("n_heads") if key == "d_model" else None
    given = args.step if args.step is not None or not isinstance(heads, int) else heads
    step = size_step(config.accelerator, config.mesh, given, batch=batch)
    first = start
    start = max(step, start // step * step)
    plans = capacity_plans(result)
    # the tune compiled these plans at the config's size: their peaks there are known, and where
    # XLA rematerialized on its own, that they do not fit whatever their peak (not compiled again:
    # on the Llama-3-8B config for h100x8, 12 of the 17 plans --maximize searched)
    known = ({n: NoFit(result[n].peak, f"XLA rematerialized on its own: {result[n].xla_remat}")
              if result[n].xla_remat else result[n].peak for n in plans}
             if start == first else None)

    sized = config.sizes_measured()  # the search's size is a layer above the config and --size

    def builder_for(v: int) -> Callable[[Plan | None], MeasureTarget]:
        if batch:
            return config.with_sizes({key: v}).builder()
        return dataclasses.replace(config, model=tuple(sized.items()), sizes=((key, v),)).builder()

    return capacity(builder_for, result.budget, plans, start=start, step=step,
                    limit=args.limit, max_compiles=args.max_compiles * 4, progress=on_event,
                    known=known, accelerator=config.accelerator, mesh=config.mesh, batch=batch)


ABOUT = ("Compile a model's training step under uniform plans, model each layer's "
         "memory and FLOPs, search every per-layer assignment exactly, and compile and "
         "verify the best candidates until one fits the budget. Exits 1 when nothing "
         "fits.")


def register(p: Any) -> None:
    """``remat tune``'s arguments (its parser made by the ``remat`` command line)."""
    p.add_argument("config", help="report config (YAML): target, model, batch, plans; or a "
                                  "shipped example: example:nnx_gpt, example:eqx_gpt")
    p.add_argument("--budget", type=_budget, metavar="BYTES",
                   help="device memory budget: bytes or units (12GiB, 800MiB, 1.5GB); with "
                        "--accelerator, default its device memory minus --reserve")
    p.add_argument("--accelerator", metavar="NAME",
                   help="search on this accelerator's compiler (h100x8, v5p:2x2x2, FILE.txtpb; "
                        f"{doc_url('targets')}): peaks per device from it, offloads placed by "
                        "it")
    p.add_argument("--mesh", metavar="AXIS=N,...",
                   help="lay the step out on the accelerator's devices (data=N, fsdp=N)")
    p.add_argument("--reserve", type=_reserve, metavar="FRACTION|BYTES",
                   help="what the default budget leaves free of the device memory (0.1, 4GiB; "
                        "default 25%% on GPUs, JAX's allocator default, 5%% on TPUs)")
    p.add_argument("--profile", metavar="NAME|FILE",
                   help="device profile (an accelerator chip: h100, v5e, ...; or a YAML file): "
                        "objective time")
    p.add_argument("--objective", choices=("flops", "time"),
                   help="what to minimise (default: time with a profile, else flops, where "
                        "offload's host transfers count at the profile's host link, h100's 64 GB/s "
                        "without one)")
    p.add_argument("--layers", metavar="STACK", help="the stack to tune (default: detected)")
    p.add_argument("--choices", nargs="+", metavar="NAME",
                   help="choices per layer (default all: save dots dots_no_batch names custom "
                        "offload offload_dots_no_batch recompute; custom where the layers declare "
                        "their own rules); per name: save:q+k+v, offload:mlp_hidden; and, on a "
                        "scanned stack, nested / nested:K: the stack's scan as checkpointed "
                        "blocks, a whole-stack candidate (default from 6 layers on)")
    p.add_argument("--plans", nargs="+", metavar="NAME",
                   help="extra candidates: names of the config's plans, shipped presets "
                        "(maxtext:full, maxtext:minimal_offloaded, ...), or plan files")
    p.add_argument("--accept-xla-remat", action="store_true",
                   help="on an accelerator, count a plan its compiler's own rematerialization "
                        "brought under the device memory as fitting at its compiled peak (the "
                        "program that runs; default: only where its peak plus every value XLA "
                        "recomputes is within the budget)")
    p.add_argument("--tags", metavar="PLAN",
                   help="a plan (a file, a name of the config's plans or a shipped preset) whose "
                        "{tag: NAME} rules every plan searched carries, its other rules unused: "
                        "names for the choices to keep (names, save:NAME) in a model that tags "
                        "nothing itself, as a third-party model opted in by plan files")
    p.add_argument("--size", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override model sizes or the batch, e.g. --size n_layers=2 batch=2")
    p.add_argument("--out", metavar="PLAN.yaml", help="write the chosen plan")
    p.add_argument("--json", metavar="OUT", help="write every compiled point as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write the frontier figure")
    p.add_argument("--max-compiles", type=POSITIVE, default=40, metavar="N",
                   help="stop the search after N compiles (default 40)")
    p.add_argument("--time-limit", type=SECONDS, metavar="S",
                   help="stop the search after S seconds")
    p.add_argument("--measure", type=POSITIVE, nargs="?", const=3, metavar="K",
                   help="time the K best plans found (default 3) and every --plans plan that "
                        "fits, and pick the fastest by measured step time; meant for an "
                        "accelerator (CPU times do not represent one)")
    p.add_argument("--measure-steps", type=POSITIVE, metavar="N",
                   help="timed steps per plan with --measure (default 10, after 2 warm-up steps)")
    p.add_argument("--profile-out", metavar="PROFILE.yaml",
                   help="with --measure and --profile: write --profile with the FLOP rate fitted "
                        "to the measured steps (its host link and memory kept), a calibrated "
                        "profile that --profile takes back")
    p.add_argument("--state", default="auto", type=_state,
                   metavar="|".join(("auto", "any", "eighths", *STATE_CHOICES)),
                   help="where the training state lives between steps, chosen with the plan: "
                        "'auto' (default) searches with it on device and, only where nothing "
                        "fits, with the optimizer state on host, then with parameters on host "
                        "too; 'any' searches under each and takes the cheapest plan (the "
                        "transfers priced at the profile's host link); 'device', 'optimizer' "
                        "(optimizer state on host) or 'all' (optimizer state and parameters on "
                        "host) searches under that one, as does a part, KIND=PART "
                        "(optimizer=0.5: the last half of the layers' optimizer state on host; "
                        "params=blocks.*: a pattern); 'eighths' the fewest eighths of the "
                        "layers' optimizer state (then parameters) on host that fit, under "
                        "REMAT_HOST_MEMORY on host too; names joined by '+' are tried in order. "
                        "The chosen plan's YAML carries state:")
    p.add_argument("--maximize", choices=sorted(AXES),
                   help="also find the largest batch, sequence length (seq), width (d_model) "
                        "or depth (n_layers) that fits, per plan (the model's sizes: on configs "
                        "whose model takes them), each plan with the state placement chosen")
    p.add_argument("--step", type=POSITIVE, metavar="N",
                   help="granularity of --maximize (default 1; d_model: the config's n_heads; a "
                        "batch laid out on a mesh: the devices it is split over, and a given step "
                        "must be a multiple of them)")
    p.add_argument("--limit", type=POSITIVE, metavar="N", help="largest value --maximize tries")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: a line on stderr per compile, and every 30 s while one runs")
    p.set_defaults(func=_run)

