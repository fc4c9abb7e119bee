"""FLOPs of steps that draw random numbers: every loop counted per iteration, RNG loops included.

On CPU, JAX's threefry generator is a while loop of 5 iterations, and XLA:CPU outlines the loop of
``jax.random.fold_in`` (every ``nnx.Rngs`` stream draws through it) into a called computation,
where the counter once gave up ("cannot be attributed a trip count"). The reference is the same
step with its keys from ``fixtures/unrolled_prng.py``: the generator's 5 steps written out one
after another, so its compiled step has no RNG loop and XLA's own figure is the unrolled count.
Both are compiled with XLA's fusion pass off: fusion duplicates producers into their consumers
differently in a loop body than in straight-line code (in the default build a loop body's
multi-output chain is computed twice), so only unfused programs do the same operations.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc

eqx = pytest.importorskip("equinox")  # not in the jax 0.12 compatibility environment
nnx = pytest.importorskip("flax.nnx")

import equinox_remat_plugin as er  # noqa: E402
import flax_remat_plugin as frp  # noqa: E402

from fixtures import eqx_models as em  # noqa: E402
from fixtures import nnx_models as nm  # noqa: E402
from fixtures import unrolled_prng  # noqa: E402
from versions import CSE_UNDOES_REMAT  # noqa: E402

UNFUSED = {"xla_disable_hlo_passes": "fusion"}

# Tooling: the FLOP counts behind remat report and remat tune (the jax 0.11.2 stage only).
pytestmark = pytest.mark.tooling


def _loops_in_calls(compiled: object) -> int:
    """How many while loops sit in a computation that a ``call`` runs (the case once unknown),
    read from the compiled HLO text."""
    comps: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in compiled.as_text().splitlines():  # type: ignore[attr-defined]
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            head = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)", line)
            lines = comps.setdefault(head.group(1) if head else line, [])
        else:
            lines.append(line)
    called = {c for body in comps.values() for ln in body if " call(" in ln
              for c in re.findall(r"to_apply=%?([\w.\-]+)", ln)}
    return sum(1 for c in called for ln in comps.get(c, []) if " while(" in ln)


def _nnx_step(key: jax.Array, plan: object, cls: type = nm.Transformer):
    model = cls(dropout=0.2, rngs=nnx.Rngs(params=0, dropout=key))
    if plan is not None:
        model = frp.annotate(model, plan)
    graphdef, state = nnx.split(model)
    tokens, targets = nm.batch()

    def step(state):
        return nnx.grad(nm.loss_fn)(nnx.merge(graphdef, state), tokens, targets)

    return jax.jit(step).lower(state)


def test_unrolled_fixture_draws_the_same_bits():
    for shape in ((5,), (3, 7)):
        assert np.array_equal(jax.random.bits(jax.random.key(3), shape),
                              jax.random.bits(unrolled_prng.key(3), shape))
    assert np.array_equal(jax.random.key_data(jax.random.fold_in(jax.random.key(3), 7)),
                          jax.random.key_data(jax.random.fold_in(unrolled_prng.key(3), 7)))


@pytest.mark.cpu_figures(
    "the while loops XLA:CPU keeps in the compiled program; XLA:TPU unrolled or "
    "fused these small ones (0 loops on a v5e chip), so there is nothing to count")
@pytest.mark.parametrize("plan", [None, {"layers.*": "recompute"}], ids=["plain", "recompute"])
def test_dropout_step_flops_equal_the_unrolled_count(plan):
    rolled = _nnx_step(jax.random.key(0), plan).compile(UNFUSED)
    unrolled = _nnx_step(unrolled_prng.key(0), plan).compile(UNFUSED)
    assert _loops_in_calls(rolled) >= 2  # fold_in's loop, outlined by XLA:CPU
    got, ref = rc.measurement.count_flops(rolled), rc.measurement.count_flops(unrolled)
    assert ref.loops == 0 and ref.flops is not None and got.flops is not None, got.reason
    assert got.flops == pytest.approx(ref.flops, rel=0.02)
    assert got.counted == got.flops and got.uncounted == ()
    assert got.xla_flops is not None and got.xla_flops < 0.98 * ref.flops  # each body once: off


@pytest.mark.cpu_figures(
    "the while loops XLA:CPU keeps in the compiled program; XLA:TPU unrolled or "
    "fused these small ones (0 loops on a v5e chip), so there is nothing to count")
def test_dropout_step_flops_are_known_in_the_default_build():
    got = rc.measurement.count_flops(_nnx_step(jax.random.key(0), None, nm.ScannedTransformer).compile())
    assert got.flops is not None and got.reason is None and got.loops >= 3  # the scan + RNG loops
    assert got.flops > 1.5 * (got.xla_flops or 0.0)


def _diffusion_lowered(key: jax.Array) -> object:
    """A diffusion-style loss: per-example noise levels and ``jax.random.normal`` noise drawn under
    ``vmap`` from split keys, a denoiser (an Equinox transformer, its blocks recomputed) asked to
    predict the noise."""
    dims = em.Dims(batch=4, seq=4, d_in=32, dim=16, hidden=16, layers=2)
    model = er.annotate(em.transformer(dims=dims), {"blocks.*": "recompute"})
    x0 = em.inputs(dims=dims)

    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, key):
        model = eqx.combine(params, static)
        k_t, k_n = jax.random.split(key)
        t = jax.random.uniform(k_t, (dims.batch, 1, 1))
        noise = jax.vmap(lambda k, x: jax.random.normal(k, x.shape))(
            jax.random.split(k_n, dims.batch), x0)
        xt = jnp.sqrt(1 - t) * x0 + jnp.sqrt(t) * noise
        return jnp.mean((model(xt) - noise) ** 2)

    return jax.jit(jax.grad(loss)).lower(params, key)


@pytest.mark.cpu_figures(
    "the while loops XLA:CPU keeps in the compiled program; XLA:TPU unrolled or "
    "fused these small ones (0 loops on a v5e chip), so there is nothing to count")
def test_diffusion_loss_flops_equal_the_unrolled_count():
    rolled = _diffusion_lowered(jax.random.key(0)).compile(UNFUSED)
    unrolled = _diffusion_lowered(unrolled_prng.key(0)).compile(UNFUSED)
    got, ref = rc.measurement.count_flops(rolled), rc.measurement.count_flops(unrolled)
    assert ref.loops == 0 and got.loops >= 2 and got.flops is not None, got.reason
    assert got.flops == pytest.approx(ref.flops, rel=0.02)
    assert got.xla_flops is not None and got.xla_flops < 0.98 * ref.flops  # each body once: off


def test_a_loop_without_a_trip_count_is_named_and_the_rest_counted():
    def f(n: jax.Array, ws: jax.Array, h: jax.Array) -> jax.Array:
        h = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), h, ws)[0]
        return jax.lax.fori_loop(0, n, lambda i, c: jnp.tanh(c @ c), h)

    args = (jnp.int32(3), jnp.ones((4, 16, 16)), jnp.ones((16, 16)))
    got = rc.measurement.count_flops(jax.jit(f).lower(*args).compile())
    assert got.flops is None and got.loops == 1 and len(got.uncounted) == 1
    assert "test_flops.py:" in got.uncounted[0] and "while" in got.uncounted[0]
    assert got.reason is not None and got.uncounted[0] in got.reason
    matmul = 2 * 16**3
    assert got.counted is not None and got.counted >= 5 * matmul  # 4 scanned + the body once
    assert got.counted < 6 * matmul + 4 * 16 * 16 * 10


# -- remat tune on steps that draw random numbers (tooling: the outcome does not depend on the
# JAX version) --------------------------------------------------------------------------------------

DATA = __import__("pathlib").Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("config", ["dropout_tune.yaml", "diffusion_tune.yaml"])
def test_remat_tune_runs_on_steps_that_draw_random_numbers(config, tmp_path, capsys):
    import json

    from remat_common.internal import main

    out = tmp_path / "t.json"
    # a budget nothing fits: save-all and recompute are compiled and ranked, then the limit
    code = main(["tune", str(DATA / config), "--budget", "1KiB", "--choices", "recompute",
                 "--max-compiles", "2", "--no-progress", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1 and "nothing fits 1.00 KiB" in text, text
    data = json.loads(out.read_text())
    points = {p["name"]: p for p in data["points"]}
    assert set(points) == {"save", "recompute"} and data["chosen"] is None
    assert not any(n.startswith("warning:") for n in data["notes"]), data["notes"]
    ratio = points["recompute"]["flops"] / points["save"]["flops"]
    assert 1.05 < ratio < 1.6, ratio  # one more forward pass of the blocks, never below 1


def _dynamic_loop_builder(plan: rc.Plan | None) -> rc.measurement.MeasureTarget:
    """Three tagged layers; the step scales its update by a factor found in a loop whose trip
    count is an argument of the step (a while loop, not differentiated)."""
    from remat_common.adapter import call_module

    paths = ["layers", "layers.0", "layers.1", "layers.2"]
    compiled = None if plan is None else rc.compile_plan(rc.resolve(plan, paths))
    ws = [jnp.full((64, 64), 0.01 * (i + 1)) for i in range(3)]
    x, n = jnp.ones((32, 64)), jnp.int32(2)

    def layer(w: jax.Array, h: jax.Array) -> jax.Array:
        return h + jnp.tanh(rc.checkpoint_name(h @ w, "hidden"))

    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for i, w in enumerate(ws):
            x = layer(w, x) if compiled is None else call_module(
                compiled, f"layers.{i}", lambda h, w=w: layer(w, h), x)
        return jnp.sum(x * x)

    def step(ws: list[jax.Array], x: jax.Array, n: jax.Array) -> tuple[Any, jax.Array]:
        v, g = jax.value_and_grad(loss)(ws, x)
        lr = jax.lax.fori_loop(0, n, lambda i, a: a * jnp.tanh(g[0] @ g[0]), g[0])  # DYNAMIC
        return [w - 1e-3 * jnp.mean(lr) * d for w, d in zip(ws, g)], v

    return rc.measurement.MeasureTarget(loss, (ws, x), step, (ws, x, n), compiled)


def _line_of(marker: str) -> str:
    """``test_flops.py:N``, the line of this file that ends with ``marker``."""
    lines = __import__("pathlib").Path(__file__).read_text().splitlines()
    (n,) = [i for i, line in enumerate(lines, 1) if line.endswith(marker)]
    return f"test_flops.py:{n}"


def test_tune_ranks_by_the_countable_part_with_a_warning():
    """A step with a loop whose trip count is an argument (XLA cannot know it): the search still
    ranks its plans, by the FLOPs it can count (that loop's body once), and says so, naming the
    loop's op and source line in a note it does not cut."""
    events: list[Any] = []
    result = rc.tune(_dynamic_loop_builder, "1TiB", choices=["recompute"], max_compiles=2,
                     stop_when_save_fits=False, progress=events.append)
    assert {p.name for p in result.points} == {"save", "recompute"}
    assert [e.name for e in events if e.stage == "compile"] == ["save", "recompute"]
    (note,) = [n for n in result.notes if n.startswith("warning:")]
    assert "2 plan(s) (save, recompute)" in note and "ranked by it" in note
    assert f"/while) at " in note and _line_of("# DYNAMIC") in note  # the op and its line
    assert "..." not in note and note.endswith(")."), note  # the reason whole
    flops = {p.name: p.flops for p in result.points}
    if CSE_UNDOES_REMAT:  # jax 0.11.0: XLA:CPU merges the recomputation back (versions.py)
        assert flops["recompute"] == flops["save"] > 0
    else:
        assert flops["recompute"] > flops["save"] > 0


def test_tune_stops_before_its_first_compile_where_no_loop_can_be_costed(monkeypatch):
    """Where no loop body can be costed at all, no plan can be ranked, and the search says so
    before it compiles a plan, in a message it does not cut. That is the case with a jaxlib
    without the HLO parser and cost analysis the counter uses (``_jaxcompat.hlo_cost_functions``
    looks them up; jax 0.11.0 to 0.12 have them): simulated here by that lookup finding none."""
    from remat_common.internal import flops_countable

    monkeypatch.setattr("remat_common._tooling.measurement._flops._hlo_tools", lambda: None)
    flops_countable.cache_clear()  # the probe's answer for this jaxlib
    events: list[Any] = []
    try:
        with pytest.raises(rc.RematError, match="before compiling any plan") as err:
            rc.tune(_dynamic_loop_builder, "1TiB", choices=["recompute"], progress=events.append)
    finally:
        flops_countable.cache_clear()
    assert [e for e in events if e.stage == "compile"] == []
    msg = str(err.value)
    assert "offers no way to cost them per iteration" in msg and "/while) at " in msg
    assert "_runner.py:" in msg  # the probe's scan, named
    assert "..." not in msg and msg.endswith("which shows these FLOPs as unknown."), msg
    # the fix it gives: the report compares the plans by compiled peak, FLOPs unknown and why
    rep = rc.measurement.measure({"save": _dynamic_loop_builder(None)}, steps=0, placement=False)
    assert rep["save"].memory.device_total and rep["save"].flops is None
    assert "offers no way to cost them per iteration" in (rep["save"].flops_unknown or "")


# -- a remat plan below save-all's FLOPs ------------------------------------------------------------

def _elementwise_stack(plan: rc.Plan | None) -> rc.measurement.MeasureTarget:
    """An Equinox ``Stacked`` of 8 elementwise layers (a per-layer scale, then sin, exp, tanh; no
    matmul), scanned; a loss over it, and its SGD step."""

    class Layer(eqx.Module):
        w: jax.Array

        def __call__(self, h: jax.Array) -> jax.Array:
            a = jnp.sin(h * self.w)
            b = jnp.exp(-a * a)
            return h + jnp.tanh(b + a) * b

    class Model(eqx.Module):
        layers: er.Stacked

        def __call__(self, h: jax.Array) -> jax.Array:
            return self.layers(h)

    model = Model(er.Stacked(Layer(jnp.linspace(0.5, 1.5, 8 * 256).reshape(8, 256))))
    if plan is not None:
        model = er.annotate(model, plan)
    params, static = eqx.partition(model, eqx.is_array)
    h = jnp.linspace(-1.0, 1.0, 64 * 256).reshape(64, 256)

    def loss(params: Any, h: jax.Array) -> jax.Array:
        return jnp.sum(eqx.combine(params, static)(h) ** 2)

    def step(params: Any, h: jax.Array) -> Any:
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params, h))

    return rc.measurement.MeasureTarget(loss, (params, h), step, (params, h),
                                        None if plan is None else er.plan_of(model))


