"""Never wrong, never silent, round 5 (issue 50): what round 4 left unclear, and what was silently
wrong. Each case asserts what the message says (what was given, why it is wrong, the fix), or the
figure now given, and that the fix works.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from remat_common import PlanError, RematError

pytestmark = pytest.mark.lock_only  # what is refused and the message: checked before JAX runs

ROOT = Path(__file__).resolve().parents[1]

#: `remat report` and `remat tune` need the `report` extra (rich, matplotlib).
needs_report = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("rich", "matplotlib")),
    reason="remat report needs the 'report' extra, not installed here")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``remat ARGV`` in this process: its exit status (argparse's own errors too), stdout and
    stderr."""
    from remat_common.internal import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


_TARGET = "def f(plan, *, batch=1, n_layers=4):\n    raise AssertionError('built')\n"


def _config(tmp_path: Path, extra: str = "") -> Path:
    """A config whose target raises if it is ever built: every refusal here comes first."""
    (tmp_path / "t.py").write_text(_TARGET)
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\nplans: {a: null}\n" + extra)
    return cfg


# -- accelerator names and target-config files ---------------------------------------------------
def _gpu_config(tmp_path: Path, name: str, old: str = "", new: str = "") -> Path:
    from remat_common.measurement import parse_accelerator

    f = tmp_path / name
    f.write_text(parse_accelerator("h100").config.replace(old, new) if old else
                 parse_accelerator("h100").config)
    return f


@pytest.mark.compat
@pytest.mark.parametrize("name", ["", "   ", "\t"])
def test_an_empty_accelerator_is_refused_not_read_as_local(name):
    from remat_common.measurement import parse_accelerator

    with pytest.raises(RematError, match=r"(?s)^accelerator '.{0,4}': an empty name names no "
                                         r"accelerator \(leave --accelerator out, or write local, "
                                         r"for this machine\)\.\nGive one of: local .*h100x8.*"
                                         r"v5p:2x2x2"):
        parse_accelerator(name)  # was local: compiled for this machine, not a word
    assert parse_accelerator("local").is_local and parse_accelerator(None).is_local  # the fix


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("option, value, match", [
    ("--accelerator", "", r"accelerator '': an empty name names no accelerator"),
    ("--accelerator", " ", r"accelerator ' ': an empty name names no accelerator"),
    ("--mesh", "", r"--mesh '': an empty mesh names no axis \(leave --mesh out for data "
                   r"parallel over all the devices\)"),
])
def test_cli_empty_target_options_are_refused(tmp_path, capsys, option, value, match):
    code, _, err = _cli(["report", str(_config(tmp_path)), "--no-progress", option, value], capsys)
    assert code == 2 and re.search(match, err), err
    assert "Traceback" not in err and "built" not in err


@pytest.mark.compat
def test_a_target_config_directory_is_a_directory_not_missing(tmp_path):
    from remat_common.measurement import parse_accelerator

    d = tmp_path / "gpus.txtpb"
    d.mkdir()
    with pytest.raises(RematError, match=rf"^accelerator '.*gpus\.txtpb:2': '{re.escape(str(d))}' "
                                         r"is a directory, not a target-config file\. Fix: give "
                                         r"the \.txtpb file itself"):
        parse_accelerator(f"{d}:2")  # was "does not exist"
    with pytest.raises(RematError, match=r"does not exist"):
        parse_accelerator(str(tmp_path / "missing.txtpb"))  # a missing one still says so


@pytest.mark.compat
@pytest.mark.parametrize("suffix", ["TXTPB", "Txtpb", "PBTXT", "TextProto"])
def test_a_target_config_suffix_in_any_case_is_a_file(tmp_path, suffix):
    from remat_common.measurement import parse_accelerator

    f = _gpu_config(tmp_path, f"MY_GPU.{suffix}")
    a = parse_accelerator(f"{f}:4")  # was "unknown accelerator"
    assert (a.platform, a.count, a.chip, a.memory_bytes) == ("cuda", 4, str(f), 84942979072)


