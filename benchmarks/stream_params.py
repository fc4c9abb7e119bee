"""The nnx_gpt training step with its parameters and optimizer state on host: the scanned blocks
fetched whole at the step's start (``train_step_fn(..., stream=False)``, the default) against
streamed through the scan a layer at a time (``stream=True``).

The figures of docs/tpu.md ("Parameters on host, streamed layer by layer"): per way, the compiled
figures, then ``--steps`` steps on the shipped text with the state made on the device a part at a
time and kept on host, as ``scripts/capacity_check`` trains its ``c`` rows (its setup is used:
``remat_common.internal.example_step``, ``train_example``);
the median step after the first and the losses. Writes ``stream-{way}-{n_layers}.json`` under
``$OUT`` (default: the working directory). Host memory: about 0.3 GB a layer streamed, 0.25 fetched
whole, at these sizes. On a TPU host::

    python benchmarks/stream_params.py --n-layers 64 --plan offload --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from remat_common import internal as cc  # the capacity check's setup and training

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # the examples it trains


def run(way: str, n_layers: int, plan_name: str, steps: int) -> dict[str, Any]:
    model = cc.example_model("nnx_gpt")
    plain = model.train_step_fn
    model.train_step_fn = lambda static, tx=None: plain(static, tx, stream=way == "streamed")
    try:
        plan = cc.example_plan("nnx_gpt", plan_name, "both")
        sizes = dict(vocab=256, d_model=1024, n_layers=n_layers, n_heads=8, seq_len=1024,
                     layout="scan")
        s = cc.example_step("nnx_gpt", plan, sizes, 8)
        t0 = time.perf_counter()
        compiled = s["step"].lower(s["args"], s["tokens"]).compile()
        mem = compiled.memory_analysis()
        out: dict[str, Any] = {"way": way, "n_layers": n_layers, "plan": plan_name,
                               "compile_s": time.perf_counter() - t0, "memory": {
            k: getattr(mem, k) for k in ("argument_size_in_bytes", "temp_size_in_bytes",
                                         "host_argument_size_in_bytes", "host_temp_size_in_bytes",
                                         "peak_memory_in_bytes")}}
        print(way, json.dumps(out), flush=True)
        out.update(cc.train_example("nnx_gpt", plan, sizes, 8, steps, compiled=compiled))
    finally:
        model.train_step_fn = plain
    with open(os.path.join(os.environ.get("OUT", "."), f"stream-{way}-{n_layers}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-layers", type=int, default=64)
    ap.add_argument("--plan", default="offload", help="a plan of examples/nnx_gpt/plans")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ways", nargs="+", default=["whole", "streamed"],
                    choices=("whole", "streamed"))
    a = ap.parse_args()
    with cc.concrete_builds("nnx_gpt"):  # the state is made on the device, a part at a time
        for w in a.ways:
            r = run(w, a.n_layers, a.plan, a.steps)
            print(w, f"{r['step_ms']:.1f} ms a step, losses", [round(x, 3) for x in r["losses"]])
