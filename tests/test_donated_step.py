"""The step measured is the step a training loop runs: state donated, outputs fed back.

``measure`` (and so ``remat report`` and ``remat tune``) compiles every step with its state donated
(``common/_tooling/measurement/_step.py``), on this machine as for a target: its memory figures
are those of ``jax.jit(step, donate_argnums=0)``, written by hand as the examples' training loop
writes it, and its timing steps feed each step's updated state into the next, so donation holds
there too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_common import Plan
from remat_common.measurement import MeasureTarget, MemoryFigures, measure

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples.eqx_gpt import model as eqx_model  # noqa: E402
from examples.nnx_gpt import model as nnx_model  # noqa: E402

SIZE = dict(vocab=64, d_model=32, n_layers=2, n_heads=2, seq_len=16)
PLANS = {"none": None, "recompute": {"blocks.*": "recompute"}}


@pytest.mark.tooling  # remat report's figures: the jax 0.11.2 stage only
@pytest.mark.parametrize("model", [nnx_model, eqx_model], ids=["nnx_gpt", "eqx_gpt"])
def test_measured_memory_is_the_donated_training_steps(model, standard_promotion: None) -> None:
    """Each plan's figures equal the hand-written ``jax.jit(step, donate_argnums=0)`` compile's,
    field for field, and differ from the undonated compile's (the state is aliased)."""
    rep = measure(lambda p: model.measure_target(p, batch=2, **SIZE), PLANS, steps=0)
    for name, plan in PLANS.items():
        t = model.measure_target(None if plan is None else Plan.coerce(plan), batch=2, **SIZE)
        state, tokens = t.step_args
        donated = MemoryFigures.from_compiled(
            jax.jit(t.step_fn, donate_argnums=0).lower(state, tokens).compile())
        kept = MemoryFigures.from_compiled(jax.jit(t.step_fn).lower(state, tokens).compile())
        got = rep[name].memory
        for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                      "alias_size_in_bytes"):
            assert getattr(got, field) == getattr(donated, field), (name, field)
        # the state's buffers as the device holds them (a TPU pads each array to its tiles)
        state_bytes = sum(x.on_device_size_in_bytes() for x in jax.tree_util.tree_leaves(state))
        assert got.alias_size_in_bytes == state_bytes > 0
        assert kept.alias_size_in_bytes == 0


def _target() -> MeasureTarget:
    """``w <- w + 1`` with a moment buffer and a typed key carried along, and a batch."""
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    def step(state, x):
        w, m, key = state
        key, sub = jax.random.split(key)
        g = jax.grad(loss)(w, x)
        return (w + 1.0, m + g + 0.0 * jax.random.normal(sub, m.shape), key), loss(w, x)

    w, x = jnp.zeros((8, 8)), jnp.ones((4, 8))
    state = (w, jnp.zeros_like(w), jax.random.key(0))
    return MeasureTarget(loss, (w, x), step, (state, x))


def test_timed_steps_feed_the_state_back_and_leave_the_callers_arrays() -> None:
    from remat_common.internal import FedSteps, lower_step

    t = _target()
    (w, m, key), x = t.step_args
    rep = measure(t, steps=3, warmup=1)
    assert len(rep["step"].timing.steps) == 3
    for a in (w, m, key, x):  # measure ran on copies: the caller's state is intact
        assert not a.is_deleted()
    # run by hand: four steps, each on the state the previous one returned
    from remat_common.internal import jittable

    fn, args = jittable(t.step_fn, t.step_args)
    lowered = lower_step(fn, args, state=(0, 1, 2))
    assert lowered.donated == (0, 1, 2)  # w, m and the key: the batch is not donated
    run = FedSteps("step", lowered.compile(), args, lowered.donated)
    for _ in range(4):
        run.run()
    assert run.args is not None
    np.testing.assert_array_equal(np.asarray(run.args[0]), np.full((8, 8), 4.0, np.float32))
    assert run.args[3] is not None and not run.args[3].is_deleted()  # the batch, placed once
    run.release()
    assert run.args is None and not w.is_deleted()


def test_a_mesh_of_one_device_times_its_steps() -> None:
    """``--mesh data=1`` on a device: the donated step runs for every timed step (it ended in
    "Array has been deleted" when the timing loop reused donated buffers)."""
    t = _target()
    rep = measure(t, steps=2, warmup=1, mesh="data=1")
    assert len(rep["step"].timing.steps) == 2 and rep["step"].timing.median_s > 0
    (w, m, key), _ = t.step_args  # w, m, the key's data, as the device holds them (padded on a TPU)
    held = sum(a.on_device_size_in_bytes() for a in (w, m, jax.random.key_data(key)))
    assert rep["step"].memory.alias_size_in_bytes == held
    assert jax.default_backend() != "cpu" or held == 2 * 8 * 8 * 4 + 8


def test_only_inputs_an_output_takes_are_donated() -> None:
    """A state input the step does not return is not donated (JAX would warn that it was not
    usable, and the suite's warnings are errors)."""
    from remat_common.internal import lower_step

    def step(w, frozen, x):
        return w - 0.1 * (frozen * x).sum(), jnp.sum(x)

    args = (jnp.ones((3,)), jnp.ones((5,)), jnp.ones((5,)))
    lowered = lower_step(step, args, state=(0, 1))
    assert lowered.donated == (0,)
    mem = MemoryFigures.from_compiled(lowered.compile())
    assert mem.alias_size_in_bytes == args[0].on_device_size_in_bytes()  # 3 * 4 on a CPU


def test_a_measured_plan_parks_its_state_on_host() -> None:
    """On an accelerator every plan's state is moved to host once the plan is measured, so that
    the device holds one plan's state at a time while the steps run (a v5e chip ran out of
    memory with five plans' states of the example GPT held at once). Parked, no reference to the
    device arrays is left anywhere (jax.jit's wrapper of the step had kept one)."""
    import gc
    import weakref

    from remat_common.internal import measure_parked

    t = _target()
    state, x = t.step_args
    originals = [weakref.ref(a) for a in state]
    shapes = [(a.shape, a.dtype) for a in (*state, x)]
    del state
    c = measure_parked(t)
    del t
    gc.collect()
    assert [r() for r in originals] == [None] * len(originals)
    assert [(a.shape, a.dtype) for a in c.args] == shapes
    assert all(a.devices() == {jax.devices("cpu")[0]} for a in c.args)
    assert c.target.step_args == () and isinstance(c.target.loss_args[0], jax.ShapeDtypeStruct)
