"""The failures remat and offload users report, rebuilt (issue 50, item 3): each test sets up the
situation here, on the CPU where it can, and asserts what the project does about it (a warning,
an error, or gradients equal to the model's without remat). Where only a TPU (or a GPU) shows the
failure, a ``device`` or ``target`` test says whether this JAX still has it, so that a release
that fixes it is noticed (docs/jax_behaviour.md "Host offload").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from fixtures.tolerance import assert_close
from remat_common import internal

D = 4
_k = jax.random.split(jax.random.key(4), 3)
W = [jax.random.normal(_k[0], (D, D)), jax.random.normal(_k[1], (D, D))]
XS = jax.random.normal(_k[2], (3, D))


def _block(w: jax.Array, x: jax.Array) -> jax.Array:
    return x + jnp.sin(rc.checkpoint_name(x @ w, "h"))


def _layers(blk: Callable, ws: list, x: jax.Array) -> jax.Array:
    for w in ws:
        x = blk(w, x)
    return x


def _scan(blk: Callable, ws: list, x: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda h, _: (_layers(blk, ws, h), None), x, None, length=2)[0]


def _sq(y: jax.Array) -> jax.Array:
    return jnp.sum(y ** 2)


def _summed(g: list) -> list:
    return jax.tree.map(lambda a: a.sum(0), g)


#: How the gradient is taken -> whether a TPU v5e got it wrong with an offloaded name (jax 0.11.2,
#: libtpu 0.0.48.1, 2026-12-06: off by 40.6 each time; docs/device_check/eager-offload-vmap-scan-*).
#: A scan and a vmap in either order, differentiated with no jit around the differentiation.
EAGER = {
    "grad(vmap(scan))": (lambda b: jax.grad(lambda ws, xs: _sq(jax.vmap(lambda x: _scan(b, ws, x))(xs))), True),
    "vmap(grad(scan))": (lambda b: lambda ws, xs: _summed(jax.vmap(jax.grad(lambda ws, x: _sq(_scan(b, ws, x))), (None, 0))(ws, xs)), True),
    "grad(vmap(jit(scan)))": (lambda b: jax.grad(lambda ws, xs: _sq(jax.vmap(jax.jit(lambda x: _scan(b, ws, x)))(xs))), True),
    "grad(jit(vmap(scan)))": (lambda b: jax.grad(jax.jit(lambda ws, xs: _sq(jax.vmap(lambda x: _scan(b, ws, x))(xs)))), True),
    "grad(scan(vmap))": (lambda b: jax.grad(lambda ws, xs: _sq(_scan(jax.vmap(b, (None, 0)), ws, xs))), True),
    "jit(grad(vmap(scan)))": (lambda b: jax.jit(jax.grad(lambda ws, xs: _sq(jax.vmap(lambda x: _scan(b, ws, x))(xs)))), False),
    "jit(vmap(grad(scan)))": (lambda b: jax.jit(lambda ws, xs: _summed(jax.vmap(jax.grad(lambda ws, x: _sq(_scan(b, ws, x))), (None, 0))(ws, xs))), False),
    "grad(scan) without vmap": (lambda b: jax.grad(lambda ws, xs: _sq(_scan(b, ws, xs[0]))), False),
    "grad(vmap) without scan": (lambda b: jax.grad(lambda ws, xs: _sq(jax.vmap(lambda x: _layers(b, ws, x))(xs))), False),
}


@contextlib.contextmanager
def _platform(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[list[warnings.WarningMessage]]:
    """The hazard checks believe the program runs on ``name``; the warnings they give, recorded."""
    monkeypatch.setattr(internal.hazards, "platform", lambda: name)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def _of(seen: list[warnings.WarningMessage], kind: type[Warning]) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, kind)]


#: The cases every stage runs; the others run in the lock's stage only (``slow``): eager gradients
#: dispatch op by op, 1.5 s each here.
_EVERY_STAGE = ("grad(vmap(scan))", "jit(grad(vmap(scan)))")


@pytest.mark.compat
@pytest.mark.parametrize("case", [c if c in _EVERY_STAGE else pytest.param(c, marks=pytest.mark.slow)
                                  for c in EAGER])
def test_an_eager_offload_under_vmap_and_scan_warns_where_a_tpu_is_wrong(case, monkeypatch) -> None:
    make, wrong_on_a_tpu = EAGER[case]
    with _platform(monkeypatch, "tpu") as seen:
        got = make(rc.checkpoint(_block, {"offload": ["h"]}))(W, XS)
    said = _of(seen, rc.EagerOffloadWarning)
    assert bool(said) == wrong_on_a_tpu
    if said:
        assert "'h'" in said[0] and "jax.jit(jax.grad(loss))" in said[0]
    assert_close(got, jax.jit(make(_block))(W, XS))  # here, on the CPU, the gradient is right


@pytest.mark.compat
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_no_warning_where_the_eager_gradient_is_right(platform, monkeypatch) -> None:
    make, _ = EAGER["grad(vmap(scan))"]
    with _platform(monkeypatch, platform) as seen:
        make(rc.checkpoint(_block, {"offload": ["h"]}))(W, XS)
        make(rc.checkpoint(_block, {"save": ["h"]}))(W, XS)
    assert not _of(seen, rc.EagerOffloadWarning)


@pytest.mark.compat
def test_a_saved_name_does_not_warn_and_an_offloaded_one_warns_once(monkeypatch) -> None:
    make, _ = EAGER["grad(vmap(scan))"]
    with _platform(monkeypatch, "tpu") as seen:
        make(rc.checkpoint(_block, {"save": ["h"]}))(W, XS)  # a TPU computes it right
        assert not _of(seen, rc.EagerOffloadWarning)
        warnings.simplefilter("default")  # the process's default: once per message
        blk = rc.checkpoint(_block, {"offload": ["h"]})
        for _ in range(3):
            make(blk)(W, XS)
    assert len(_of(seen, rc.EagerOffloadWarning)) == 1


@pytest.mark.device
def test_on_a_tpu_the_eager_gradient_is_still_wrong() -> None:
    """Says when a JAX or libtpu release fixes it: then the warning (common/_hazards.py) can go."""
    if jax.default_backend() != "tpu":
        pytest.skip("the failure is XLA:TPU's")
    make, _ = EAGER["grad(vmap(scan))"]
    with pytest.warns(rc.EagerOffloadWarning):
        got = make(rc.checkpoint(_block, {"offload": ["h"]}))(W, XS)
    want = jax.jit(make(_block))(W, XS)
    off = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(got, want))
    assert off > 1e-2, ("fixed in this JAX: the eager gradient of vmap(scan(checkpoint)) with an "
                        "offloaded name is right on a TPU; remove EagerOffloadWarning")


# -- float64 residuals on a TPU ----------------------------------------------------------------------

def _f64(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.sin(rc.checkpoint_name(jnp.sin(x @ w), "h")) ** 2)


@pytest.mark.compat
@pytest.mark.parametrize("annotation,warns", [
    ({"save": ["h"]}, True), pytest.param({"offload": ["h"]}, True, marks=pytest.mark.slow),
    pytest.param("offload", True, marks=pytest.mark.slow), ("recompute", False)])
def test_a_float64_value_kept_on_a_tpu_warns_before_the_compile(annotation, warns, monkeypatch) -> None:
    with jax.enable_x64(True):
        w = jnp.full((D, D), 0.1, jnp.float64)
        with _platform(monkeypatch, "tpu") as seen:
            g = jax.grad(rc.checkpoint(_f64, annotation, offload_argnums=1
                                       if annotation == "offload" else None))(w, w)
        assert g.dtype == jnp.float64
        assert_close(g, jax.grad(_f64)(w, w))
        with _platform(monkeypatch, "cpu") as on_cpu:  # the CPU compiles it: no warning
            jax.grad(rc.checkpoint(_f64, annotation))(w + 1, w)
    said = _of(seen, rc.Float64ResidualWarning)
    assert bool(said) == warns and not _of(on_cpu, rc.Float64ResidualWarning)
    if said:
        assert "float64" in said[0] and "'recompute'" in said[0]
    with _platform(monkeypatch, "tpu") as f32:  # float32: nothing to say
        jax.grad(rc.checkpoint(_f64, {"save": ["h"]}))(W[0], W[1])
    assert not _of(f32, rc.Float64ResidualWarning)


def _x64_refused(compile_: Callable[[Callable, tuple], object]) -> str | None:
    """XLA:TPU's error for a saved float64 residual (plain JAX), or None when it compiles."""
    policy = jax.checkpoint_policies.save_only_these_names("h")

    def f(w: jax.Array) -> jax.Array:
        h = jax.ad_checkpoint.checkpoint_name(jnp.sin(w @ w), "h")
        return jnp.sum(jnp.sin(h) ** 2)

    with jax.enable_x64(True):
        try:
            compile_(jax.grad(jax.checkpoint(f, policy=policy)), (jnp.ones((D, D), jnp.float64),))
        except Exception as e:  # noqa: BLE001 - the compiler's error is the finding
            return str(e)
    return None


