"""√n nested checkpointing of stacks (``{"remat": ..., "nested": k | "sqrt"}``), both adapters.

For L = 16 and 64 layers: the residuals AD keeps grow like √L (≤ 2√L layers' inputs, against
L for per-layer recompute), the gradient step costs at most full recompute plus one forward, and
gradients equal the un-annotated stack's; with jax_remat3 on too; bad values are refused.
"""

from __future__ import annotations

import functools
import math
import textwrap

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")

import remat_common as rc  # noqa: E402
from fixtures.nested_models import FRAMEWORKS, Figures, figures  # noqa: E402
from fixtures.tolerance import assert_close  # noqa: E402
from versions import SHOW_REMAT  # noqa: E402

D, BATCH = 16, 64
NESTED = {"layers": {"remat": "recompute", "nested": "sqrt"}}
RECOMPUTE = {"layers": "recompute"}


@functools.cache
def _figures(framework: str, num_layers: int, plan_key: str, flops: bool = True) -> Figures:
    plan = {"none": None, "recompute": RECOMPUTE, "nested": NESTED}[plan_key]
    return figures(framework, num_layers, plan, d=D, batch=BATCH, flops=flops,
                   compiler_options=SHOW_REMAT)  # jax 0.11.0: no CSE (versions.py)


@pytest.mark.parametrize("num_layers", [16, 64])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_nested_residuals_grow_like_sqrt_and_cost_one_forward(framework: str,
                                                              num_layers: int) -> None:
    base = _figures(framework, num_layers, "none", flops=False)
    rec = _figures(framework, num_layers, "recompute")
    nested = _figures(framework, num_layers, "nested")
    assert_close(nested.grads, base.grads)
    assert_close(rec.grads, base.grads)
    # Per-layer recompute keeps every layer's input: L carries (and the output).
    assert rec.residual_bytes >= num_layers * rec.carry_bytes
    # Nested keeps one input per block of √L layers (plus the output and the block offsets).
    bound = 2 * math.sqrt(num_layers) * rec.carry_bytes
    assert nested.residual_bytes <= bound, (nested.residual_bytes, bound)
    assert nested.residual_bytes >= math.sqrt(num_layers) * rec.carry_bytes
    # At most one more forward than full recompute: each block's forward runs again in the
    # backward pass, all but its last layer (whose output the block's backward does not need);
    # each layer's gradient is written into the stack's, not added (measured: +0.76 and +0.89
    # forwards at 16 and 64 layers, (k - 1) / k = 0.75 and 0.875).
    assert rec.flops is not None and nested.flops is not None and nested.forward_flops is not None
    limit = rec.flops + nested.forward_flops
    assert nested.flops <= limit, (nested.flops, rec.flops, nested.forward_flops)
    block = math.isqrt(num_layers)  # 16 and 64 layers: blocks of exactly √L
    recomputed = 0.95 * (1 - 1 / block) * nested.forward_flops
    assert nested.flops >= rec.flops + recomputed  # the recomputation is real


@pytest.mark.cpu_figures(
    "the temporaries of a small program: on a TPU v5e chip XLA:TPU kept them in "
    "on-chip memory (temp 0) and tile-padded the arrays; TPU figures are checked at "
    "real sizes by the target stage and scripts/device_check")
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_nested_residuals_scale_with_sqrt_depth(framework: str) -> None:
    small, big = _figures(framework, 16, "nested"), _figures(framework, 64, "nested")
    rec_small, rec_big = _figures(framework, 16, "recompute"), _figures(framework, 64, "recompute")
    assert rec_big.residual_bytes / rec_small.residual_bytes > 3.5  # 4x the layers: ~4x
    assert big.residual_bytes / small.residual_bytes < 2.5          # 4x the layers: ~2x
    # The compiled step's temporaries follow (at 64 layers, 64 x 16 activations).
    assert big.temp_bytes is not None and rec_big.temp_bytes is not None
    assert big.temp_bytes < rec_big.temp_bytes


