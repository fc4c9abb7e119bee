"""Per-annotation costs of the small Equinox test transformer: residual bytes, FLOPs and temp memory.

Goal: the same table as ``benchmarks/flax_annotation_table.py``, for the Equinox adapter: for every
annotation of the vocabulary applied to the transformer's blocks, what reverse-mode AD keeps on
device and on host, how many more FLOPs the compiled training step does (recomputation), and what
XLA reports as temp memory, each against the un-annotated model.

(1) Build ``fixtures/eqx_models.py``'s transformer (the Python list of blocks or the ``Stacked``
variant) once per plan, annotate it with ``equinox_remat_plugin.annotate``, and wrap an SGD step on
its ``eqx.partition``-ed parameters as a ``MeasureTarget``.
(2) ``remat_common.measurement.measure`` compiles each step, reads ``cost_analysis()`` / ``memory_analysis()``,
verifies the residuals against the plan, and checks host placements in the step lowered for cuda.
(3) Print one row per annotation (the Flax table's formatter, so the two tables line up).

Run from the repository root (so that ``fixtures.eqx_models`` imports)::

    .venv/bin/python -m benchmarks.eqx_annotation_table --variant list
"""

from __future__ import annotations

import argparse
from typing import Any

import equinox as eqx
import jax

import equinox_remat_plugin as er
import remat_common as rc
from benchmarks.flax_annotation_table import table
from fixtures import eqx_models as em
from fixtures.vocabulary import EQX_PLANS

#: One plan per annotation of the vocabulary, applied to every block (``custom``: to every MLP,
#: whose ``__remat_custom__`` runs its own rule set, ``eqx_models.MLP_RULES``).
PLANS: dict[str, Any] = {"none": None, **EQX_PLANS}


def builder(*, variant: str, dims: em.Dims, lr: float = 0.1) -> Any:
    """``build(plan) -> MeasureTarget``: a fresh model (same seed) annotated with ``plan``."""
    x = em.inputs(1, dims)

    def build(plan: rc.Plan | None) -> rc.measurement.MeasureTarget:
        model = em.transformer(0, dims, stacked=variant == "scanned")
        if plan is not None:
            model = er.annotate(model, plan)
        params, static = eqx.partition(model, eqx.is_array)

        def loss(params: Any, x: jax.Array) -> jax.Array:
            return em.loss(eqx.combine(params, static), x)

        def step(params: Any, x: jax.Array) -> Any:
            grads = jax.grad(loss)(params, x)
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

        return rc.measurement.MeasureTarget(
            loss_fn=lambda params: loss(params, x), loss_args=(params,),
            step_fn=step, step_args=(params, x), plan=er.plan_of(model),
        )

    return build


def main(*, variant: str = "list", batch: int = 8, seq: int = 128, d_in: int = 128, d: int = 256,
         heads: int = 4, f: int = 1024, layers: int = 4, remat3: bool = False) -> str:
    """Measures every plan and returns the table (``remat3`` sets ``jax_remat3`` for the run only)."""
    dims = em.Dims(batch=batch, seq=seq, d_in=d_in, dim=d, heads=heads, hidden=f, layers=layers)
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", remat3)
    try:
        report = rc.measurement.measure(builder(variant=variant, dims=dims), PLANS, steps=0)
    finally:
        jax.config.update("jax_remat3", old)
    head = (f"jax {jax.__version__}, equinox {eqx.__version__}, {jax.default_backend()}, "
            f"jax_remat3={'on' if remat3 else 'off'}; {variant} Equinox transformer: batch {batch}, "
            f"seq {seq}, d_in {d_in}, d {d}, heads {heads}, mlp {f}, layers {layers}, float32")
    return head + "\n\n" + table(report)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("list", "scanned"), default="list")
    for name, default in (("batch", 8), ("seq", 128), ("d_in", 128), ("d", 256), ("heads", 4),
                          ("f", 1024), ("layers", 4)):
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=default)
    p.add_argument("--remat3", action="store_true", help="run with jax_remat3 on")
    a = p.parse_args()
    print(main(variant=a.variant, batch=a.batch, seq=a.seq, d_in=a.d_in, d=a.d, heads=a.heads,
               f=a.f, layers=a.layers, remat3=a.remat3))
