"""AdamW where the training state is kept on host: the update on the device (parameters and both
moments brought down and taken back) against the update on host (``compute_on("device_host")``:
parameters down, gradients up, the update run by the host inside the jitted step).

The figures of docs/tpu.md ("The update on host"): ``L`` float32 matrices of ``D`` x ``D`` as the
parameters, their gradients from a small matrix product on the device, the state donated and kept
in ``pinned_host`` between steps, five steps each; the median of the last four, the compiled
figures, whether the program holds a host computation, the process's peak RSS and the largest
difference between the two updates' parameters. Writes ``host_update_L{L}.json`` under ``$OUT``
(default: the working directory). Host memory: about ten times the parameters' bytes. On a TPU
host (CPU: both run, nothing goes to a host)::

    python benchmarks/host_update.py 8 4096
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compute_on import compute_on

B1, B2, LR, EPS = 0.9, 0.999, 1e-3, 1e-8


def adam(p: Any, m: Any, v: Any, g: Any, t: Any) -> tuple[Any, Any, Any]:
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * g * g
    return p - LR * (m / (1 - B1 ** t)) / (jnp.sqrt(v / (1 - B2 ** t)) + EPS), m, v


def grads(p: Any, x: Any) -> Any:
    return jax.vmap(jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w))))(p)


def on_device(p: Any, m: Any, v: Any, x: Any, t: Any) -> tuple[Any, Any, Any]:
    p, m, v = (jax.device_put(a, jax.memory.Space.Device) for a in (p, m, v))
    p, m, v = adam(p, m, v, grads(p, x), t)
    return tuple(jax.device_put(a, jax.memory.Space.Host) for a in (p, m, v))  # type: ignore


on_host_adam = compute_on(compute_type="device_host", out_memory_spaces=jax.memory.Space.Host)(adam)


def on_host(p: Any, m: Any, v: Any, x: Any, t: Any) -> tuple[Any, Any, Any]:
    g = jax.device_put(grads(jax.device_put(p, jax.memory.Space.Device), x), jax.memory.Space.Host)
    return on_host_adam(p, m, v, g, t)  # type: ignore[no-any-return]


def main(n: int = 8, d: int = 4096) -> dict[str, Any]:
    dev = jax.devices()[0]
    mesh = jax.sharding.Mesh(np.array([dev]), ("x",))
    host, device = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind=k)
                    for k in ("pinned_host", "device"))
    x = jax.device_put(np.random.default_rng(0).standard_normal((256, d), np.float32), device)
    out: dict[str, Any] = {"L": n, "D": d, "param_bytes": n * d * d * 4, "jax": jax.__version__,
                           "device": dev.device_kind}
    firsts = {}
    for name, fn in (("device", on_device), ("host", on_host)):
        step = jax.jit(fn, in_shardings=(host, host, host, device, None),
                       out_shardings=(host, host, host), donate_argnums=(0, 1, 2))
        p, m, v = (jax.device_put(np.full((n, d, d), c, np.float32), host) for c in (0.01, 0, 0))
        t0 = time.perf_counter()
        compiled = step.lower(p, m, v, x, 1.0).compile()
        row: dict[str, Any] = {"compile_s": time.perf_counter() - t0, "step_ms": []}
        for i in range(5):
            t0 = time.perf_counter()
            p, m, v = compiled(p, m, v, x, float(i + 1))
            jax.block_until_ready(p)
            row["step_ms"].append(1e3 * (time.perf_counter() - t0))
        mem = compiled.memory_analysis()
        row.update(median_ms=float(np.median(row["step_ms"][1:])), temp=mem.temp_size_in_bytes,
                   host_temp=mem.host_temp_size_in_bytes,
                   host_computation="HostExecute" in compiled.as_text(),
                   peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        out[name] = row
        print(name, json.dumps(row), flush=True)
        firsts[name] = np.asarray(jax.device_put(p, device)[0, :4, :4])  # a host array sliced
        del p, m, v                                                       # eagerly is refused
    out["max_abs_diff"] = float(np.max(np.abs(firsts["device"] - firsts["host"])))
    print("largest |device - host| after five steps:", out["max_abs_diff"])
    with open(os.path.join(os.environ.get("OUT", "."), f"host_update_L{n}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
