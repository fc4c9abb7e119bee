"""The attention rule set against save-all and recompute: residual bytes and compiled FLOPs.

Goal: show what the custom attention rule buys at several sequence lengths. One causal multi-head
attention block (q/k/v projections, attention, output projection) at module path ``attn`` runs
through ``remat_common.adapter.call_module`` under three plans:

1. ``save-all``: no plan (plain autodiff keeps the ``[B, H, T, T]`` probabilities);
2. ``recompute``: ``{"attn": "recompute"}`` (keeps only the block input, recomputes everything);
3. ``custom``: ``{"attn": "custom"}`` (the module's ``__remat_custom__`` runs
   ``remat_common.rules.attention_rules``: it keeps the output and the row log-sum-exp, the projections
   are recomputed, the scores are rebuilt from q, k and the log-sum-exp in the backward pass).

For each, the residuals of ``grad(loss)`` are counted with ``remat_common.saved_residuals``
(bytes kept for the backward pass, the parameters and the input excluded), and ``jit(grad(loss))``
is compiled for its FLOPs (XLA's cost analysis) and temp buffer size. ``--remat3`` picks the
custom-rule path: on (``jax.custom_remat``, JAX 0.11.x), off (the portable ``jax.custom_vjp``
path), or both.

Run: ``python benchmarks/custom_attention.py [--seq 128 256 512] [--batch 4] [--d-model 256]
[--heads 4] [--remat3 both]``. This prints figures; it is not a timed test.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import remat_common as rc

PLANS: dict[str, dict[str, str] | None] = {
    "save-all": None,
    "recompute": {"attn": "recompute"},
    "custom": {"attn": "custom"},
}


def _block(heads: int, rules: rc.rules.RuleSet) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The block's plain ``__call__`` and its ``__remat_custom__``."""
    def split(p: dict[str, jax.Array], x: jax.Array) -> tuple[jax.Array, ...]:
        b, t, d = x.shape
        return tuple((x @ p[n]).reshape(b, t, heads, d // heads) for n in ("wq", "wk", "wv"))

    def plain(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return rc.rules.attention(*split(p, x), causal=True).reshape(x.shape) @ p["wo"]

    def custom(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return rules(*split(p, x)).reshape(x.shape) @ p["wo"]

    return plain, custom


def _loss(plan: dict[str, str] | None, heads: int) -> Callable[..., jax.Array]:
    plain, custom = _block(heads, rc.rules.attention_rules(causal=True))
    compiled = None if plan is None else rc.compile_plan(rc.resolve(rc.Plan.from_mapping(plan),
                                                                    ["attn"]))

    def loss(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        y = plain(p, x) if compiled is None else rc.adapter.call_module(compiled, "attn", plain, p, x,
                                                                 custom=custom)
        return jnp.sum(jnp.tanh(x + y) ** 2)

    return loss


def _flops(compiled: Any) -> float:
    """FLOPs with scan bodies counted per iteration (``nan`` when unknown)."""
    flops = rc.measurement.count_flops(compiled).flops
    return float("nan") if flops is None else flops


def measure(seq: int, *, batch: int, d_model: int, heads: int) -> dict[str, dict[str, Any]]:
    keys = jax.random.split(jax.random.key(0), 5)
    p = {n: jax.random.normal(k, (d_model, d_model), jnp.float32) / d_model ** 0.5
         for n, k in zip(("wq", "wk", "wv", "wo"), keys)}
    x = jax.random.normal(keys[4], (batch, seq, d_model), jnp.float32)
    scores = (batch, heads, seq, seq)
    out: dict[str, dict[str, Any]] = {}
    for name, plan in PLANS.items():
        loss = _loss(plan, heads)
        with rc.rules.collect_rule_runs() as runs:
            report = rc.saved_residuals(loss, p, x)
        compiled = jax.jit(jax.grad(loss)).lower(p, x).compile()
        mem = compiled.memory_analysis()
        out[name] = {
            "bytes": report.nbytes(),
            "scores_kept": any(r.shape == scores for r in report.residuals),
            "flops": _flops(compiled),
            "temp": int(getattr(mem, "temp_size_in_bytes", 0)) if mem is not None else 0,
            "path": ",".join(sorted({r.impl for r in runs if r.forward_ran})) or "-",
        }
    return out


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:8.2f}"


def main(*, seq: tuple[int, ...] = (128, 256, 512), batch: int = 4, d_model: int = 256,
         heads: int = 4, remat3: str = "both") -> None:
    flags = {"off": [False], "on": [True], "both": [False, True]}[remat3]
    old = jax.config.jax_remat3
    print(f"jax {jax.__version__}, backend {jax.default_backend()}; causal attention block, "
          f"batch {batch}, d_model {d_model}, {heads} heads (head dim {d_model // heads}), "
          "float32")
    print("residual MiB: kept for the backward pass, parameters and input excluded; "
          "GFLOP: compiled jit(grad(loss)); temp MiB: XLA's temp buffers")
    try:
        for flag in flags:
            jax.config.update("jax_remat3", flag)
            print(f"\njax_remat3={'on' if flag else 'off'} (custom rule path: "
                  f"{rc.capabilities().custom_path})")
            head = (f"{'T':>5} | {'residual MiB':^32} | {'GFLOP':^26} | {'temp MiB':^26} | scores kept")
            sub = (f"{'':>5} | {'save-all':>10}{'recompute':>11}{'custom':>11} | "
                   f"{'save-all':>8}{'recomp':>9}{'custom':>9} | "
                   f"{'save-all':>8}{'recomp':>9}{'custom':>9} | (s/r/c)")
            print(head)
            print(sub)
            for t in seq:
                m = measure(t, batch=batch, d_model=d_model, heads=heads)
                s, r, c = m["save-all"], m["recompute"], m["custom"]
                print(f"{t:>5} | {_mib(s['bytes']):>10}{_mib(r['bytes']):>11}{_mib(c['bytes']):>11} | "
                      f"{s['flops'] / 1e9:>8.3f}{r['flops'] / 1e9:>9.3f}{c['flops'] / 1e9:>9.3f} | "
                      f"{_mib(s['temp'])}{_mib(r['temp']):>9}{_mib(c['temp']):>9} | "
                      f"{'/'.join('y' if v['scores_kept'] else 'n' for v in (s, r, c))}"
                      f"  [{c['path']}]")
    finally:
        jax.config.update("jax_remat3", old)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--remat3", choices=["off", "on", "both"], default="both")
    a = ap.parse_args()
    main(seq=tuple(a.seq), batch=a.batch, d_model=a.d_model, heads=a.heads, remat3=a.remat3)
