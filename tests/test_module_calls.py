"""A measurement's module scopes (scoped_module_calls): every module call a trace makes
is traced in a named scope of its path, without changing a class, the program, or the names it
tags, and without leaving a scope open when a call raises."""

from __future__ import annotations

from typing import Any

import jax
import pytest

pytest.importorskip("flax")

from flax import nnx  # noqa: E402

from remat_common.internal import jittable, scoped_module_calls  # noqa: E402

SIZE = {"batch": 8, "d_model": 8, "n_layers": 3}


def _lowered(target: Any, scoped: bool) -> Any:
    fn, args = jittable(target.step_fn, target.step_args)
    if not scoped:
        return jax.jit(fn).lower(*args), None
    with scoped_module_calls() as calls:
        return jax.jit(fn).lower(*args), calls


def test_scopes_change_only_the_metadata(standard_promotion: None) -> None:
    """The un-annotated model, traced with and without the scopes: the same program; with them,
    every module's path (the root's own code as <root>) in the op names, every class as it was."""
    from fixtures import fat_mlp

    target = fat_mlp.measure_target(None, **SIZE)
    plain, _ = _lowered(target, scoped=False)
    scoped, calls = _lowered(target, scoped=True)
    assert scoped.as_text() == plain.as_text()  # without debug info: the program
    paths = {"", "head", *(f"layers.{i}{s}" for i in range(SIZE["n_layers"])
                           for s in ("", ".up", ".down"))}
    assert calls.scoped == paths
    text = scoped.as_text(debug_info=True)
    assert "layers.2/layers.2.up" in text and "<root>" in text
    assert "layers.2" not in plain.as_text(debug_info=True)
    model = fat_mlp.FatMLP(4, 2, rngs=nnx.Rngs(0))
    assert type(model.layers[0]) is fat_mlp.Layer  # nothing was swapped


def test_a_call_that_raises_leaves_no_scope_open(standard_promotion: None) -> None:
    """A module call that raises inside the block (caught by the caller): its scope is closed
    with it, and the trace goes on at the right depth."""
    from jax._src import source_info_util

    class Fails(nnx.Module):
        def __call__(self, x: jax.Array) -> jax.Array:
            raise ValueError("no")

    class Model(nnx.Module):
        def __init__(self) -> None:
            self.bad = Fails()
            self.lin = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

        def __call__(self, x: jax.Array) -> jax.Array:
            try:
                self.bad(x)
            except ValueError:
                pass
            return self.lin(x)

    model = Model()
    with scoped_module_calls() as calls:
        text = jax.jit(lambda x: model(x)).lower(jax.numpy.ones((1, 2))).as_text(debug_info=True)
        assert str(source_info_util.current_name_stack()) == ""
    assert calls.scoped == {"", "bad", "lin"}
    assert "<root>/lin" in text and "bad/lin" not in text