@pytest.mark.target
def test_xla_tpu_still_cannot_compile_a_saved_float64_residual() -> None:
    """Deviceless, for a v5e chip (./scripts/test's target stage). When this fails, libtpu compiles
    it: Float64ResidualWarning can go."""
    from remat_common.measurement import compile_for, compiler_available

    if compiler_available("tpu") is not None:
        pytest.skip(str(compiler_available("tpu")))

    def compile_(fn: Callable, args: tuple) -> None:
        tc = compile_for(fn, args, "v5e:1x1", batch=[False])
        if tc.error is not None:
            raise RuntimeError(tc.error)

    said = _x64_refused(compile_)
    assert said is not None, "fixed in this libtpu: float64 residuals compile"
    assert "not contain X{64|128} element types" in said


@pytest.mark.device
def test_on_a_tpu_a_saved_float64_residual_still_does_not_compile() -> None:
    if jax.default_backend() != "tpu":
        pytest.skip("the failure is XLA:TPU's")
    said = _x64_refused(lambda fn, args: jax.jit(fn).lower(*args).compile())
    assert said is not None, "fixed in this libtpu: float64 residuals compile"
    assert "not contain X{64|128} element types" in said


# -- openxla/xla#46231: offloaded scan residuals read back in the wrong order (XLA:GPU) -------------

