"""``scripts/capacity_check`` (see that file and
https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/tpu.md): the largest example GPT
that one device trains, (a) with no plan, (b) with the best activation plan, (c) with an activation
plan and the training state on host (a plan's ``state:``).

For each example and each kind of plan, the model is grown along one size (``--grow n_layers``,
``d_model`` or ``batch``) and the largest size whose training step the device's compiler accepts
is then trained for ``--steps`` steps on the shipped text: the losses must fall. "Fits" is the
compiler's verdict (XLA refuses a program that does not fit the device's memory); ``--budget``
adds a limit of its own on the compiled figures (device arguments, outputs and temporaries; on
CPU, whose compiler drops host placements, it cannot see state on host). Step times of the three
kinds are printed side by side.

On a TPU v5e chip, batch 8, sequence 1024::

    ./scripts/capacity_check --examples nnx_gpt,eqx_gpt --batch 8 --seq-len 1024 --d-model 1024 \\
        --n-heads 8 --grow n_layers --json capacity.json

Without the chip, ``--target v5e:1x1`` searches on the deviceless compile (nothing trained), and
on the chip ``--check FILE`` checks such a search's rows: each size fits and trains, the next is
refused. On a CPU, tiny (what the test runs): ``./scripts/capacity_check --quick``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..._compiler import compiler_identity
from ..._errors import RematError
from ..accelerators._accelerators import compiler_available, parse_accelerator
from ..accelerators._meshes import target_mesh
from ..accelerators._profiles import host_link, load_profile
from ..cli._args import POSITIVE
from ..cli._config import ConfigError, check_output
from ..measurement._host_memory import beyond_machine, host_budget
from ._capacity import (STATES, concrete_builds, example_model, example_plan, fits, largest,
                        measure_link, plan_state, train_example)
from ._guard import (EXAMPLES, Stopped, byte_size, first_line, restore_signals, stop_on_signals,
                     write_json)

#: The sizes ``--quick`` sets (a tiny model, for a CPU), and the defaults otherwise. Given beside
#: ``--quick`` they were silently replaced: the combination is refused.
QUICK = {"batch": 2, "seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 1, "most": 4}
DEFAULTS = {"batch": 8, "seq_len": 1024, "d_model": 1024, "n_heads": 8, "n_layers": 8, "most": 4096}
#: The compiled figures --check compares with the deviceless search's, where it recorded them.
_BYTES = ("argument_bytes", "temp_bytes", "alias_bytes", "host_temp_bytes", "device_bytes")

Save = Callable[[dict[str, Any]], None]


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`parse`, then :func:`run` in a worker thread while this one writes its JSON after
    every row and waits for a signal: stopped (Ctrl-C, SIGTERM), what was finished is written,
    marked incomplete with the signal named, and the process exits at once (128 + the signal),
    not waiting for a compile. The tool's own refusals (an accelerator it cannot compile for, a
    plan file it cannot read) are one line on stderr, status 2, not a traceback."""
    handlers = stop_on_signals()
    a: argparse.Namespace | None = None
    docs: list[dict[str, Any]] = [{"rows": []}]
    done: dict[str, Any] = {}
    try:
        a = parse(argv)
        with concrete_builds(*a.examples.split(",")):
            worker = threading.Thread(target=_outcome, args=(done, run, a, docs.append),
                                      daemon=True)
            worker.start()
            written = 1
            while worker.is_alive():
                worker.join(0.5)
                if a.json is not None and len(docs) > written:
                    written = len(docs)
                    write_json(a.json, {**docs[-1], "incomplete": True})
        if a.json is not None:
            write_json(a.json, {**docs[-1], "incomplete": "status" not in done})
        if "error" in done:
            raise done["error"]
        return int(done["status"])
    except RematError as e:
        print(f"capacity_check: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except Stopped as e:
        if a is not None and a.json is not None:
            write_json(a.json, {**docs[-1], "incomplete": True, "signal": e.name})
        print(f"capacity_check: stopped by {e.name}" + (
            f"; wrote {a.json}: {len(docs[-1]['rows'])} row(s) finished, marked incomplete"
            if a is not None and a.json is not None else ""), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(e.status)
    finally:
        restore_signals(handlers)


def _outcome(done: dict[str, Any], fn: Any, *args: Any) -> None:
    try:
        done["status"] = fn(*args)
    except BaseException as e:  # noqa: BLE001 - raised again in the main thread
        done["error"] = e


def _path(text: str) -> str:
    """A file path that is not empty (``--json ''`` was read as not given)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file")
    return text


def _names(p: argparse.ArgumentParser, option: str, text: str, allowed: Sequence[str]) -> None:
    """Refuses ``text`` unless its comma-separated names are each one of ``allowed`` (an unknown
    one was searched for nothing, or raised KeyError)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        p.error(f"{option} {text!r}: {'unknown ' + ', '.join(map(repr, bad)) if bad else 'no name'}"
                f"; allowed: {', '.join(map(repr, allowed))} (comma-separated)")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments, every one checked before any work starts (a bad one was a traceback, or
    found after the whole search)."""
    p = argparse.ArgumentParser(prog="capacity_check", description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", default=",".join(EXAMPLES))
    for key in ("batch", "seq_len", "d_model", "n_layers", "n_heads"):
        p.add_argument(f"--{key.replace('_', '-')}", type=POSITIVE, default=None,
                       help=f"default {DEFAULTS[key]} (--quick: {QUICK[key]})")
    p.add_argument("--vocab", type=POSITIVE, default=256)
    p.add_argument("--layout", choices=("scan", "list"), default="scan",
                   help="scan (one compile for any depth) or list")
    p.add_argument("--grow", choices=("n_layers", "d_model", "batch"), default="n_layers",
                   help="what grows: the model's depth or width, or the batch (--batch then unused)")
    p.add_argument("--start", type=POSITIVE, default=None, help="first size tried (default: 1 layer, or the d_model step)")
    p.add_argument("--most", type=POSITIVE, default=None, help="the largest size tried (default 4096)")
    p.add_argument("--plans", default="recompute,offload",
                   help="activation plans: the example's (plans/NAME.yaml) or LABEL=FILE (a plan file, "
                        "'{example}' in FILE replaced by the example's name; one whose state: keeps "
                        "something on host is of kind c, as remat tune --state writes them)")
    p.add_argument("--states", default="optimizer,both", help="state placements for (c)")
    p.add_argument("--steps", type=POSITIVE, default=20)
    p.add_argument("--budget", type=byte_size, default=None,
                   help="device memory, bytes or units (12GiB; besides the compiler's own limit)")
    p.add_argument("--profile", default="v5e",
                   help="device profile (a name or a YAML file, as remat tune --profile takes): its host link "
                        "prices the state's transfers, its time model predicts each step")
    p.add_argument("--target", default=None, metavar="ACCELERATOR",
                   help="search on this accelerator's compiler without its device (v5e:1x1, h100x8): the "
                        "sizes only, nothing trained; the JSON is what --check takes on the device")
    p.add_argument("--check", type=_path, default=None, metavar="JSON",
                   help="on the device: a --target run's rows, each size compiled (it must fit), the "
                        "next size compiled (it must be refused) and the size trained; no search")
    p.add_argument("--host-memory", type=byte_size, default=None, metavar="BYTES",
                   help="what the step may keep in host memory (30GiB; default on a device: 90 %% of "
                        "this machine's available memory, and no more; compiled for a --target: no "
                        "limit)")
    p.add_argument("--kinds", default="", help="the kinds of rows to search or --check (a,b,c; default all)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a CPU")
    p.add_argument("--json", type=_path, default=None)
    a = p.parse_args(argv)
    given = [f"--{k.replace('_', '-')}" for k in QUICK if getattr(a, k) is not None]
    if a.quick and given:
        p.error(f"--quick sets {', '.join(given)} itself (a tiny model, for a CPU) and replaced "
                f"what was given beside it without a word. Fix: drop {' '.join(given)}, or --quick")
    for k, v in (QUICK if a.quick else DEFAULTS).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.quick:
        a.steps = min(a.steps, 6)
    _names(p, "--examples", a.examples, EXAMPLES)
    if a.kinds:  # "" (the default): all
        _names(p, "--kinds", a.kinds, ("a", "b", "c"))
    if a.states:  # "": no state placements (no kind c rows of that form)
        _names(p, "--states", a.states, tuple(STATES))
    if a.start is not None and a.most < a.start:
        p.error(f"--most {a.most} is below --start {a.start}: nothing would be tried")
    if a.json is not None:
        try:
            check_output(a.json, "--json", example="capacity.json")
        except ConfigError as e:
            p.error(str(e))
    a.step = 1 if a.grow != "d_model" else 128 if not a.quick else 2 * a.n_heads
    a.base = dict(vocab=a.vocab, d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads,
                  seq_len=a.seq_len, layout=a.layout)
    a.searched = None
    if a.check is not None:
        try:
            a.searched = _searched(Path(a.check))
        except ValueError as e:
            p.error(f"--check {a.check}: {e}")
    _check_tools(p, a)
    return a


def _searched(path: Path) -> dict[str, Any]:
    """A ``--check`` file's search, checked before any work (a missing file, a directory, text
    that is not JSON and a missing key were each a traceback)."""
    if path.is_dir():
        raise ValueError("a directory; give the JSON file a --target search wrote (--json FILE)")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError("no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"not JSON ({type(e).__name__}: {str(e)[:120]})") from None
    keys = ("where", "compiler", "batch", "seq_len", "grow", "step", "base", "rows")
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}: not the JSON of a capacity_check search "
                         "(capacity_check --target NAME --json FILE writes one)")
    grow = data["grow"]
    if grow not in ("n_layers", "d_model", "batch") or not isinstance(data["base"], dict) or not (
            isinstance(data["rows"], list) and data["rows"]):
        raise ValueError("its grow, base or rows are not a search's (grow: n_layers, d_model or "
                         "batch; base: the sizes; rows: at least one)")
    for i, row in enumerate(data["rows"]):
        need = ("example", "kind", "plan", "state", grow)
        if not isinstance(row, dict) or any(k not in row for k in need):
            raise ValueError(f"row {i} lacks one of {', '.join(need)}")
        if row["example"] not in EXAMPLES:
            raise ValueError(f"row {i}: example {row['example']!r} is not one of "
                             f"{', '.join(EXAMPLES)}")
    return data


def _check_tools(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """What the arguments name, checked before any work: the accelerator and its compiler, the
    host memory, the profile, every plan (a missing one was found after a kind was searched), and
    the model at the first and last size tried (the model's own refusal: d_model=100 with 8 heads)."""
    if a.target is not None:
        try:
            acc = parse_accelerator(a.target)
        except RematError as e:
            p.error(first_line(e))
        if (why := compiler_available(acc.platform) if not acc.is_local else None) is not None:
            p.error(f"--target {a.target}: this machine cannot compile for {acc.platform}: {why}")
    elif a.host_memory is not None and (why := beyond_machine(a.host_memory)) is not None:
        p.error(f"--host-memory: {why}")
    try:
        load_profile(a.profile)
    except (RematError, OSError) as e:
        p.error(f"--profile {a.profile}: {first_line(e)}")
    wanted = ([(r["example"], r["plan"], _state(r)) for r in a.searched["rows"]] if a.searched
              else [(ex, n, None) for ex in a.examples.split(",") for n in a.plans.split(",") if n])
    for example, name, state in wanted:
        try:
            example_plan(example, name, state)
        except (RematError, OSError, KeyError) as e:  # KeyError: a --check row's unknown state
            p.error(f"--plans {name} ({example}): {first_line(e)}")
    if a.searched:
        return
    for example in a.examples.split(","):
        model = example_model(example)
        for v in dict.fromkeys((a.start or a.step, a.most)):
            sizes = {**a.base, a.grow: v}
            sizes.pop("batch", None)
            try:
                model.build(None, tx=model.optimizer(learning_rate=3e-3, warmup_steps=5,
                                                     decay_steps=100), abstract=True, **sizes)
            except (ValueError, TypeError, RematError) as e:
                p.error(f"{example} at {a.grow}={v} (from --start/--most): {first_line(e)}")


def _kinds(plans: list[str], states: list[str], example: str) -> list[tuple[str, str, str | None]]:
    """``(kind, plan, state)`` to search: no plan; each activation plan (a plan file whose
    ``state:`` keeps something on host is of kind c); each with each state placement."""
    kinds: list[tuple[str, str, str | None]] = [("a: no plan", "none", None)]
    for name in plans:
        on_host = "=" in name and bool(example_plan(example, name, None).state.on_host)
        kinds.append(("c: plan + state on host" if on_host else "b: activation plan", name, None))
    kinds += [("c: plan + state on host", name, st) for name in plans
              if "=" not in name or not example_plan(example, name, None).state.on_host
              for st in states]
    return kinds


def _state(row: dict[str, Any]) -> str | None:
    """The state placement to add to the row's plan (``None``: the plan's own)."""
    return None if row["state"] == "device" or "=" in str(row["plan"]) else row["state"]


def run(a: argparse.Namespace, save: Save) -> int:
    """The search (or, with ``--check``, the check) the arguments ask for; ``save`` is handed the
    JSON document after every row."""
    import jax

    profile = load_profile(a.profile)
    link = host_link(profile)
    a.mesh, memory = None, None  # the compile-only device of --target; the device's bytes
    if a.target is not None:
        acc = parse_accelerator(a.target)
        a.mesh = target_mesh(acc, {"data": 1})
        memory = acc.memory_bytes
        where = f"{acc.describe()}, compiled without the device"
    else:
        dev = jax.devices()[0]
        memory = (dev.memory_stats() or {}).get("bytes_limit") if dev.platform != "cpu" else None
        where = f"{jax.default_backend()} ({dev.device_kind})"
    a.host_limit = a.host_memory  # what the step may keep in host memory
    if a.host_limit is None and a.mesh is None and jax.default_backend() != "cpu":
        a.host_limit = host_budget() or int(
            0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    compiler = compiler_identity(
        "tpu" if a.mesh is not None and a.mesh.devices.flat[0].platform == "tpu" else None
    ).describe()
    a.link_measured = None
    if a.mesh is None and jax.default_backend() != "cpu":
        a.link_measured = measured = measure_link()
        print(f"host link measured: {measured['to_device'] / 1e9:.1f} GB/s to the device, "
              f"{measured['to_host'] / 1e9:.1f} GB/s to host ({profile.name if profile else 'no profile'} "
              f"assumes {link.bytes_per_s / 1e9:g} GB/s)", flush=True)
    if a.searched is not None:
        return check(a, Path(a.check), profile, link, where, compiler, save)
    step, base = a.step, a.base
    start = a.start if a.start is not None else step  # `--start 0` was taken as not given
    plans = [n for n in a.plans.split(",") if n]
    states = [s for s in a.states.split(",") if s]
    print(f"capacity_check on {where} ({compiler}), "
          f"{'' if a.grow == 'batch' else f'batch {a.batch}, '}seq_len {a.seq_len}, "
          f"growing {a.grow} from {base}", flush=True)
    rows: list[dict[str, Any]] = []
    head = {"where": where, "compiler": compiler, "target": a.target, "batch": a.batch,
            "seq_len": a.seq_len, "grow": a.grow, "step": step, "base": base,
            "profile": profile.name if profile else None, "link_measured": a.link_measured}
    save({**head, "rows": []})
    for example in a.examples.split(","):
        best: dict[str, tuple[dict[str, Any], Any]] = {}
        for kind, name, st in _kinds(plans, states, example):
            if a.kinds and kind.split(":")[0] not in a.kinds.split(","):
                continue
            plan = example_plan(example, name, st)
            print(f"{example} {kind}: plan {name}, state {st or 'device'}", flush=True)
            size, info = largest(example, plan, base, a.grow, a.batch, start, a.most, step,
                                 a.budget, lambda m: print(m, flush=True), link, memory, profile,
                                 a.mesh, a.host_limit)
            if size is None:
                print("  nothing fits", flush=True)
                continue
            key = kind.split(":")[0]
            if st is None and not plan_state(plan) == "device":
                st = plan_state(plan)  # a plan file's own state:
            compiled = info.pop("compiled", None)
            row = {"example": example, "kind": kind, "plan": name, "state": st or "device",
                   a.grow: size, **info}
            if a.mesh is not None:
                compiled = None  # compiled for a device this machine does not have
            print(f"  largest: {a.grow}={size}, {info['params']:,} parameters", flush=True)
            if key not in best or (info["params"], size) > (best[key][0]["params"],
                                                             best[key][0][a.grow]):
                best[key] = (row, compiled)
        for key in sorted(best):
            row, compiled = best[key]
            if a.mesh is None:
                row.update(train_example(example, example_plan(example, row["plan"], _state(row)),
                                         {**base, a.grow: row[a.grow]}, a.batch, a.steps, compiled))
            rows.append(row)
            save({**head, "rows": list(rows)})
    _table(rows, a.grow)
    if a.mesh is not None:
        return 0 if rows else 1
    return 0 if rows and all(r["falling"] for r in rows) else 1


def check(a: argparse.Namespace, path: Path, profile: Any, link: Any, where: str,
          compiler: str, save: Save) -> int:
    """The device's verdict on a deviceless search's answers (``a.searched``, read from ``path``):
    each row's size fits and trains with the loss falling, the next size is refused; the figures
    of both compiles side by side. ``save`` is handed the JSON document after every row."""
    data = a.searched
    grow, base = data["grow"], data["base"]
    print(f"capacity_check --check {path} on {where} ({compiler}); the search: {data['where']} "
          f"({data['compiler']})", flush=True)
    rows: list[dict[str, Any]] = []
    for want in data["rows"]:
        example, size = want["example"], want[grow]
        if (a.examples and example not in a.examples.split(",")) or (
                a.kinds and want["kind"].split(":")[0] not in a.kinds.split(",")):
            continue
        plan = example_plan(example, want["plan"], _state(want))
        print(f"{example} {want['kind']}: plan {want['plan']}, state {want['state']}, "
              f"{grow}={size}", flush=True)
        ok, info = fits(example, plan, {**base, grow: size}, data["batch"], a.budget, link,
                        profile, a.mesh, a.host_limit)
        compiled = info.pop("compiled", None)
        print(f"  {grow}={size}: {'fits' if ok else 'refused'} {info}", flush=True)
        nxt = want.get("next") or {}
        refused = None
        if nxt:
            good, ninfo = fits(example, plan, {**base, grow: nxt[grow]}, data["batch"], a.budget,
                               link, profile, a.mesh, a.host_limit)
            refused = not good
            ninfo.pop("compiled", None)
            print(f"  {grow}={nxt[grow]}: {'fits' if good else 'refused'} {ninfo}", flush=True)
        row = {**{k: want[k] for k in ("example", "kind", "plan", "state", grow)}, **info,
               "fits": ok, "next_refused": refused, "deviceless": want,
               # the figures the search recorded (a tune's capacity rows: the peak only)
               "same_bytes": all(info.get(k) == want[k] for k in _BYTES if k in want)
               if any(k in want for k in _BYTES) else None}
        if a.link_measured and info.get("flops") and profile is not None:
            # the same time model at the measured link: bytes that go both ways take as long as
            # at the harmonic mean of the two directions
            to_dev, to_host = a.link_measured["to_device"], a.link_measured["to_host"]
            measured = dataclasses.replace(
                profile, host_link_bytes_per_s=2 / (1 / to_dev + 1 / to_host))
            row["predicted_ms_link_measured"] = 1e3 * measured.step_seconds(
                info["flops"], 2 * info["host_temp_bytes"], info["transfer_bytes"])
        if ok:
            row.update(train_example(example, plan, {**base, grow: size}, data["batch"], a.steps,
                                     compiled))
            for k in ("predicted_ms", "predicted_ms_link_measured"):
                if row.get(k):
                    row[k.replace("predicted_ms", "prediction_error")] = row[k] / row["step_ms"] - 1
            print(f"  trained: {row['step_ms']:.1f} ms/step, loss {row['losses'][0]:.3f} -> "
                  f"{row['losses'][-1]:.3f}", flush=True)
        del compiled
        rows.append(row)
        save({"where": where, "compiler": compiler,
              "searched": {k: data[k] for k in ("where", "compiler")},
              "batch": data["batch"], "seq_len": data["seq_len"], "grow": grow, "base": base,
              "profile": profile.name if profile else None, "link_measured": a.link_measured,
              "rows": list(rows)})
    _table(rows, grow)
    return 0 if rows and all(r["fits"] and r.get("falling") and r["next_refused"] is not False
                             for r in rows) else 1


def _table(rows: list[dict[str, Any]], grow: str) -> None:
    print(f"\n{'example':8} {'kind':26} {'plan':10} {'state':10} {grow:>8} {'parameters':>14} "
          f"{'peak MiB':>9} {'ms/step':>9} {'predicted':>16} {'host MiB/step':>13} "
          f"{'loss first->last':>18} falling")
    for r in rows:
        ms = f"{r['step_ms']:.1f}" if "step_ms" in r else "-"
        pred = f"{r['predicted_ms']:.1f}" if r.get("predicted_ms") else "-"
        if r.get("prediction_error") is not None:
            pred += f" ({100 * r['prediction_error']:+.0f} %)"
        loss = (f"{r['losses'][0]:>8.3f}->{r['losses'][-1]:<8.3f}" if r.get("losses") else f"{'-':>18}")
        falling = ("yes" if r["falling"] else "NO") if "falling" in r else "-"
        peak = f"{r['device_bytes'] / 2**20:,.0f}" if "device_bytes" in r else "-"
        moved = f"{r['transfer_bytes'] / 2**20:.1f}" if "transfer_bytes" in r else "-"  # refused
        print(f"{r['example']:8} {r['kind']:26} {str(r['plan'])[:10]:10} {r['state']:10} "
              f"{r[grow]:>8} {r['params']:>14,} {peak:>9} {ms:>9} {pred:>16} "
              f"{moved:>13} {loss} {falling}")