@pytest.mark.compat
@pytest.mark.parametrize("value, problem", [
    ("-5", r"sets device_memory_size: '-5', which is not a positive number"),
    ("0", r"sets device_memory_size: '0', which is not a positive number"),
    ("lots", r"sets device_memory_size: 'lots', which is not a positive number"),
    (None, r"sets no device_memory_size"),
])
def test_a_target_config_without_a_memory_is_refused(tmp_path, value, problem):
    from remat_common.measurement import parse_accelerator

    f = _gpu_config(tmp_path, "g.txtpb", "device_memory_size: 84942979072",
                    "" if value is None else f"device_memory_size: {value}")
    with pytest.raises(RematError, match=rf"^accelerator '.*g\.txtpb': the target-config file "
                                         rf"'.*g\.txtpb' {problem}, so the device's memory is "
                                         r"unknown: no plan could be checked against it\. Fix: set "
                                         r"device_memory_size: N inside its gpu_device_info block"):
        parse_accelerator(str(f))  # was memory_bytes=None: no budget, no "will it fit"
    f = _gpu_config(tmp_path, "g.txtpb", "84942979072", "50000000000")  # the fix
    assert parse_accelerator(str(f)).memory_bytes == 50_000_000_000


@pytest.mark.compat
def test_a_target_config_with_a_bad_host_link_is_refused(tmp_path):
    from remat_common.measurement import parse_accelerator

    f = _gpu_config(tmp_path, "g.txtpb", "pcie_bandwidth: 34359738368", "pcie_bandwidth: -1")
    with pytest.raises(RematError, match=r"sets pcie_bandwidth: '-1', which is not a positive "
                                         r"number, so the host link's speed is unknown"):
        parse_accelerator(str(f))
    f = _gpu_config(tmp_path, "g.txtpb", "pcie_bandwidth: 34359738368", "")
    assert parse_accelerator(str(f)).host_link_bytes_per_s is None  # absent: optional, as before


# -- output paths ----------------------------------------------------------------------------------
@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("command, option, name", [
    ("report", "--json", "report.json"),
    ("report", "--timeline-json", "timeline.json"),
    ("report", "--plot", "report.png"),
    ("report", "--html", "report.html"),  # suggested report.png
    ("tune", "--out", "plan.yaml"),  # suggested report.png
    ("tune", "--json", "tune.json"),
    ("tune", "--plot", "tune.png"),
])
def test_a_directory_given_for_an_output_suggests_a_file_of_its_kind(tmp_path, capsys, command,
                                                                      option, name):
    out = tmp_path / "out"
    out.mkdir()
    budget = ["--budget", "1GiB"] if command == "tune" else []
    code, _, err = _cli([command, str(_config(tmp_path)), "--no-progress", *budget, option,
                         str(out)], capsys)
    assert code == 2 and "built" not in err, err
    assert re.search(rf"{option} '{re.escape(str(out))}' is a directory\. Fix: give a file name, "
                     rf"e\.g\. '{re.escape(str(out / name))}'\.", " ".join(err.split())), err
    code, _, err = _cli([command, str(_config(tmp_path)), "--no-progress", *budget, option,
                         str(out / name)], capsys)  # the fix: the output is taken, the target built
    assert code == 2 and "AssertionError: built" in err and "is a directory" not in err, err


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("command, option", [("report", "--json"), ("report", "--html"),
                                             ("report", "--plot"), ("tune", "--out"),
                                             ("tune", "--json")])
def test_an_empty_output_path_is_refused_not_taken_as_not_given(tmp_path, capsys, command, option):
    budget = ["--budget", "1GiB"] if command == "tune" else []
    code, _, err = _cli([command, str(_config(tmp_path)), "--no-progress", *budget, option, ""],
                        capsys)  # `if args.json:` read "" as no --json: nothing written
    assert code == 2 and "built" not in err, err
    assert re.search(rf"{option} '': an empty path names no file\. Fix: give a file name, e\.g\. "
                     rf"{option} \S+, or leave {option} out\.", " ".join(err.split())), err


# -- plan files ----------------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("item, match", [
    ({"pattern": "a"}, r"rule \{'pattern': 'a'\} lacks 'remat'\. A rule .*Fix: add the missing "
                       r"key\.$"),
    ({"pattern": "a", "remat": "save", "x": 1}, r"rule .* has extra 'x'\. A rule .*Fix: remove "
                                                r"the extra one\(s\)\.$"),
    ({"remat": "save", "x": 1}, r"lacks 'pattern' and has extra 'x'\. .*Fix: add the missing key "
                                r"and remove the extra one\(s\)\.$"),
])
def test_a_list_rule_names_only_what_is_wrong(item, match):
    from remat_common import Plan

    with pytest.raises(PlanError, match=match) as info:
        Plan.from_rules([item])
    assert "lacks nothing" not in str(info.value) and "extra nothing" not in str(info.value)
    assert Plan.from_rules([{"pattern": "a", "remat": "save"}]).rules[0].pattern == "a"


