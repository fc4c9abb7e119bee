"""A plan's ``state:`` entry: where training state lives between steps (docs/semantics.md).

Loading from every format and from Python, the schema, ``describe``, fingerprints of plans without
it unchanged, and what is refused (the key, the value and the fix in the message).
"""

from __future__ import annotations

import json

import pytest

import remat_common as rc
from fixtures.schema import validate
from remat_common import Plan, PlanError, StatePlacement

pytestmark = pytest.mark.lock_only  # state placements parsed: no JAX


@pytest.mark.parametrize("name, text", [
    ("p.yaml", 'rules: {"blocks.*": recompute}\nstate: {optimizer: host, params: device}\n'),
    ("p.toml", '[rules]\n"blocks.*" = "recompute"\n[state]\noptimizer = "host"\n'),
    ("p.json", '{"rules": {"blocks.*": "recompute"}, "state": {"optimizer": "host"}}'),
])
def test_state_loads_from_every_format(tmp_path, name, text) -> None:
    f = tmp_path / name
    f.write_text(text)
    plan = Plan.load(f)
    assert plan.state == StatePlacement(optimizer="host", params="device")
    assert plan.state.on_host == ("optimizer",)
    assert plan.state.memory_kind("optimizer") == "pinned_host"
    assert plan.state.memory_kind("params") == plan.state.memory_kind("other") == "device"
    assert [r.pattern for r in plan.rules] == ["blocks.*"]
    assert Plan.from_config(json.loads(json.dumps(plan.to_config()))) == plan


def test_python_forms_agree() -> None:
    a = Plan.from_mapping({"blocks.*": "recompute"}, state={"optimizer": "host", "params": "host"})
    b = Plan(rules=a.rules, state=StatePlacement(optimizer="host", params="host"))
    c = Plan(rules=a.rules, state={"optimizer": "host", "params": "host"})
    d = Plan.from_mapping({"blocks.*": "recompute"}).with_defaults(
        state={"optimizer": "host", "params": "host"})
    assert a == b == c == d and a.state.on_host == ("optimizer", "params")
    assert (a + Plan.from_mapping({"x": "save"})).state == a.state  # defaults of the left plan
    assert a.fingerprint() != Plan.from_mapping({"blocks.*": "recompute"}).fingerprint()


def test_default_is_all_on_device_and_keeps_fingerprints() -> None:
    plan = Plan.from_mapping({"blocks.*": "recompute"})
    assert plan.state == StatePlacement() and plan.state.is_default
    assert "state" not in plan.to_config()  # plans written before keep their fingerprints
    assert Plan.from_config({"rules": {"blocks.*": "recompute"}, "state": None}) == plan
    assert Plan.from_config({"rules": {"blocks.*": "recompute"},
                             "state": {"optimizer": "device"}}).fingerprint() == plan.fingerprint()


def test_describe_says_where_state_lives() -> None:
    plan = Plan.from_mapping({"blocks.*": "recompute"}, state={"params": "host", "optimizer": "host"})
    assert plan.describe().splitlines() == [
        "blocks.*: recompute",
        "state between steps: optimizer state on host (pinned_host), parameters on host (pinned_host)"]
    assert "state" not in Plan.from_mapping({"a": "save"}).describe()


def test_schema_knows_state() -> None:
    schema = Plan.json_schema()
    assert set(schema["properties"]["state"]["properties"]) == set(rc.state.STATE_KEYS)
    for key in rc.state.STATE_KEYS:
        place = schema["properties"]["state"]["properties"][key]["anyOf"]
        assert place[0]["enum"] == list(rc.state.STATE_PLACES)
    for state in ({"optimizer": "host", "params": "device"},
                  {"optimizer": {"host": 0.5}, "params": {"host": ["blocks.*", "head"]}},
                  {"params": {"host": "blocks.[0-3]"}}):
        ok = {"rules": {}, "state": state}
        assert validate(ok, schema) == []
        Plan.from_config(ok)
    for bad in ({"rules": {}, "state": {"optimiser": "host"}},
                {"rules": {}, "state": {"optimizer": "pinned_host"}},
                {"rules": {}, "state": {"optimizer": {"host": 1.5}}},
                {"rules": {}, "state": {"optimizer": {"host": True}}},
                {"rules": {}, "state": {"optimizer": {"device": 0.5}}}):
        assert validate(bad, schema) != []
        with pytest.raises(PlanError):
            Plan.from_config(bad)


@pytest.mark.parametrize("state, key, value, fix", [
    ({"optimiser": "host"}, "unknown state key(s) 'optimiser'", "(value 'host')",
     "Fix: write 'optimizer' for 'optimiser'."),
    ({"weights": "host"}, "unknown state key(s) 'weights'", "(value 'host')",
     "Fix: write 'params' for 'weights'."),
    ({"grads": "host"}, "unknown state key(s) 'grads'", "Allowed keys: 'optimizer', 'params'.",
     "Fix: use only 'optimizer', 'params'."),
    ({"optimizer": "hots"}, "state.optimizer: 'hots' is not a place", "Allowed: 'device', 'host'.",
     "Fix: write state: {optimizer: host}, {optimizer: device} or a part, "
     "{optimizer: {host: 0.5}}."),
    ({"params": True}, "state.params: True is not a place", "as booleans",
     "Fix: write state: {params: host}, {params: device} or a part, {params: {host: 0.5}}."),
    ({"optimizer": "pinned_host"}, "state.optimizer: 'pinned_host' is not a place", "a memory kind",
     "Fix: write state: {optimizer: host}"),
    ("host", "'state' must be a mapping, got str 'host'", "", "Fix: write state: {optimizer: host}"),
])
def test_bad_state_is_refused_clearly(tmp_path, state, key, value, fix) -> None:
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"rules": {"a": "save"}, "state": state}))
    with pytest.raises(PlanError) as e:
        Plan.load(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: ") and key in msg and value in msg and fix in msg
    with pytest.raises(PlanError, match="state"):
        Plan.from_mapping({"a": "save"}, state=state)


def test_placement_is_frozen_and_checked() -> None:
    with pytest.raises(PlanError, match=r"state.params: 'disk' is not a place"):
        StatePlacement(params="disk")
    p = StatePlacement(optimizer="host")
    assert hash(p) == hash(StatePlacement(optimizer="host")) and p.to_config() == {
        "optimizer": "host", "params": "device"}


def test_the_compiled_plan_carries_its_state() -> None:
    """``CompiledPlan.state`` is the plan's ``state:``, and the training step's functions take the
    compiled plan for it: the placement travels with what an adapter compiled."""
    import jax
    import jax.numpy as jnp

    plan = Plan.from_mapping({"mlp": "recompute"}, state={"optimizer": "host"})
    compiled = rc.compile_plan(rc.resolve(plan, ["", "mlp"]))
    assert compiled.state == plan.state == StatePlacement(optimizer="host")
    state = {"opt": jnp.zeros(3), "w": jnp.ones(3)}
    placed = rc.state.place_state(state, rc.state.default_shardings(state), ["optimizer", "params"],
                                  compiled)
    assert [x.sharding.memory_kind for x in jax.tree.leaves(placed)] == ["pinned_host", "device"]
