"""Plans side by side: activation bytes, FLOP ratio and step-time ratio against save-all.

Goal: one run per model that puts the plans next to each other, so that the memory a plan saves
and the time it costs are read together (change one boundary at a time, measure both). For each
model every plan is compiled, its residuals counted, and its steps timed interleaved with the
other plans' (``remat_common.measurement.measure``); ratios are against ``none`` (no remat: everything saved).

Models:
1. a plain-JAX residual MLP built here (``layers.<i>``, tags ``hidden`` and ``out``), under
   ``none``, ``recompute``, ``names`` (save ``hidden``), ``dots``, ``offload`` and ``mixed``
   (offload the first half of the layers, recompute the rest);
2. every ``remat report`` config given with ``--config`` (by default the examples'
   ``examples/nnx_gpt/report.yaml`` and ``examples/eqx_gpt/report.yaml`` when present), at the
   sizes ``--size`` sets.

Run: ``python benchmarks/plans_side_by_side.py [--steps 10] [--size n_layers=2 ...]``. This
prints figures; it is not a timed test.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from rich.console import Console
from rich.table import Table

import remat_common
from remat_common import Plan
from remat_common.internal import ReportConfig, fmt_bytes, parse_size, run_report
from remat_common.measurement import MeasureTarget, Report, report_table

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIGS = (ROOT / "examples" / "nnx_gpt" / "report.yaml",
                   ROOT / "examples" / "eqx_gpt" / "report.yaml")


def mlp_plans(n_layers: int) -> dict[str, Any]:
    half = max(1, n_layers // 2)
    return {
        "none": None,
        "recompute": {"layers.*": "recompute"},
        "names": {"layers.*": {"save": ["hidden"]}},
        "dots": {"layers.*": "dots"},
        "offload": {"layers.*": "offload"},
        "mixed": {"layers.*": "recompute", f"layers.[0-{half - 1}]": "offload"},
    }


def mlp_target(plan: Plan | None, *, batch: int, d_model: int, n_layers: int) -> MeasureTarget:
    """A residual tanh MLP with plain SGD; layers run through ``call_module``."""
    hidden = 4 * d_model
    paths = ["layers", *(f"layers.{i}" for i in range(n_layers))]
    compiled = None if plan is None else remat_common.compile_plan(remat_common.resolve(plan, paths))
    keys = jax.random.split(jax.random.key(0), 2 * n_layers + 3)
    params = {
        "layers": [{"w1": jax.random.normal(keys[2 * i], (d_model, hidden)) / d_model ** 0.5,
                    "w2": jax.random.normal(keys[2 * i + 1], (hidden, d_model)) / hidden ** 0.5}
                   for i in range(n_layers)],
        "head": jax.random.normal(keys[-3], (d_model, 1)) / d_model ** 0.5,
    }
    x = jax.random.normal(keys[-2], (batch, d_model))
    y = jax.random.normal(keys[-1], (batch, 1))

    def layer(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        h = remat_common.checkpoint_name(x @ p["w1"], "hidden")
        return x + remat_common.checkpoint_name(jnp.tanh(h) @ p["w2"], "out")

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        for i, p in enumerate(params["layers"]):
            fun = functools.partial(layer, p)
            if compiled is None:
                with remat_common.adapter.module_scope(f"layers.{i}"):
                    x = fun(x)
            else:
                x = remat_common.adapter.call_module(compiled, f"layers.{i}", fun, x)
        return jnp.mean((x @ params["head"] - y) ** 2)

    def step_fn(params: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda w, g: w - 0.01 * g, params, grads), loss

    return MeasureTarget(loss_fn, (params, x, y), step_fn, (params, x, y), compiled)


def summary(title: str, report: Report) -> Table:
    """Device activation bytes, FLOP ratio and step-time ratio against the baseline."""
    base = report[report.baseline]
    t = Table(title=f"{title}: against {report.baseline!r} (save-all)", title_justify="left")
    for col in ("plan", "device act.", "vs save-all", "host act.", "FLOP ratio", "step ratio"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for p in report.plans:
        frac = p.device_bytes / base.device_bytes if base.device_bytes else float("nan")
        t.add_row(p.name, fmt_bytes(p.device_bytes), f"{frac:.2f}x", fmt_bytes(p.host_bytes),
                  "-" if p.flop_ratio is None else f"{p.flop_ratio:.3f}",
                  "-" if p.step_time_ratio is None else f"{p.step_time_ratio:.3f}")
    return t


def main(*, n_layers: int = 8, d_model: int = 512, batch: int = 256, steps: int = 10,
         warmup: int = 2, configs: tuple[Path, ...] | None = None,
         size: dict[str, Any] | None = None) -> dict[str, Report]:
    """Measures every model's plans and prints the tables; returns the reports by model."""
    console = Console(width=150)
    caps = remat_common.capabilities()
    console.print(f"jax {caps.jax} on {caps.backend} ({caps.device_kind}), "
                  f"jax_remat3={caps.remat3}", highlight=False)
    reports: dict[str, Report] = {}

    def show(name: str, rep: Report) -> None:
        reports[name] = rep
        console.print(summary(name, rep))
        console.print(report_table(rep))
        for p in rep.plans:
            for msg in p.problems:
                console.print(f"{p.name}: PROBLEM: {msg}", markup=False, highlight=False)

    show(f"plain-JAX MLP ({n_layers} layers, d_model {d_model}, batch {batch})",
         remat_common.measurement.measure(
             functools.partial(mlp_target, batch=batch, d_model=d_model, n_layers=n_layers),
             mlp_plans(n_layers), steps=steps, warmup=warmup))
    configs = tuple(p for p in EXAMPLE_CONFIGS if p.is_file()) if configs is None else configs
    for cfg in configs:
        config = ReportConfig.load(cfg).with_sizes(size or {})
        sizes = ", ".join(f"{k} {v}" for k, v in config.model) + f", batch {config.batch}"
        cfg = cfg.resolve()
        rel = cfg.relative_to(ROOT) if cfg.is_relative_to(ROOT) else cfg
        show(f"{rel} ({sizes})", run_report(config, steps=steps, warmup=warmup))
    return reports


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8, help="MLP layers")
    ap.add_argument("--d-model", type=int, default=512, help="MLP width")
    ap.add_argument("--batch", type=int, default=256, help="MLP batch")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--config", action="append", type=Path,
                    help="a remat report config (repeatable); default: the examples' configs")
    ap.add_argument("--no-examples", action="store_true", help="only the plain-JAX MLP")
    ap.add_argument("--size", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="size overrides for the configs, as in `remat report --size`")
    a = ap.parse_args()
    configs = () if a.no_examples else None if a.config is None else tuple(a.config)
    main(n_layers=a.layers, d_model=a.d_model, batch=a.batch, steps=a.steps, warmup=a.warmup,
         configs=configs, size=parse_size(a.size))
