"""Trains a vendored third-party model on the shipped text under a plan file, logging loss, step
time, tokens per second and MFU (``log.jsonl`` in ``--workdir``).

    python -m examples.llms.train qwen3 --plan minimal --steps 20
    python -m examples.llms.train eqx_llama --plan layer_input_offloaded --d-model 256 --n-layers 4

``--plan`` is a name from ``plans/MODEL/`` (``full``, ``minimal``, ...), a plan file, or ``none``.
The step is the report target's (``nnx_llms.measure_target``, ``eqx_llms.measure_target``): AdamW
on float32 parameters, bfloat16 compute; tokens are the text's bytes (a vocabulary of 256).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ("qwen3", "llama3_2", "eqx_llama")


def plan_path(model: str, plan: str) -> Path | None:
    """``none`` -> ``None``; a name from ``plans/MODEL/``; else a file, which must exist."""
    if plan == "none":
        return None
    named = HERE / "plans" / model / f"{plan}.yaml"
    path = named if named.is_file() else Path(plan)
    if not path.is_file():
        names = sorted(p.stem for p in (HERE / "plans" / model).glob("*.yaml"))
        raise SystemExit(f"--plan {plan}: neither a plan of {model} ({', '.join(names)}) nor a "
                         "plan file. Fix: one of those names, a YAML/TOML/JSON path, or none.")
    return path


def main(argv: list[str] | None = None) -> dict[int, float]:
    ap = argparse.ArgumentParser(prog="python -m examples.llms.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--plan", default="full", help="a plan name of the model, a plan file, or none")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--workdir", default=None, help="where log.jsonl goes (default: none written)")
    args = ap.parse_args(argv)
    if not args.learning_rate > 0:
        ap.error(f"--learning-rate {args.learning_rate}: must be a positive number.")
    for name in ("steps", "batch", "seq_len", "d_model", "n_layers", "n_heads", "log_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1.")
    path = plan_path(args.model, args.plan)

    import jax

    import remat_common
    from examples import training

    plan = None if path is None else remat_common.Plan.load(path)
    sizes: dict[str, Any] = dict(vocab=training.VOCAB, d_model=args.d_model, n_layers=args.n_layers,
                                 n_heads=args.n_heads, seq_len=args.seq_len)
    if args.model == "eqx_llama":
        from examples.llms.eqx_llms import measure_target
        target = measure_target(plan, batch=args.batch, learning_rate=args.learning_rate, **sizes)
    else:
        from examples.llms.nnx_llms import measure_target
        sizes["n_kv_heads"] = max(1, args.n_heads // 2)
        target = measure_target(plan, batch=args.batch, family=args.model,
                                learning_rate=args.learning_rate, **sizes)
    train_tokens, _ = training.split_text(training.encode(training.load_text()))
    batches = training.TextBatches(train_tokens, batch=args.batch, seq_len=args.seq_len)
    log = training.RunLog(None if args.workdir is None else Path(args.workdir) / "log.jsonl")
    log.event("start", model=args.model, plan=None if path is None else str(path), sizes=sizes,
              batch=args.batch)
    step = jax.jit(target.step_fn, donate_argnums=(0, 1))
    params, opt_state = target.step_args[:2]
    peak = remat_common.measurement.device_peak(jax.devices()[0].device_kind, jax.device_count())
    losses: dict[int, float] = {}
    times: list[float] = []
    for i in range(1, args.steps + 1):
        t = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batches(i))
        losses[i] = float(loss)  # waits for the step
        if i > 1:  # the first step compiles
            times.append(time.perf_counter() - t)
        log.event("step", step=i, loss=losses[i])
        if i % args.log_every == 0 or i == args.steps:
            recent = training.median(times[-args.log_every:]) if times else None
            rate = remat_common.measurement.throughput({**sizes, "batch": args.batch}, recent, peak)
            ms = "" if recent is None else f"  {1e3 * recent:.1f} ms/step"
            print(f"{args.model} step {i:4d}  loss {losses[i]:.4f}{ms}" + training._rate(rate))
            if rate is not None:
                log.event("throughput", step=i, tokens_per_s=rate[0], mfu=rate[1])
    return losses


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
