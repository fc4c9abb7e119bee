"""The body of ``scripts/capacity_check`` (see that file and docs/tpu.md): the largest example GPT
that one device trains, (a) with no plan, (b) with the best activation plan, (c) with an activation
plan and the training state on host (a plan's ``state:``).

For each example and each kind of plan, the model is grown along one size (``--grow n_layers`` or
``d_model``: doubled while the step fits, then bisected) and the largest size whose training step
the device's compiler accepts is then trained for ``--steps`` steps on the shipped text: the
losses must fall. "Fits" is the compiler's verdict (XLA refuses a program that does not fit the
device's memory); ``--budget`` adds a limit of its own on the compiled figures (device arguments,
outputs and temporaries; on CPU, whose compiler drops host placements, it cannot see state on
host). Step times of the three kinds are printed side by side.

On a TPU v5e chip, batch 8, sequence 1024::

    ./scripts/capacity_check --examples nnx_gpt,eqx_gpt --batch 8 --seq-len 1024 --d-model 1024 \\
        --n-heads 8 --grow n_layers --json capacity.json

On a CPU, tiny (what the test runs): ``./scripts/capacity_check --quick``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXAMPLES = ("nnx_gpt", "eqx_gpt")
STATES = {"optimizer": {"optimizer": "host"}, "both": {"optimizer": "host", "params": "host"}}
_OOM = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|exceeds .*memory|Ran out of memory")


def _model(example: str) -> Any:
    module = importlib.import_module(f"examples.{example}.model")
    module.MAX_CONCRETE_BYTES = 1 << 50  # the state is made on the device, not on this host
    return module


def _plan(example: str, name: str | None, state: str | None) -> Any:
    import remat_common as rc

    if name is None or name == "none":
        rules: Any = rc.Plan()
    else:
        rules = rc.Plan.load(ROOT / "examples" / example / "plans" / f"{name}.yaml")
    if state is None:
        return None if name in (None, "none") else rules
    return rules.with_defaults(state=STATES[state])


def _setup(example: str, plan: Any, sizes: dict[str, Any], batch: int) -> dict[str, Any]:
    """The step of ``example`` under ``plan`` at ``sizes``, jitted as the examples train it."""
    import jax
    import jax.numpy as jnp
    import remat_common as rc

    model = _model(example)
    tx = model.optimizer(learning_rate=3e-3, warmup_steps=5, decay_steps=100)
    static, state, _ = model.build(plan, tx=tx, abstract=True, **sizes)
    roles = model.state_roles(state)
    placement = plan.state if plan is not None else rc.StatePlacement()
    shardings = rc.state.default_shardings(state)
    stored, _ = rc.state.state_shardings(shardings, roles, placement)
    step = rc.state.jit_state_step(model.train_step_fn(static, tx), shardings, roles, placement,
                                   fetches=True)
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, stored)
    tokens = jax.ShapeDtypeStruct((batch, sizes["seq_len"] + 1), jnp.int32)
    nbytes = rc.state.state_bytes(state, roles)
    return dict(model=model, tx=tx, static=static, stored=stored, step=step, args=args,
                tokens=tokens, params=nbytes["params"] // 4, state_bytes=nbytes, plan=plan)


def fits(example: str, plan: Any, sizes: dict[str, Any], batch: int,
         budget: int | None, link: Any = None) -> tuple[bool, dict[str, Any]]:
    """Whether the step compiles for this device (and, with ``budget``, stays within it); the
    state's host traffic per step, priced at ``link`` (a profile's host link)."""
    import remat_common as rc
    from remat_common.measurement import host_link, state_transfer

    try:
        s = _setup(example, plan, sizes, batch)
        t0 = time.perf_counter()
        compiled = s["step"].lower(s["args"], s["tokens"]).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the answer
        if _OOM.search(str(e)):
            return False, {"error": str(e).splitlines()[0][:300]}
        raise
    m = compiled.memory_analysis()
    peak = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)
    placement = plan.state if plan is not None else rc.StatePlacement()
    traffic = state_transfer(s["state_bytes"], placement)
    info = {"params": s["params"], "compile_s": time.perf_counter() - t0, "device_bytes": peak,
            "host_argument_bytes": m.host_argument_size_in_bytes,
            "state_host_bytes": traffic.host_bytes, "transfer_bytes": traffic.transfer_bytes,
            "transfer_ms": 1e3 * traffic.seconds(link or host_link(None))}
    return budget is None or peak <= budget, info


def largest(example: str, plan: Any, base: dict[str, Any], grow: str, batch: int, start: int,
            most: int, step: int, budget: int | None, log: Any,
            link: Any = None) -> tuple[int | None, dict[str, Any]]:
    """The largest ``grow`` size (a multiple of ``step``) whose step fits: doubling, then bisection."""
    good, info, v = None, {}, start
    while v <= most:
        ok, i = fits(example, plan, {**base, grow: v}, batch, budget, link)
        log(f"  {grow}={v}: {'fits' if ok else 'does not fit'} {i}")
        if not ok:
            break
        good, info, v = v, i, v * 2
    lo, hi = good, min(v, most + step)
    if lo is None:
        return None, {}
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        ok, i = fits(example, plan, {**base, grow: mid}, batch, budget, link)
        log(f"  {grow}={mid}: {'fits' if ok else 'does not fit'} {i}")
        lo, hi, info = (mid, hi, i) if ok else (lo, mid, info)
    return lo, info


def train(example: str, plan: Any, sizes: dict[str, Any], batch: int, steps: int) -> dict[str, Any]:
    """``steps`` steps on the shipped text; the state made on the device where the plan keeps it."""
    import jax
    import numpy as np

    from examples import training

    s = _setup(example, plan, sizes, batch)
    model, tx = s["model"], s["tx"]
    make = jax.jit(lambda: model.build(plan, tx=tx, **sizes)[1], out_shardings=s["stored"])
    state = make()
    compiled = s["step"].lower(state, s["tokens"]).compile()
    data = training.TextBatches(training.split_text(training.encode(training.load_text()))[0],
                                batch=batch, seq_len=sizes["seq_len"], seed=0)
    losses, times = [], []
    for i in range(steps):
        tokens = np.asarray(data(i))
        t0 = time.perf_counter()
        state, loss = compiled(state, tokens)
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - t0)
    tail = times[1:] or times
    return {"losses": losses, "step_ms": 1e3 * statistics.median(tail),
            "falling": losses[-1] < losses[0], "params": s["params"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", default=",".join(EXAMPLES))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--n-layers", type=int, default=8)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--layout", default="scan", help="scan (one compile for any depth) or list")
    p.add_argument("--grow", choices=("n_layers", "d_model"), default="n_layers")
    p.add_argument("--start", type=int, default=None, help="first size tried (default: 1 layer, or the d_model step)")
    p.add_argument("--most", type=int, default=4096)
    p.add_argument("--plans", default="recompute,offload",
                   help="activation plans of the example (plans/NAME.yaml) for (b) and (c)")
    p.add_argument("--states", default="optimizer,both", help="state placements for (c)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget", type=int, default=None, help="bytes of device memory (besides the compiler's own limit)")
    p.add_argument("--profile", default="tpu-v5e", help="device profile whose host link prices the state's transfers")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a CPU")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.batch, a.seq_len, a.d_model, a.n_heads, a.n_layers, a.most = 2, 16, 32, 2, 1, 4
        a.steps = min(a.steps, 6)
    import jax
    from remat_common.measurement import host_link, load_profile

    link = host_link(load_profile(a.profile))
    step = 1 if a.grow == "n_layers" else 128 if not a.quick else 2 * a.n_heads
    start = a.start or (1 if a.grow == "n_layers" else step)
    base = dict(vocab=256, d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads,
                seq_len=a.seq_len, layout=a.layout)
    kinds = [("a: no plan", "none", None)]
    kinds += [("b: activation plan", name, None) for name in a.plans.split(",") if name]
    kinds += [("c: plan + state on host", name, st) for name in ["none", *a.plans.split(",")]
              if name for st in a.states.split(",") if st]
    dev = jax.devices()[0]
    print(f"capacity_check on {jax.default_backend()} ({dev.device_kind}), batch {a.batch}, "
          f"seq_len {a.seq_len}, growing {a.grow} from {base}", flush=True)
    rows: list[dict[str, Any]] = []
    for example in a.examples.split(","):
        best: dict[str, dict[str, Any]] = {}
        for kind, name, st in kinds:
            plan = _plan(example, name, st)
            print(f"{example} {kind}: plan {name}, state {st or 'device'}", flush=True)
            size, info = largest(example, plan, base, a.grow, a.batch, start, a.most, step,
                                 a.budget, lambda m: print(m, flush=True), link)
            if size is None:
                print("  nothing fits", flush=True)
                continue
            key = kind.split(":")[0]
            if key not in best or info["params"] > best[key]["params"]:
                best[key] = {"example": example, "kind": kind, "plan": name,
                             "state": st or "device", a.grow: size, **info}
        for key in sorted(best):
            row = best[key]
            sizes = {**base, a.grow: row[a.grow]}
            run = train(example, _plan(example, row["plan"], None if row["state"] == "device"
                                       else row["state"]), sizes, a.batch, a.steps)
            row.update(run)
            rows.append(row)
            print(f"  trained {row['kind']}: {a.grow}={row[a.grow]}, {row['params']:,} parameters, "
                  f"{row['step_ms']:.1f} ms/step, loss {run['losses'][0]:.3f} -> "
                  f"{run['losses'][-1]:.3f}", flush=True)
    print(f"\n{'example':8} {'kind':26} {'plan':10} {'state':10} {a.grow:>8} {'parameters':>14} "
          f"{'ms/step':>9} {'host MiB/step':>13} {'link ms':>8} {'loss first->last':>18} falling")
    for r in rows:
        print(f"{r['example']:8} {r['kind']:26} {r['plan']:10} {r['state']:10} {r[a.grow]:>8} "
              f"{r['params']:>14,} {r['step_ms']:>9.1f} {r['transfer_bytes'] / 2**20:>13.1f} "
              f"{r['transfer_ms']:>8.2f} {r['losses'][0]:>8.3f}->{r['losses'][-1]:<8.3f} "
              f"{'yes' if r['falling'] else 'NO'}")
    if a.json:
        Path(a.json).write_text(json.dumps({"backend": jax.default_backend(),
                                            "device_kind": str(dev.device_kind), "batch": a.batch,
                                            "seq_len": a.seq_len, "grow": a.grow, "base": base,
                                            "rows": rows}, indent=1, default=str))
    return 0 if rows and all(r["falling"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