@pytest.mark.usefixtures("remat3_on")
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_nested_under_remat3(framework: str) -> None:
    base = _figures(framework, 16, "none", flops=False)
    got = figures(framework, 16, NESTED, d=D, batch=BATCH, flops=False)
    assert_close(got.grads, base.grads)
    assert got.residual_bytes <= 2 * 4 * got.carry_bytes


@pytest.mark.parametrize(("framework", "plan"), [
    # 16 = a first block of 1 + 5 blocks of 3; layers keep their names inside the blocks.
    ("flax", {"layers": {"save": ["h"], "nested": 3}}),
    # Two layer groups (0-4 keep h, 5-15 recompute), each nested: 1 block + 2, 3 blocks + 2.
    ("equinox", [("layers", {"remat": "recompute", "nested": 3}), ("layers.[0-4]", {"save": ["h"]})]),
])
def test_nested_remainder_and_groups(framework: str, plan: object) -> None:
    base = _figures(framework, 16, "none", flops=False)
    got = figures(framework, 16, plan, d=D, batch=BATCH, flops=False)
    assert_close(got.grads, base.grads)
    # Only block inputs survive: 5 + 1 carries (or 1 + 1 + 3 + 1), the output, the offsets.
    assert 6 * got.carry_bytes <= got.residual_bytes <= 8 * got.carry_bytes


def test_block_sizes() -> None:
    block_size = rc.adapter.block_size
    assert [block_size("sqrt", n) for n in (1, 4, 10, 16, 64, 100)] == [1, 2, 3, 4, 8, 10]
    assert [block_size(3, n) for n in (2, 3, 16)] == [2, 3, 3]  # a group smaller than a block
    paths = ["layers"] + [f"layers.{i}" for i in range(16)]
    r = rc.resolve(rc.Plan.from_mapping({"layers": {"remat": "recompute", "nested": 3}}), paths,
                   stacks=["layers"])
    assert r.nested == (("layers", 3),) and r.nested_block("layers", 16) == 3
    assert r.describe().endswith("layers: nested scans, blocks of 3 layers, each block one "
                                 "boundary that keeps its input")
    assert {r.annotation(f"layers.{i}") for i in range(16)} == {rc.parse_annotation("recompute")}
    # A later rule on the stack without 'nested' wins: one plain scan again.
    later = rc.resolve(rc.Plan.from_rules([("layers", {"remat": "recompute", "nested": 3}),
                                           ("layers", "recompute")]), paths, stacks=["layers"])
    assert later.nested == () and later.nested_block("layers", 16) is None


@pytest.mark.parametrize(("value", "match"), [
    (1, r"nested: 1 .* at least 2"),
    (0, r"nested: 0 .*Fix: write nested: 4 or nested: sqrt"),
    (True, r"nested: True .*A boolean is not a size"),
    ("4", r"nested: '4' .*'4' is a string: write the number unquoted"),
    ("root", r"nested: 'root' .*'sqrt'"),
    (2.5, r"nested: 2.5 .*whole number"),
])
def test_bad_nested_values(value: object, match: str) -> None:
    with pytest.raises(rc.AnnotationError, match=rf"(?s)module 'layers': {match}"):
        rc.parse_annotation({"remat": "recompute", "nested": value}, path="layers")


_PATHS = ["", "layers"] + [f"layers.{i}{s}" for i in range(4) for s in ("", ".mlp")]


