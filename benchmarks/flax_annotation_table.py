"""Per-annotation costs of the small NNX test transformer: residual bytes, FLOPs and temp memory.

Goal: one table that shows, for every annotation of the vocabulary applied to the transformer's
blocks, what reverse-mode AD keeps on device and on host, how many more FLOPs the compiled training
step does (recomputation), and what XLA reports as temp memory, each against the un-annotated model.

(1) Build ``fixtures/nnx_models.py``'s transformer (the ``nnx.List`` or the scanned variant) once per
plan, annotate its blocks with one annotation, and wrap an SGD step as a ``MeasureTarget``.
(2) ``remat_common.measurement.measure`` compiles each step, reads ``cost_analysis()`` / ``memory_analysis()``,
verifies the residuals against the plan, and checks host placements in the step lowered for cuda.
(3) Print one row per annotation.

Run from the repository root (so that ``fixtures.nnx_models`` imports)::

    .venv/bin/python -m benchmarks.flax_annotation_table --variant list
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
from flax import nnx

import flax_remat_plugin as frp
import remat_common as rc
from fixtures import nnx_models as nm
from fixtures.vocabulary import NNX_PLANS

#: One plan per annotation of the vocabulary, applied to every block (``custom``: to every MLP,
#: whose ``__remat_custom__`` runs the core's gated-MLP rule set).
PLANS: dict[str, Any] = {"none": None, **NNX_PLANS}


def builder(*, variant: str, batch: int, seq: int, d: int, heads: int, f: int, layers: int,
            vocab: int, lr: float = 0.1) -> Any:
    """``build(plan) -> MeasureTarget``: a fresh model (same seed) annotated with ``plan``."""
    cls = nm.ScannedTransformer if variant == "scanned" else nm.Transformer
    tokens, targets = nm.batch(0, batch=batch, seq=seq, vocab=vocab)

    def build(plan: rc.Plan | None) -> rc.measurement.MeasureTarget:
        model = cls(vocab=vocab, d=d, heads=heads, f=f, layers=layers, rngs=nnx.Rngs(0))
        if plan is not None:
            frp.annotate(model, plan)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss(params: Any, rest: Any, tokens: jax.Array, targets: jax.Array) -> jax.Array:
            return nm.loss_fn(nnx.merge(graphdef, params, rest, copy=True), tokens, targets)

        def step(params: Any, rest: Any, tokens: jax.Array, targets: jax.Array) -> Any:
            grads = jax.grad(loss)(params, rest, tokens, targets)
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

        return rc.measurement.MeasureTarget(
            loss_fn=lambda params: loss(params, rest, tokens, targets), loss_args=(params,),
            step_fn=step, step_args=(params, rest, tokens, targets),
            plan=frp.compiled_plan(model) if plan is not None else None,
        )

    return build


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def table(report: rc.measurement.Report) -> str:
    """A markdown table: one row per plan, figures against the report's baseline."""
    base = report[report.baseline]
    rows = ["| annotation | residuals on device (MiB) | on host (MiB) | FLOPs ratio | temp (MiB) "
            "| temp vs none | cuda host placements | verified |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in report.plans:
        temp, base_temp = r.memory.temp_size_in_bytes, base.memory.temp_size_in_bytes
        ratio = f"{temp / base_temp:.2f}" if temp is not None and base_temp else "-"
        placed = "-" if r.placement is None else str(r.placement.to_host)
        ok = "yes" if not r.problems else "; ".join(r.problems)
        flops = "-" if r.flop_ratio is None else f"{r.flop_ratio:.3f}"
        rows.append(f"| {r.name} | {_mib(r.device_bytes)} | {_mib(r.host_bytes)} | {flops} | "
                    f"{_mib(temp)} | {ratio} | {placed} | {ok} |")
    return "\n".join(rows)


def main(*, variant: str = "list", batch: int = 8, seq: int = 128, d: int = 256, heads: int = 4,
         f: int = 1024, layers: int = 4, vocab: int = 512, remat3: bool = False) -> str:
    """Measures every plan and returns the table (``remat3`` sets ``jax_remat3`` for the run only)."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", remat3)
    try:
        build = builder(variant=variant, batch=batch, seq=seq, d=d, heads=heads, f=f,
                        layers=layers, vocab=vocab)
        report = rc.measurement.measure(build, PLANS, steps=0)
    finally:
        jax.config.update("jax_remat3", old)
    head = (f"jax {jax.__version__}, {jax.default_backend()}, jax_remat3={'on' if remat3 else 'off'}; "
            f"{variant} transformer: batch {batch}, seq {seq}, d {d}, heads {heads}, mlp {f}, "
            f"layers {layers}, vocab {vocab}, float32")
    return head + "\n\n" + table(report)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("list", "scanned"), default="list")
    for name, default in (("batch", 8), ("seq", 128), ("d", 256), ("heads", 4), ("f", 1024),
                          ("layers", 4), ("vocab", 512)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--remat3", action="store_true", help="run with jax_remat3 on")
    a = p.parse_args()
    print(main(variant=a.variant, batch=a.batch, seq=a.seq, d=a.d, heads=a.heads, f=a.f,
               layers=a.layers, vocab=a.vocab, remat3=a.remat3))
