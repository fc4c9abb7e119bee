"""Gradient parity on the backend at hand (issue 50, item 3): ``remat verify --parity`` and
``--fuzz``, :func:`remat_common.verify_parity` and :func:`remat_common.measurement.fuzz_plans`.

A wrong gradient must fail and name its plan and parameter; a plan the project or JAX refuses is
recorded, not failed; the tolerance is the suite's on the CPU and follows the backend's and the
compute dtype's precision elsewhere; the fuzz is seeded and exercises every feature in turn.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from fixtures import tolerance as suite
from remat_common.internal import main
from remat_common.measurement import MeasureTarget, fuzz_plans, parity_tolerance

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab=64, d_model=32, n_layers=2, n_heads=2, seq_len=16)


@pytest.mark.compat
def test_the_tolerance_follows_the_backend_and_the_compute_dtype() -> None:
    bf16, tf32 = float(jnp.finfo(jnp.bfloat16).eps), 2.0 ** -10
    cpu = parity_tolerance("float32", backend="cpu")
    assert (cpu.value, cpu.factor) == (suite.tolerance("float32"), 1)  # the suite's own rule
    highest = parity_tolerance("float32", backend="tpu", precision="highest")
    assert highest.value == suite.tolerance("float32") * suite.DEVICE_FACTOR
    tpu = parity_tolerance("float32", backend="tpu")  # default precision: bfloat16 passes
    assert (tpu.precision, tpu.value) == ("bfloat16", 8 * bf16) and "tpu" in str(tpu)
    assert parity_tolerance("float32", backend="gpu").value == 8 * tf32  # TF32
    for backend in ("cpu", "tpu"):
        t = parity_tolerance(jnp.bfloat16, backend=backend, precision="highest")
        assert (t.precision, t.value) == ("bfloat16", 8 * bf16)
    assert parity_tolerance("float64", backend="cpu").value == suite.tolerance("float64")


# -- a model in plain JAX: the plan's first rule is the layers' annotation -------------------------

@jax.custom_vjp
def _off_by_a_little(x: jax.Array) -> jax.Array:
    return x


_off_by_a_little.defvjp(lambda x: (x, None), lambda _, g: (g * 1.001,))


def _layer(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.tanh(rc.checkpoint_name(x @ w, "h"))


def build(plan: rc.Plan | None, *, batch: int = 3, wrong: bool = False) -> MeasureTarget:
    """``{"layer": ANNOTATION}``; the pattern ``wrong`` scales the gradient by 1.001, ``crash``
    raises the model's own error."""
    rng = np.random.default_rng(0)
    params = {"embed": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32),
              "w": jnp.asarray(rng.normal(size=(4, 4)) / 2, jnp.float32)}
    tokens = jnp.asarray(rng.integers(0, 8, (batch,)), jnp.int32)
    rule = None if plan is None else plan.rules[0]
    if rule is not None and rule.pattern == "crash":
        raise KeyError("the model's own bug")
    if rule is not None and rule.pattern == "wrapped":  # as remat report's config builder does
        raise rc.PlanError("the target raised while building the model") from KeyError("bug")
    layer = _layer if rule is None else rc.checkpoint(_layer, rule.annotation)

    def loss(p: dict[str, jax.Array], t: jax.Array) -> jax.Array:
        h = layer(p["w"], layer(p["w"], p["embed"][t]))
        if wrong or (rule is not None and rule.pattern == "wrong"):
            h = _off_by_a_little(h)
        return jnp.sum(h ** 2)

    return MeasureTarget(loss, (params, tokens), loss, (params, tokens))


@pytest.mark.compat
def test_each_plan_matches_the_model_as_written() -> None:
    seen = []
    report = rc.verify_parity(build, {"none": None, "recompute": {"layer": "recompute"},
                                      "names": {"layer": {"save": ["h"]}},
                                      "offload": {"layer": {"offload": ["h"]}}},
                              progress=seen.append)
    assert [p.name for p in report.plans] == ["recompute", "names", "offload"] == [p.name for p in seen]
    assert report.ok and report.counts() == {"ok": 3, "fail": 0, "refused": 0, "error": 0}
    assert (report.backend, report.compute_dtype) == (jax.default_backend(), "float32")
    for p in report.plans:
        assert p.status == "ok" and p.loss is not None and p.grads is not None
        assert p.grads.used <= 1 and p.loss.used <= 1
    assert json.loads(json.dumps(report.to_json()))["counts"]["ok"] == 3


