"""Rule sets inside both adapters' models: Flax NNX (``flax_remat_plugin``) and Equinox
(``equinox_remat_plugin``), with a Python list of blocks and with stacked blocks run by
``scan_layers``. Each block's norm, attention and gated MLP declare ``__remat_custom__`` through the
core's rule sets; a plan switches them on per path with ``"custom"``.

Gradients equal the un-annotated model's; every rule's forward rule ran on the expected path and
saw what the plan says; the attention scores are never a residual.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")
import equinox_remat_plugin as erp  # noqa: E402
import flax_remat_plugin as frp  # noqa: E402
from fixtures.tolerance import assert_close

L, B, T, D, H, F = 2, 1, 12, 8, 2, 16
HAS_CUSTOM_REMAT = hasattr(jax, "custom_remat")
NORM, ATTN, MLP = rc.rules.rms_norm_rules(), rc.rules.attention_rules(causal=True), rc.rules.gated_mlp_rules()
CUSTOM = {"layers.*.norm": "custom", "layers.*.attn": "custom", "layers.*.mlp": "custom"}
OUTER = {"layers.*": {"save": ["attn/attn_lse", "mlp/mlp_gate"]}, "layers.*.attn": "custom",
         "layers.*.mlp": "custom"}
PLANS = {"custom": CUSTOM, "outer-names": OUTER}
WHERE = {  # per plan: rule -> residual -> location
    "custom": {"rms_norm": {"norm_inv": "device"},
               "attention": {"attn_out": "device", "attn_lse": "device"},
               "gated_mlp[silu]": {"mlp_gate": "device", "mlp_up": "device"}},
    "outer-names": {"attention": {"attn_out": "recompute", "attn_lse": "device"},
                    "gated_mlp[silu]": {"mlp_gate": "device", "mlp_up": "recompute"}},
}


def _heads(x: jax.Array) -> jax.Array:
    return x.reshape(*x.shape[:-1], H, D // H)


# -- Flax NNX ----------------------------------------------------------------------------------------

class NNXNorm(nnx.Module):
    def __init__(self) -> None:
        self.scale = nnx.Param(jnp.linspace(0.5, 1.5, D))

    def __call__(self, x: jax.Array) -> jax.Array:
        return rc.rules.rms_norm(x, self.scale[...])

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        return NORM(x, self.scale[...])


class NNXAttention(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.q, self.k, self.v, self.o = (nnx.Linear(D, D, use_bias=False, rngs=rngs) for _ in range(4))

    def _qkv(self, x: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(_heads(m(x)) for m in (self.q, self.k, self.v))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.o(rc.rules.attention(*self._qkv(x), causal=True).reshape(x.shape))

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        return self.o(ATTN(*self._qkv(x)).reshape(x.shape))


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.gate, self.up = (nnx.Linear(D, F, use_bias=False, rngs=rngs) for _ in range(2))
        self.down = nnx.Linear(F, D, use_bias=False, rngs=rngs)

    def _w(self) -> tuple[jax.Array, ...]:
        return self.gate.kernel[...], self.up.kernel[...], self.down.kernel[...]

    def __call__(self, x: jax.Array) -> jax.Array:
        return rc.rules.gated_mlp(x, *self._w())

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        return MLP(x, *self._w())


class NNXBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm, self.attn, self.mlp = NNXNorm(), NNXAttention(rngs), NNXMLP(rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class NNXNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([NNXBlock(rngs) for _ in range(L)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


class NNXScanned(nnx.Module):
    __remat_stacks__ = ("layers",)

    def __init__(self, rngs: nnx.Rngs) -> None:
        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> NNXBlock:
            return NNXBlock(rngs)

        self.layers = create(rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return frp.scan_layers(self.layers, x)


def _nnx_grads(model: Any, x: jax.Array) -> Any:
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params: Any) -> jax.Array:
        return jnp.sum(jnp.tanh(nnx.merge(graphdef, params, rest, copy=True)(x)) ** 2)
    return loss, params


# -- Equinox -----------------------------------------------------------------------------------------

class EqxNorm(eqx.Module):
    scale: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return rc.rules.rms_norm(x, self.scale)

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        return NORM(x, self.scale)


class EqxAttention(eqx.Module):
    w: jax.Array  # [4, D, D]: q, k, v, out

    def _qkv(self, x: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(_heads(x @ self.w[i]) for i in range(3))

    def __call__(self, x: jax.Array) -> jax.Array:
        return rc.rules.attention(*self._qkv(x), causal=True).reshape(x.shape) @ self.w[3]

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        return ATTN(*self._qkv(x)).reshape(x.shape) @ self.w[3]


class EqxMLP(eqx.Module):
    gate: jax.Array
    up: jax.Array
    down: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return rc.rules.gated_mlp(x, self.gate, self.up, self.down)

    def __remat_custom__(self, x: jax.Array) -> jax.Array:
        return MLP(x, self.gate, self.up, self.down)


class EqxBlock(eqx.Module):
    norm: EqxNorm
    attn: EqxAttention
    mlp: EqxMLP

    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.norm = EqxNorm(jnp.linspace(0.5, 1.5, D))
        self.attn = EqxAttention(jax.random.normal(k1, (4, D, D)) / D ** 0.5)
        self.mlp = EqxMLP(jax.random.normal(k2, (D, F)) / D ** 0.5,
                          jax.random.normal(k3, (D, F)) / D ** 0.5,
                          jax.random.normal(k4, (F, D)) / F ** 0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class EqxNet(eqx.Module):
    layers: Any  # a list of blocks, or an erp.Stacked

    def __call__(self, x: jax.Array) -> jax.Array:
        if isinstance(self.layers, erp.Stacked):
            return self.layers(x)
        for layer in self.layers:
            x = layer(x)
        return x


def _eqx_model(stacked: bool) -> EqxNet:
    keys = jax.random.split(jax.random.key(0), L)
    if stacked:
        return EqxNet(erp.Stacked.from_keys(EqxBlock, keys))
    return EqxNet([EqxBlock(k) for k in keys])


# -- the tests ---------------------------------------------------------------------------------------

def _build(adapter: str, structure: str, plan: Any) -> tuple[Any, Any]:
    """(loss, params) of the model, annotated with ``plan`` when it is not None."""
    if adapter == "nnx":
        model = (NNXNet if structure == "list" else NNXScanned)(nnx.Rngs(0))
        if plan is not None:
            frp.annotate(model, plan)
        return _nnx_grads(model, X)
    model = _eqx_model(structure == "stacked")
    if plan is not None:
        model = erp.annotate(model, plan)
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params: Any) -> jax.Array:
        return jnp.sum(jnp.tanh(eqx.combine(params, static)(X)) ** 2)
    return loss, params


X = jax.random.normal(jax.random.key(7), (B, T, D), jnp.float32)
_BASELINE: dict[tuple[str, str], Any] = {}


def _baseline(adapter: str, structure: str) -> Any:
    if (adapter, structure) not in _BASELINE:
        loss, params = _build(adapter, structure, None)
        _BASELINE[adapter, structure] = jax.jit(jax.grad(loss))(params)
    return _BASELINE[adapter, structure]


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(tree)]  # annotation adds no array leaves


# (adapter, structure, plan, remat3): each adapter and structure under each plan, both flags
# covered across the table (each case traces a whole model: the table is kept short).
CASES = [
    ("nnx", "list", "custom", True), ("nnx", "stacked", "custom", True),
    ("eqx", "list", "outer-names", True), ("eqx", "stacked", "custom", True),
    ("nnx", "list", "outer-names", False), ("nnx", "stacked", "outer-names", False),
    ("eqx", "list", "custom", False), ("eqx", "stacked", "outer-names", False),
]


@pytest.mark.parametrize(("adapter", "structure", "plan", "remat3"), CASES, indirect=["remat3"],
                         ids=[f"{a}-{s}-{p}-remat3-{'on' if r else 'off'}" for a, s, p, r in CASES])
def test_rules_in_adapter_models(adapter: str, structure: str, plan: str, remat3: bool) -> None:
    if plan == "outer-names" and remat3 and not HAS_CUSTOM_REMAT:
        pytest.skip("0.12 with remat3 on cannot keep a custom_vjp's residuals inside a boundary "
                    "(a clear CapabilityError, tested in test_custom_plan.py)")
    loss, params = _build(adapter, structure, PLANS[plan])
    with rc.rules.collect_rule_runs() as runs:
        grads = jax.jit(jax.grad(loss))(params)
        report = rc.saved_residuals(loss, params)
    for got, want in zip(_leaves(grads), _leaves(_baseline(adapter, structure)), strict=True):
        # float32 through two blocks: round-off only (fixtures/tolerance.py)
        assert_close(got, want)
    assert not any(r.shape[-3:] == (H, T, T) for r in report.select())  # never the scores
    fwd = [r for r in runs if r.forward_ran]
    impl = "custom_remat" if remat3 and HAS_CUSTOM_REMAT else "custom_vjp"
    assert {r.impl for r in fwd} == {impl}
    # Every annotated module's rule ran, at its own path (a scan body runs as layer 0).
    layers = range(L) if structure == "list" else range(1)
    want_paths = {f"layers.{i}.{m}" for i in layers
                  for m in (("norm", "attn", "mlp") if plan == "custom" else ("attn", "mlp"))}
    assert {r.path for r in fwd} == want_paths
    for r in fwd:
        assert dict(r.ambient.locations) == dict(r.plan_locations) == WHERE[plan][r.rule]
