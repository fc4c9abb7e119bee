"""Every annotation of the vocabulary on the NNX test transformer, list and scanned, remat3 off/on.

For each case: gradients equal the un-annotated model's (float32, to round-off: fixtures/tolerance.py); the core verifier finds
the residuals the plan asks for; and the residuals themselves, counted by shape per layer, are what
the annotation means (recompute keeps no MLP hidden state and no attention scores, dots keeps the
matmul outputs, dots_no_batch drops the batched attention matmuls, offload and names move exactly
the planned bytes to host...).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import jax
import pytest
from flax import nnx

import flax_remat_plugin as frp
from fixtures.jaxprs import count_scans
from fixtures import nnx_models as nm
from fixtures.vocabulary import NNX_PLANS
import remat_common as rc
from versions import SHOW_REMAT, TEMP_TRACKS_RESIDUALS, temp_is_flagged

B, T, D, H, F, L = nm.BATCH, nm.SEQ, nm.D, nm.HEADS, nm.F, nm.LAYERS
X_SHAPE, HIDDEN, SCORES = (B, T, D), (B, T, F), (B, H, T, T)
X_BYTES, HIDDEN_BYTES = B * T * D * 4, B * T * F * 4

PLANS: dict[str, Any] = NNX_PLANS  # the vocabulary table the benchmarks measure too

#: Per annotation, residuals counted per layer instance (a scanned residual of shape [L, ...] counts
#: L times): MLP hidden-sized ones on device, attention-score-sized ones on device, bytes on host and
#: the shape of what is on host. ``None``: as in the un-annotated model.
EXPECTED: dict[str, tuple[int | None, int | None, int, tuple[int, ...] | None]] = {
    "recompute": (0, 0, 0, None),
    "offload": (0, 0, L * X_BYTES, X_SHAPE),           # each block's input goes to host
    "dots": (2 * L, 2 * L, 0, None),                     # gate/up matmuls, q.k scores per block
    "dots_no_batch": (2 * L, 0, 0, None),                # attention einsums have batch dims
    "names": (0, 0, L * HIDDEN_BYTES, HIDDEN),           # attn_out on device, mlp_hidden on host
    # every matmul output without batch dims goes to host: the fused q/k/v projection (3 D), the
    # attention output projection (D), gate and up (F each); the batched attention einsums do not
    "offload_dots_no_batch": (0, 0, L * (4 * X_BYTES + 2 * HIDDEN_BYTES), None),
    "custom": (2 * L, None, 0, None),                    # the rule set keeps gate and up only
}


@pytest.fixture(scope="module")
def models() -> dict[str, nnx.Module]:
    return {"list": nm.Transformer(rngs=nnx.Rngs(0)), "scanned": nm.ScannedTransformer(rngs=nnx.Rngs(0))}


@pytest.fixture(scope="module")
def data() -> tuple[jax.Array, jax.Array]:
    return nm.batch(0)


_BASELINES: dict[tuple[str, bool], tuple[Any, rc.ResidualReport]] = {}


def _baseline(model: nnx.Module, variant: str, remat3: bool, data: Any) -> tuple[Any, rc.ResidualReport]:
    key = (variant, remat3)
    if key not in _BASELINES:
        frp.unannotate(model)
        loss, params = nm.split_loss(model, *data)
        _BASELINES[key] = (nm.fast_jit(jax.grad(loss))(params), rc.saved_residuals(loss, params))
    return _BASELINES[key]


def _count(report: rc.ResidualReport, shape: tuple[int, ...], placement: str = "device") -> int:
    n = 0
    for r in report.select(placement=placement):  # type: ignore[arg-type]
        n += 1 if r.shape == shape else L if r.shape == (L, *shape) else 0
    return n


def _shapes(report: rc.ResidualReport) -> Counter[tuple[Any, ...]]:
    return Counter((r.kind, r.shape, r.dtype, r.placement) for r in report.residuals)


@pytest.mark.parametrize("kind", list(PLANS))
@pytest.mark.parametrize("variant", ["list", "scanned"])
def test_annotation(models, data, variant, kind, remat3):
    model = models[variant]
    grads0, base = _baseline(model, variant, remat3, data)
    frp.annotate(model, PLANS[kind])
    try:
        plan = frp.compiled_plan(model)
        loss, params = nm.split_loss(model, *data)
        nm.assert_trees_close(nm.fast_jit(jax.grad(loss))(params), grads0)
        v = rc.verify(loss, params, plan=plan, strict=True)
    finally:
        frp.unannotate(model)
    rep = v.report
    if kind in ("inherit", "save"):  # no boundary: exactly what plain AD keeps
        assert not plan.boundaries
        assert _shapes(rep) == _shapes(base)
        return
    hidden, scores, host, host_shape = EXPECTED[kind]
    assert _count(rep, HIDDEN) == (_count(base, HIDDEN) if hidden is None else hidden)
    assert _count(rep, SCORES) == (_count(base, SCORES) if scores is None else scores)
    assert rep.nbytes("host") == host
    if host_shape is not None:
        assert _count(rep, host_shape, "host") == L
    assert rep.nbytes("device") < base.nbytes("device")
    boundary_paths = [b.path for b in plan.boundaries]
    if kind == "custom":
        assert boundary_paths == [f"layers.{i}.mlp" for i in range(L)]
    else:
        assert boundary_paths == [f"layers.{i}" for i in range(L)]
    want = {"names": {f"layers.{i}.attn/attn_out" for i in range(L)},
            "custom": {f"layers.{i}.mlp/__rule__" for i in range(L)}}.get(kind, set())
    first = {n.replace(f"layers.{i}.", "layers.0.") for n in want
             for i in range(L) if n.startswith(f"layers.{i}.")}
    if variant == "list" and not plan.shared:
        assert rep.names("device") == want
    elif variant == "list":  # alike layers share layers.0's trace (the default): its names, per layer
        assert rep.names("device") == first
        assert sum(1 for r in rep.residuals if r.name in first) == L * len(first)
    else:  # seen inside the scan: one stacked residual per name, under the group's first layer
        assert not rep.opaque
        assert rep.names("device") == first
        assert all(r.layers == L for r in rep.residuals if r.name is not None)


def test_layer_groups_split_the_scan(models, data, remat3):
    """The first layer offloads, the rest recompute: two scans, one layer's input on host."""
    model = models["scanned"]
    grads0, base = _baseline(model, "scanned", remat3, data)
    frp.annotate(model, {"layers": "recompute", "layers.0": "offload"})
    try:
        plan = frp.compiled_plan(model)
        groups = rc.adapter.layer_groups(plan.resolution, "layers", L)
        loss, params = nm.split_loss(model, *data)
        jaxpr = jax.make_jaxpr(loss)(params)
        nm.assert_trees_close(nm.fast_jit(jax.grad(loss))(params), grads0)
        rep = rc.verify(loss, params, plan=plan, strict=True).report
    finally:
        frp.unannotate(model)
    assert [(g.start, g.stop, g.path) for g in groups] == [(0, 1, "layers.0"), (1, L, "layers.1")]
    assert count_scans(jaxpr.jaxpr) == 2  # one per group, under the groups' one custom_vjp
    assert rep.nbytes("host") == X_BYTES
    assert _count(rep, HIDDEN) == 0


