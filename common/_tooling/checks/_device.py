"""The device check's measurements (``scripts/device_check``; its command line, and what it is
for: ``_device_cli.py``): a child process per example and mode that writes its report, the rows
that set the device's compile beside the deviceless one, and the time model against the steps."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..._shipped import example_config
from ..accelerators._accelerators import accelerator_for, parse_accelerator
from ..accelerators._profiles import fit_profile, load_profile
from ..accelerators._units import fmt_bytes
from ..cli._config import ReportConfig, parse_size
from ..cli._report import run_report, with_target
from ..measurement._host_memory import over_memory
from ..measurement._mfu import ModelFlops, mfu
from ..measurement._report import Report
from ..report._compare import compare_reports
from ._guard import checkout

#: The figures compared for the verdict: compiled memory per device, field for field.
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "host_temp_size_in_bytes", "peak_memory_in_bytes")
#: A child's command: this package's device check, run by the interpreter running this one.
_CHILD = ("import sys; from remat_common.internal import device_check; "
          "sys.exit(device_check(sys.argv[1:]))")


def child(args: argparse.Namespace) -> int:
    """Measure one example in this process (``--mode device``: on this machine's devices, steps
    run; ``deviceless``: compiled for ``--target``); write the report and the devices to the file
    open as ``--out-fd`` (unnamed: nothing is left on disk however this process ends)."""
    import jax

    config = ReportConfig.load(config_path(args.child))
    config = config.with_sizes(parse_size(args.size or ()))
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
        report = run_report(config, steps=args.steps, warmup=args.warmup)
    else:
        report = run_report(with_target(config, args.target, None), steps=0, warmup=0)
    dev = jax.devices()[0]
    peak_rss = 1024 * resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with os.fdopen(args.out_fd, "w") as out:
        out.write(json.dumps({
            "backend": jax.default_backend(), "device_kind": str(dev.device_kind),
            "devices": len(jax.devices()), "size": report.sizes or dict(config.model),
            "batch": config.batch, "host_bytes_predicted": need, "host_peak_bytes": peak_rss,
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
              f"step's arguments (parameters, optimizer state, batch: {fmt_bytes(per_plan)} a plan) "
              f"{copies} time(s) in host memory ({why})", fix, limit)


def config_path(example: str) -> Path:
    """An example's report config (``nnx_gpt``), or a report config file of any model."""
    return Path(example).resolve() if example.endswith((".yaml", ".yml")) else (
        example_config(example))


def with_mfu(rows: list[dict[str, Any]], sizes: dict[str, Any], batch: int,
             peak: float | None) -> None:
    """Tokens per second and MFU beside each timed row: model FLOPs per token from the
    architecture (``ModelFlops.from_sizes``), never the compiler's count."""
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
    cmd = [sys.executable, "-c", _CHILD, "--child", example, "--mode", mode,
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
    root = checkout()  # what the examples import of each other (examples.llms)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    if mode == "deviceless":  # it only compiles: libtpu may be held by this process's caller
        env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([*cmd, "--out-fd", str(out.fileno())], cwd=root, env=env,
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


def _compiler(report: Any) -> Any:
    """What compiled a report: its compiler record where it has one, else the accelerator or
    backend name."""
    doc = report.to_json()
    return doc.get("compiler") or (report.accelerator or {}).get("name") or report.capabilities.backend


def rows_of(example: str, device: dict[str, Any], deviceless: dict[str, Any] | str | None
            ) -> list[dict[str, Any]]:
    """Per plan: the device's figures, the deviceless compile's, and the verdict."""
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


def _signed(n: int | None) -> str:
    if n is None:
        return "-"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


def time_model(rows: list[dict[str, Any]], profile: str | None) -> dict[str, Any]:
    """The profile's predicted step time of each plan that ran against the measured one, and the
    profile fitted to these measurements (its FLOP rate; the host link kept)."""
    ran = [r for r in rows if r["status"] == "fits" and r.get("step_s") and r.get("flops")]
    if not ran or profile is None:
        return {"profile": profile, "note": "no plan ran, or no profile for this device"}
    base = load_profile(profile)
    if base is None:
        return {"profile": profile, "note": "no plan ran, or no profile for this device"}
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
        target = accelerator_for(device["device_kind"], device["devices"])
    deviceless: dict[str, Any] | str | None = None
    if target:
        deviceless = run_child(example, "deviceless", args,
                               max(10.0, args.budget_s - (time.monotonic() - t0)), target)
        if isinstance(deviceless, str):
            deviceless = f"deviceless compile failed: {deviceless}"
            failed.append(f"{example} ({target}): {deviceless}")
    merged = rows_of(example, device, deviceless)
    local = accelerator_for(device["device_kind"], device["devices"])  # this device's peak
    peak = None
    if local:
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
