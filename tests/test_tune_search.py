"""``remat tune``: per-name choices, preset files as candidates, the scanned layout and
``--maximize seq`` (``n_layers``, ``d_model``).

Small on purpose (a 2-layer scanned GPT, short sequences): one CLI run compiles the uniform plans
and a MaxText preset file (4 compiles), the capacity test 2 more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("rich")

from remat_common import RematError, tune  # noqa: E402
from remat_common.internal import ReportConfig, main  # noqa: E402
from versions import SHOW_REMAT  # noqa: E402

# Tooling (the tuner's search and CLI): slow, marked `tooling` (`-m "not tooling"` leaves it out of a
# quick local run); every stage of scripts/test runs it.
pytestmark = [pytest.mark.tooling, pytest.mark.usefixtures("standard_promotion")]

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "nnx_gpt" / "report.yaml"
PRESET = "maxtext:save_qkv_proj"  # a shipped preset, by name
TINY = {"vocab": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 64, "batch": 4,
        "layout": "scan"}
SIZE = ["--size", *(f"{k}={v}" for k, v in TINY.items())]
QKV = "save:q+k+v"


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory,
           standard_promotion: None) -> dict[str, dict[str, Any]]:
    """``remat tune`` on the scanned GPT with a per-name choice and a preset file: its points."""
    js = tmp_path_factory.mktemp("tune") / "t.json"
    rc = main(["tune", str(CONFIG), *SIZE, "--budget", "1TiB", "--choices", QKV, "recompute",
               "--plans", PRESET, "--no-progress", "--json", str(js)])
    data = json.loads(js.read_text())
    assert rc == 0 and data["stack"] == "blocks" and data["layers"] == TINY["n_layers"]
    return {p["name"]: p for p in data["points"]}


def test_per_name_choice_on_the_scanned_layout(points: dict[str, dict[str, Any]]) -> None:
    """``save:q+k+v`` is compiled as its own uniform plan, verified, and lands between full
    recompute and save-all in memory and FLOPs. (Mixing choices per layer at a budget is
    tests/test_tune.py's subject.)"""
    qkv, low, high = points[QKV], points["recompute"], points["save"]
    assert qkv["plan"] == {"blocks.*": {"save": ["k", "q", "v"]}} and not qkv["problems"]
    assert low["peak"] < qkv["peak"] < high["peak"]  # keeping q, k, v costs device bytes ...
    assert high["flops"] < qkv["flops"] < low["flops"]  # ... and saves their recomputation


def test_preset_file_is_a_candidate(points: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """MaxText's save_qkv_proj is the same plan as the choice save:q+k+v: the same compiled figures.
    A preset that does not exist is a message listing those that do."""
    preset = points["maxtext/save_qkv_proj"]
    assert preset["source"] == "extra" and not preset["problems"]
    assert (preset["peak"], preset["flops"]) == (points[QKV]["peak"], points[QKV]["flops"])
    assert main(["tune", str(CONFIG), "--budget", "1TiB", "--plans", "nope.yaml"]) != 0
    assert "nope.yaml: no such plan file. Fix:" in capsys.readouterr().err
    assert main(["tune", str(CONFIG), "--budget", "1TiB", "--plans", "maxtext:nope"]) != 0
    assert "--plans maxtext:nope: unknown preset 'maxtext:nope'. Presets: 'maxtext:full'" in (
        capsys.readouterr().err)


def test_per_name_choice_errors() -> None:
    build = ReportConfig.load(CONFIG).with_sizes(TINY).builder()
    with pytest.raises(RematError, match=r"choice 'save:qq' names 'qq'; the layers tag .*'q'.*Fix"):
        tune(build, "1GiB", choices=["save:qq"])
    with pytest.raises(RematError, match=r"choice 'offload:' names no value.*Fix"):
        tune(build, "1GiB", choices=["offload:"])


def test_cli_maximize_seq(points: dict[str, dict[str, Any]], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    """At the save-all peak of seq_len 64, the scanned GPT's sequence length is searched in steps of
    64: save-all fits 64 exactly and not 128. Two compiles: the tune's (64), whose peak the capacity
    search reuses, then 128."""
    budget = points["save"]["peak"]
    js = tmp_path / "t.json"
    rc = main(["tune", str(CONFIG), *SIZE, "--budget", str(budget), "--choices", "save",
               "--maximize", "seq", "--step", "64", "--limit", "128", "--no-progress",
               "--json", str(js)])
    text = capsys.readouterr().out
    assert rc == 0, text
    cap = json.loads(js.read_text())["capacity"]
    assert cap["axis"] == "seq"
    (save,) = cap["rows"]
    assert save["name"] == "save" and (save["largest"], save["peak"]) == (TINY["seq_len"], budget)
    assert save["next"] == 2 * TINY["seq_len"] and save["next_peak"] > budget
    assert save["compiles"] == 1  # 64 was compiled by the tune


@pytest.mark.parametrize("axis, nxt", [("n_layers", TINY["n_layers"] + 1),
                                       ("d_model", TINY["d_model"] + TINY["n_heads"])])
def test_cli_maximize_grows_the_model(points: dict[str, dict[str, Any]], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str], axis: str,
                                      nxt: int) -> None:
    """``--maximize n_layers`` and ``--maximize d_model`` grow the model itself: at save-all's
    peak, the config's depth (width) fits exactly and the next one (one more layer; the width in
    steps of the config's heads) does not. One compile: the tune's size is reused."""
    budget = points["save"]["peak"]
    js = tmp_path / "t.json"
    rc = main(["tune", str(CONFIG), *SIZE, "--budget", str(budget), "--choices", "save",
               "--state", "device", "--maximize", axis, "--limit", str(nxt), "--no-progress",
               "--json", str(js)])
    text = capsys.readouterr().out
    assert rc == 0, text
    cap = json.loads(js.read_text())["capacity"]
    (save,) = cap["rows"]
    assert cap["axis"] == axis and save["largest"] == TINY[axis] and save["peak"] == budget
    assert save["next"] == nxt and save["next_peak"] > budget and save["compiles"] == 1
    assert f"the largest {axis} whose compiled step fits" in text


def _custom_target(plan: Any) -> Any:
    """The fixtures' NNX transformer (2 layers; each layer's gated MLP declares its own rules,
    ``__remat_custom__``) under ``plan``: an SGD step on its parameters."""
    import jax
    from flax import nnx

    import flax_remat_plugin as frp
    from fixtures import nnx_models as nm
    from remat_common.measurement import MeasureTarget

    model = nm.Transformer(rngs=nnx.Rngs(0))
    if plan is not None:
        frp.annotate(model, plan)
    loss, params = nm.split_loss(model, *nm.batch(batch=8, seq=32))

    def step(params: Any) -> Any:
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))

    return MeasureTarget(loss, (params,), step, (params,),
                         None if plan is None else frp.compiled_plan(model))