# -- a step with no backward pass ------------------------------------------------------------------
def _eqx_stack_target(n_layers: int) -> Any:
    """An Equinox stack of ``n_layers`` Linear layers and nothing else (no embedding, no head)."""
    eqx = pytest.importorskip("equinox")
    import jax
    import jax.numpy as jnp
    from remat_common.measurement import MeasureTarget

    class Stack(eqx.Module):
        layers: list

        def __call__(self, x: Any) -> Any:
            for layer in self.layers:
                x = jnp.tanh(jax.vmap(layer)(x))
            return x

    keys = jax.random.split(jax.random.key(0), max(n_layers, 1))[:n_layers]
    model = Stack([eqx.nn.Linear(4, 4, key=k) for k in keys])
    x = jnp.ones((2, 4))

    def loss(m: Any, x: Any) -> Any:
        return m(x).sum()

    def step(m: Any, x: Any) -> Any:
        value, grads = eqx.filter_value_and_grad(loss)(m, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, m, grads), value

    return lambda plan: MeasureTarget(loss, (model, x), step, (model, x), None)


def test_an_equinox_model_without_layers_is_told_so_not_about_nnx():
    """`n_layers=0` on an Equinox target was told to fix "an in-place NNX step" (the message of
    measure's backward-pass check): the loss depends on no parameter, and the message says so."""
    pytest.importorskip("equinox")
    from remat_common.measurement import measure

    with pytest.raises(RematError, match=r"plan 'none': the compiled training step has no "
                                         r"backward pass: the loss depends on no parameter \(its "
                                         r"arguments before the batch hold no floating-point "
                                         r"array\).*Fix: sizes that give the model parameters "
                                         r"\(remat report --size n_layers=N with N >= 1\)") as info:
        measure(_eqx_stack_target(0), {"none": None}, steps=0)
    assert "NNX" not in str(info.value)
    report = measure(_eqx_stack_target(1), {"none": None}, steps=0)  # the fix
    assert report["none"].memory.device_total and report["none"].flops


def test_a_step_that_drops_its_gradients_names_each_framework_s_fix():
    import jax
    import jax.numpy as jnp
    from remat_common.measurement import MeasureTarget, measure

    w, x = jnp.ones((4, 4)), jnp.ones((2, 4))

    def loss(w: Any, x: Any) -> Any:
        return jnp.tanh(x @ w).sum()

    def dropped(w: Any, x: Any) -> Any:  # the gradients are computed, then thrown away
        return jax.value_and_grad(loss)(w, x)[0]

    with pytest.raises(RematError) as info:
        measure(lambda plan: MeasureTarget(loss, (w, x), dropped, (w, x), None), {"none": None},
                steps=0)
    said = " ".join(str(info.value).split())
    assert re.search(r"no backward pass \(no transposed operation.*a step that returns only the "
                     r"loss: return the updated parameters too \(plain JAX, Equinox: .*an in-place "
                     r"NNX step .*Fix: pass the NNX objects .* otherwise make step_fn return the "
                     r"updated state\.$", said), said
    assert "depends on no parameter" not in said  # the weights do reach the loss

    def step(w: Any, x: Any) -> Any:  # the fix
        value, g = jax.value_and_grad(loss)(w, x)
        return w - 0.1 * g, value
    assert measure(lambda plan: MeasureTarget(loss, (w, x), step, (w, x), None), {"none": None},
                   steps=0)["none"].flops


# -- a report's JSON -------------------------------------------------------------------------------
def _report_json() -> dict[str, Any]:
    """A small report's JSON compiled for h100x2, committed (no compile here)."""
    return json.loads((ROOT / "tests" / "data" / "target_offload_report.json").read_text())


