"""``remat verify CONFIG...``: what each plan of a report config keeps (the residual verifier), or,
with ``--parity``, its loss and gradients against the model as written, on this machine's default
device; ``--fuzz N`` draws N random plans over the configs' models instead of their plans."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..._verify import verify
from ..measurement._fuzz import fuzz_plans, model_shape
from ..measurement._parity import PlanParity, verify_parity
from ._args import bounded
from ._config import ConfigError, ReportConfig, check_output, parse_size, writing

EPILOG = """\
examples:
  remat verify examples/nnx_gpt/report.yaml            # residuals kept, per plan
  remat verify --parity examples/llms/llama3_2.yaml    # loss and gradients, per plan
  remat verify --fuzz 50 --seed 0 example:nnx_gpt examples/llms/llama3_2.yaml \\
      --size d_model=32 n_layers=2 n_heads=2 seq_len=16 vocab=64 batch=2

--parity compares each plan with the model as written (no plan: everything saved) on this
machine's default device, at a tolerance from the backend and the compute dtype (float32 on a
CPU: 256 eps; float32 matrix products on a TPU at the default precision are bfloat16 passes:
bfloat16's; --precision highest: float32's). A plan the project or JAX refuses is listed as
refused, not failed. exit status: 0 when every plan passes, 1 when one fails (a wrong
gradient, a residual problem, or an unexpected error), 2 for a usage or config error."""


ABOUT = ("Builds the model of each report config under each of its plans and checks\n"
         "what reverse-mode AD keeps against the plan (remat_common.verify); with --parity, the\n"
         "loss and gradients against the model as written (remat_common.verify_parity).")


def register(p: Any) -> None:
    """``remat verify``'s arguments (its parser made by the ``remat`` command line)."""
    p.add_argument("configs", nargs="+", metavar="CONFIG",
                   help="report configs (YAML, or example:nnx_gpt)")
    p.add_argument("--parity", action="store_true",
                   help="compare each plan's loss and gradients with the model as written")
    p.add_argument("--fuzz", metavar="N",
                   type=bounded(int, "an integer",
                                message="{text!r}: give a number of plans, 1 or more"),
                   help="gradient parity of N random plans over the configs' models (implies --parity)")
    p.add_argument("--seed", type=int, metavar="S", help="the fuzz's seed (default 0)")
    p.add_argument("--plans", nargs="+", metavar="NAME", help="only these plans of the config")
    p.add_argument("--size", nargs="+", default=[], metavar="KEY=VALUE",
                   help="model sizes and batch, as remat report --size")
    p.add_argument("--precision", choices=("default", "high", "highest"),
                   help="matrix product precision (jax.default_matmul_precision) for --parity")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    if args.fuzz is None and args.seed is not None:
        raise ConfigError(f"--seed {args.seed} is the fuzz's seed, and --fuzz is not given. Fix: "
                          "add --fuzz N, or leave --seed out.")
    if args.fuzz is not None and args.plans:
        raise ConfigError("--plans picks plans of the config, but --fuzz draws its own. Fix: give "
                          "one of them.")
    parity = args.parity or args.fuzz is not None
    if args.precision is not None and not parity:
        raise ConfigError(f"--precision {args.precision} sets the precision of --parity's "
                          "gradients, and --parity is not given. Fix: add --parity.")
    sizes = parse_size(args.size)
    configs = [ReportConfig.load(c).select(None if args.fuzz else args.plans).with_sizes(sizes)
               for c in args.configs]
    json_out = (check_output(args.json, "--json", inputs=[p for c in configs for p in c.inputs()])
                if args.json is not None else None)
    if args.fuzz is None:
        for c in configs:
            c.plan_objects()  # every plan file read before anything is built
    results: list[dict[str, Any]] = []
    ok = True
    for k, config in enumerate(configs):
        builder = config.builder()
        sized = ", ".join(f"{a}={v}" for a, v in config.kwargs().items())
        print(f"remat verify{' --parity' if parity else ''} {config.source} ({sized})", flush=True)
        if not parity:
            good, out = _residuals(config, builder)
            ok &= good
            results.append({"config": str(config.source), "plans": out})
            continue
        if args.fuzz is not None:
            n = args.fuzz // len(configs) + (k < args.fuzz % len(configs))
            plans: dict[str, Any] = fuzz_plans(model_shape(builder), n, seed=args.seed or 0,
                                               start=1000 * k) if n else {}
        else:
            plans = dict(config.plan_objects())
        total = sum(v is not None for v in plans.values())
        done: list[PlanParity] = []

        def tick(row: PlanParity) -> None:
            done.append(row)
            print(f"remat verify: [{len(done)}/{total}] {row.name}: {row.status} "
                  f"({row.seconds:.1f} s)", file=sys.stderr, flush=True)

        report = verify_parity(builder, plans, precision=args.precision, progress=tick)
        print(report, flush=True)
        ok &= report.ok
        results.append({"config": str(config.source), "sizes": config.kwargs(),
                        "report": report.to_json()})
    if json_out is not None:
        with writing("--json", json_out):
            Path(json_out).write_text(json.dumps({"parity": parity, "seed": args.seed,
                                                  "results": results}, indent=1) + "\n")
    return 0 if ok else 1


def _residuals(config: ReportConfig, builder: Any) -> tuple[bool, list[dict[str, Any]]]:
    """The residual verifier on each plan of ``config``: its problems and notes printed."""
    ok, out = True, []
    for name, plan in config.plan_objects().items():
        if plan is None:
            continue
        t = builder(plan)
        if t.plan is None:
            raise ConfigError(f"{config.source}: plan {name!r}: the target returns no compiled "
                              "plan (MeasureTarget.plan is None), so there is nothing to verify "
                              "against. Fix: set plan= to frp.compiled_plan(model) / "
                              "erp.plan_of(model).")
        v = verify(t.loss_fn, *t.loss_args, plan=t.plan, strict=False)
        ok &= v.ok
        print(f"{name}: {'ok' if v.ok else f'{len(v.problems)} problem(s)'}")
        for line in [*(f"  problem: {p}" for p in v.problems), *(f"  note: {n}" for n in v.notes)]:
            print(line.replace("\n", "\n    "))
        out.append({"name": name, **v.to_json()})
    return ok, out
