"""√n nested checkpointing of deep stacks: residual bytes and FLOPs against save-all and recompute.

For stacks of L = 16 and 64 residual MLP layers (``x + tanh(tanh(x @ w1) @ w2)``, width D, batch
B) in Flax NNX and Equinox, this prints per plan on the stack ``layers``:

- residual bytes: what AD keeps on device between the forward and backward pass (arguments
  excluded), read by the core's verifier; and that in layer inputs ("carries");
- temp: the compiled gradient step's ``temp_size_in_bytes`` (XLA:CPU);
- FLOP ratio: FLOPs of the jitted gradient (scans counted per iteration) over save-all's, and the
  extra over full recompute in forward passes;
- whether the gradients equal the un-annotated stack's.

Plans: ``save`` (no remat), ``recompute`` (one boundary per layer), ``nested`` =
``{remat: recompute, nested: sqrt}`` (√L blocks of √L layers, each layer recomputed in its
block) and ``nested-save`` = ``{remat: save, nested: sqrt}`` (the block's layers keep everything
while the block is recomputed: the classic √n schedule, recompute's FLOPs).

Run: ``.venv/bin/python benchmarks/nested_stacks.py [--d 64] [--batch 256] [--layers 16 64] [--remat3]``
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from fixtures.nested_models import FRAMEWORKS, figures  # noqa: E402

PLANS = {
    "save": {"layers": "save"},
    "recompute": {"layers": "recompute"},
    "nested": {"layers": {"remat": "recompute", "nested": "sqrt"}},
    "nested-save": {"layers": {"remat": "save", "nested": "sqrt"}},
}


def _equal(a: object, b: object) -> bool:
    return all(np.allclose(x, y, rtol=1e-4, atol=1e-5)
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def main(d: int = 64, batch: int = 256, layers: tuple[int, ...] = (16, 64),
         frameworks: tuple[str, ...] = FRAMEWORKS) -> None:
    print(f"jax {jax.__version__}, jax_remat3 {'on' if jax.config.jax_remat3 else 'off'}, "
          f"{jax.devices()[0].platform}; layer width D={d}, batch B={batch}, float32; residual "
          "bytes exclude the arguments")
    head = (f"{'framework':9s} {'L':>3s} {'plan':12s} {'residual B':>11s} {'carries':>8s} "
            f"{'temp B':>10s} {'FLOPs':>12s} {'/ save':>7s} {'- recompute':>12s} grads")
    print(head)
    print("-" * len(head))
    for fw in frameworks:
        for n in layers:
            base = figures(fw, n, None, d=d, batch=batch, flops=False)
            rows = {name: figures(fw, n, plan, d=d, batch=batch) for name, plan in PLANS.items()}
            save, rec = rows["save"], rows["recompute"]
            for name, f in rows.items():
                assert f.flops and save.flops and rec.flops and f.forward_flops
                extra = (f.flops - rec.flops) / f.forward_flops
                print(f"{fw:9s} {n:3d} {name:12s} {f.residual_bytes:11,d} "
                      f"{f.residual_bytes / f.carry_bytes:8.2f} {f.temp_bytes or 0:10,d} "
                      f"{f.flops:12,.0f} {f.flops / save.flops:7.3f} {extra:+9.3f} fwd "
                      f"{'equal' if _equal(f.grads, base.grads) else 'DIFFER'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--layers", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--framework", choices=FRAMEWORKS, nargs="+", default=list(FRAMEWORKS))
    ap.add_argument("--remat3", action="store_true", help="run with jax_remat3 on")
    ns = ap.parse_args()
    if ns.remat3:
        jax.config.update("jax_remat3", True)
    main(ns.d, ns.batch, tuple(ns.layers), tuple(ns.framework))