@pytest.mark.parametrize(("rules", "match"), [
    ([("layers.*", {"remat": "recompute", "nested": 2})],
     r"nested: 2 on 'layers.0', which is not a stack.*Fix: put the rule on the stack itself"),
    ([("layers", {"remat": "recompute", "nested": 8})],
     r"nested: 8 on stack 'layers' of 4 layers.*Fix: a block size from 2 to 4, or nested: sqrt"),
    ([("layers", {"remat": "offload", "nested": 2})],
     r"stack 'layers' is nested .*offloads the inputs of 'layers.0'.*Fix: drop 'nested'"),
    ([("layers", {"remat": "recompute", "nested": 2}), ("layers.*.mlp", {"offload": ["h"]})],
     r"boundary at 'layers.0' offloads.*Fix: keep those names with 'save'"),
    ([(".", {"save": ["layers.*.mlp/h"]}), ("layers", {"remat": "inherit", "nested": 2})],
     r"boundary at '<root>' keeps .*from inside it.*Fix: name them in the layers' own annotation"),
])
def test_nested_plans_refused(rules: list[tuple[str, object]], match: str) -> None:
    with pytest.raises(rc.PlanError, match=f"(?s){match}"):
        rc.resolve(rc.Plan.from_rules(rules), _PATHS, stacks=["layers"])


def test_nested_in_plan_files(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "plan.yaml"  # type: ignore[operator]
    path.write_text(textwrap.dedent("""\
        rules:
          layers: {remat: recompute, nested: sqrt}
          "layers.*.mlp": {save: [h]}
        """))
    plan = rc.Plan.load(path)
    assert plan.rules[0].annotation.nested == "sqrt"
    assert rc.Plan.from_config(plan.to_config()) == plan  # round trip keeps the key
    r = rc.resolve(plan, _PATHS, stacks=["layers"])
    assert r.nested == (("layers", "sqrt"),) and r.nested_block("layers", 4) == 2
    bad = tmp_path / "bad.yaml"  # type: ignore[operator]
    bad.write_text("rules:\n  layers: {remat: recompute, nested: yes}\n")
    with pytest.raises(rc.AnnotationError, match=r"(?s)module 'layers' \(.*bad.yaml:2\): .*A boolean is not a size"):
        rc.Plan.load(bad)


def test_toml_plan(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "plan.toml"  # type: ignore[operator]
    path.write_text('[rules]\nlayers = {remat = "recompute", nested = 2}\n')
    r = rc.resolve(rc.Plan.load(path), _PATHS, stacks=["layers"])
    assert r.nested == (("layers", 2),) and r.nested_block("layers", 4) == 2


def test_flax_stack_scanned_by_the_model_is_refused() -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    class Model(nnx.Module):
        __remat_stacks__ = ("layers",)

        def __init__(self) -> None:
            @nnx.split_rngs(splits=4)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create(rngs: nnx.Rngs) -> nnx.Linear:
                return nnx.Linear(D, D, rngs=rngs)

            self.layers = create(nnx.Rngs(0))

        def __call__(self, x: jax.Array) -> jax.Array:
            def body(c: jax.Array, layer: nnx.Linear) -> jax.Array:
                return layer(c)  # type: ignore[no-any-return]
            return nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(x, self.layers)  # type: ignore[no-any-return]

    model = frp.annotate(Model(), {"layers": {"remat": "recompute", "nested": 2}})
    with pytest.raises(rc.PlanError, match=r"(?s)module 'layers' is a stack of 4 layers called as "
                       r"a whole.*nested: 2.*Fix: run the stack with flax_remat_plugin.scan_layers"):
        model(jnp.ones((2, D)))


def test_equinox_stack_scanned_by_the_model_is_refused() -> None:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import equinox_remat_plugin as erp

    class Model(eqx.Module):
        layers: erp.Stacked[eqx.nn.Linear]

        def __call__(self, x: jax.Array) -> jax.Array:
            dynamic, static = eqx.partition(self.layers, eqx.is_array)

            def body(c: jax.Array, d: object) -> tuple[jax.Array, None]:
                return eqx.combine(d, static)(c), None
            return jax.lax.scan(body, x, dynamic)[0]

    keys = jax.random.split(jax.random.key(0), 4)
    model = erp.annotate(Model(erp.Stacked.from_keys(lambda k: eqx.nn.Linear(D, D, key=k), keys)),
                         {"layers": {"remat": "recompute", "nested": 2}})
    with pytest.raises(rc.PlanError, match=r"(?s)scans the stack at 'layers' itself.*nested: 2.*"
                       r"Fix: call the Stacked"):
        model(jnp.ones(D))