@pytest.mark.compat
def test_a_wrong_gradient_fails_naming_the_plan_and_the_parameter() -> None:
    report = rc.verify_parity(build, {"recompute": {"layer": "recompute"},
                                      "bad": {"wrong": "recompute"}})
    good, bad = report.plans
    assert good.status == "ok" and not report.ok
    assert bad.status == "fail" and bad.grads is not None and bad.grads.used > 1
    assert bad.grads.worst in ("embed", "w") and bad.grads.rel == pytest.approx(1e-3, rel=0.5)
    assert "'bad'" in bad.message and bad.grads.worst in bad.message
    text = str(report)
    assert "bad" in text and "fail" in text and bad.grads.worst in text
    assert "1 failed" in text and '"wrong"' in text  # the failing plan's rules, to reproduce it


@pytest.mark.compat
def test_refused_plans_are_recorded_and_crashes_are_errors() -> None:
    report = rc.verify_parity(build, {"custom": {"layer": "custom"}, "crash": {"crash": "recompute"},
                                      "typo": {"layer": "recompte"}, "wrapped": {"wrapped": "save"}})
    custom, crash, typo, wrapped = report.plans
    assert wrapped.status == "error" and "building the model" in wrapped.message
    assert custom.status == "refused" and "PlanError" in custom.message  # rc.checkpoint refuses it
    assert typo.status == "refused" and "recompte" in typo.message
    assert crash.status == "error" and "the model's own bug" in crash.message
    assert not report.ok and report.counts()["refused"] == 2


@pytest.mark.compat
def test_the_compute_dtype_is_read_from_the_matrix_products() -> None:
    def bf16(plan: rc.Plan | None) -> MeasureTarget:
        t = build(plan)
        return MeasureTarget(lambda p, x: t.loss_fn(jax.tree.map(lambda a: a.astype(jnp.bfloat16), p), x)
                             .astype(jnp.float32), t.loss_args, t.step_fn, t.step_args)

    report = rc.verify_parity(bf16, {"recompute": {"layer": "recompute"}})
    assert report.compute_dtype == "bfloat16" and report.tolerance.precision == "bfloat16"


# -- the command line ----------------------------------------------------------------------------

_MODEL = """\
import jax, jax.numpy as jnp, numpy as np
import remat_common as rc
from remat_common.measurement import MeasureTarget

@jax.custom_vjp
def off(x):
    return x

off.defvjp(lambda x: (x, None), lambda _, g: (g * 1.001,))

def layer(w, x):
    return jnp.tanh(rc.checkpoint_name(x @ w, "h"))

def measure_target(plan, *, batch, wrong=False):
    w = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)) / 2, jnp.float32)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(batch, 4)), jnp.float32)
    f = layer if plan is None else rc.checkpoint(layer, plan.rules[0].annotation)
    def loss(w, x):
        h = f(w, f(w, x))
        return jnp.sum((off(h) if wrong and plan is not None else h) ** 2)
    return MeasureTarget(loss, (w, x), loss, (w, x))
"""


def _config(folder: Path, plans: str, wrong: bool = False) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "model.py").write_text(_MODEL)
    cfg = folder / "config.yaml"
    cfg.write_text(f"target: model.py:measure_target\nmodel: {{wrong: {str(wrong).lower()}}}\n"
                   f"batch: 3\nplans: {plans}\n")
    return cfg