def test_a_remat_plan_below_save_all_flops_is_flagged_and_explained():
    """Recomputing a layer only adds work, yet a compiled step can count fewer FLOPs: XLA's
    fusion runs a producer again inside each consumer, and it does so more in the save-all
    step's scanned forward body (which hands its intermediates to the backward pass) than in the
    recomputing one (measured: recompute 0.97x save-all; with fusion off 1.17x). The report says
    so in the plan's notes, with the ratio; a plan at or above 1.0 gets no such note."""
    rep = rc.measurement.measure(
        {"none": _elementwise_stack(None),
         "recompute": _elementwise_stack(rc.Plan.from_mapping({"layers": "recompute"}))},
        steps=0, placement=False)
    ratio = rep["recompute"].flop_ratio
    assert ratio is not None and ratio < 1.0, ratio
    (note,) = [n for n in rep["recompute"].notes if "recomputation only adds work" in n]
    assert note.startswith(f"FLOP ratio {ratio:.3f} to 'none', which recomputes nothing, although "
                           "this plan recomputes (layers.0, layers.1, layers.2 and 5 more)")
    assert "XLA fuses" in note and note.endswith("rather than these FLOPs.")
    assert not any("only adds work" in n for n in rep["none"].notes)
    unfused = {name: rc.measurement.count_flops(
        jax.jit(t.step_fn).lower(*t.step_args).compile(UNFUSED)).flops
        for name, t in (("none", _elementwise_stack(None)),
                        ("recompute", _elementwise_stack(rc.Plan.from_mapping({"layers": "recompute"}))))}
    assert unfused["recompute"] > 1.1 * unfused["none"]  # the plan's own work: one more forward


