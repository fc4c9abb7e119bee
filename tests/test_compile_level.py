"""``./scripts/test`` compiles at XLA's LLVM optimization level 0 (``XLA_FLAGS=
--xla_backend_optimization_level=0``, a quarter less of the suite's time on XLA:CPU). That level
changes only the machine code XLA emits: the optimized HLO, from which every figure the project
reports is read (``memory_analysis()``, the buffer assignment, ``cost_analysis()`` FLOPs, the
placements), is the same as at XLA's default level 3. Checked here on the example GPTs' training
steps (NNX on a list of layers, Equinox on a scanned stack) without a plan and under the plan
that saves names, offloads one and recomputes the rest, compiled at both levels in this process
whatever ``XLA_FLAGS`` says. The whole suite passes at either level (measured: 1678 tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

from remat_common.internal import ReportConfig, jittable  # noqa: E402

# Tooling (a check of the suite's own set-up): marked `tooling`; every stage of scripts/test runs it.
pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[1]
TINY = {"vocab": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 64, "batch": 4}
#: One example: the LLVM level changes XLA:CPU's machine code, after the HLO passes every figure is
#: read from, whatever the framework that traced the program (the Equinox GPT's scanned step was a
#: second case, 43 s of CI's 2-core time).
CASES = [("nnx_gpt", "list")]
MEMORY = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "host_argument_size_in_bytes", "host_output_size_in_bytes",
          "host_alias_size_in_bytes", "host_temp_size_in_bytes")


def _figures(compiled: Any) -> tuple[str, dict[str, int], float]:
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return compiled.as_text(), {k: getattr(m, k) for k in MEMORY}, cost.get("flops", -1.0)


@pytest.mark.usefixtures("standard_promotion")
@pytest.mark.parametrize(("example", "layout"), CASES, ids=["-".join(c) for c in CASES])
def test_llvm_level_0_compiles_the_same_hlo_as_the_default(example: str, layout: str) -> None:
    config = ReportConfig.load(ROOT / "examples" / example / "report.yaml").with_sizes(
        {**TINY, "layout": layout})
    build = config.builder()
    plans = config.plan_objects()
    for name in ("none", "names"):  # names: saved names, an offload, recomputation
        t = build(plans[name])
        fn, args = jittable(t.step_fn, tuple(t.step_args))
        lowered = jax.jit(fn).lower(*args)
        fast, default = (_figures(lowered.compile(
            compiler_options={"xla_backend_optimization_level": level})) for level in (0, 3))
        assert fast[1:] == default[1:], (example, layout, name)
        assert fast[0] == default[0], (example, layout, name, "optimized HLO differs")
