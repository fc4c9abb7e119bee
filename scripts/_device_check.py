"""The body of ``scripts/device_check`` (see that file and docs/tpu.md).

On a machine with an accelerator (a TPU chip, a GPU), per example GPT and plan: the device's own
compile of the training step as a loop runs it (state donated) beside the deviceless compile of
the same step for the same topology (``--accelerator v5e:1x1``, ``h100``: what ``remat report``
and ``remat tune`` compile on a machine without the device), with an exact-equality verdict;
whether each fits or is refused, with XLA's bytes; the median step time over fed-back steps;
host bytes moved per step; and the time model's prediction against the measured time, with a
device profile fitted from the measurements.

Each measurement runs in a child process (``--child``) that writes its report as JSON: first the
device's (it holds the device), then the deviceless compile's; the parent opens no device.
Without an accelerator the device column is this machine's backend and the verdict compares two
different compilers (``--target`` names one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _guard import Stopped, byte_size, count, gib, stop_on_signals, unwritable, write_json

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("nnx_gpt", "eqx_gpt")
QUICK_SIZE = ("n_layers=1", "d_model=32", "n_heads=2", "seq_len=16", "batch=2", "vocab=64")
#: The figures compared for the verdict: compiled memory per device, field for field.
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "host_temp_size_in_bytes", "peak_memory_in_bytes")
BUDGET_S = 540


def child(args: argparse.Namespace) -> int:
    """Measure one example in this process (``--mode device``: on this machine's devices, steps
    run; ``deviceless``: compiled for ``--target``); write the report and the devices to the file
    open as ``--out-fd`` (unnamed: nothing is left on disk however this process ends)."""
    import jax

    import remat_common.internal as ri

    config = ri.ReportConfig.load(config_path(args.child))
    config = config.with_sizes(ri.parse_size(args.size or ()))
    if args.plans:
        config = config.select(args.plans.split(","))
    for named in args.plan_file or ():  # beside the plans selected
        name, _, path = named.partition("=")
        config = dataclasses.replace(config, plans=(*config.plans, (name, str(Path(path).resolve()))))
    need, refusal = host_need(config, args.mode, Path(args.child).stem, args.host_memory)
    if refusal:
        print(f"device_check: {refusal}", file=sys.stderr)
        return 3
    if args.mode == "device":
        report = ri.run_report(config, steps=args.steps, warmup=args.warmup)
    else:
        report = ri.run_report(ri.with_target(config, args.target, None), steps=0, warmup=0)
    dev = jax.devices()[0]
    with os.fdopen(args.out_fd, "w") as out:
        out.write(json.dumps({
            "backend": jax.default_backend(), "device_kind": str(dev.device_kind),
            "devices": len(jax.devices()), "size": report.sizes or dict(config.model),
            "batch": config.batch, "host_bytes_predicted": need, "host_peak_bytes": _peak_rss(),
            "report": report.to_json()}))
    return 0


def host_need(config: Any, mode: str, example: str, limit: int | None = None
              ) -> tuple[int | None, str | None]:
    """The host memory measuring ``config`` holds beyond this process's own, predicted before
    anything is allocated, and why it is refused (``None``: it fits ``limit``, else this
    machine's available memory with a margin): the step's arguments (parameters, optimizer state,
    batch), from the shapes of one plan's target (``jax.eval_shape``), times the copies that live
    in host memory: on a CPU every plan's state and its placed copy (their steps interleaved); on
    an accelerator one plan's state parked on host while its copy runs (a state kept on host: that
    copy too); compiled only, one plan's arrays at a time, in host memory on a CPU."""
    import jax
    from remat_common.internal import over_memory

    build = config.builder()
    try:
        shapes = jax.eval_shape(lambda: tuple(build(None).step_args))
    except Exception as e:  # noqa: BLE001 - the measurement says what is wrong with the target
        print(f"device_check: host memory not predicted ({type(e).__name__}: "
              f"{str(e)[:200]})", file=sys.stderr)
        return None, None
    per_plan = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    n, cpu = len(config.plans), jax.default_backend() == "cpu"
    if mode == "deviceless":
        copies, why = (1 if cpu else 0), "compiled only: one plan's arrays at a time"
    elif cpu:
        copies, why = 2 * n, "every plan's state and its placed copy, their steps interleaved"
    else:
        copies, why = 2, "one plan's state parked on host while its steps run"
    fix = "a smaller size (--size n_layers=N batch=N)"
    if cpu and mode == "device" and n > 1:
        fix = f"fewer plans per call (--plans {','.join(p for p, _ in config.plans[:2])}), or {fix}"
    need = copies * per_plan
    return need, over_memory(
        need, f"measuring {n} plan(s) of {example} on {jax.default_backend()} ({mode}) holds the "
              f"step's arguments (parameters, optimizer state, batch: {gib(per_plan)} a plan) "
              f"{copies} time(s) in host memory ({why})", fix, limit)


