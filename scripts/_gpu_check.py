"""The body of ``scripts/gpu_check`` (see that file and docs/gpu.md).

The parent process never imports JAX (on a GPU, JAX would take the device's memory for the whole
run); each measurement runs in a child process (``--child``) that measures one or more plans with
``remat_common.internal.run_report`` and prints one JSON line. Peak device memory is read from the
child's device after its plans ran, so it is a plan's own peak only when the child ran one plan
(the default; ``--quick`` runs all plans in one process and reports no per-plan peak).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("nnx_gpt", "eqx_gpt")
PLANS = ("save", "recompute", "offload", "names")
QUICK_PLANS = ("save", "offload")
QUICK_SIZE = ("n_layers=1", "d_model=32", "n_heads=2", "seq_len=16", "batch=2", "vocab=64")
#: On a GPU the configs' batch of 8 keeps too few activations to see beside parameters and
#: optimizer state; 64 makes them dominate (override with --size).
GPU_SIZE = ("batch=64",)
MARK = "GPU_CHECK_ROWS "
CHILD_TIMEOUT_S = 200
#: The whole run stays under 8 minutes: a child gets at most what is left of this budget.
BUDGET_S = 450


def child(args: argparse.Namespace) -> int:
    """Measure ``args.plans`` of one example in this process; print the rows as one JSON line."""
    import jax

    import remat_common.internal as ri

    backend = jax.default_backend()
    gpu = backend in ("gpu", "cuda", "rocm")
    size = ri.parse_size(args.size or (GPU_SIZE if gpu else ()))
    config = ri.ReportConfig.load(ROOT / "examples" / args.child / "report.yaml")
    config = config.select(args.plans.split(",")).with_sizes(size)
    report = ri.run_report(config, steps=args.steps, warmup=args.warmup)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use") if len(args.plans.split(",")) == 1 else None
    both = _both_ways(ri, config, report, str(jax.devices()[0].device_kind), gpu, args.target)
    rows = []
    for p in report.plans:
        placement = p.placement
        rows.append({
            "example": args.child, "plan": p.name, "backend": backend,
            "device": str(jax.devices()[0].device_kind), "size": dict(config.model),
            "batch": config.batch,
            "peak_bytes_in_use": peak if gpu else None,
            "step_time_median_s": p.timing.median_s,
            "steps_timed": len(p.timing.steps), "warmup": p.timing.warmup,
            "device_residual_bytes": p.device_bytes, "host_residual_bytes": p.host_bytes,
            # the verifier's host residual bytes, out and back: what the plan moves per step
            "transfer_bytes_per_step": p.host_transfer_bytes,
            "compiled_temp_bytes": p.memory.temp_size_in_bytes,
            "compiled_host_temp_bytes": p.memory.host_temp_size_in_bytes,
            "placed_on_host_in_cuda_export": None if placement is None else placement.placed,
            "problems": list(p.problems),
            **both.get(p.name, both.get("", {})),
        })
    print(MARK + json.dumps(rows), flush=True)
    return 0


def _both_ways(ri: Any, config: Any, report: Any, device_kind: str, gpu: bool,
               target: str | None) -> dict[str, dict[str, Any]]:
    """Each plan compiled for the target config that matches this device (``--target``: that
    accelerator, on any backend), beside this device's compile: ``{plan: fields}``, or ``{"":
    {"target_note": why not}}``."""
    name = target or (ri.accelerator_for(device_kind) if gpu else None)
    if name is None:
        why = (f"no target config ships for {device_kind!r}" if gpu else
               "not a GPU: no matching target config (give --target NAME to compare anyway)")
        return {"": {"target_accelerator": None, "target_note": why}}
    from remat_common.measurement import compiler_available, parse_accelerator

    missing = compiler_available(parse_accelerator(name).platform)
    if missing is not None:
        return {"": {"target_accelerator": name, "target_note": missing}}
    target = ri.run_report(ri.with_target(config, name, None), steps=0, warmup=0)
    out = {}
    for r in ri.compare_reports(report, target):
        out[r.plan] = {"target_accelerator": name, "target_note": None,
                       "compiled_peak": r.peak[0], "target_peak": r.peak[1],
                       "peak_diff": r.peak_diff, "target_temp": r.temp[1],
                       "temp_diff": r.temp_diff, "target_host_temp": r.host_temp[1]}
    return out


def run_child(example: str, plans: tuple[str, ...], args: argparse.Namespace,
              timeout: float) -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", example, "--plans", ",".join(plans),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.target:
        cmd += ["--target", args.target]
    if args.size:
        cmd += ["--size", *args.size]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # peak_bytes_in_use is what the plan used
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:  # the child is killed; the plans are reported as missing
        sys.stderr.write(f"gpu_check: {example} {plans}: no result within {timeout:.0f} s\n")
        return [{"example": example, "plan": plan, "missing": f"timed out after {timeout:.0f} s"}
                for plan in plans]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"gpu_check: measuring {example} {plans} failed (exit {proc.returncode})")
    rows: list[dict[str, Any]] = json.loads(lines[-1][len(MARK):])
    for r in rows:
        r["process_s"] = round(time.monotonic() - t0, 1)
    return rows


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def compare(rows: list[dict[str, Any]]) -> None:
    """Per example: does each offloading plan lower the real device peak below ``save``?"""
    for r in rows:
        if "missing" in r:
            continue
        save = next((s for s in rows if s["example"] == r["example"] and s["plan"] == "save"
                     and "missing" not in s), None)
        r["offloads"] = r["host_residual_bytes"] > 0
        if not r["offloads"]:
            r["lowers_peak_vs_save"] = None
        elif save is None or r["peak_bytes_in_use"] is None or save["peak_bytes_in_use"] is None:
            r["lowers_peak_vs_save"] = None
        else:
            r["lowers_peak_vs_save"] = r["peak_bytes_in_use"] < save["peak_bytes_in_use"]


def table(rows: list[dict[str, Any]]) -> str:
    head = ("example", "plan", "peak", "step ms", "host<->dev/step", "device res", "host res",
            "temp", "placed (cuda)", "lowers peak")
    body = [head]
    for r in rows:
        if "missing" in r:
            body.append((r["example"], r["plan"], r["missing"], *("",) * (len(head) - 3)))
            continue
        t = r["step_time_median_s"]
        body.append((r["example"], r["plan"], _bytes(r["peak_bytes_in_use"]),
                     "-" if t is None else f"{t * 1e3:.2f}", _bytes(r["transfer_bytes_per_step"]),
                     _bytes(r["device_residual_bytes"]), _bytes(r["host_residual_bytes"]),
                     _bytes(r["compiled_temp_bytes"]),
                     {True: "yes", False: "NO", None: "-"}[r["placed_on_host_in_cuda_export"]],
                     {True: "yes", False: "NO", None: "-"}[r["lowers_peak_vs_save"]]))
    widths = [max(len(str(row[i])) for row in body) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in body)


def both_ways(rows: list[dict[str, Any]]) -> str:
    """Each plan compiled for this device and for its target config: peak and temp, both ways."""
    done = [r for r in rows if r.get("target_peak") is not None]
    if not done:
        notes = sorted({str(r.get("target_note")) for r in rows if r.get("target_note")})
        return "not compiled for a target config: " + ("; ".join(notes) or "no plan measured")
    head = ("example", "plan", "peak here", "peak target", "diff", "temp here", "temp target",
            "diff", "host temp target")
    body = [head] + [(r["example"], r["plan"], _bytes(r["compiled_peak"]), _bytes(r["target_peak"]),
                      _signed(r["peak_diff"]), _bytes(r["compiled_temp_bytes"]),
                      _bytes(r["target_temp"]), _signed(r["temp_diff"]),
                      _bytes(r["target_host_temp"])) for r in done]
    widths = [max(len(str(row[i])) for row in body) for i in range(len(head))]
    return (f"compiled both ways: this device ({done[0]['device']}, {done[0]['backend']}) and "
            f"the target config {done[0]['target_accelerator']}, per device:\n"
            + "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in body))


def _signed(n: Any) -> str:
    if n is None:
        return "-"
    return ("+" if n > 0 else "-" if n < 0 else "") + _bytes(abs(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu_check", description=__doc__)
    ap.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    ap.add_argument("--plans", default=None, help="comma-separated plan names of the report configs")
    ap.add_argument("--size", nargs="+", default=None, metavar="KEY=VALUE",
                    help="model sizes and batch (default on a GPU: batch=64; --quick: tiny)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per plan (default 5; quick 1)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2; quick 1)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, plans save and offload, one process per example")
    ap.add_argument("--json", default="gpu_check.json", help="where to write the rows")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help=f"stop starting measurements after this many seconds (default {BUDGET_S})")
    ap.add_argument("--target", default=None, metavar="NAME",
                    help="compile each plan for this accelerator too (default on a GPU: the "
                         "target config of its device_kind, NVIDIA H200 -> h200; docs/targets.md)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 1 if args.quick else 5
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.child:
        return child(args)
    plans = tuple(args.plans.split(",")) if args.plans else (QUICK_PLANS if args.quick else PLANS)
    if args.quick and not args.size:
        args.size = list(QUICK_SIZE)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    # one process per plan (the device's peak is then that plan's own), or per example with --quick
    jobs = [(e, plans) for e in args.examples] if args.quick else \
        [(e, (p,)) for e in args.examples for p in plans]
    for example, some in jobs:
        left = args.budget_s - (time.monotonic() - t0)
        if left < 10:
            rows += [{"example": example, "plan": p, "missing": "out of time"} for p in some]
            continue
        rows += run_child(example, some, args, min(CHILD_TIMEOUT_S, left))
    compare(rows)
    done = [r for r in rows if "missing" not in r]
    backend = done[0]["backend"] if done else "none"
    gpu = backend in ("gpu", "cuda", "rocm")
    out = {"backend": backend, "device": done[0]["device"] if done else None, "gpu": gpu,
           "per_plan_processes": not args.quick, "steps": args.steps, "warmup": args.warmup,
           "transfer_source": "verified host residual bytes x 2 (to host and back), per step",
           "wall_s": round(time.monotonic() - t0, 1), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(table(rows))
    print()
    print(both_ways(done))
    print()
    if gpu:
        print(f"GPU: {out['device']}. Peak = device memory_stats()['peak_bytes_in_use'] of a "
              f"process that ran only that plan{'' if not args.quick else ' (absent: --quick runs all plans in one process)'}; "
              "step time = median of the timed steps after warm-up; host<->dev = verified host "
              "residual bytes x 2 per step.")
    else:
        print(f"NO GPU: ran on {backend}. GPU figures are ABSENT (real peak memory, and whether "
              "offload lowers it); on this backend offload is a no-op, so step times and "
              "transfers are not those of a GPU. Printed: the compiled figures (verified residual "
              "bytes, compiled temp) and the offload placements in the step exported for cuda.")
    print(f"wrote {args.json} ({out['wall_s']} s)")
    if len(done) < len(rows):
        print(f"INCOMPLETE: {len(rows) - len(done)} of {len(rows)} measurements missing (see the "
              "table); raise --budget-s or measure fewer plans (--plans).")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