@pytest.mark.parametrize("accelerator, match", [
    ({"name": 5, "memory": "lots"}, r"accelerator\.name is 5, but it must be a string"),
    ({"name": "h100", "memory": "lots"}, r"accelerator\.platform is missing \(remat-report/1 has "
                                         r"'description', 'memory_bytes', 'name', 'platform', "
                                         r"'source'\)"),
    ("h100x2", r"accelerator is 'h100x2', but it must be null or a mapping"),
    (lambda a: a.pop("description"), r"accelerator\.description is missing"),
    (lambda a: a.update(memory_bytes="lots"), r"accelerator\.memory_bytes is 'lots', but it must "
                                              r"be null or a non-negative integer"),
    (lambda a: a.update(platform="gpu"), r"accelerator\.platform is 'gpu', but it must be 'cuda' "
                                         r"or 'tpu'"),
    (lambda a: a.update(mesh={"data": 0}), r"accelerator\.mesh\.data is 0, but it must be a "
                                           r"positive integer"),
    (lambda a: a.update(flops_per_s=-1.0), r"accelerator\.flops_per_s is -1\.0, but it must be "
                                           r"null or a non-negative number"),
])
def test_a_report_json_with_a_malformed_accelerator_is_refused_at_read_time(accelerator, match):
    """It read, then rendering raised KeyError: 'description'."""
    from remat_common.measurement import Report, ReportFormatError, render_text

    data = _report_json()
    assert "h100x2" in render_text(Report.from_json(data))  # the file as written renders
    if callable(accelerator):
        accelerator(data["accelerator"])
    else:
        data["accelerator"] = accelerator
    with pytest.raises(ReportFormatError, match=rf"^Report\.from_json: {match}.*Fix: write the "
                                                r"report again"):
        Report.from_json(data)


