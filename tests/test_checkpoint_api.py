"""The plain-JAX entry points: checkpoint, checkpoint_name, capabilities, the CLI."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close


def mlp(w, x):
    h = rc.checkpoint_name(x @ w, "h")
    return jnp.sum(jnp.tanh(rc.checkpoint_name(jnp.sin(h), "s")) @ w)


W = jnp.eye(8) * 0.3
X = jnp.arange(32.0, dtype=jnp.float32).reshape(4, 8) / 32


@pytest.mark.compat
@pytest.mark.parametrize("form", ["positional", "decorator", "decorator_annotation_first"])
def test_checkpoint_forms(form, remat3):
    if form == "positional":
        f = rc.checkpoint(mlp, {"save": ["h"]})
    elif form == "decorator":
        f = rc.checkpoint(annotation={"save": ["h"]})(mlp)
    else:
        f = rc.checkpoint({"save": ["h"]})(mlp)
    rep = rc.saved_residuals(f, W, X)
    assert rep.names("device") == {"h"}
    assert_close(jax.grad(f)(W, X), jax.grad(mlp)(W, X))


@pytest.mark.compat
def test_checkpoint_offload_moves_array_inputs_to_host(remat3):
    f = rc.checkpoint(mlp, "offload")
    with pytest.warns(rc.OffloadArgumentsWarning, match=r"every array argument \(0, 1\)(.|\n)*"
                      r"offload_argnums=\(1,\)"):  # both differentiated: the weights too (was silent)
        rep = rc.saved_residuals(f, W, X)
    assert len(rep.select(placement="host")) == 2  # both array inputs
    assert rep.nbytes("host") == W.nbytes + X.nbytes
    only_x = rc.saved_residuals(rc.checkpoint(mlp, "offload", offload_argnums=1), W, X)
    assert only_x.nbytes("host") == X.nbytes
    assert_close(jax.grad(f, argnums=1)(W, X), jax.grad(mlp, argnums=1)(W, X))


@pytest.mark.compat
def test_checkpoint_static_argnums_and_path():
    def scaled(w, x, k):
        return mlp(w, x) * k

    f = rc.checkpoint(scaled, {"save": ["h"]}, static_argnums=2, path="block")
    rep = rc.saved_residuals(lambda w, x: f(w, x, 3), W, X)
    assert rep.names("device") == {"block/h"}
    assert_close(jax.grad(lambda w: f(w, X, 3))(W), 3 * jax.grad(mlp)(W, X))


@pytest.mark.compat
def test_checkpoint_rejects_two_annotations_and_bad_values():
    with pytest.raises(TypeError, match="pass the annotation once"):
        rc.checkpoint("offload", "recompute")
    with pytest.raises(rc.AnnotationError, match="unknown remat annotation 'offlaod'"):
        rc.checkpoint(mlp, "offlaod")


@pytest.mark.compat
def test_checkpoint_name_qualifies_inside_module_scope():
    with rc.adapter.collect_tags() as tags:
        rc.checkpoint_name(jnp.ones(2), "a")
        with rc.adapter.module_scope("layers.3.attn"):
            assert rc.adapter.current_module_path() == "layers.3.attn"
            rc.checkpoint_name({"k": jnp.ones(2), "v": jnp.ones(3)}, "kv")
        with rc.adapter.layer_scope("layers", "layers.4"):
            with rc.adapter.module_scope("layers.attn"):
                rc.checkpoint_name(jnp.ones(2), "o")
    assert [t.name for t in tags] == ["a", "layers.3.attn/kv", "layers.3.attn/kv", "layers.4.attn/o"]
    assert rc.adapter.current_module_path() is None
    with pytest.raises(ValueError, match=r"name must be a non-empty string without '/'.*Fix"):
        rc.checkpoint_name(jnp.ones(2), "a/b")


@pytest.mark.compat
def test_capabilities_reads_flag_live(remat3):
    caps = rc.capabilities()
    assert caps.remat3 is remat3 and caps.jax == jax.__version__
    assert caps.backend == jax.default_backend() and "device" in caps.memory_kinds
    assert caps.custom_remat == hasattr(jax, "custom_remat")
    assert caps.policy_classes == hasattr(jax.checkpoint_policies, "SaveOnlyTheseNames")
    assert caps.custom_remat_usable == (caps.custom_remat and remat3)
    # XLA:CPU drops host placement (docs/jax_behaviour.md "Host offload"); a TPU keeps it
    placed = caps.backend != "cpu" and "pinned_host" in caps.memory_kinds
    assert caps.host_offload_placed is placed
    json.dumps(caps.to_json())
    assert jax.config.jax_remat3 is remat3  # probing never flips the flag


def test_cli_help_and_version():
    out = subprocess.run([sys.executable, "-m", "remat_common", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("usage: remat")
    ver = subprocess.run([sys.executable, "-m", "remat_common", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert ver.strip() == f"remat {rc.__version__}"
