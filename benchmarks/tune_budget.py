"""``remat tune`` at five budgets on a 12-layer GPT: the tuned plan next to a grid and the uniform plans.

Goal: show that the tuned plan is never over budget, within 2% of the best plan a broad grid finds
at the same budget, no worse than any uniform plan that fits, and cheap to find (compiles and
wall time), then how much larger a batch each plan allows under one budget.

Steps:
1. Compile the grid: every uniform plan over the stack (save, dots, dots_no_batch, names,
   recompute) and every two-choice mix with 3, 6 or 9 of the 12 layers on the first choice (one
   compile each; ``tune(..., plans=grid)`` with a cache, so these figures are shared).
2. Pick five budgets spread between the full-recompute peak and the save-all peak.
3. Tune at each budget from scratch (no cache: the compiles and the wall time are the real cost)
   and print the tuned plan (its YAML), its compiled peak, FLOP ratio, compiles and wall time, the
   best grid plan under the same budget, and every uniform plan.
4. The capacity table at the middle budget: the largest batch under budget for save-all, full
   recompute and the tuned plan (doubling, then bisection over compiles).

Offload is left out of the choices here: on CPU its device saving is an estimate (the compiler
keeps the data on device), and this benchmark compares compiled figures only.

Run: ``python benchmarks/tune_budget.py [--example nnx_gpt|eqx_gpt] [--size layout=scan ...]``.
This prints figures; it is not a timed test.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from remat_common import tune
from remat_common.internal import ReportConfig, assignment_plan, fmt_bytes, parse_size
from remat_common.measurement import TuneResult, capacity

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"vocab": 128, "d_model": 64, "n_layers": 12, "n_heads": 4, "seq_len": 64, "batch": 8}
CHOICES = ("dots", "dots_no_batch", "names", "recompute")
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)


def grid(layers: int, choices: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Two-choice mixes: ``k`` layers of one choice, the rest of another (contiguous runs)."""
    names = list(choices)
    out = {}
    for a, b in itertools.combinations(names, 2):
        for k in (layers // 4, layers // 2, 3 * layers // 4):
            assign = (a,) * k + (b,) * (layers - k)
            out[f"{a}x{k}+{b}x{layers - k}"] = assignment_plan("blocks", assign, choices)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="nnx_gpt", choices=("nnx_gpt", "eqx_gpt"))
    ap.add_argument("--size", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    ap.add_argument("--max-compiles", type=int, default=40)
    args = ap.parse_args()
    console = Console(width=200)
    config = ReportConfig.load(ROOT / "examples" / args.example / "report.yaml")
    config = config.with_sizes({**SIZES, **parse_size(args.size)})
    build = config.builder()
    n = dict(config.model)["n_layers"]
    console.print(f"model: {args.example} {dict(config.model)} batch {config.batch}")

    # 1. the grid
    t0 = time.perf_counter()
    cache: dict[str, Any] = {}
    probe = tune(build, "1TiB", choices=list(CHOICES), cache=cache, max_compiles=1)
    choices = dict(probe.choices)
    plans = grid(n, choices)
    everything = tune(build, "1TiB", choices=list(CHOICES), plans=plans, cache=cache,
                      max_compiles=10_000)
    console.print(f"grid: {len(everything.points)} plans compiled in "
                  f"{time.perf_counter() - t0:.0f} s")
    uniform = [p for p in everything.points if p.source == "uniform"]
    base = everything["save"].flops

    # 2. budgets
    low, high = everything["recompute"].peak, everything["save"].peak
    budgets = [int(low + f * (high - low)) for f in FRACTIONS]

    # 3. tune at each budget
    summary = Table(title=f"tuned vs grid vs uniform, {n}-layer {args.example}")
    for col in ("budget", "tuned peak", "tuned FLOP ratio", "compiles", "wall s",
                "best grid plan", "grid peak", "grid ratio", "tuned/grid", *(u.name for u in uniform)):
        summary.add_column(col, justify="left" if col == "best grid plan" else "right",
                           overflow="fold")
    results: list[TuneResult] = []
    for budget in budgets:
        r = tune(build, budget, choices=list(CHOICES), max_compiles=args.max_compiles)
        results.append(r)
        fits = [p for p in everything.points if p.fits(budget)]
        best = min(fits, key=lambda p: p.flops) if fits else None
        console.print(f"\n[bold]budget {fmt_bytes(budget)}[/bold]: {r.message}", highlight=False)
        console.print(r.yaml() or "(no plan)", highlight=False, markup=False)
        b = r.best
        summary.add_row(
            fmt_bytes(budget), fmt_bytes(b.peak) if b else "-",
            f"{b.flops / base:.4f}" if b else "-", str(r.compiles), f"{r.wall_s:.0f}",
            best.name if best else "-", fmt_bytes(best.peak) if best else "-",
            f"{best.flops / base:.4f}" if best else "-",
            f"{b.flops / best.flops:.4f}" if b and best else "-",
            *(f"{u.flops / base:.3f}" if u.fits(budget) else "over" for u in uniform))
    console.print(summary)
    console.print("uniform peaks: " + ", ".join(f"{u.name} {fmt_bytes(u.peak)}" for u in uniform))
    over = [r for r in results if r.best is not None and r.best.peak > r.budget]
    console.print(f"over budget: {len(over)} of {len(results)}; max compiles "
                  f"{max(r.compiles for r in results)}; max wall {max(r.wall_s for r in results):.0f} s")

    # 4. capacity at the middle budget
    mid = results[len(results) // 2]
    cap_plans: dict[str, Any] = {"save": {"blocks.*": "save"}, "recompute": {"blocks.*": "recompute"}}
    if mid.best is not None and mid.best.plan is not None:
        cap_plans["tuned"] = mid.best.plan
    t1 = time.perf_counter()
    known = {"save": everything["save"].peak, "recompute": everything["recompute"].peak}
    if mid.best is not None:
        known["tuned"] = mid.best.peak  # compiled at the config's batch: not compiled again
    rows = capacity(lambda b: config.with_sizes({"batch": b}).builder(), mid.budget, cap_plans,
                    start=config.batch or 1, known=known)
    table = Table(title=f"largest batch under {fmt_bytes(mid.budget)} "
                        f"({time.perf_counter() - t1:.0f} s)")
    for col in ("plan", "largest batch", "peak", "gain vs save", "next batch: peak", "compiles"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    save_cap = rows[0].largest or 1
    for row in rows:
        table.add_row(row.name, str(row.largest), fmt_bytes(row.peak),
                      f"{row.largest / save_cap:.2f}x",
                      "-" if row.next is None else f"{row.next}: {fmt_bytes(row.next_peak)}",
                      str(row.compiles))
    console.print(table)


if __name__ == "__main__":
    main()