# -- training state on host --------------------------------------------------------------------------
@pytest.mark.parametrize("placement", [{"optimizer": "host"}, "plan", "placement"])
def test_place_state_takes_a_plans_state_mapping(placement):
    """The docs write a plan's state as a mapping ({optimizer: host}); place_state took only a
    StatePlacement and raised AttributeError: 'dict' object has no attribute 'memory_kind'."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import remat_common as rc

    state = {"opt": jnp.zeros(3), "w": jnp.ones(3)}
    roles = ["optimizer", "params"]  # jax.tree.leaves order: opt, w
    shardings = rc.state.default_shardings(state)
    given = (rc.Plan.from_mapping({"a": "save"}, state={"optimizer": "host"}) if placement == "plan"
             else rc.StatePlacement(optimizer="host") if placement == "placement" else placement)
    out = rc.state.place_state(state, shardings, roles, given)
    assert jax.tree.map(lambda x: x.sharding.memory_kind, out) == {"opt": "pinned_host",
                                                                   "w": "device"}
    assert jax.tree.map(lambda x: np.asarray(x).tolist(), out) == {"opt": [0.0] * 3, "w": [1.0] * 3}
    step = rc.state.jit_state_step(lambda s, t: (s, t.sum()), shardings, roles, given)
    assert float(step(out, jnp.ones(2))[1]) == 2.0  # the same forms for the step


@pytest.mark.parametrize("placement, error, match", [
    ("host", TypeError, r"^remat_common\.state\.place_state: placement must be a StatePlacement, "
                        r"a plan's state: mapping \(\{'optimizer': 'host'\}\), a Plan or a "
                        r"CompiledPlan; got str "
                        r"'host'\. Fix: pass plan\.state, or StatePlacement\(optimizer='host'\)\."),
    (3, TypeError, r"placement must be a StatePlacement.*got int 3"),
    ({"optimiser": "host"}, PlanError, r"^remat_common\.state\.place_state: placement: unknown "
                                       r"state key\(s\) 'optimiser'(.|\n)*Fix: write 'optimizer' "
                                       r"for 'optimiser'\."),
    ({"optimizer": "cpu"}, PlanError, r"state\.optimizer: 'cpu' is not a place"),
])
def test_place_state_refuses_what_is_no_placement(placement, error, match):
    import jax.numpy as jnp

    import remat_common as rc

    state = {"opt": jnp.zeros(3), "w": jnp.ones(3)}
    with pytest.raises(error, match=match):
        rc.state.place_state(state, rc.state.default_shardings(state), ["optimizer", "params"],
                             placement)


_STATE_TARGET = '''
import functools
import jax, jax.numpy as jnp
import remat_common
from remat_common.adapter import call_module, module_scope
from remat_common.measurement import MeasureTarget, with_state


def f(plan, *, batch=4, d=16, n_layers=2, opt=False, placed=True):
    """Two layers trained by SGD (opt=False: no optimizer state) or with a momentum (opt=True);
    placed=False: the plan's state: is never applied."""
    paths = ["layers", *(f"layers.{i}" for i in range(n_layers))]
    compiled = None if plan is None else remat_common.compile_plan(remat_common.resolve(plan, paths))
    params = {"layers": [{"w": jnp.eye(d) * 0.5} for _ in range(n_layers)]}
    state = {"params": params, **({"mu": jax.tree.map(jnp.zeros_like, params)} if opt else {})}
    x = jnp.ones((batch, d))

    def loss(params, x):
        for i, p in enumerate(params["layers"]):
            fun = functools.partial(lambda p, x: jnp.tanh(x @ p["w"]), p)
            if compiled is None:
                with module_scope(f"layers.{i}"):
                    x = fun(x)
            else:
                x = call_module(compiled, f"layers.{i}", fun, x)
        return x.sum()

    def step(state, x):
        value, g = jax.value_and_grad(loss)(state["params"], x)
        new = dict(state, params=jax.tree.map(lambda w, g: w - 0.1 * g, state["params"], g))
        if opt:
            new["mu"] = jax.tree.map(lambda m, g: 0.9 * m + g, state["mu"], g)
        return new, value

    t = MeasureTarget(loss, (params, x), step, (state, x), compiled)
    roles = ["optimizer" if p[0].key == "mu" else "params"
             for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    return t if plan is None or not placed else with_state(t, plan, roles, fetches=False)
'''


def _state_config(tmp_path: Path) -> Path:
    (tmp_path / "t.py").write_text(_STATE_TARGET)
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\nplans: {none: null}\n")
    return cfg


@pytest.mark.tooling  # the tuner's search
@needs_report
@pytest.mark.parametrize("size, why", [
    ("opt=false", r"the target's training state holds no optimizer state \(optimizer state 0 B, "
                  r"parameters 2\.00 KiB, other 0 B\)"),
    ("placed=false", r"the target's step does not put its training state where a plan's state: "
                     r"says \(its MeasureTarget carries no state: .*with_state\)"),
])
def test_tune_state_optimizer_without_optimizer_state_is_refused(tmp_path, capsys, size, why):
    """`--state optimizer` on a target with no optimizer state (or one that ignores a plan's
    state:) exited 0 with a plan whose state: changed nothing, its transfer priced."""
    cfg = _state_config(tmp_path)
    code, out, err = _cli(["tune", str(cfg), "--budget", "1GiB", "--no-progress", "--state",
                           "optimizer", "--size", size], capsys)
    said = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, err
    assert re.search(r"remat tune: error: remat_common\.tune: every plan keeps optimizer state on "
                     r"host \(pinned_host\), parameters on device between steps \(state: "
                     rf"\{{optimizer: host, params: device\}}\), but {why}: nothing would move to "
                     r"host, and the search would price a transfer that cannot happen .*Fix: "
                     r"search with the state on device \(state='device'; remat tune --state "
                     r"device\)", said), said
    assert "state:" not in out  # no plan written
    code, out, _ = _cli(["tune", str(cfg), "--budget", "1GiB", "--no-progress", "--state",
                         "optimizer", "--size", "opt=true"], capsys)  # the fix: the state it has
    assert code == 0 and "state: {optimizer: host, params: device}" in out
    assert "state on host 2.00 KiB to the device and back per step" in out


@pytest.mark.tooling  # the tuner's search
@needs_report
def test_tune_state_auto_skips_a_placement_the_target_cannot_take_and_says_so(tmp_path, capsys):
    code, out, err = _cli(["tune", str(_state_config(tmp_path)), "--budget", "1KiB",
                           "--no-progress", "--state", "auto"], capsys)
    said = " ".join(out.split())
    assert code == 1, err  # nothing fits 1 KiB, under any placement
    assert re.search(r"state optimizer \(optimizer state on host \(pinned_host\), parameters on "
                     r"device\): not searched: the target's training state holds no optimizer "
                     r"state", said), said


# -- scripts/capacity_check ----------------------------------------------------------------------
_MEMINFO = pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="reads /proc/meminfo")


@pytest.mark.tooling  # the check's argument checks, which load the examples' models
@pytest.mark.parametrize("argv, match", [
    (["--host-memory", "lots"], r"argument --host-memory: size 'lots': not a number with a unit\. "
                                r"Give bytes or a number with a unit: 12GiB"),  # was a traceback
    (["--start", "0"], r"argument --start: 0 is not a positive integer; give 1 or more"),  # was 1
    (["--budget", "-1"], r"argument --budget: size '-1': a size cannot be negative"),
    (["--json", ""], r"argument --json: an empty path names no file"),  # was: not written
    (["--check", ""], r"argument --check: an empty path names no file"),  # was: a search
    (["--kinds", "x"], r"--kinds 'x': unknown 'x'; allowed: 'a', 'b', 'c'"),  # was: nothing searched
    (["--states", "bogus"], r"--states 'bogus': unknown 'bogus'; allowed: 'optimizer', 'both'"),
    (["--examples", "nope"], r"--examples 'nope': unknown 'nope'; allowed: 'nnx_gpt', 'eqx_gpt'"),
    (["--quick", "--start", "9"], r"--most 4 is below --start 9: nothing would be tried"),
    (["--target", ""], r"^capacity_check: error: accelerator '': an empty name names no "
                       r"accelerator"),  # was: this machine
    (["--target", "v9z:1x1"], r"^capacity_check: error: accelerator 'v9z:1x1': unknown TPU "
                              r"generation 'v9z'"),
    # --quick replaced these without a word
    (["--quick", "--batch", "4", "--most", "8"], r"--quick sets --batch, --most itself \(a tiny "
                                                 r"model, for a CPU\) .* Fix: drop --batch --most, "
                                                 r"or --quick"),
    (["--json", "/dev/null/x.json"], r"--json '/dev/null/x.json': '/dev/null' is a file, not a "
                                     r"folder"),  # was: a traceback after the whole search
    (["--plans", "nope"], r"--plans nope \(nnx_gpt\): plan file '.*nope\.yaml' does not exist"),
    (["--profile", "nope"], r"--profile nope: profile 'nope' is neither a built-in profile"),
    (["--layout", "bogus"], r"argument --layout: invalid choice: 'bogus'"),  # was: a traceback
    (["--d-model", "100", "--n-heads", "8"], r"nnx_gpt at n_layers=1 \(from --start/--most\): "
                                             r".*n_heads must divide d_model"),  # a traceback
    pytest.param(["--host-memory", "1000TiB"], r"--host-memory: 1000.00 TiB is more than this "
                 r"machine can give: 90% of the .* it has available \(MemAvailable\)",
                 marks=_MEMINFO),  # its runs on a 40 GiB host with --host-memory 36GiB were killed
])
def test_capacity_check_refuses_its_arguments_at_once(argv, match, capsys):
    _refused_at_once("capacity_check", argv, match, capsys)


def _refused_at_once(check: str, argv: list[str], match: str,
                     capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (``remat_common.internal.capacity_check`` or ``device_check``, what the
    scripts run): refused with status 2 and one message, nothing done, and the signal handlers it
    set for its run given back. tests/test_capacity_check.py and tests/test_device_check.py run
    the scripts as processes (their exit statuses, their signals); a process each here cost ~3 s
    of CPU importing JAX and the examples again."""
    import signal

    import remat_common.internal

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = getattr(remat_common.internal, check)(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    assert out == ""  # nothing searched, nothing measured
    assert re.search(match, err, re.M), err
    assert {s: signal.getsignal(s) for s in handlers} == handlers


_SEARCH = {"where": "x", "compiler": "x", "batch": 2, "seq_len": 16, "grow": "n_layers", "step": 1,
           "base": {}, "rows": [{"example": "eqx_gpt", "kind": "b", "plan": "recompute"}]}


@pytest.mark.tooling  # the check's argument checks
@pytest.mark.parametrize("content, match", [
    (None, r"--check .*found\.json: no such file"),
    ("", r"--check .*: a directory; give the JSON file a --target search wrote"),
    ("nope", r"--check .*found\.json: not JSON \(JSONDecodeError: "),
    ("{}", r"lacks where, compiler, batch, seq_len, grow, step, base, rows: not the JSON of a "
           r"capacity_check search"),
    (json.dumps({**_SEARCH, "grow": "width"}), r"its grow, base or rows are not a search's"),
    (json.dumps(_SEARCH), r"row 0 lacks one of example, kind, plan, state, n_layers"),
])
def test_capacity_check_reads_its_check_file_before_any_work(tmp_path, content, match, capsys):
    """Each was a traceback (FileNotFoundError, IsADirectoryError, JSONDecodeError, KeyError)."""
    found = tmp_path / "found.json"
    if content is not None:
        found.write_text(content)
    _refused_at_once("capacity_check", ["--check", str(tmp_path if content == "" else found)],
                     match, capsys)


_NO_LIBTPU = importlib.util.find_spec("libtpu") is None


# -- scripts/device_check ---------------------------------------------------------------------------
@pytest.mark.tooling  # the script's argument checks, which load the examples' report configs
@pytest.mark.parametrize("argv, match", [
    # each was found in a child, after a measurement, or never
    (["--target", "v9z:1x1"], r"--target v9z:1x1: accelerator 'v9z:1x1': unknown TPU generation"),
    pytest.param(["--target", "v5e:1x1"], r"--target v5e:1x1: this machine cannot compile for tpu: "
                                          r"libtpu \(jax\[tpu\]\) is not installed\. Fix: install",
                 marks=pytest.mark.skipif(not _NO_LIBTPU, reason="libtpu is installed here")),
    (["--target", "local"], r"--target local: the device column is this machine's already"),
    (["--steps", "0"], r"argument --steps: 0 is not a positive integer; give 1 or more"),
    (["--warmup", "-1"], r"argument --warmup: -1 is negative; give 0 or more"),
    (["--budget-s", "nan"], r"argument --budget-s: nan: give 0 or more seconds"),
    (["--examples", "nope"], r"--examples nope: neither an example \(nnx_gpt, eqx_gpt\) nor a "
                             r"report config file"),
    (["--plans", "nope"], r"report\.yaml: no plan\(s\) named 'nope'; plans: 'default'"),
    (["--plan-file", "tuned"], r"--plan-file tuned: not NAME=FILE \(tuned=tuned\.yaml\)"),
    (["--plan-file", "t=/nonexistent/p.yaml"], r"--plan-file t=/nonexistent/p\.yaml: plan file "
                                               r"'/nonexistent/p\.yaml' does not exist"),
    (["--size", "bogus"], r"--size 'bogus': expected KEY=VALUE"),
    (["--profile", "nope"], r"--profile nope: profile 'nope' is neither a built-in profile"),
    (["--json", "/dev/null/x.json"], r"--json '/dev/null/x\.json': '/dev/null' is a file, not "
                                     r"a folder"),
    pytest.param(["--host-memory", "1000TiB"], r"--host-memory: 1000\.00 TiB is more than this "
                 r"machine can give", marks=_MEMINFO),
])
def test_device_check_refuses_its_arguments_before_any_work(argv, match, capsys):
    _refused_at_once("device_check", argv, match, capsys)


# -- a figure's parts never exceed the whole ----------------------------------------------------------
def _v5e_like() -> Any:
    """The breakdown `remat report examples/nnx_gpt/report.yaml --accelerator v5e:1x1` read at a
    tiny size: 107.51 KiB in the buffer assignment's rows, 85.50 KiB of them allocator slack,
    where XLA:TPU's memory_analysis() (its heap peak) gave 25.00 KiB."""
    from remat_common.measurement import MemoryBreakdown, PeakRow, Timeline

    return MemoryBreakdown((
        PeakRow("parameter", "blocks", "kernel", 8192), PeakRow("optimizer state", "blocks",
                                                                "kernel (mu)", 4096),
        PeakRow("saved residual", "blocks.0", None, 10248),
        PeakRow("unwritten output", None, None, 0),
        PeakRow("allocator slack", None, None, 87552, "no live value")), Timeline((), (), None, 0),
        compiler="tpu")


def test_a_compiler_peak_below_the_rows_is_a_line_not_a_negative_row():
    """Was: "compiled peak 25.00 KiB", then "largest: allocator slack 85.50 KiB" (a part 3.4x
    the whole), the JSON balanced by a "compiler accounting" row of -84,488 B."""
    b = _v5e_like().reconciled(25600)
    assert all(r.bytes >= 0 for r in b.rows) and "compiler accounting" not in b.by_kind()
    assert b.total == b.peak == 25600 and b.over == 0
    assert b.taken == (("allocator slack", 84488),) and b.by_kind()["allocator slack"] == 3064
    fit = b.will_it_fit(2**30)
    assert fit.peak == 25600 == sum(v for _, v in fit.parts)
    assert all(v <= fit.peak for _, v in fit.parts) and all(v <= fit.peak for *_, v in fit.largest)
    lines = fit.lines()
    assert lines[0] == "compiled peak 25.00 KiB fits 1.00 GiB with 1023.98 MiB to spare"
    assert lines[2] == ("  the compiler's memory_analysis() peak, 25.00 KiB (what XLA accepts or "
                        "refuses the program by), is 82.51 KiB below what XLA's buffer assignment "
                        "holds at its peak (107.51 KiB): its heap leaves out 82.51 KiB of "
                        "allocator slack, bytes allocated that hold no live value at the peak, so "
                        "the rows leave them out too.")
    assert lines[3] == ("  largest: saved residual blocks.0 10.01 KiB; parameter 8.00 KiB; "
                        "optimizer state 4.00 KiB")
    assert b.reconciled(25600) == b and b.reconciled(None) == b  # once
    again = b.reconciled(200_000)  # another peak: from the buffer assignment's own rows
    assert again.taken == () and again.by_kind()["allocator slack"] == 87552
    assert again.rows[-1].kind == "compiler accounting" and again.rows[-1].bytes == 200_000 - 110088
    assert again.accounting() is None and again.reconciled(25600) == b


def test_live_bytes_beyond_the_compiler_peak_are_their_own_whole():
    b = _v5e_like().reconciled(10000)  # below even the live bytes (22,536)
    assert all(r.bytes >= 0 for r in b.rows)
    assert (b.peak, b.total, b.over) == (10000, 22536, 12536)
    fit = b.will_it_fit(2**30)
    assert fit.peak == 10000 and sum(v for _, v in fit.parts) == b.total
    lines = fit.lines()
    assert lines[1].startswith("  the rows' 22.01 KiB: parameters 8.00 KiB + optimizer state ")
    assert lines[2].endswith("the values live at the buffer assignment's peak are 12.24 KiB more "
                             "than the compiler's peak (its heap holds them at other times, or in "
                             "less memory), so the rows sum to 22.01 KiB, the whole they are parts "
                             "of.")


def test_a_report_states_the_compilers_accounting_in_its_notes_table_and_json():
    import dataclasses

    from remat_common.measurement import PeakRow, Report, render_text

    rep = Report.from_json(_report_json())
    p = rep.plans[0]
    peak = p.breakdown.total
    b = dataclasses.replace(p.breakdown, rows=(*p.breakdown.rows, PeakRow(
        "allocator slack", None, None, 3 * peak))).reconciled(peak)
    rep = dataclasses.replace(rep, plans=(dataclasses.replace(p, breakdown=b), *rep.plans[1:]))
    text = render_text(rep, width=400)
    assert "none: peak by kind: the compiler's memory_analysis() peak, 11.00 MiB (what XLA " \
           "accepts or refuses the program by), is 33.00 MiB below what XLA's buffer assignment " \
           "holds at its peak (44.00 MiB)" in text
    assert not re.search(r"allocator slack .*0 B", text) and "-" not in "".join(
        ln for ln in text.splitlines() if ln.startswith("│ compiler accounting"))
    data = rep.to_json()["plans"][0]["breakdown"]
    assert data["taken"] == [["allocator slack", 3 * peak]] and data["over"] == 0
    assert data["accounting"] == b.accounting()
    assert Report.from_json(json.loads(json.dumps(rep.to_json()))) == rep  # reads back


def test_a_report_written_with_a_negative_accounting_row_reads_as_a_line():
    from remat_common.measurement import Report

    data = _report_json()
    rows = data["plans"][0]["breakdown"]["rows"]
    total = sum(r["bytes"] for r in rows)
    rows += [{"kind": "allocator slack", "module": None, "name": None, "bytes": 3000},
             {"kind": "compiler accounting", "module": None, "name": None, "bytes": -2000}]
    b = Report.from_json(data).plans[0].breakdown  # as a report of the round before wrote it
    assert b.peak == b.total == total + 1000 and b.taken == (("allocator slack", 2000),)
    assert all(r.bytes >= 0 for r in b.rows) and b.accounting()


@pytest.mark.parametrize("edit, match", [
    (lambda b: b.update(taken=[["parameter", 5]]), r"breakdown\.taken is \[\['parameter', 5\]\], "
                                                   r"but it must be a list of \[kind, bytes\]"),
    (lambda b: b.update(taken=[["allocator slack", -5]]), r"breakdown\.taken is"),
    (lambda b: b.update(over=-1), r"breakdown\.over is -1, but it must be a non-negative integer"),
])
def test_a_breakdowns_accounting_fields_are_checked_at_read_time(edit, match):
    from remat_common.measurement import Report, ReportFormatError

    data = _report_json()
    edit(data["plans"][0]["breakdown"])
    with pytest.raises(ReportFormatError, match=rf"plans\[0\]\.{match}"):
        Report.from_json(data)