def _peak_rss() -> int | None:
    """This process's peak resident memory (``VmHWM``), bytes."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return None


def config_path(example: str) -> Path:
    """An example's report config (``nnx_gpt``), or a report config file of any model."""
    return Path(example).resolve() if example.endswith((".yaml", ".yml")) else (
        ROOT / "examples" / example / "report.yaml")


def with_mfu(rows: list[dict[str, Any]], sizes: dict[str, Any], batch: int,
             peak: float | None) -> None:
    """Tokens per second and MFU beside each timed row: model FLOPs per token from the
    architecture (``ModelFlops.from_sizes``), never the compiler's count."""
    from remat_common.measurement import ModelFlops, mfu

    try:
        per_token = ModelFlops.from_sizes(sizes).per_token
    except ValueError:
        return
    tokens = batch * int(sizes["seq_len"])
    for r in rows:
        if r.get("step_s"):
            r["tokens_per_s"] = tokens / r["step_s"]
            r["model_flops_per_token"] = per_token
            if peak:
                r["mfu"] = mfu(per_token, r["tokens_per_s"], peak)


def run_child(example: str, mode: str, args: argparse.Namespace, timeout: float,
              target: str | None = None) -> dict[str, Any] | str:
    """What the child wrote (its ``report`` a ``Report``), or why there is none. The child runs in
    a session of its own: stopped (a signal, :class:`Stopped`; its time out), it is ended with
    everything it started, and no device is left held."""
    from remat_common.measurement import Report

    cmd = [sys.executable, __file__, "--child", example, "--mode", mode,
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.plans:
        cmd += ["--plans", args.plans]
    if target:
        cmd += ["--target", target]
    for pf in args.plan_file or ():
        cmd += ["--plan-file", pf]
    if args.size:
        cmd += ["--size", *args.size]
    if args.host_memory:
        cmd += ["--host-memory", str(args.host_memory)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if mode == "deviceless":  # it only compiles: libtpu may be held by this process's caller
        env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([*cmd, "--out-fd", str(out.fileno())], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, pass_fds=(out.fileno(),))
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            return f"no result within {timeout:.0f} s"
        except BaseException:  # Stopped: the child goes too
            _end(proc)
            raise
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0 or not text:
        tail = (stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        sys.stderr.write(stdout[-2000:] + stderr[-4000:])
        return f"exit {proc.returncode}: {tail if tail.startswith('device_check: ') else tail[:300]}"
    data = json.loads(text)
    data["report"] = Report.from_json(data["report"])
    return data


def _end(proc: subprocess.Popen[str]) -> None:
    """Ends a child's session: SIGTERM, then SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.communicate(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def auto_target(kind: str, n: int) -> str | None:
    """The deviceless name of this machine's accelerator: ``TPU v5 lite`` x1 -> ``v5e:1x1``,
    ``NVIDIA H100 80GB HBM3`` x8 -> ``h100x8``; ``None`` for a CPU or an unknown device."""
    from remat_common.internal import accelerator_for

    return accelerator_for(kind, n)


def _compiler(report: Any) -> Any:
    """What compiled a report: its compiler record where it has one, else the accelerator or
    backend name."""
    doc = report.to_json()
    return doc.get("compiler") or (report.accelerator or {}).get("name") or report.capabilities.backend


def rows_of(example: str, device: dict[str, Any], deviceless: dict[str, Any] | str | None
            ) -> list[dict[str, Any]]:
    """Per plan: the device's figures, the deviceless compile's, and the verdict."""
    from remat_common.internal import compare_reports

    rep = device["report"]
    other = deviceless["report"] if isinstance(deviceless, dict) else None
    both = {r.plan: r for r in compare_reports(rep, other)} if other is not None else {}
    refused_there = {r.name: r.error for r in other.refused} if other is not None else {}
    out: list[dict[str, Any]] = []
    for p in rep.plans:
        row: dict[str, Any] = {
            "example": example, "plan": p.name, "status": "fits",
            **{f: getattr(p.memory, f) for f in FIELDS}, "peak_bytes": p.memory.device_total,
            "flops": p.flops, "host_bytes_per_step": p.host_transfer_bytes,
            "step_s": p.timing.median_s, "steps_timed": len(p.timing.steps),
            "xla_remat": p.xla_remat, "problems": list(p.problems)}
        b = both.get(p.name)
        if b is not None:
            row.update(target_peak_bytes=b.peak[1], target_temp_bytes=b.temp[1],
                       target_host_temp_bytes=b.host_temp[1], identical=b.identical,
                       verdict="identical" if b.identical else
                       f"DIFFERS: peak {_signed(b.peak_diff)}, temp {_signed(b.temp_diff)}")
        elif p.name in refused_there:
            row.update(identical=False, target_error=refused_there[p.name],
                       verdict="DIFFERS: fits on the device, refused deviceless")
        else:
            row["verdict"] = deviceless if isinstance(deviceless, str) else "not compiled deviceless"
        out.append(row)
    fits_there = {p.name for p in other.plans} if other is not None else set()
    for r in rep.refused:  # "identical" only where a deviceless compile was there to compare
        row = {"example": example, "plan": r.name, "status": "refused", "error": r.error}
        if r.name in refused_there:
            row.update(identical=True, verdict="identical (both refused)")
        elif r.name in fits_there:
            row.update(identical=False, verdict="DIFFERS: refused on the device, fits deviceless")
        else:
            row["verdict"] = (deviceless if isinstance(deviceless, str)
                              else "not compiled deviceless")
        out.append(row)
    return out


def time_model(rows: list[dict[str, Any]], profile: str | None) -> dict[str, Any]:
    """The profile's predicted step time of each plan that ran against the measured one, and the
    profile fitted to these measurements (its FLOP rate; the host link kept)."""
    from remat_common.measurement import fit_profile, load_profile

    ran = [r for r in rows if r["status"] == "fits" and r.get("step_s") and r.get("flops")]
    if not ran or profile is None:
        return {"profile": profile, "note": "no plan ran, or no profile for this device"}
    base = load_profile(profile)
    fitted, errors = fit_profile(base, [(r["flops"], r["host_bytes_per_step"] or 0, r["step_s"])
                                        for r in ran])
    for r, err in zip(ran, errors):
        predicted = base.step_seconds(r["flops"], r["host_bytes_per_step"] or 0)
        r["predicted_s"] = predicted
        r["model_error"] = predicted / r["step_s"] - 1
        r["fitted_s"] = fitted.step_seconds(r["flops"], r["host_bytes_per_step"] or 0)
        r["fitted_error"] = err
    return {"profile": base.name, "flops_per_s": base.flops_per_s,
            "fitted_flops_per_s": fitted.flops_per_s,
            "fitted_fraction_of_profile": fitted.flops_per_s / base.flops_per_s,
            "fitted": fitted.to_json()}


def _signed(n: int | None) -> str:
    from remat_common.internal import fmt_bytes

    if n is None:
        return "-"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def table(rows: list[dict[str, Any]]) -> str:
    from remat_common.internal import fmt_bytes

    head = ("example", "plan", "device", "peak", "temp", "deviceless temp", "verdict", "step ms",
            "tokens/s", "MFU", "model ms", "err", "fitted ms", "err", "host/step")
    body = [head]
    for r in rows:
        if "missing" in r:
            body.append((r["example"], r["plan"], r["missing"], *("",) * (len(head) - 3)))
            continue
        fits = r["status"] == "fits"
        body.append((
            r["example"], r["plan"], "fits" if fits else "REFUSED",
            fmt_bytes(r.get("peak_bytes")), fmt_bytes(r.get("temp_size_in_bytes")),
            fmt_bytes(r["target_temp_bytes"]) if "target_temp_bytes" in r
            else "refused" if "target_error" in r or (r.get("identical") and not fits) else "-",
            r["verdict"],
            "-" if not r.get("step_s") else f"{1e3 * r['step_s']:.1f}",
            "-" if not r.get("tokens_per_s") else f"{r['tokens_per_s']:,.0f}",
            "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %",
            "-" if r.get("predicted_s") is None else f"{1e3 * r['predicted_s']:.1f}",
            _pct(r.get("model_error")),
            "-" if r.get("fitted_s") is None else f"{1e3 * r['fitted_s']:.1f}",
            _pct(r.get("fitted_error")), fmt_bytes(r.get("host_bytes_per_step"))))
    widths = [max(len(str(row[i])) for row in body) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in body)


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text}: give 0 or more seconds")
    return v


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every argument, before any work starts (a bad one was found in a child, after minutes, or
    never: an unknown --target measured, compared nothing and exited 0); paths taken against the
    caller's working directory, as absolute paths, since the children run in the repository."""
    from remat_common import Plan, RematError
    from remat_common.internal import ReportConfig, parse_size
    from remat_common.measurement import load_profile, parse_accelerator
    from remat_common._tooling.accelerators._accelerators import compiler_available
    from remat_common.internal import beyond_machine

    def first(e: BaseException) -> str:
        return (str(e).strip().splitlines() or [type(e).__name__])[0]

    if args.host_memory is not None and (why := beyond_machine(args.host_memory)) is not None:
        ap.error(f"--host-memory: {why}")
    args.json = str(Path(args.json).resolve())
    if (why := unwritable(args.json)) is not None:
        ap.error(f"--json {args.json}: {why}")
    examples = []
    for example in args.examples:
        path = Path(example).resolve()
        if example not in EXAMPLES and not (example.endswith((".yaml", ".yml")) and path.is_file()):
            ap.error(f"--examples {example}: neither an example ({', '.join(EXAMPLES)}) nor a "
                     "report config file. Fix: a name, or the path of a report config (.yaml).")
        examples.append(example if example in EXAMPLES else str(path))
    args.examples = examples
    files = []
    for named in args.plan_file or ():
        name, eq, path = named.partition("=")
        try:
            if not (name and eq and path):
                raise RematError("not NAME=FILE (tuned=tuned.yaml)")
            Plan.load(Path(path).resolve())
        except (RematError, OSError) as e:
            ap.error(f"--plan-file {named}: {first(e)}")
        files.append(f"{name}={Path(path).resolve()}")
    args.plan_file = files or None
    try:
        sizes = parse_size(args.size or ())
        for example in args.examples:
            config = ReportConfig.load(config_path(example)).with_sizes(sizes)
            if args.plans:
                config.select(args.plans.split(","))
    except (RematError, OSError) as e:
        ap.error(first(e))
    if args.target not in ("auto", "none"):
        try:
            acc = parse_accelerator(args.target)
        except RematError as e:
            ap.error(f"--target {args.target}: {first(e)}")
        if acc.is_local:
            ap.error(f"--target {args.target}: the device column is this machine's already. "
                     "Fix: an accelerator name (v5e:1x1, h100x8), auto or none.")
        if (why := compiler_available(acc.platform)) is not None:
            ap.error(f"--target {args.target}: this machine cannot compile for {acc.platform}: "
                     f"{why}. Fix: install it (pip install 'jax-remat-plan[target-"
                     f"{'tpu' if acc.platform == 'tpu' else 'gpu'}]'), or --target none.")
    if args.profile not in ("auto", "none"):
        try:
            load_profile(args.profile)
        except (RematError, OSError) as e:
            ap.error(f"--profile {args.profile}: {first(e)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/device_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", nargs="+", default=list(EXAMPLES), metavar="NAME|CONFIG.yaml",
                    help=f"example GPTs ({', '.join(EXAMPLES)}) or report config files of any "
                         "model (examples/llms/qwen3.yaml)")
    ap.add_argument("--plans", default=None, help="comma-separated plan names of the report configs")
    ap.add_argument("--plan-file", action="append", metavar="NAME=FILE",
                    help="a plan of your own (a tuned plan), added to each example's; repeatable")
    ap.add_argument("--size", nargs="+", default=None, metavar="KEY=VALUE",
                    help="model sizes and batch (default: the report configs'; --quick: tiny)")
    ap.add_argument("--steps", type=count(1), default=None,
                    help="timed steps per plan (default 5; quick 2)")
    ap.add_argument("--warmup", type=count(0), default=1, help="untimed steps first (default 1)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--target", default="auto", metavar="NAME",
                    help="the deviceless compile to set beside the device's: an accelerator name "
                         "(v5e:1x1, h100x8), 'auto' (the default: this device's topology) or 'none'")
    ap.add_argument("--profile", default="auto", metavar="NAME|FILE",
                    help="the device profile whose time model is checked ('auto': v5e on a "
                         "v5e, h100/h200 on those; 'none')")
    ap.add_argument("--json", default="device_check.json", help="where to write the rows")
    ap.add_argument("--budget-s", type=_seconds, default=BUDGET_S,
                    help=f"start no measurement after this many seconds (default {BUDGET_S})")
    ap.add_argument("--host-memory", type=byte_size, default=None, metavar="BYTES",
                    help="what a measurement may hold in host memory, checked against its "
                         "prediction before anything is allocated (default: 90 %% of this "
                         "machine's available memory)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="device", choices=("device", "deviceless"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--out-fd", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.quick else 5
    if args.quick and not args.size:
        args.size = list(QUICK_SIZE)
    if args.child:
        from remat_common import RematError

        _die_with_parent()
        try:
            return child(args)
        except RematError as e:  # the library's own refusal: one line, for the row
            print(f"device_check: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    stop_on_signals()
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"steps": args.steps, "warmup": args.warmup, "examples": {}}
    failed: list[str] = []  # requested deviceless compiles that did not compile
    stopped: Stopped | None = None
    try:
        check_args(ap, args)
    except Stopped as e:
        print(f"device_check: stopped by {e.name}, before anything ran", file=sys.stderr)
        return e.status
    try:
        for example in args.examples:
            rows += measure(example, args, t0, out, failed)
    except Stopped as e:  # the running child is ended; what the others finished is written
        stopped = e
        rows.append({"example": example, "plan": "*", "missing": f"stopped by {e.name}"})
    for s in (signal.SIGINT, signal.SIGTERM):  # from here on: writing what was done, whole
        signal.signal(s, signal.SIG_IGN)
    out["rows"] = rows
    out["wall_s"] = round(time.monotonic() - t0, 1)
    out["incomplete"] = bool(stopped or failed or any("missing" in r for r in rows))
    if stopped:
        out["signal"] = stopped.name
    write_json(args.json, out, indent=2)
    if stopped:
        done = sum("missing" not in r for r in rows)
        print(f"device_check: stopped by {stopped.name}; wrote {args.json}: {done} plan(s) "
              "measured before, marked incomplete", file=sys.stderr)
        return stopped.status
    return summary(rows, out, args, failed)


def measure(example: str, args: argparse.Namespace, t0: float, out: dict[str, Any],
            failed: list[str]) -> list[dict[str, Any]]:
    """One example's rows: the device's child, then the deviceless one's, merged."""
    left = args.budget_s - (time.monotonic() - t0)
    if left < 10:
        return [{"example": example, "plan": "*", "missing": "out of time"}]
    device = run_child(example, "device", args, left)
    if isinstance(device, str):
        return [{"example": example, "plan": "*", "missing": device}]
    target = None if args.target == "none" else args.target
    if target == "auto":
        target = auto_target(device["device_kind"], device["devices"])
    deviceless: dict[str, Any] | str | None = None
    if target:
        deviceless = run_child(example, "deviceless", args,
                               max(10.0, args.budget_s - (time.monotonic() - t0)), target)
        if isinstance(deviceless, str):
            deviceless = f"deviceless compile failed: {deviceless}"
            failed.append(f"{example} ({target}): {deviceless}")
    merged = rows_of(example, device, deviceless)
    local = auto_target(device["device_kind"], device["devices"])  # this device's peak
    peak = None
    if local:
        from remat_common.measurement import parse_accelerator
        peak = parse_accelerator(local).flops_per_s
    with_mfu(merged, dict(device["size"]), int(device["batch"]), peak)
    profile = args.profile
    if profile == "auto":
        chip = (target or "").split(":")[0].split("x")[0]
        profile = chip if chip in ("v5e", "h100", "h200") else None
    model = time_model(merged, None if profile == "none" else profile)
    out["examples"][example] = {k: device[k] for k in (
        "backend", "device_kind", "devices", "size", "batch", "host_bytes_predicted",
        "host_peak_bytes")}
    out["examples"][example].update(
        target=target, time_model=model, compiler=_compiler(device["report"]),
        deviceless_compiler=_compiler(deviceless["report"])
        if isinstance(deviceless, dict) else None)
    return merged


def summary(rows: list[dict[str, Any]], out: dict[str, Any], args: argparse.Namespace,
            failed: list[str]) -> int:
    """The table and what it shows; 1 where a measurement is missing or a deviceless compile
    asked for failed (nothing was compared: never reported as agreement)."""
    print(table(rows))
    print()
    for example, info in out["examples"].items():
        m = info["time_model"]
        fitted = ("" if "fitted_flops_per_s" not in m else
                  f"; fitted to these steps: {m['fitted_flops_per_s'] / 1e12:.1f} TFLOP/s "
                  f"({100 * m['fitted_fraction_of_profile']:.0f} % of the profile's "
                  f"{m['flops_per_s'] / 1e12:.0f})")
        print(f"{example}: {info['device_kind']} x{info['devices']} ({info['backend']}), size "
              f"{info['size']} batch {info['batch']}; deviceless: {info['target'] or 'none'}; "
              f"time model: {m.get('profile') or 'none'}{fitted}")
    backends = {info["backend"] for info in out["examples"].values()}
    if backends == {"cpu"}:
        print("NO accelerator: ran on cpu. The device column is XLA:CPU's compile and steps, not a "
              "TPU's or GPU's; a verdict against a deviceless TPU/GPU compile compares two "
              "compilers (run this on the device to compare a device with its topology).")
    done = [r for r in rows if "missing" not in r]
    differs = [r for r in done if str(r.get("verdict", "")).startswith("DIFFERS")]
    compared = [r for r in done if "identical" in r]
    print(f"peak: arguments + outputs + temp - aliased, as the compiler accounts it (on a TPU, "
          f"memory_stats() counts arrays only); step ms: median of {args.steps} steps after "
          f"{args.warmup} warm-up, each on the state the previous step returned (donated).")
    print(f"wrote {args.json} ({out['wall_s']} s); {len(done)} plan(s) measured, "
          + (f"{len(compared)} compared with the deviceless compile, {len(differs)} differ"
             if compared else "none compared with a deviceless compile"))
    for example, info in out["examples"].items():
        if info["host_bytes_predicted"] is None:
            print(f"{example}: its host memory was not predicted (its target does not build from "
                  "shapes alone): nothing budgeted it")
    for why in failed:
        print(f"FAILED: {why}; its plans were compared with nothing")
    if len(done) < len(rows):
        print(f"INCOMPLETE: {len(rows) - len(done)} measurement(s) missing (see the table)")
    return 1 if failed or len(done) < len(rows) else 0


def _die_with_parent() -> None:
    """A child ends with its parent, however the parent ends (SIGKILL included: it would hold the
    device, orphaned): Linux's PR_SET_PDEATHSIG."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's own stop still ends it
        pass


if __name__ == "__main__":
    sys.exit(main())