def test_tune_warns_of_a_plan_below_save_all_flops():
    """The same stack searched: the recomputing plan's ratio below 1.0 is a warning of the
    result, naming the plan and its ratio (the search ranks by these FLOPs)."""
    result = rc.tune(_elementwise_stack, "1TiB", choices=["recompute"], max_compiles=2,
                     stop_when_save_fits=False)
    ratio = result["recompute"].flops / result["save"].flops
    assert ratio < 1.0, ratio
    (warning,) = [w for w in result.warnings if "fewer FLOPs than save-all" in w]
    assert warning.startswith(f"plan recompute ({ratio:.3f}x) compiled to fewer FLOPs")
    assert warning.endswith("before trusting the order.")


def test_below_a_save_all_xla_rematerialized_blames_the_baseline() -> None:
    """Where the target compiler rematerialized save-all on its own (Llama-3-8B on h100x8), a
    plan below its FLOPs says so: the baseline recomputes, not fusion (the warning blamed it)."""
    from remat_common.internal import below_save_all

    def point(name: str, plan: dict | None, flops: float, changed: str | None = None):
        return rc.measurement.TunePoint(name, plan, None, 1, False, 0, 0, flops, flops,
                                        xla_remat=changed)

    save = point("save", {"blocks.*": "save"}, 100.0, "Can't reduce memory use below ...")
    plans = [save, point("recompute", {"blocks.*": "recompute"}, 90.0),
             point("dots", {"blocks.*": "dots"}, 120.0)]
    (warning,) = below_save_all(plans, save)
    assert warning.startswith("plan recompute (0.900x) compiled to fewer FLOPs than save-all: as "
                              "written save-all exceeds the device memory"), warning
    assert "XLA fuses" not in warning
    (fused,) = below_save_all(plans, dataclasses.replace(save, xla_remat=None))
    assert "XLA fuses" in fused
