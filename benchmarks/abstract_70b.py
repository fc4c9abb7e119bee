"""A Llama-3-70B-shaped training step compiled at full depth from shapes only, and the RSS it takes.

The claim of ``docs/targets.md``: a 70B-parameter step compiles on a 24 GiB, 2-core machine, because
nothing the size of the model is allocated on the host. This runs the project's own command,
``remat report examples/EXAMPLE/llama3_70b_h100x64.yaml --plans PLAN --json OUT`` (80 scanned
layers, d_model 8192, GQA 64/8 heads, SwiGLU 28672, vocabulary 128256, sequence 4096, batch 64,
AdamW, FSDP over 64 H100s), in a child process, and prints the compiled figures per device, the
wall and CPU time and the child's peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``). It exits 1
when the peak RSS exceeds the bound (default 4 GiB, as ``tests/test_targets.py`` checks for a
smaller shape: a sixth of the 24 GiB machine) or the plan does not compile. Run (about 20 s on
2 cores; needs ``jax-remat-plan[target-gpu]``)::

    JAX_PLATFORMS=cpu JAX_ENABLE_COMPILATION_CACHE=false python benchmarks/abstract_70b.py
    JAX_PLATFORMS=cpu python benchmarks/abstract_70b.py eqx_gpt --plan recompute --bound 4GiB
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from remat_common.internal import fmt_bytes  # noqa: E402
from remat_common.measurement import Report, parse_bytes  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("example", nargs="?", default="nnx_gpt", choices=("nnx_gpt", "eqx_gpt"))
    ap.add_argument("--plan", default="recompute", help="a plan of the config (default recompute)")
    ap.add_argument("--bound", default="4GiB", help="the peak RSS the compile must stay under")
    args = ap.parse_args(argv)
    bound = parse_bytes(args.bound, "--bound")
    config = ROOT / "examples" / args.example / "llama3_70b_h100x64.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, str(ROOT / "_remat_cli.py"), "report", str(config), "--plans",
               args.plan, "--json", str(out), "--no-progress"]
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            print(f"remat report exited with status {run.returncode}: {' '.join(cmd)}")
            return 1
        report = Report.load(out)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = after.ru_maxrss * 1024  # KiB on Linux
    p = report[args.plan]
    m = p.memory
    over = report.exceeds_by(args.plan)
    acc = report.accelerator or {}
    print(f"{args.example} {config.name}, plan {args.plan}: {acc.get('description', 'local')}, "
          f"mesh {acc.get('mesh')}")
    devices = math.prod((acc.get("mesh") or {}).values())
    args_all = fmt_bytes(m.argument_size_in_bytes * devices)
    print(f"  per device: arguments {fmt_bytes(m.argument_size_in_bytes)} (x {devices} devices: "
          f"{args_all}), temp {fmt_bytes(m.temp_size_in_bytes)}, "
          f"host temp {fmt_bytes(m.host_temp_size_in_bytes)}, peak {fmt_bytes(m.device_total)}; "
          "fits: "
          + ("?" if over is None else "yes" if over == 0 else f"no (+{fmt_bytes(over)})")
          + f"; XLA remat on its own: {'yes' if p.xla_remat else 'no'}")
    print(f"  lower {p.timing.lower_s:.1f} s, compile {p.timing.compile_s:.1f} s; the whole "
          f"command: wall {wall:.0f} s, CPU {cpu:.0f} s")
    print(f"  peak RSS {fmt_bytes(rss)} (bound {fmt_bytes(bound)}): "
          + ("ok" if rss <= bound else "OVER THE BOUND"))
    return 0 if rss <= bound else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