@pytest.mark.compat
def test_offloaded_scan_residuals_keep_their_gradients() -> None:
    """openxla/xla#46231 (fixed by #46308; jaxlib 0.11.0 reproduces it on a V100): XLA:GPU's
    dynamic-slice analysis read residuals that a scan offloads with the forward walk's offsets in
    the backward pass (``n-1-i`` taken for ``i``): silently wrong gradients. The project cannot see
    XLA:GPU's passes; the check is ``remat verify --parity`` on the GPU. Here: the same program
    (a scan whose carry's name is offloaded) keeps the gradients, and exported for a GPU it moves
    the residuals to host and back, as the bug needs."""
    from remat_common.measurement import export_placements

    blk = rc.checkpoint(_block, {"offload": ["h"]})
    loss = lambda ws, x: _sq(_scan(blk, ws, x))  # noqa: E731
    assert_close(jax.jit(jax.grad(loss))(W, XS), jax.jit(jax.grad(lambda ws, x: _sq(_scan(_block, ws, x))))(W, XS))
    kinds = {p.kind for p in export_placements(jax.grad(loss), W, XS)}
    assert kinds == {"pinned_host", "device"}


# -- jax-ml/jax#35900: gradients of pinned_host parameters break clip_by_global_norm --------------

@pytest.mark.compat
def test_gradients_of_parameters_kept_on_host() -> None:
    """jax-ml/jax#35900: a gradient taken with respect to a parameter in ``pinned_host`` memory
    carries that memory space, and ``optax.clip_by_global_norm`` (a sum over every gradient) then
    mixes host and device values: ValueError. Reproduced here with jax 0.11.2. The project's
    steps differentiate the parameters after :func:`remat_common.state.fetch` brings them to the
    device (a plan's ``state: {params: host}``): device gradients, clipped as on device."""
    optax = pytest.importorskip("optax")
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    params = {"w": jax.device_put(W[0], host), "b": jnp.ones(D)}
    x = XS

    def loss(p: dict, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(x @ p["w"] + p["b"]))

    def clipped(g: dict) -> dict:
        return optax.clip_by_global_norm(0.1).update(g, optax.EmptyState())[0]

    def plain(p: dict, x: jax.Array) -> dict:  # differentiated with respect to the host array
        return clipped(jax.grad(lambda p, x: loss(rc.state.fetch(p), x))(p, x))

    def project(p: dict, x: jax.Array) -> dict:  # the examples' steps: fetch, then differentiate
        return clipped(jax.grad(loss)(rc.state.fetch(p), x))

    with pytest.raises(ValueError, match="memory_space"):  # when this fails, JAX fixed #35900
        jax.jit(plain)(params, x)
    got = jax.jit(project)(params, x)
    assert all(a.sharding.memory_kind == "device" for a in jax.tree.leaves(got))
    assert_close(got, jax.jit(lambda p, x: clipped(jax.grad(loss)(p, x)))(
        {"w": W[0], "b": jnp.ones(D)}, x))


# -- AI-Hypercomputer/maxtext#971: dots_no_batch under a pipeline's vmap over stages ---------------

@pytest.mark.compat
def test_matmuls_under_a_vmap_over_stages_have_a_batch_dimension() -> None:
    """AI-Hypercomputer/maxtext#971: MaxText's pipeline vmaps its layers over stages, weights
    included, so every matmul has a batch dimension (the stage) and
    ``checkpoint_dots_with_no_batch_dims`` saved nothing. The same here: ``dots_no_batch`` keeps
    the matmul outputs of one stage and none of a stage-vmapped layer (``offload_dots_no_batch``
    moves none to host), gradients unchanged; names are kept either way, which is MaxText's fix
    and this project's advice (docs/semantics.md)."""
    ws = jnp.stack([W[0], W[1], W[0]]) * 0.5
    xs = jnp.stack([XS, XS, XS])

    def two(w: jax.Array, x: jax.Array) -> jax.Array:
        return _block(w, _block(w, x))

    def kept(annotation: object, stages: bool) -> tuple[list, list[str]]:
        layer = rc.checkpoint(two, annotation)
        run = jax.vmap(layer) if stages else lambda w, x: layer(w[0], x[0])
        plain = jax.vmap(two) if stages else lambda w, x: two(w[0], x[0])
        report = rc.saved_residuals(lambda w, x: _sq(run(w, x)), ws, xs)
        assert_close(jax.grad(lambda w: _sq(run(w, xs)))(ws), jax.grad(lambda w: _sq(plain(w, xs)))(ws))
        return ([r for r in report.residuals if "dot_general" in r.source],
                sorted(report.names("device") | report.names("host")))

    assert kept("dots_no_batch", stages=False)[0]
    assert not kept("dots_no_batch", stages=True)[0]
    assert not [r for r in kept("offload_dots_no_batch", stages=True)[0] if r.placement == "host"]
    assert kept({"save": ["h"]}, stages=True)[1] == ["h"]