def test_custom_is_a_choice_where_the_layers_declare_rules() -> None:
    """The layers' MLPs define ``__remat_custom__``, so ``custom`` is one of the model's choices,
    written as the layer saved and its ``mlp`` annotated ``custom``; uniform and mixed with
    save-all, it compiles, verifies, and keeps less than save-all. Three compiles."""
    from remat_common import Plan
    from remat_common.internal import assignment_plan, custom_choice
    from remat_common.measurement import LayerRules

    view = _custom_target(Plan.from_mapping({"**": "inherit"})).plan  # built, not compiled
    assert view is not None and set(view.custom_paths) == {"layers.0.mlp", "layers.1.mlp"}
    custom = custom_choice("layers", 2, view.custom_paths)
    assert custom == LayerRules((("", "save"), ("mlp", "custom")))
    mix = assignment_plan("layers", ("save", "custom"), {"save": "save", "custom": custom})
    assert mix == {"layers.*": "save", "layers.1.mlp": "custom"}
    # "custom" is accepted only because it is among this model's default choices
    r = tune(_custom_target, "1TiB", choices=["custom"], plans={"mix": mix})
    assert r.compiles == 3 and dict(r.choices)["custom"] == custom
    assert r["custom"].plan == {"layers.*": "save", "layers.*.mlp": "custom"}
    for name in ("custom", "mix"):
        assert not r[name].problems, r[name].problems
    save, mixed, own = r["save"], r["mix"], r["custom"]
    assert own.device_bytes < mixed.device_bytes < save.device_bytes
    assert save.flops <= mixed.flops <= own.flops
    assert json.loads(json.dumps(r.to_json()))["choices"][1] == [
        "custom", {"rules": {".": "save", "mlp": "custom"}}]


#: 16 scanned layers: √16 nesting keeps 4 block inputs + 4 layer inputs, recompute 16.
DEEP = {**TINY, "n_layers": 16}
NESTED = {"blocks": {"remat": "recompute", "nested": "sqrt"}}


