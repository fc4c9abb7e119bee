"""The report of the NNX GPT's training step on a device mesh, next to the same step on one device.

The figures of ``docs/scale.md``: each plan's residuals (global shapes), compiled temp and argument
bytes (per device), FLOP ratios and the cuda-export placement check, at the size of
``examples/nnx_gpt/report.yaml`` (width 128, 4 blocks, sequence 128, batch 8). The step is placed
on the mesh as training places it (``examples.training._on_mesh``).

Run (about 3 minutes each on 2 CPU cores)::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/sharded_report.py data=2,tensor=2
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/sharded_report.py   # one device
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import remat_common as rc  # noqa: E402

from examples import scale, training  # noqa: E402
from examples.nnx_gpt import model as gpt  # noqa: E402

SIZES = dict(vocab=256, d_model=128, n_layers=4, n_heads=4, seq_len=128)
PLANS = ("none", "recompute", "offload", "names")


def main(mesh_text: str | None) -> None:
    here = training.EXAMPLES / "nnx_gpt"
    plans = {n: None if n == "none" else training.load_plan(n, here) for n in PLANS}
    build = functools.partial(gpt.measure_target, batch=8, seed=0, **SIZES)
    mesh = scale.make_mesh(mesh_text)
    if mesh is not None:
        build = functools.partial(training._on_mesh, build, gpt=gpt, mesh=mesh)
    with jax.numpy_dtype_promotion("standard"):
        report = rc.measurement.measure(build, plans, steps=2, warmup=1)
    print(f"mesh {None if mesh is None else dict(mesh.shape)}, {jax.device_count()} devices")
    print(rc.measurement.render_text(report))
    print("plan        argument bytes per device  temp bytes per device  FLOPs per device")
    for p in report.plans:
        m = p.memory
        print(f"{p.name:11s} {m.argument_size_in_bytes:>25}  {m.temp_size_in_bytes:>21}  "
              f"{p.flops if p.flops is not None else '-':>16}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
