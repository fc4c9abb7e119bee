"""A part of a kind of training state on host (a plan's ``state: {optimizer: {host: 0.5}}`` or
``{params: {host: "blocks.*"}}``): exactly that part's arrays are placed in ``pinned_host`` and
counted as host bytes, by the training step and by the report's compiled step; the step computes
what the all-on-device step computes; and every bad part is refused with the fix.

On CPU the compiler drops host placements (``../shared/JAX_FACTS.md``): the memory kinds the
project assigns and the bytes it counts are the proof of where the part lives, the values the proof
that the step is the same.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_common as rc
from remat_common.measurement import measure

pytest.importorskip("flax")  # the examples' models
pytest.importorskip("equinox")
pytest.importorskip("optax")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples.eqx_gpt import model as eqx_model  # noqa: E402
from examples.nnx_gpt import model as nnx_model  # noqa: E402
from fixtures.matrix import alternate  # noqa: E402
from fixtures.tolerance import assert_close  # noqa: E402

EXAMPLES = {"nnx_gpt": nnx_model, "eqx_gpt": eqx_model}
LAYERS = 4
SIZES = dict(d_model=8, n_layers=LAYERS, n_heads=2, seq_len=8, vocab=32)
RULES = {"blocks.*": "recompute"}
#: part -> the layers of ``blocks`` it puts on host, or the top-level modules it names
PARTS: dict[str, tuple[dict[str, Any], dict[str, set[str]]]] = {
    "opt-half": ({"optimizer": {"host": 0.5}}, {"optimizer": {"blocks.2", "blocks.3"}}),
    "params-0.3": ({"params": {"host": 0.3}}, {"params": {"blocks.2", "blocks.3"}}),  # ceil(1.2)
    "params-eighth": ({"params": {"host": 0.125}}, {"params": {"blocks.3"}}),
    "pattern": ({"params": {"host": "blocks.[0-1]"}}, {"params": {"blocks.0", "blocks.1"}}),
    "both": ({"params": {"host": ["head", "embed"]}, "optimizer": {"host": 0.75}},
             {"params": {"head", "embed"}, "optimizer": {"blocks.1", "blocks.2", "blocks.3"}}),
}
pytestmark = pytest.mark.usefixtures("standard_promotion")


def _tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 32, (2, SIZES["seq_len"] + 1), dtype=np.int32)


def _under(path: str, modules: set[str]) -> bool:
    return any(f".{m}." in f".{path}." for m in modules)


# Of the jax 0.11.0 and 0.12 stages, each runs the tests on this fixture for one example, the
# other example's (fixtures/matrix.py): remat_common.state resolves and places a part with no
# JAX-version branch, and each example's adapter and remat paths are checked on every version
# elsewhere (tests/test_examples.py, tests/test_host_state.py's scanned stacks). Stage 1 runs both.
@pytest.fixture(scope="module", params=alternate(sorted(EXAMPLES)))
def example(request: pytest.FixtureRequest, standard_promotion: None) -> dict[str, Any]:
    model = EXAMPLES[request.param]
    tx = model.optimizer()
    static, state, _ = model.build(rc.Plan.from_mapping(RULES), tx=tx, **SIZES)
    step = model.train_step_fn(static, tx)
    want = jax.tree.map(jnp.copy, state)
    losses = []
    for i in range(2):
        want, loss = jax.jit(step)(want, _tokens(i))
        losses.append(float(loss))
    return dict(model=model, state=state, step=step, roles=model.state_roles(state),
                want=(want, losses))


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_part_places_exactly_its_arrays_and_steps_as_on_device(example: dict[str, Any],
                                                                 part: str) -> None:
    config, modules = PARTS[part]
    state, roles = example["state"], example["roles"]
    shardings = rc.state.default_shardings(state)
    placed = rc.state.place_state(jax.tree.map(jnp.copy, state), shardings, roles, config)
    flat = jax.tree_util.tree_flatten_with_path(placed)[0]
    paths = [jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in flat]
    host = [x.sharding.memory_kind == "pinned_host" for _, x in flat]
    want = [r in modules and _under(p, modules[r]) for p, r in zip(paths, roles)]
    assert host == want and any(host)
    # the bytes counted on host are those arrays' bytes, per kind
    counted = rc.state.state_bytes(state, rc.state.host_roles(state, roles, config))
    for kind in modules:
        assert counted[kind] == sum(x.nbytes for (_, x), h, r in zip(flat, host, roles)
                                    if h and r == kind) > 0
    # the step with the part on host: the all-on-device step's losses and state (AdamW's moments
    # follow the gradients), and the part back on host after it
    step = rc.state.jit_state_step(example["step"], shardings, roles, config, fetches=True)
    losses = []
    for i in range(2):
        placed, loss = step(placed, _tokens(i))
        losses.append(float(loss))
    want_state, want_losses = example["want"]
    assert_close(losses, want_losses)
    assert_close(jax.tree.leaves(placed), jax.tree.leaves(want_state), err_msg=part)
    assert [x.sharding.memory_kind == "pinned_host" for x in jax.tree.leaves(placed)] == host


@pytest.mark.tooling  # the report's compiled figures: the jax 0.11.2 stage only
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_report_counts_the_part_on_host(name: str) -> None:
    """``remat report``'s step takes exactly the part as host arguments; its figures and JSON say
    the part's bytes per kind beside the kind's whole."""
    model = EXAMPLES[name]
    plans = {"half": rc.Plan.from_mapping(RULES, state={"optimizer": {"host": 0.5}}),
             "all": rc.Plan.from_mapping(RULES, state={"optimizer": "host"})}
    rep = measure(lambda p: model.measure_target(p, batch=2, **SIZES), plans, steps=0, warmup=0)
    half, whole = rep["half"].state, rep["all"].state
    assert half is not None and whole is not None
    opt = half.state_bytes["optimizer"]
    blocks = half.host_state_bytes["optimizer"]
    assert 0 < blocks < opt and whole.host_state_bytes == {"optimizer": opt}
    assert half.host_argument_bytes == blocks  # two of the four layers' moments, nothing else
    assert half.placement == {"optimizer": {"host": 0.5}, "params": "device"}
    assert half.to_json()["host_state_bytes"] == {"optimizer": blocks}
    assert "optimizer state: the last 50% of the layers on host" in half.describe()


@pytest.mark.lock_only  # parsed and resolved: no JAX version in it
@pytest.mark.parametrize("fraction,layers", [(0, 0), (1e-9, 1), (0.5, 2), (0.51, 3), (1, 4)])
def test_a_fraction_takes_the_last_ceil_f_l_layers(fraction: float, layers: int) -> None:
    state = {"blocks": [{"w": np.zeros(3)} for _ in range(LAYERS)], "head": np.zeros(2)}
    placement = rc.StatePlacement.coerce({"params": {"host": fraction}})
    roles = rc.state.host_roles(state, ["params"] * 5, placement)
    host = [placement.memory_kind(r) == "pinned_host" for r in roles]
    assert host[:LAYERS] == [False] * (LAYERS - layers) + [True] * layers
    assert host[-1] == (fraction == 1)  # 1 is host: everything
    assert placement.params == {0: "device", 1: "host"}.get(fraction, fraction)
    assert layers == math.ceil(fraction * LAYERS)


@pytest.mark.lock_only  # parsed and resolved: no JAX version in it
@pytest.mark.parametrize("value,match", [
    (1.5, r"host: 1\.5 is not a fraction in \[0, 1\]"),
    (-0.25, r"host: -0\.25 is not a fraction in \[0, 1\]"),
    (float("nan"), r"host: nan is not a fraction"),
    (True, r"host: True \(bool\) is neither a fraction nor .*YAML reads unquoted"),
    ("0.5", r"host: '0\.5' is a string, not a fraction.*write the number unquoted"),
    (None, r"host: None \(NoneType\) is neither a fraction nor module path patterns"),
    ([], r"host: \[\] \(list\) is neither"),
    ({"layers": 2}, r"host: \{'layers': 2\} \(dict\) is neither a fraction"),
])
def test_bad_parts_are_refused_with_the_fix(value: Any, match: str) -> None:
    with pytest.raises(rc.PlanError, match=r"(?s)plan\.yaml: state\.optimizer: " + match) as e:
        rc.Plan.from_config({"rules": RULES, "state": {"optimizer": {"host": value}}},
                            source="plan.yaml")
    assert "state: {optimizer: {host: 0.5}}" in str(e.value)  # the message shows a right one


@pytest.mark.lock_only  # parsed and resolved: no JAX version in it
def test_a_part_with_another_key_or_an_unknown_kind_is_refused() -> None:
    with pytest.raises(rc.PlanError, match=r"state\.params: \{'device': 0\.5\} has key\(s\) "
                                           r"'device'; a part has one key, 'host'"):
        rc.StatePlacement.coerce({"params": {"device": 0.5}})
    with pytest.raises(rc.PlanError, match=r"state\.params.host: .*not a numeric range"):
        rc.StatePlacement.coerce({"params": {"host": "blocks.[3-1]"}})


def test_a_pattern_that_matches_nothing_is_refused(example: dict[str, Any]) -> None:
    plan = rc.Plan.from_config({"rules": RULES, "state": {"params": {"host": "decoder.*"}}},
                               source="plan.yaml")
    shardings = rc.state.default_shardings(example["state"])
    with pytest.raises(rc.PlanError, match=r"(?s)plan\.yaml: state\.params: host: 'decoder\.\*' "
                                           r"matches no array of the params state .*Fix: name a "
                                           r"module of the model"):
        rc.state.place_state(example["state"], shardings, example["roles"], plan)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_fraction_of_a_scanned_stack_is_refused(name: str) -> None:
    """The scanned layout holds each weight of all layers in one array, which lives in one
    memory: a fraction of its layers is refused, naming the ways that work."""
    model = EXAMPLES[name]
    static, state, _ = model.build(rc.Plan.from_mapping(RULES), tx=model.optimizer(),
                                   **{**SIZES, "layout": "scan"})
    plan = rc.Plan.from_config({"rules": RULES, "state": {"optimizer": {"host": 0.5}}},
                               source="plan.yaml")
    with pytest.raises(rc.PlanError, match=r"(?s)plan\.yaml: state\.optimizer: host: 0\.5 is a "
                                           r"fraction of the layers, but the state has no stack "
                                           r"of numbered layers.*Fix: build the model with one "
                                           r"module per layer"):
        rc.state.place_state(state, rc.state.default_shardings(state), model.state_roles(state),
                             plan)


@pytest.mark.lock_only  # parsed and resolved: no JAX version in it
def test_a_part_round_trips_through_plan_files(tmp_path: Path) -> None:
    config = {"optimizer": {"host": 0.5}, "params": {"host": ["blocks.*", "head"]}}
    plan = rc.Plan.from_mapping(RULES, state=config)
    assert plan.to_config()["state"] == config
    path = tmp_path / "plan.yaml"
    path.write_text("rules: {'blocks.*': recompute}\n"
                    "state: {optimizer: {host: 0.5}, params: {host: ['blocks.*', head]}}\n")
    assert rc.Plan.load(path).state == plan.state
    assert rc.Plan.from_mapping(RULES, state={"optimizer": {"host": 1}}).state == \
        rc.StatePlacement(optimizer="host")
    assert rc.Plan.from_mapping(RULES, state={"optimizer": {"host": 0}}).state.is_default


@pytest.mark.tooling  # the tuner's search, as tests/test_tune*.py: the jax 0.11.2 stage only
def test_the_tuner_searches_under_a_part(tmp_path: Path) -> None:
    """``remat tune --state optimizer=0.5`` (``tune_states(state="optimizer=0.5")``): every plan
    is compiled with that part on host and its bytes priced; the YAML says the part and loads
    back."""
    from remat_common.measurement import tune_states

    def build(plan: rc.Plan | None) -> Any:
        return nnx_model.measure_target(plan, batch=2, **SIZES)

    result = tune_states(build, 2**40, state="optimizer=0.5", choices=["recompute"],
                         max_compiles=2)
    assert result.state == rc.StatePlacement(optimizer=0.5) and result.best is not None
    half = build(rc.Plan.from_mapping(RULES, state={"optimizer": {"host": 0.5}}))
    assert result.best.state_host_bytes == half.host_state_bytes["optimizer"] > 0
    assert 'state: {optimizer: {"host": 0.5}, params: device}' in result.yaml()
    path = tmp_path / "tuned.yaml"
    path.write_text(result.yaml())
    assert rc.Plan.load(path).state == result.state


@pytest.mark.tooling  # the tuner's search, as tests/test_tune*.py: the jax 0.11.2 stage only
def test_the_tuner_finds_the_fewest_eighths_that_fit() -> None:
    """``state="eighths"``: below every on-device peak, the fewest eighths of the layers'
    optimizer state on host under which a plan fits the device budget; under a host budget below
    that part's bytes nothing fits, and the notes say why."""
    from remat_common.internal import fmt_bytes
    from remat_common.measurement import tune_states

    def build(plan: rc.Plan | None) -> Any:
        return nnx_model.measure_target(plan, batch=2, **SIZES)

    cache: dict[str, Any] = {}

    def go(budget: int, **kw: Any) -> Any:
        return tune_states(build, budget, choices=["recompute"], max_compiles=2, cache=cache,
                           **kw)

    low = min(p.peak for p in go(2**40, state="device", stop_when_save_fits=False).points)
    layer = build(rc.Plan.from_mapping(RULES, state={"optimizer": {"host": 0.25}}))
    one = layer.host_state_bytes["optimizer"]  # one layer's moments (ceil(0.25 * 4) = 1)
    # two layers on host are needed: 2/8 is one layer of four, 3/8 two (ceil(1.5))
    result = go(low - one - 1, state="eighths")
    assert result.state == rc.StatePlacement(optimizer=0.375), result.notes[0]
    assert result.best is not None and result.best.state_host_bytes == 2 * one
    assert "chose optimizer=0.375" in result.notes[0]
    # 3/8 puts on host the arrays 4/8 does (the last 2 layers; searched first, by bisection): its
    # search takes their figures from the cache (Runner.key: the arrays a part resolves to)
    assert result.cached >= 2, result.notes
    # the host budget holds one layer's moments only: nothing fits
    none = go(low - one - 1, state="eighths", host_budget=one)
    assert none.plan is None and none.best is None and "nothing fits" in none.notes[0]
    over = f"optimizer=0.375: {fmt_bytes(2 * one)} on host, over {fmt_bytes(one)}"
    assert over in none.notes[0]
