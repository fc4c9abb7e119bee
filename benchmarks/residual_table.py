"""Residuals per annotation, jax_remat3 off and on, on the quickstart's four-layer MLP.

For every annotation of the vocabulary applied to every layer (``layers.*``) this prints what
reverse-mode AD keeps — bytes on device and host, and the names — as measured by the core's
verifier, and whether gradients equal the un-annotated model's.

Run: ``.venv/bin/python benchmarks/residual_table.py``
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import remat_common as rc  # noqa: E402
from examples.quickstart import LAYERS, PATHS, WIDTH, loss  # noqa: E402

ANNOTATIONS = {
    "(none)": None,
    "save": "save",
    "recompute": "recompute",
    "offload": "offload",
    "dots": "dots",
    "dots_no_batch": "dots_no_batch",
    "{save: [h]}": {"save": ["h"]},
    "{offload: [h]}": {"offload": ["h"]},
    "{save: [act], offload: [h]}": {"save": ["act"], "offload": ["h"]},
}


def _short(names: frozenset[str]) -> str:
    leaves = sorted({n.rpartition("/")[2] for n in names})
    return ",".join(leaves) or "-"


def main() -> None:
    ws = jax.random.normal(jax.random.key(0), (LAYERS, WIDTH, WIDTH)) / WIDTH**0.5
    x = jax.random.normal(jax.random.key(1), (64, WIDTH))
    base = jax.grad(loss)(ws, x, None)
    print(f"jax {jax.__version__}, {LAYERS} layers, x [64, {WIDTH}] float32; bytes exclude the arguments")
    header = f"{'annotation':30s} {'remat3':6s} {'policy':33s} {'device B':>9s} {'host B':>8s} {'named dev':10s} {'named host':10s} grads"
    print(header)
    print("-" * len(header))
    for remat3 in (False, True):
        jax.config.update("jax_remat3", remat3)
        for label, ann in ANNOTATIONS.items():
            plan = rc.compile_plan(rc.resolve(rc.Plan.from_mapping({"layers.*": ann} if ann else {}), PATHS))
            check = rc.verify(loss, ws, x, plan, plan=plan)
            rep = check.report
            ok = np.allclose(jax.grad(loss)(ws, x, plan), base, rtol=1e-5, atol=1e-6)
            policy = plan.boundaries[0].policy_name if plan.boundaries else "(no boundary)"
            print(f"{label:30s} {'on' if remat3 else 'off':6s} {policy:33s} {rep.nbytes('device'):9,d} "
                  f"{rep.nbytes('host'):8,d} {_short(rep.names('device')):10s} "
                  f"{_short(rep.names('host')):10s} {'equal' if ok else 'DIFFER'}")
    jax.config.update("jax_remat3", False)


if __name__ == "__main__":
    main()