def test_nested_is_chosen_where_it_is_the_only_fit() -> None:
    """On a scanned stack of 16 layers, ``nested`` (the scan as 4 checkpointed blocks of 4, each
    layer recomputed in its block) compiles to a smaller peak than full recompute, for one more
    forward pass of FLOPs. Under a budget between the two it is the plan chosen, on the frontier,
    in the table and the JSON; it is a default candidate on a stack this deep. Three compiles
    (save, recompute as an extra plan, nested); the rest from their cache. Compiled with
    ``SHOW_REMAT`` (jax 0.11.0's CPU: CSE off, which would merge the recomputation back). Nested
    runs under the layer groups' one custom_vjp, so it peaks below full recompute on every
    version, jax 0.11.0 included (7.52 MB against 8.63 MB there)."""
    from remat_common import Plan
    from remat_common.internal import points_table


    build = ReportConfig.load(CONFIG).with_sizes(DEEP).builder()
    cache: dict[str, Any] = {}
    recompute = {"blocks.*": "recompute"}
    probe = tune(build, "1TiB", choices=["nested"], plans={"recompute": recompute}, cache=cache,
                 compiler_options=SHOW_REMAT)
    assert probe.compiles == 3
    nested, full = probe["nested"], probe["recompute"]
    assert nested.source == "nested" and nested.plan == NESTED and not nested.problems
    assert nested.assignment is None
    assert nested.peak < full.peak and nested.flops > full.flops
    budget = (nested.peak + full.peak) // 2
    r = tune(build, budget, choices=["nested"], plans={"recompute": recompute}, cache=cache,
             compiler_options=SHOW_REMAT)
    assert r.compiles == 0 and r.chosen == "nested"
    assert r.best is not None and r.best.peak <= budget
    assert r.plan == Plan.from_mapping(NESTED)
    assert r.yaml().endswith('rules:\n  "blocks": {remat: recompute, nested: sqrt}\n')
    assert "nested" in [p.name for p in r.frontier()]
    data = json.loads(json.dumps(r.to_json()))
    assert data["chosen"] == "nested" and data["whole_stack"] == {"nested": NESTED}
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(points_table(r))
    assert "recompute, nested: 4 blocks of 4" in console.export_text()
    # a default candidate here (an expired time limit: only what the cache holds is taken)
    auto = tune(build, budget, cache=dict(cache), time_limit=1e-9, compiler_options=SHOW_REMAT)
    assert dict(auto.whole_stack) == {"nested": NESTED} and auto.chosen == "nested"
    assert auto.compiles == 0


def test_a_third_party_model_is_tuned_with_the_names_its_plan_files_give() -> None:
    """Bonsai's Qwen3 tags nothing itself: its plan files name the projections' outputs by
    ``{tag: NAME}`` rules. ``tags=`` (``remat tune --tags PLAN``) puts those rules in every plan
    searched, so the choices keep MaxText's names (``save:query_proj+...``, ``names``: every
    projection, MaxText's ``minimal``), verified, and the plan chosen carries them. Without them
    the names are unknown; a plan that tags nothing is refused. Three compiles."""
    llms = ROOT / "examples" / "llms"
    build = ReportConfig.load(llms / "qwen3.yaml").with_sizes(
        {"vocab": 64, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "seq_len": 32,
         "batch": 2}).builder()
    minimal = llms / "plans" / "qwen3" / "minimal.yaml"
    qkv = "save:query_proj+key_proj+value_proj"
    r = tune(build, "1TiB", choices=[qkv, "recompute"], tags=str(minimal),
             stop_when_save_fits=False)
    tag_rules = {p: a for p, a in yaml.safe_load(minimal.read_text())["rules"].items()
                 if "tag" in a}
    point, low, high = r[qkv], r["recompute"], r["save"]
    assert point.plan == {"layers.*": {"save": ["key_proj", "query_proj", "value_proj"]},
                          **tag_rules} and not point.problems
    assert low.peak < point.peak < high.peak and high.flops < point.flops < low.flops
    assert r.plan is not None and r.yaml().endswith(
        '"layers.*.mlp.down_proj": {tag: mlpwo}\n')  # the tags travel with the plan chosen
    with pytest.raises(RematError, match=r"choice 'save:query_proj' names 'query_proj'; the "
                                         r"layers tag nothing"):
        tune(build, "1TiB", choices=["save:query_proj"])
    with pytest.raises(RematError, match=r"tags: the plan has no \{tag: NAME\} rule.*Fix"):
        tune(build, "1TiB", tags=str(llms / "plans" / "qwen3" / "full.yaml"))