def _host_placements(text: str) -> int:
    return len(re.findall(r"annotate_device_placement.*pinned_host", text))


@pytest.mark.parametrize("variant", ["list", "scanned"])
def test_offload_is_placed_on_host_in_the_cuda_export(models, data, variant, remat3):
    """On CPU the compiler drops offloads; the step exported for cuda shows the host placements."""
    model = models[variant]
    frp.annotate(model, PLANS["offload"])
    try:
        loss, params = nm.split_loss(model, *data)
        exported = jax.export.export(jax.jit(jax.grad(loss)), platforms=["cuda"])(params)
    finally:
        frp.unannotate(model)
    text = exported.mlir_module()
    assert "annotate_device_placement" in text and "pinned_host" in text
    # one move to host per offloaded block input (inside the scan body: one for all layers)
    assert _host_placements(text) == (L if variant == "list" else 1)
    loss, params = nm.split_loss(model, *data)
    plain = jax.export.export(jax.jit(jax.grad(loss)), platforms=["cuda"])(params).mlir_module()
    assert "pinned_host" not in plain


def test_offloaded_dots_are_placed_on_host_in_the_cuda_export(models, data):
    """offload_dots_no_batch: each block's four no-batch matmul outputs are moved to host and back
    in the step exported for cuda (JAX's offload_dot_with_no_batch_dims; test_annotation checks the
    host residuals with remat3 off and on)."""
    model = models["list"]
    frp.annotate(model, PLANS["offload_dots_no_batch"])
    try:
        assert {b.policy_name for b in frp.compiled_plan(model).boundaries} == {
            "offload_dot_with_no_batch_dims"}
        loss, params = nm.split_loss(model, *data)
        text = jax.export.export(jax.jit(jax.grad(loss)), platforms=["cuda"])(params).mlir_module()
    finally:
        frp.unannotate(model)
    assert _host_placements(text) == 4 * L


@pytest.mark.cpu_figures(
    "the temporaries of a small program: on a TPU v5e chip XLA:TPU kept them in "
    "on-chip memory (temp 0) and tile-padded the arrays; TPU figures are checked at "
    "real sizes by the target stage and scripts/device_check")
@pytest.mark.slow
def test_recompute_costs_flops_and_saves_temp_memory():
    """At a size where XLA:CPU's memory analysis tracks activations (jax 0.11.2, docs/jax_behaviour.md "Measuring on CPU")."""
    size = dict(vocab=256, d=128, heads=4, f=512, layers=2)
    data = nm.batch(0, batch=4, seq=64, vocab=256)
    out = {}
    for kind in ("none", "recompute", "dots_no_batch"):
        model = nm.Transformer(**size, rngs=nnx.Rngs(0))
        if kind != "none":
            frp.annotate(model, PLANS[kind])
        loss, params = nm.split_loss(model, *data)
        compiled = jax.jit(jax.grad(loss)).lower(params).compile(SHOW_REMAT)  # versions.py
        out[kind] = (compiled.cost_analysis()["flops"], compiled.memory_analysis().temp_size_in_bytes)
    (f0, t0), (f1, t1), (f2, t2) = out["none"], out["recompute"], out["dots_no_batch"]
    assert f1 > 1.15 * f0          # the blocks' forward runs twice
    assert f0 < f2 < f1            # keeping the matmuls recomputes only the cheap ops
    if not TEMP_TRACKS_RESIDUALS:  # jax 0.11.0 / 0.12 on CPU: the report says temp means nothing
        assert temp_is_flagged()
        return
    assert t1 < 0.8 * t0           # ... and their activations are not held
    assert t1 < t2 < t0
