"""A plan's ``state:`` in the report and the tuner: the examples' measure targets compile the step
with the host parts of the training state as ``pinned_host`` arguments (the program that trains),
the report counts them apart (host argument bytes, transfer bytes and seconds per step), the
device peak and "will it fit" leave them out, the JSON round-trips them, and the tuner chooses
state on host only when nothing with the state on device fits.

On CPU the compiler drops the host placements (its memory figures count the state as device
arguments): the figures say so (``counted_on_device``) and the device peak is its total less the
host bytes; compiled for a TPU v5e chip with no device, the compiler's own figures hold them on
host (the target stage).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import remat_common as rc
from remat_common.measurement import Report, compiler_available, measure, render_text

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the examples are not an installed package
    sys.path.insert(0, str(REPO))

from examples.eqx_gpt import model as eqx_model  # noqa: E402
from examples.nnx_gpt import model as nnx_model  # noqa: E402

EXAMPLES = {"nnx_gpt": nnx_model, "eqx_gpt": eqx_model}
SIZES = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16, vocab=64)
RULES = {"blocks.*": "recompute"}
PLANS = {"device": rc.Plan.from_mapping(RULES),
         "opt_host": rc.Plan.from_mapping(RULES, state={"optimizer": "host"}),
         "all_host": rc.Plan.from_mapping(RULES, state={"optimizer": "host", "params": "host"})}
pytestmark = pytest.mark.usefixtures("standard_promotion")


def _build(model: Any, plan: rc.Plan | None, sizes: dict[str, Any] = SIZES, **kw: Any) -> Any:
    return model.measure_target(plan, batch=2, **sizes, **kw)


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def cpu_report(request: pytest.FixtureRequest, standard_promotion: None) -> tuple[str, Report]:
    model = EXAMPLES[request.param]
    return request.param, measure(lambda p: _build(model, p), PLANS, steps=1, warmup=0)


@pytest.mark.tooling  # remat report's state figures: the jax 0.11.2 stage only
@pytest.mark.cpu_figures(
    "XLA:CPU drops host placements and counts the host parts unpadded; the v5e "
    "tests of this file compile the same steps for a TPU")
def test_report_counts_state_on_host_apart(cpu_report: tuple[str, Report]) -> None:
    name, rep = cpu_report
    model = EXAMPLES[name]
    sizes = _build(model, None).state_bytes
    assert sizes is not None and sizes["optimizer"] > sizes["params"] > 0
    dev, opt, both = rep["device"], rep["opt_host"], rep["all_host"]
    assert dev.state is None
    assert opt.state is not None and both.state is not None
    # every byte of the host parts, none of the others (the step counts are scalars)
    assert sizes["optimizer"] - 64 <= opt.state.host_argument_bytes <= sizes["optimizer"]
    assert both.state.host_argument_bytes == pytest.approx(
        sizes["optimizer"] + sizes["params"], abs=64)
    assert opt.state.transfer_bytes == 2 * opt.state.host_argument_bytes
    assert opt.state.transfer_s == pytest.approx(
        opt.state.transfer_bytes / opt.state.link_bytes_per_s)
    # XLA:CPU drops the placements: the compiled totals are the same program's, the device peak
    # leaves the host parts out
    assert opt.state.counted_on_device and dev.memory.host_argument_size_in_bytes == 0
    assert opt.device_peak == opt.memory.device_total - opt.state.host_argument_bytes
    assert both.device_peak < opt.device_peak < dev.device_peak  # type: ignore[operator]
    text = render_text(rep, width=220)
    assert "state on host" in text and "MiB over the host link per step" in text
    # the step runs with the state in host memory and is timed
    assert opt.timing.steps and opt.problems == ()


@pytest.mark.tooling  # remat report's state figures: the jax 0.11.2 stage only
def test_state_figures_round_trip_the_json(cpu_report: tuple[str, Report], tmp_path: Path) -> None:
    _, rep = cpu_report
    back = Report.load(rep.save(tmp_path / "r.json"))
    assert back["all_host"].state == rep["all_host"].state
    assert back["all_host"].device_peak == rep["all_host"].device_peak
    assert back["device"].state is None
    data = rep.to_json()
    data["plans"][1]["state"]["host_argument_bytes"] = -1
    with pytest.raises(rc.RematError, match="state"):
        Report.from_json(data)


@pytest.mark.tooling  # remat report's state figures: the jax 0.11.2 stage only
@pytest.mark.cpu_figures(
    "XLA:CPU drops host placements and counts the host parts unpadded; the v5e "
    "tests of this file compile the same steps for a TPU")
def test_will_it_fit_leaves_host_state_out(cpu_report: tuple[str, Report]) -> None:
    _, rep = cpu_report
    both = rep["all_host"]
    assert both.breakdown is not None and both.state is not None
    fit = both.breakdown.will_it_fit(both.device_peak or 0, both.state.host_argument_bytes)
    assert fit.peak == both.device_peak and fit.fits
    assert not both.breakdown.will_it_fit(both.device_peak or 0).fits
    # the renderer's answer, what `remat report --budget` prints: the plan fits, its state named
    from remat_common.measurement import fit_lines, render_text

    lines = fit_lines(rep, both.device_peak or 0)
    mine = lines[lines.index(next(x for x in lines if x.startswith("will all_host fit?"))):]
    assert mine[0].startswith("will all_host fit? compiled peak") and " fits " in mine[0], lines
    assert mine[1].startswith("  state on host, not device memory: "), lines
    assert render_text(rep, budget=both.device_peak or 0).endswith("\n".join(lines) + "\n")


# -- compiled for a TPU v5e chip with no device: the compiler holds the state on host ----------

_tpu_missing = compiler_available("tpu")
needs_tpu = pytest.mark.skipif(
    _tpu_missing is not None and not os.environ.get("REMAT_REQUIRE_TARGETS"),
    reason=f"{_tpu_missing} (./scripts/test's target stage)")


@needs_tpu
@pytest.mark.target
@pytest.mark.parametrize("name", ["eqx_gpt"])  # the NNX GPT's v5e compile: tests/test_host_state.py
def test_v5e_report_holds_the_state_on_host(name: str) -> None:
    model = EXAMPLES[name]
    big = dict(SIZES, d_model=128, seq_len=64, vocab=256)  # tiles pad little at these widths
    rep = measure(lambda p: _build(model, p, big, abstract=True), PLANS, steps=0,
                  accelerator="v5e:1x1", check_layouts=False)
    sizes = _build(model, None, big, abstract=True).state_bytes
    dev, opt, both = rep["device"], rep["opt_host"], rep["all_host"]
    pad = 1024 * 4  # XLA:TPU pads scalars (the step counts) to a tile
    for p, moved in ((opt, sizes["optimizer"]), (both, sizes["optimizer"] + sizes["params"])):
        assert p.state is not None and not p.state.counted_on_device
        assert moved <= p.memory.host_argument_size_in_bytes <= moved + pad
        assert p.state.host_argument_bytes == p.memory.host_argument_size_in_bytes
        # the state's moves are host placements the plan asked for: no problem, placed
        assert p.problems == () and p.placement is not None and p.placement.placed
        assert p.device_peak == p.memory.device_total  # the compiler's own device figures
        down = dev.memory.argument_size_in_bytes - p.memory.argument_size_in_bytes
        assert moved - pad <= down <= moved + pad
        assert p.state.link == "v5e:1x1" or "v5e" in p.state.link


# -- the tuner chooses the state placement beside the activation plan ---------------------------

@pytest.mark.tooling  # the tuner's search, as tests/test_tune*.py: the jax 0.11.2 stage only
def test_tuner_moves_state_to_host_only_when_nothing_else_fits(tmp_path: Path) -> None:
    from remat_common.measurement import tune_states

    model = EXAMPLES["nnx_gpt"]
    cache: dict[str, Any] = {}

    def go(budget: int, state: str = "auto", **kw: Any) -> Any:
        return tune_states(lambda p: _build(model, p), budget, state=state, cache=cache,
                           choices=["recompute"], max_compiles=8, **kw)

    # the smallest peak with the state on device: recompute every layer
    on_device = go(2**40, "device", stop_when_save_fits=False)
    assert on_device.plan is not None and on_device.state.is_default
    low = min(p.peak for p in on_device.points)
    # activations alone fit: the state stays on device
    fits = go(low)
    assert fits.plan is not None and fits.plan.state.is_default and fits.best is not None
    assert fits.best.state_host_bytes == 0 and "state:" not in fits.yaml()
    # below every on-device plan: the optimizer state goes to host, and the plan says so
    host = go(low - 1)
    assert host.plan is not None and host.best is not None
    assert host.plan.state.optimizer == "host" and host.plan.state.params == "device"
    assert host.best.peak <= low - 1 and host.best.state_host_bytes > 0
    assert "state: {optimizer: host, params: device}" in host.yaml()
    assert any("chose optimizer" in n for n in host.notes)
    back = rc.Plan.load(_write(tmp_path / "tuned.yaml", host.yaml()))
    assert back.state == host.plan.state
    # the transfers are priced: the same activation plan costs more with the state on host
    same = [p for p in on_device.points if p.plan == host.best.plan]
    assert not same or same[0].cost < host.best.cost


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@needs_tpu
@pytest.mark.target
def test_v5e_tuner_weighs_state_on_host_by_the_compilers_figures() -> None:
    """On the TPU compiler's own figures (no estimate): at the smallest on-device peak the state
    stays on device; below it the host placements are compiled, and host state is chosen exactly
    when one of their compiled peaks fits. (With the examples' step as it is, XLA:TPU holds the
    fetched optimizer state and its update in device temporaries: at these sizes the host
    placements compile to larger device peaks than the state on device, and nothing fits.)"""
    from remat_common.measurement import tune_states

    model = EXAMPLES["nnx_gpt"]
    big = dict(SIZES, d_model=128, seq_len=64, vocab=256)
    cache: dict[str, Any] = {}

    def go(budget: int, state: str = "auto", **kw: Any) -> Any:
        return tune_states(lambda p: _build(model, p, big, abstract=True), budget, state=state,
                           cache=cache, choices=["recompute"], max_compiles=8,
                           accelerator="v5e:1x1", **kw)

    on_device = go(2**34, "device", stop_when_save_fits=False)
    low = min(p.peak for p in on_device.points)
    fits = go(low)
    assert fits.plan is not None and fits.plan.state.is_default
    host = go(low - 1, "any")
    assert any("placements searched (device, optimizer, all" in n for n in host.notes)
    assert not any(p.estimated for p in host.points)
    assert all(p.state_host_bytes > 0 for p in host.points) == (not host.state.is_default)
    fitting = [p for p in host.points if p.fits(low - 1)]
    assert (host.plan is not None) == bool(fitting)
    if host.plan is not None:
        assert not host.plan.state.is_default and host.best is not None


@needs_tpu
@pytest.mark.target
def test_v5e_tuner_moves_on_where_the_compiler_refuses_the_state_on_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose training state alone is over the v5e chip's memory (1.26 B parameters,
    AdamW: 20 GB): XLA:TPU refuses every plan with the state on device, and the tuner goes on to
    the next placement instead of stopping there: the optimizer state on host; its notes say what
    the refused placement got. (It stopped with "none of the plans compiled could be used" before.)
    A refused compile leaves no dump folder behind (each left one in the temporary folder)."""
    import tempfile

    from remat_common.measurement import tune_states

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    sizes = dict(d_model=512, n_layers=400, n_heads=4, seq_len=128, vocab=256, layout="scan")
    result = tune_states(lambda p: _build(EXAMPLES["nnx_gpt"], p, sizes, abstract=True), None,
                         state="auto", choices=["recompute"], max_compiles=4,
                         accelerator="v5e:1x1")
    assert result.plan is not None and result.plan.state.optimizer == "host"
    assert result.best is not None and result.best.state_host_bytes > 0
    refused = [n for n in result.notes if "state device" in n]
    assert refused and "none of" in refused[0], result.notes
    assert not list(tmp_path.glob("remat-breakdown-*"))
