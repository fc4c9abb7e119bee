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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("nnx_gpt", "eqx_gpt")
QUICK_SIZE = ("n_layers=1", "d_model=32", "n_heads=2", "seq_len=16", "batch=2", "vocab=64")
#: The figures compared for the verdict: compiled memory per device, field for field.
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "host_temp_size_in_bytes", "peak_memory_in_bytes")
BUDGET_S = 540


def child(args: argparse.Namespace) -> int:
    """Measure one example in this process (``--mode device``: on this machine's devices, steps
    run; ``deviceless``: compiled for ``--target``); write the report and the devices to ``--out``."""
    import jax

    import remat_common.internal as ri

    config = ri.ReportConfig.load(config_path(args.child))
    config = config.with_sizes(ri.parse_size(args.size or ()))
    if args.plans:
        config = config.select(args.plans.split(","))
    for named in args.plan_file or ():  # beside the plans selected
        name, _, path = named.partition("=")
        config = dataclasses.replace(config, plans=(*config.plans, (name, str(Path(path).resolve()))))
    if args.mode == "device":
        report = ri.run_report(config, steps=args.steps, warmup=args.warmup)
    else:
        report = ri.run_report(ri.with_target(config, args.target, None), steps=0, warmup=0)
    dev = jax.devices()[0]
    Path(args.out).write_text(json.dumps({
        "backend": jax.default_backend(), "device_kind": str(dev.device_kind),
        "devices": len(jax.devices()), "size": report.sizes or dict(config.model),
        "batch": config.batch,
        "report": report.to_json()}))
    return 0


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
    """What the child wrote (its ``report`` a ``Report``), or why there is none."""
    from remat_common.measurement import Report

    out = Path(args.json).with_suffix(f".{Path(example).stem}.{mode}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", example, "--mode", mode, "--out", str(out),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.plans:
        cmd += ["--plans", args.plans]
    if target:
        cmd += ["--target", target]
    for pf in args.plan_file or ():
        cmd += ["--plan-file", pf]
    if args.size:
        cmd += ["--size", *args.size]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if mode == "deviceless":  # it only compiles: libtpu may be held by this process's caller
        env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no result within {timeout:.0f} s"
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        return f"exit {proc.returncode}: {tail[:300]}"
    data = json.loads(out.read_text())
    out.unlink()
    data["report"] = Report.from_json(data["report"])
    return data


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
    for r in rep.refused:
        out.append({"example": example, "plan": r.name, "status": "refused", "error": r.error,
                    "identical": r.name in refused_there,
                    "verdict": "identical (both refused)" if r.name in refused_there else
                    "DIFFERS: refused on the device, fits deviceless" if r.name in fits_there
                    else "not compiled deviceless"})
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


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _signed(n: int | None) -> str:
    if n is None:
        return "-"
    return ("+" if n > 0 else "-" if n < 0 else "") + _bytes(abs(n))


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def table(rows: list[dict[str, Any]]) -> str:
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
            _bytes(r.get("peak_bytes")), _bytes(r.get("temp_size_in_bytes")),
            _bytes(r["target_temp_bytes"]) if "target_temp_bytes" in r
            else "refused" if "target_error" in r or (r.get("identical") and not fits) else "-",
            r["verdict"],
            "-" if not r.get("step_s") else f"{1e3 * r['step_s']:.1f}",
            "-" if not r.get("tokens_per_s") else f"{r['tokens_per_s']:,.0f}",
            "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %",
            "-" if r.get("predicted_s") is None else f"{1e3 * r['predicted_s']:.1f}",
            _pct(r.get("model_error")),
            "-" if r.get("fitted_s") is None else f"{1e3 * r['fitted_s']:.1f}",
            _pct(r.get("fitted_error")), _bytes(r.get("host_bytes_per_step"))))
    widths = [max(len(str(row[i])) for row in body) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in body)


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
    ap.add_argument("--steps", type=int, default=None, help="timed steps per plan (default 5; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2; quick 1)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--target", default="auto", metavar="NAME",
                    help="the deviceless compile to set beside the device's: an accelerator name "
                         "(v5e:1x1, h100x8), 'auto' (the default: this device's topology) or 'none'")
    ap.add_argument("--profile", default="auto", metavar="NAME|FILE",
                    help="the device profile whose time model is checked ('auto': tpu-v5e on a "
                         "v5e, h100/h200 on those; 'none')")
    ap.add_argument("--json", default="device_check.json", help="where to write the rows")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help=f"start no measurement after this many seconds (default {BUDGET_S})")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="device", choices=("device", "deviceless"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.quick else 5
    if args.warmup is None:
        args.warmup = 1
    if args.quick and not args.size:
        args.size = list(QUICK_SIZE)
    if args.child:
        return child(args)
    for example in args.examples:
        if example not in EXAMPLES and not config_path(example).is_file():
            ap.error(f"--examples {example}: neither an example ({', '.join(EXAMPLES)}) nor a "
                     "report config file. Fix: a name, or the path of a report config (.yaml).")
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"steps": args.steps, "warmup": args.warmup, "examples": {}}
    for example in args.examples:
        left = args.budget_s - (time.monotonic() - t0)
        if left < 10:
            rows.append({"example": example, "plan": "*", "missing": "out of time"})
            continue
        device = run_child(example, "device", args, left)
        if isinstance(device, str):
            rows.append({"example": example, "plan": "*", "missing": device})
            continue
        target = None if args.target == "none" else args.target
        if target == "auto":
            target = auto_target(device["device_kind"], device["devices"])
        deviceless: dict[str, Any] | str | None = None
        if target:
            deviceless = run_child(example, "deviceless", args,
                                   max(10.0, args.budget_s - (time.monotonic() - t0)), target)
            if isinstance(deviceless, str):
                deviceless = f"deviceless compile failed: {deviceless}"
        merged = rows_of(example, device, deviceless)
        local = auto_target(device["device_kind"], device["devices"])  # this device's peak
        peak = None
        if local:
            from remat_common.measurement import parse_accelerator
            peak = parse_accelerator(local).flops_per_s
        with_mfu(merged, dict(device["size"]), int(device["batch"]), peak)
        profile = args.profile
        if profile == "auto":
            profile = {"v5e": "tpu-v5e", "h100": "h100", "h200": "h200"}.get(
                (target or "").split(":")[0].split("x")[0])
        model = time_model(merged, None if profile == "none" else profile)
        rows += merged
        out["examples"][example] = {k: device[k] for k in ("backend", "device_kind", "devices",
                                                           "size", "batch")}
        out["examples"][example].update(
            target=target, time_model=model, compiler=_compiler(device["report"]),
            deviceless_compiler=_compiler(deviceless["report"])
            if isinstance(deviceless, dict) else None)
    out["rows"] = rows
    out["wall_s"] = round(time.monotonic() - t0, 1)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
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
    if len(done) < len(rows):
        print(f"INCOMPLETE: {len(rows) - len(done)} measurement(s) missing (see the table)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