@pytest.mark.tooling
def test_remat_verify_parity_prints_each_plan_and_exits_by_the_result(tmp_path, capsys) -> None:
    cfg = _config(tmp_path / "a", "{none: null, recompute: {layer: recompute}, names: {layer: {save: [h]}}}")
    out = tmp_path / "parity.json"
    assert main(["verify", "--parity", str(cfg), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recompute" in text and "names" in text and "2 plan(s): 2 ok" in text
    data = json.loads(out.read_text())
    assert data["parity"] is True and data["results"][0]["report"]["ok"] is True
    wrong = _config(tmp_path / "b", "{recompute: {layer: recompute}}", wrong=True)
    assert main(["verify", "--parity", str(wrong)]) == 1
    text = capsys.readouterr().out
    assert "fail" in text and "'recompute'" in text


@pytest.mark.tooling
@pytest.mark.parametrize("argv,says", [
    (["--seed", "1"], "--seed 1 is the fuzz's seed"),
    (["--fuzz", "2", "--plans", "a"], "--plans picks plans of the config"),
    (["--precision", "highest"], "--parity is not given"),
])
def test_remat_verify_refuses_options_that_would_do_nothing(argv, says, capsys) -> None:
    assert main(["verify", "example:nnx_gpt", *argv]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.tooling
def test_remat_verify_without_parity_checks_the_residuals(capsys) -> None:
    pytest.importorskip("flax")
    argv = ["verify", "example:nnx_gpt", "--plans", "names", "--size",
            *(f"{k}={v}" for k, v in TINY.items()), "batch=2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "names: ok" in text


# -- the fuzz ------------------------------------------------------------------------------------

_PATHS = ["", "embed", "head", "layers", "layers.0", "layers.1", "layers.2", "layers.0.attn",
          "layers.1.attn", "layers.2.attn", "layers.0.attn.q_proj", "layers.1.attn.q_proj",
          "layers.2.attn.q_proj", "layers.0.mlp", "layers.1.mlp", "layers.2.mlp"]


def _shaped(plan: rc.Plan | None, *, tags: bool = True, stacks: tuple[str, ...] = ("layers",)
            ) -> MeasureTarget:
    """A model of paths only: its loss tags ``q`` and ``mlp_out`` as layer 0's modules would (JAX's
    own tags, qualified by hand), so the fuzz's probes need no framework and no compile."""
    from jax.ad_checkpoint import checkpoint_name

    def loss(w: jax.Array) -> jax.Array:
        h = jnp.sin(w)
        if tags:
            h = jnp.sin(checkpoint_name(h, "layers.0.attn/q"))
            h = jnp.sin(checkpoint_name(h, "layers.0.mlp/mlp_out"))
        return jnp.sum(h)

    compiled = rc.compile_plan(rc.resolve(plan or rc.Plan.from_mapping({}), _PATHS, stacks=stacks))
    return MeasureTarget(loss, (jnp.ones(3),), loss, (jnp.ones(3),), plan=compiled)


def _features(config: dict) -> set[str]:
    rules, out = config["rules"], set()
    text = json.dumps(rules)
    out |= {"state"} if "state" in config else set()
    out |= {"nested"} if "nested" in text else set()
    out |= {"tag"} if '"tag"' in text else set()
    for v in rules.values():
        v = v.get("remat", v) if isinstance(v, dict) and "nested" in v else v
        if isinstance(v, dict) and "tag" not in v:
            out |= {"names"} | ({"offload"} if "offload" in v else set())
        elif v in ("offload", "offload_dots_no_batch"):
            out.add("offload")
        elif v in ("dots", "dots_no_batch"):
            out.add("dots")
        elif v == "recompute":
            out.add("recompute")
    return out


@pytest.mark.compat
def test_the_fuzz_is_seeded_and_exercises_every_feature_in_turn() -> None:
    plans = fuzz_plans(_stateful, 12, seed=0)
    assert plans == fuzz_plans(_stateful, 12, seed=0) != fuzz_plans(_stateful, 12, seed=1)
    assert list(plans)[:2] == ["fuzz-s0-0", "fuzz-s0-1"]
    for window in (list(plans.values())[:6], list(plans.values())[6:]):
        seen = set().union(*map(_features, window))
        assert {"offload", "names", "nested", "recompute", "dots", "state"} <= seen
    for config in plans.values():
        rc.Plan.from_config(config)  # every drawn config is a plan (refusals come at resolution)
    # a model that tags nothing gets tag rules on its layers' leaf modules, and names them
    untagged = fuzz_plans(functools.partial(_shaped, tags=False), 6, seed=3)
    assert all("tag" in _features(c) for c in untagged.values())
    # without a stack, the nested turn falls back to recompute
    flat = fuzz_plans(functools.partial(_shaped, stacks=()), 6, seed=0)
    assert not any("nested" in _features(c) for c in flat.values())


def _stateful(plan: rc.Plan | None) -> MeasureTarget:
    """:func:`_shaped` with a step that keeps its state where a plan's ``state:`` says."""
    return dataclasses.replace(_shaped(plan), state=rc.StatePlacement())


@pytest.fixture(scope="module")
def examples():
    pytest.importorskip("flax")
    from examples.llms import nnx_llms
    from examples.nnx_gpt import model as nnx_gpt

    return nnx_gpt, nnx_llms


@pytest.mark.slow
def test_the_fuzz_on_an_example_gpt_and_a_third_party_model(examples, standard_promotion) -> None:
    """CI's share of the 50-plan fuzz (docs/semantics.md): five plans over the NNX GPT's scanned
    stack (one per feature: offload, names, nested, dots, state on host; recompute, the suite's
    most tested, is left out for time: ~3 s a plan, 10 s the state plan's three compiles) and one
    over bonsai's Llama 3.2 (tag rules, offloaded), at tiny sizes; no gradient may differ."""
    nnx_gpt, nnx_llms = examples
    gpt = functools.partial(nnx_gpt.measure_target, batch=2, layout="scan", **TINY)
    llama = functools.partial(nnx_llms.measure_target, batch=2, family="llama3_2", n_kv_heads=1,
                              **TINY)
    for builder, n in ((gpt, 6), (llama, 1)):
        plans = fuzz_plans(builder, n, seed=0)
        plans.pop("fuzz-s0-3", None)  # the recompute turn
        n = len(plans)
        report = rc.verify_parity(builder, plans)
        assert report.ok, str(report)
        assert report.counts()["ok"] == n, str(report)  # seed 0 draws no plan that is refused
