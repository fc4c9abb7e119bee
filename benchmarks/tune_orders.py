"""Does the order of the layers matter to ``remat tune``? Every assignment of 3 choices to 3 layers.

Goal: find the space an exhaustive check of the tuner has to cover. On the example GPTs (NNX and
Equinox; list and scanned layouts; the test suite's tiny sizes, 3 layers), compile every one of
the 27 assignments of save / dots_no_batch / recompute to the 3 layers, in every order, and
print, for each multiset of choices, the compiled peak and FLOPs of each of its orders. Then tune
at five budgets spread between the full-recompute peak and the save-all peak, from the figures
compiled here (a shared cache: a plan the tuner asks for is compiled only if it is not among the
27), and compare the tuned plan with the best of all 27 under the same budget.

Steps:
1. Compile the 27 plans of a layout (``tune(..., plans=every_order, cache=cache)``).
2. Per multiset: each order's peak against the order with the smallest peak, and its FLOPs.
3. Per budget: the tuned plan, the best of the 27, and the best plan whose layers run in the
   order the tuner wrote before it modelled the order (save first, recompute last).

Run: ``python benchmarks/tune_orders.py [--example nnx_gpt eqx_gpt] [--layout list scan]``
(about 27 compiles per layout). This prints figures; it is not a timed test.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

from remat_common import tune
from remat_common.internal import ReportConfig, assignment_plan, fmt_bytes

ROOT = Path(__file__).resolve().parent.parent
TINY = {"vocab": 64, "d_model": 32, "n_layers": 3, "n_heads": 2, "seq_len": 128, "batch": 8}
NAMES = ("save", "dots_no_batch", "recompute")
SHORT = {"save": "S", "dots_no_batch": "D", "recompute": "R"}


def _name(a: tuple[str, ...]) -> str:
    return "".join(SHORT[c] for c in a)


def run(example: str, layout: str) -> None:
    import jax

    jax.config.update("jax_numpy_dtype_promotion", "standard")  # optax's AdamW
    config = ReportConfig.load(ROOT / "examples" / example / "report.yaml")
    build = config.with_sizes({**TINY, "layout": layout}).builder()
    choices = {n: n for n in NAMES}
    orders = list(itertools.product(NAMES, repeat=TINY["n_layers"]))
    plans = {_name(a): assignment_plan("blocks", a, choices) for a in orders}
    cache: dict[str, Any] = {}
    t0 = time.perf_counter()
    every = tune(build, "1TiB", choices=list(NAMES[1:]), plans=plans, cache=cache,
                 max_compiles=100)
    print(f"\n== {example}, layout {layout}: {every.compiles} compiles, "
          f"{time.perf_counter() - t0:.0f} s")
    by = {_name(a): every[_name(a)] for a in orders}
    base = every["save"].flops
    print("multiset  order  peak        vs best    FLOP ratio")
    for ms in itertools.combinations_with_replacement(NAMES, TINY["n_layers"]):
        group = sorted({_name(a) for a in orders if sorted(a) == sorted(ms)},
                       key=lambda k: (by[k].peak, k))
        best = by[group[0]]
        for k in group:
            p = by[k]
            print(f"{_name(ms):9s} {k:6s} {fmt_bytes(p.peak):>11s} "
                  f"{(p.peak - best.peak) / 2**10:+9.0f} KiB {p.flops / base:.4f}")
    low, high = every["recompute"].peak, every["save"].peak
    old = {_name(a) for a in orders if list(a) == sorted(a, key=NAMES.index)}
    print("budget       tuned (order, peak, FLOP ratio)        best of 27             "
          "best in the old order   compiles")
    for k in range(5):
        budget = low + (high - low) * k // 4
        r = tune(build, budget, choices=list(NAMES[1:]), cache=cache)
        assert r.best is not None and r.best.peak <= budget
        fit = [p for p in by.values() if p.fits(budget)]
        best = min(fit, key=lambda p: (p.flops, p.peak))
        best_old = min((p for p in fit if p.name in old), key=lambda p: (p.flops, p.peak))
        tuned = r.best.name if r.best.assignment is None else _name(r.best.assignment)
        print(f"{fmt_bytes(budget):>10s}   {tuned:4s} {fmt_bytes(r.best.peak):>10s} "
              f"{r.best.flops / base:.4f} ({r.best.flops / best.flops - 1:+.2%})   "
              f"{best.name:4s} {best.flops / base:.4f}   "
              f"{best_old.name:4s} {best_old.flops / base:.4f} "
              f"({best_old.flops / best.flops - 1:+.2%})"
              f"   {r.compiles}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", nargs="+", default=["nnx_gpt", "eqx_gpt"],
                    choices=("nnx_gpt", "eqx_gpt"))
    ap.add_argument("--layout", nargs="+", default=["list", "scan"], choices=("list", "scan"))
    args = ap.parse_args()
    for example in args.example:
        for layout in args.layout:
            run(example, layout)


if __name__ == "__main__":
    main()
