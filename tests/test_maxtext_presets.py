"""MaxText's remat presets as plans (shipped: ``remat_common/presets/maxtext/``, by name
``Plan.preset("maxtext:minimal")``): each loads, resolves and
verifies on both example GPTs and keeps what MaxText's policy of the same name keeps (by this
model's names). ``remat tune --plans`` taking a preset file: tests/test_tune_search.py.

The presets are not in the loop of tests/test_examples.py (which trains on ``plans/*.yaml``): here
each is only traced (strict verification of what AD keeps), at a tiny size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("rich")

import remat_common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(d_model=32, n_layers=1, n_heads=2, seq_len=16)
PRESETS = ("full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp",
           "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj", "qkv_proj_offloaded",
           "minimal_offloaded", "save_out_proj")
#: A value the backward pass never reads, so no plan keeps it: the MLP output feeds only the block's
#: last residual addition. (``attn_out`` is read: the recomputed ``x + attn_out`` feeds ``mlp_norm``.)
UNREAD = {"mlp_out"}


def _model(example: str) -> Any:
    if example == "nnx_gpt":
        from examples.nnx_gpt import model
    else:
        from examples.eqx_gpt import model
    return model


def _leaves(names: frozenset[str] | set[str]) -> set[str]:
    return {n.rpartition("/")[2] for n in names}


@pytest.mark.parametrize("example", ["nnx_gpt", "eqx_gpt"])
def test_every_preset_verifies(example: str) -> None:
    assert sorted(remat_common.internal.presets()) == sorted(f"maxtext:{n}" for n in PRESETS)
    model = _model(example)
    for name in PRESETS:
        plan = remat_common.Plan.preset(f"maxtext:{name}")
        target = model.measure_target(plan, batch=2, **SIZES)
        ver = remat_common.verify(target.loss_fn, *target.loss_args, plan=target.plan, strict=True)
        (boundary_spec,) = {(b.spec.kind, frozenset(_leaves(b.spec.save)), frozenset(_leaves(b.spec.offload)))
                            for b in target.plan.boundaries}
        kind, save, offload = boundary_spec
        assert [b.path for b in target.plan.boundaries] == [f"blocks.{i}" for i in range(SIZES["n_layers"])]
        rep = ver.report
        # what AD keeps by name is what the preset lists, less the values the backward never reads
        assert _leaves(rep.names("device")) == save - UNREAD, name
        assert _leaves(rep.names("host")) == offload - UNREAD, name
        if name == "full":
            assert kind == "recompute" and not rep.names("device") and not rep.names("host")
        if name.endswith("_offloaded"):
            assert not save and rep.nbytes("host") > 0
