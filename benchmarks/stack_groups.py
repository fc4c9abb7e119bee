"""Layer groups and √n nesting of a scanned stack: compiled temp, peak, residuals and FLOPs.

A stack of residual MLP layers (``x + tanh(tanh(x @ w1) @ w2)``, width D, two D×D weights per
layer; ``fixtures/nested_models.py``) in Flax NNX (``scan_layers``) and Equinox (``erp.Stacked``),
one compiled ``jit(grad(loss))`` per plan on the stack ``layers`` (L layers, S = stacked parameter
bytes):

- ``plain``: no annotation; ``save`` / ``recompute`` / ``dots``: one annotation for every layer
  (one scan);
- ``rec/save``, ``rec/dots``: the first half of the layers recomputed, the second half saved or
  keeping its matmuls (two layer groups, two scans);
- ``nested``: ``{remat: recompute, nested: sqrt}`` (√L blocks, each block's layers recomputed);
- ``mixed``: ``{layers: {remat: recompute, nested: 2}, layers.[L/2-L-1]: dots}`` (two layer groups,
  each nested in blocks of 2).

Columns: ``temp`` = compiled ``temp_size_in_bytes`` (XLA:CPU) as bytes and as a multiple of S;
``ref`` = the temp of the layout's reference, the largest temp among the one-scan plans of the
annotations the plan uses (``rec/save`` → ``save``, ``nested`` → ``recompute``), and ``over`` =
(temp - ref) / S, which the library keeps ≤ 0.05 (``measure`` / ``remat report`` flag more: the
layout check);
``peak`` = arguments + outputs + temp - aliased bytes; ``residual`` = what AD keeps between the
forward and the backward pass, arguments excluded (``remat_common.saved_residuals``); ``FLOPs`` = the
gradient's FLOPs over ``plain``'s (scans counted per iteration).

Run: ``.venv/bin/python benchmarks/stack_groups.py [--remat3] [--framework flax equinox]``
(the point-1 table of issue 26 at (L, B, D) = (8, 8, 128), (8, 64, 128), (8, 8, 256), and a
32-layer stack where activations dominate: B = 16 × 512 rows of D = 128).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import remat_common as rc  # noqa: E402
from fixtures.nested_models import FRAMEWORKS, build  # noqa: E402

SIZES = ((8, 8, 128), (8, 64, 128), (8, 8, 256), (32, 16 * 512, 128))


def plans(n: int) -> dict[str, Any]:
    half = f"layers.[0-{n // 2 - 1}]", f"layers.[{n // 2}-{n - 1}]"
    return {
        "plain": None,
        "save": {"layers": "save"},
        "recompute": {"layers": "recompute"},
        "dots": {"layers": "dots"},
        "rec/save": {half[0]: "recompute", half[1]: "save"},
        "rec/dots": {half[0]: "recompute", half[1]: "dots"},
        "nested": {"layers": {"remat": "recompute", "nested": "sqrt"}},
        "mixed": {"layers": {"remat": "recompute", "nested": 2}, half[1]: "dots"},
    }


REFERENCE = {"rec/save": ("recompute", "save"), "rec/dots": ("recompute", "dots"),
             "nested": ("recompute",), "mixed": ("recompute", "dots")}


def row(framework: str, n: int, batch: int, d: int, plan: Any) -> dict[str, float]:
    loss, args, _ = build(framework, n, d, batch, plan)
    c = jax.jit(jax.grad(loss)).lower(*args).compile()
    mem = c.memory_analysis()
    resid = rc.saved_residuals(loss, *args).nbytes()
    return {"temp": mem.temp_size_in_bytes,
            "peak": (mem.argument_size_in_bytes + mem.output_size_in_bytes
                     + mem.temp_size_in_bytes - mem.alias_size_in_bytes),
            "residual": resid, "flops": rc.measurement.count_flops(c).flops or float("nan")}


def main(frameworks: tuple[str, ...] = FRAMEWORKS,
         sizes: tuple[tuple[int, int, int], ...] = SIZES) -> None:
    print(f"jax {jax.__version__}, jax_remat3 {'on' if jax.config.jax_remat3 else 'off'}, "
          f"{jax.devices()[0].platform}, float32")
    head = (f"{'framework':9s} {'L,B,D':>13s} {'S':>9s} {'plan':10s} {'temp B':>11s} {'/S':>6s} "
            f"{'over/S':>7s} {'peak B':>11s} {'residual B':>11s} {'FLOPs':>6s}")
    print(head)
    print("-" * len(head))
    for fw in frameworks:
        for n, b, d in sizes:
            s = n * 2 * d * d * 4
            rows = {name: row(fw, n, b, d, p) for name, p in plans(n).items()}
            for name, r in rows.items():
                ref = max((rows[k]["temp"] for k in REFERENCE.get(name, ())), default=None)
                over = "" if ref is None else f"{(r['temp'] - ref) / s:+7.2f}"
                print(f"{fw:9s} {f'{n},{b},{d}':>13s} {s:9,d} {name:10s} {r['temp']:11,d} "
                      f"{r['temp'] / s:6.2f} {over:>7s} {r['peak']:11,d} {r['residual']:11,d} "
                      f"{r['flops'] / rows['plain']['flops']:6.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=FRAMEWORKS, nargs="+", default=list(FRAMEWORKS))
    ap.add_argument("--small", action="store_true", help="only the three 8-layer sizes")
    ap.add_argument("--remat3", action="store_true", help="run with jax_remat3 on")
    ns = ap.parse_args()
    if ns.remat3:
        jax.config.update("jax_remat3", True)
    main(tuple(ns.framework), SIZES[:3] if ns.small else SIZES)
