"""``scripts/device_check`` (see that file and
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md).

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
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..._errors import RematError
from ..._plan import Plan
from ..accelerators._accelerators import compiler_available, parse_accelerator
from ..accelerators._profiles import load_profile
from ..accelerators._units import fmt_bytes
from ..cli._args import NON_NEGATIVE, POSITIVE, bounded
from ..cli._config import ConfigError, ReportConfig, check_output, parse_size
from ..measurement._host_memory import beyond_machine
from ._device import child, config_path, measure
from ._guard import (EXAMPLES, Stopped, byte_size, first_line, ignore_signals, restore_signals,
                     stop_on_signals, write_json)

#: ``--budget-s``: 0 or more seconds.
_SECONDS = bounded(float, "a number of seconds", zero=True, message="{text}: give 0 or more seconds")
QUICK_SIZE = ("n_layers=1", "d_model=32", "n_heads=2", "seq_len=16", "batch=2", "vocab=64")
BUDGET_S = 540


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


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every argument, before any work starts (a bad one was found in a child, after minutes, or
    never: an unknown --target measured, compared nothing and exited 0); paths taken against the
    caller's working directory, as absolute paths, since the children run in the repository."""
    if args.host_memory is not None and (why := beyond_machine(args.host_memory)) is not None:
        ap.error(f"--host-memory: {why}")
    args.json = str(Path(args.json).resolve())
    try:
        check_output(args.json, "--json", example="device_check.json")
    except ConfigError as e:
        ap.error(str(e))
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
            ap.error(f"--plan-file {named}: {first_line(e)}")
        files.append(f"{name}={Path(path).resolve()}")
    args.plan_file = files or None
    try:
        sizes = parse_size(args.size or ())
        for example in args.examples:
            config = ReportConfig.load(config_path(example)).with_sizes(sizes)
            if args.plans:
                config.select(args.plans.split(","))
    except (RematError, OSError) as e:
        ap.error(first_line(e))
    if args.target not in ("auto", "none"):
        try:
            acc = parse_accelerator(args.target)
        except RematError as e:
            ap.error(f"--target {args.target}: {first_line(e)}")
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
            ap.error(f"--profile {args.profile}: {first_line(e)}")


def _parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--steps", type=POSITIVE, default=None,
                    help="timed steps per plan (default 5; quick 2)")
    ap.add_argument("--warmup", type=NON_NEGATIVE, default=1, help="untimed steps first (default 1)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--target", default="auto", metavar="NAME",
                    help="the deviceless compile to set beside the device's: an accelerator name "
                         "(v5e:1x1, h100x8), 'auto' (the default: this device's topology) or 'none'")
    ap.add_argument("--profile", default="auto", metavar="NAME|FILE",
                    help="the device profile whose time model is checked ('auto': v5e on a "
                         "v5e, h100/h200 on those; 'none')")
    ap.add_argument("--json", default="device_check.json", help="where to write the rows")
    ap.add_argument("--budget-s", type=_SECONDS, default=BUDGET_S,
                    help=f"start no measurement after this many seconds (default {BUDGET_S})")
    ap.add_argument("--host-memory", type=byte_size, default=None, metavar="BYTES",
                    help="what a measurement may hold in host memory, checked against its "
                         "prediction before anything is allocated (default: 90 %% of this "
                         "machine's available memory)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="device", choices=("device", "deviceless"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--out-fd", type=int, default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """The device check (``--child``: one measurement of it); a signal stops it with what was
    measured written, marked incomplete, and 128 + the signal."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.quick else 5
    if args.quick and not args.size:
        args.size = list(QUICK_SIZE)
    if args.child:
        _die_with_parent()
        try:
            return child(args)
        except RematError as e:  # the library's own refusal: one line, for the row
            print(f"device_check: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    handlers = stop_on_signals()
    try:
        return _measured(ap, args)
    finally:
        restore_signals(handlers)


def _measured(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
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
    ignore_signals()  # from here on: writing what was done, whole
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
