"""``remat_common.tune`` and ``remat tune``: never over budget, as good as an exhaustive search.

Compiles are the cost here (about 3 s each on a 2-core CPU), so one module-level cache of
compiled figures is shared: the exhaustive search compiles every plan of its space once and each
tuning run takes what it needs from it (compiled figures are deterministic), counting only new
compiles. The space (every multiset of three choices over three layers, each in the layer order
with the smallest peak; why that is exhaustive: ``fixtures/tune_space.py``) is the NNX GPT's list
layout here; the Equinox GPT and the scanned layouts are in ``tests/test_tune_layouts.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("rich")

from fixtures.tune_space import CHOICES, TINY, budgets, check_tuned, config  # noqa: E402
from fixtures.tune_space import space as compiled_space  # noqa: E402
from versions import BACKWARD_TEMPS_SET_THE_PEAK, SHOW_REMAT  # noqa: E402
import remat_common  # noqa: E402
from remat_common import Plan, RematError  # noqa: E402
from remat_common.internal import NoFit, fmt_bytes, main  # noqa: E402
from remat_common.measurement import TuneResult, capacity, compiler_identity, parse_bytes  # noqa: E402

# Tooling (the tuner's search and CLI): slow, marked `tooling` (`-m "not tooling"` leaves it out of a
# quick local run); every stage of scripts/test runs it.
pytestmark = [pytest.mark.tooling, pytest.mark.usefixtures("standard_promotion")]


ROOT = Path(__file__).resolve().parents[1]
#: The best plan at full recompute's peak: recompute, recompute, save (the last layer's residuals
#: are consumed first). On jax 0.11.0 (versions.BACKWARD_TEMPS_SET_THE_PEAK) every plan that keeps
#: at most one layer peaks alike there, and the cheapest of them in FLOPs keeps the matmul outputs
#: of two layers and everything of the last.
AT_RECOMPUTES_PEAK = (("dots_no_batch", "dots_no_batch", "save") if BACKWARD_TEMPS_SET_THE_PEAK
                      else ("recompute", "recompute", "save"))


def tune(*args: Any, **kwargs: Any) -> TuneResult:
    """``remat_common.tune`` compiling as the shared space was compiled: with ``SHOW_REMAT``
    (jax 0.11.0's CPU: CSE off, which would merge each recomputation back; nothing elsewhere)."""
    return remat_common.tune(*args, compiler_options=SHOW_REMAT, **kwargs)


@pytest.fixture(scope="module")
def space(standard_promotion: None) -> tuple[Any, dict[str, Any], TuneResult]:
    """The NNX GPT (3 layers, list layout) with every plan of the space compiled once, with
    ``SHOW_REMAT``: (builder, cache, result)."""
    return compiled_space("nnx_gpt", "list", SHOW_REMAT)


def test_budget_parsing() -> None:
    assert parse_bytes("12GiB") == 12 * 2**30
    assert parse_bytes("800MiB") == 800 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes(" 4096 ") == parse_bytes(4096) == 4096
    assert parse_bytes("2k") == 2048
    with pytest.raises(RematError, match=r"(?s)budget '12XB': unknown unit 'XB'.*12GiB, 800MiB"):
        parse_bytes("12XB")
    with pytest.raises(RematError, match="cannot be negative"):
        parse_bytes("-1GiB")
    with pytest.raises(RematError, match="cannot be negative"):
        parse_bytes(-5)
    with pytest.raises(RematError, match="at least one byte"):
        parse_bytes("0")
    with pytest.raises(RematError, match="at least one byte"):
        parse_bytes(0)
    with pytest.raises(RematError, match="not a number with a unit"):
        parse_bytes("lots")
    with pytest.raises(RematError, match="not a size"):
        parse_bytes(True)


def test_tuned_plans_fit_and_match_the_exhaustive_search(space: Any) -> None:
    """At five budgets from full recompute's peak to save-all's: within the budget, within 2% of
    the best plan of the space (``fixtures/tune_space.py``), no worse than a uniform plan. At
    the smallest budget only full recompute and recompute, recompute, save (the last layer kept:
    its residuals are consumed first) fit; the tuned plan is the second, 7% cheaper (jax 0.11.0:
    :data:`AT_RECOMPUTES_PEAK`; compiled without the CSE that merges recomputation back there)."""
    build, cache, everything = space
    results = check_tuned(build, cache, everything, SHOW_REMAT)
    assert results[0].best is not None
    assert results[0].best.assignment == AT_RECOMPUTES_PEAK


def test_budget_at_save_all_gives_save_all(space: Any) -> None:
    build, cache, everything = space
    r = tune(build, everything["save"].peak, choices=CHOICES, cache=cache)
    assert r.chosen == "save" and r.compiles == 0
    assert r.yaml().endswith('rules:\n  "blocks.*": save\n')


def test_nothing_fits_says_the_smallest_peak(space: Any) -> None:
    """Below every plan of the space, nothing fits: the message names the smallest peak and what
    it would take. That peak is a searched plan's (the last layer saved, 9.86 MiB), below every
    uniform plan's: where nothing fits, the search compiles the plan it predicts smallest."""
    build, cache, everything = space
    smallest = min(p.peak for p in everything.points)
    r = tune(build, smallest - 1, choices=CHOICES, cache=cache)
    assert r.plan is None and r.best is None and r.yaml() == ""
    assert r.message.startswith(f"nothing fits {fmt_bytes(smallest - 1)}")
    assert f"smallest compiled peak is {fmt_bytes(smallest)}" in r.message
    assert f"It would take a budget of at least {fmt_bytes(smallest)}, or a smaller batch" in r.message
    assert r.smallest_peak.peak == smallest and r.smallest_peak.source == "search"
    # what holds the most at that peak, read from its buffer assignment
    top = r.smallest_peak.dominant
    assert len(top) == 3 and top[0][2] >= top[1][2] >= top[2][2] > 0
    assert f"At that peak the most is held by: {top[0][0]}" in r.message
    uniform = min(p.peak for p in r.points if p.source == "uniform")
    assert smallest == uniform if BACKWARD_TEMPS_SET_THE_PEAK else smallest < uniform


def test_compile_and_time_limits_stop_the_search(space: Any) -> None:
    """``max_compiles`` and ``time_limit`` end the search where they are reached, say so in the
    notes, and the result is the best compiled plan so far, never over budget. With only the
    uniform plans cached, at full recompute's peak: one compile is save's one-layer delta, and
    the search stops before the candidate it would try (recompute, recompute, save); an expired
    time limit compiles nothing."""
    build, cache, everything = space
    budget = budgets(everything)[0]
    keys = {json.dumps(p.plan, sort_keys=True) for p in everything.points if p.source == "uniform"}
    uniform = {k: v for k, v in cache.items() if k in keys}
    r = tune(build, budget, choices=CHOICES, cache=dict(uniform), max_compiles=1)
    assert r.compiles == 1 and [p.name for p in r.points] == [
        "save", "dots_no_batch", "recompute", "savex1"]
    assert "the search stopped at the limit (1 compiles)." in r.notes
    # the cheapest uniform plan that fits: full recompute, the only one (jax 0.11.0: dots_no_batch,
    # which peaks alike there)
    first = min((p for p in r.points if p.source == "uniform" and p.fits(budget)),
                key=lambda p: p.cost).name
    assert first == ("dots_no_batch" if BACKWARD_TEMPS_SET_THE_PEAK else "recompute")
    assert r.chosen == first and r.best is not None and r.best.peak <= budget
    late = tune(build, budget, choices=CHOICES, cache=dict(uniform), time_limit=1e-9)
    assert late.compiles == 0 and late.chosen == first
    assert "the search stopped at the limit (0 compiles, 1e-09 s)." in late.notes
    full = tune(build, budget, choices=CHOICES, cache=cache)  # no limit: the candidate fits
    assert full.best is not None and full.best.peak <= budget and full.best.cost < r.best.cost
    assert full.best.assignment == AT_RECOMPUTES_PEAK


def test_frontier_json_and_plot(space: Any, tmp_path: Path) -> None:
    build, cache, everything = space
    r = tune(build, budgets(everything)[1], choices=CHOICES, cache=cache)
    front = r.frontier()
    assert [p.peak for p in front] == sorted(p.peak for p in front)
    assert all(a.cost > b.cost for a, b in itertools.pairwise(front))
    assert r.chosen in {p.name for p in front}
    data = json.loads(json.dumps(r.to_json()))
    assert data["format"] == "remat-tune/1" and data["chosen"] == r.chosen
    assert data["frontier"] == [p.name for p in front]
    assert r.plot(tmp_path / "f.png").stat().st_size > 0


def test_time_objective_with_a_profile(space: Any, tmp_path: Path) -> None:
    build, cache, everything = space
    r = tune(build, budgets(everything)[3], choices=CHOICES, cache=cache, profile="h100")
    assert r.objective == "time" and r.profile is not None and r.profile.name == "h100"
    assert r.best is not None and r.best.cost == pytest.approx(r.best.flops / 989.4e12)
    custom = tmp_path / "gpu.yaml"
    custom.write_text("base: h100\nname: slow\nflops_per_s: 1.0e12\nhbm_bytes: 24GiB\n")
    r2 = tune(build, budgets(everything)[3], choices=CHOICES, cache=cache, profile=str(custom))
    assert r2.profile is not None and r2.profile.hbm_bytes == 24 * 2**30
    assert r2.profile.host_link_bytes_per_s == 64e9
    with pytest.raises(RematError, match="neither a built-in profile nor a YAML file"):
        tune(build, "1GiB", profile="a100-typo")
    with pytest.raises(RematError, match="unknown choice"):
        tune(build, "1GiB", choices=["dots_no_batchh"], cache=cache)


def test_measure_times_the_best_candidates(space: Any) -> None:
    """``measure=2``: the two cheapest compiled plans under the budget are compiled again by
    ``measure`` (tune checks that they compile to the same peak) and timed side by side; the
    chosen one is the faster, and on CPU the notes say what the times are worth. An extra plan
    (``--plans``, a preset to beat) that fits is timed too, however it ranks: the plan chosen
    is never slower than it as measured."""
    build, cache, everything = space
    budget = budgets(everything)[2]
    full = {"blocks.*": "recompute"}  # the costliest: uniform recompute, named by the user
    r = tune(build, budget, choices=CHOICES, cache=cache, measure=2, measure_steps=2,
             plans={"baseline": full})
    times = dict(r.step_times)
    fitting = sorted((p for p in r.points if p.fits(budget)), key=lambda p: (p.cost, p.peak))
    assert r["baseline"].fits(budget) and "baseline" not in [p.name for p in fitting[:2]]
    assert list(times) == [p.name for p in fitting[:2]] + ["baseline"]
    assert all(t > 0 for t in times.values())
    assert r.chosen == min(times, key=lambda n: (times[n], r[n].cost))
    assert r.best is not None and r.best.peak <= budget and r.best.problems == ()
    assert r.compiles >= 2  # the two timed plans are compiled again to run
    assert "median step" in r.message and r.to_json()["step_times"] == times
    assert any("do not represent" in n for n in r.notes)
    # a readable plan: a glob for the most common choice, ranges for the rest
    assert r.best.plan is not None and list(r.best.plan)[0] == "blocks.*"
    with pytest.raises(RematError, match="measure must be an integer >= 0, got int -1"):
        tune(build, budget, cache=cache, measure=-1)


def test_capacity_finds_the_largest_batch(space: Any) -> None:
    _, _, everything = space
    cfg = config("nnx_gpt")
    budget = everything["save"].peak  # batch 8 fits exactly under save-all
    rows = capacity(lambda b: cfg.with_sizes({"batch": b}).builder(), budget,
                    {"save": {"blocks.*": "save"}}, start=8, step=4, known={"save": budget},
                    compiler_options=SHOW_REMAT)
    (row,) = rows
    assert row.largest == 8 and row.peak == budget and row.compiles == 2  # 16, then 12 (8 known)
    assert row.next == 12 and row.next_peak is not None and row.next_peak > budget
    # known not to fit at the start (XLA rematerialized it there), the smallest step: no compile
    (row,) = capacity(lambda b: cfg.with_sizes({"batch": b}).builder(), budget,
                      {"save": {"blocks.*": "save"}}, start=4, step=4,
                      known={"save": NoFit(budget + 1, "XLA rematerialized on its own: ...")})
    assert (row.largest, row.peak, row.compiles) == (0, None, 0), row
    assert (row.next, row.next_peak, row.next_why) == (4, budget + 1,
                                                       "XLA rematerialized on its own: ..."), row
    with pytest.raises(RematError, match="positive multiple of step"):
        capacity(lambda b: cfg.builder(), budget, {"save": None}, start=3, step=2)


@pytest.mark.parametrize("plan_file", ["plan.yaml", "plan.json"])  # --out in the format it names
def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], plan_file: str) -> None:
    cfg = ROOT / "examples" / "nnx_gpt" / "report.yaml"
    size = ["--size", *(f"{k}={v}" for k, v in TINY.items())]
    out, js = tmp_path / plan_file, tmp_path / "t.json"
    rc = main(["tune", str(cfg), *size, "--budget", "1TiB", "--choices", "recompute",
               "--max-compiles", "1", "--no-progress", "--out", str(out), "--json", str(js)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "save fits 1.00 TiB" in text and f"remat tune: blocks ({TINY['n_layers']} layers)" in text
    assert Plan.load(out) == Plan.from_mapping({"blocks.*": "save"})
    data = json.loads(js.read_text())
    assert data["chosen"] == "save" and [p["name"] for p in data["points"]] == ["save"]
    assert "save-all fits 1.00 TiB" in " ".join(data["notes"])  # one compile: nothing else
    here = compiler_identity()  # the compiler whose peaks decided, named in each output
    assert data["compiler"] == here.to_json() and f"peaks compiled by {here.describe()}." in text
    assert f"# compiled by {here.describe()}." in text


@pytest.mark.parametrize("budget", ["12XB", "-1GiB", "0"])
def test_cli_refuses_bad_budgets(budget: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["tune", "examples/nnx_gpt/report.yaml", f"--budget={budget}"])
    assert e.value.code == 2
    assert f"budget {budget!r}" in capsys.readouterr().err


def test_a_profile_calibrated_by_measured_steps_is_written_and_read_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``remat tune --measure --profile NAME --profile-out FILE``: the profile with the FLOP rate
    fitted to the measured steps (its host link and memory kept), as a YAML file that
    ``--profile FILE`` (``load_profile``) reads back whole; without ``--profile`` it is refused."""
    from remat_common.internal import main
    from remat_common.measurement import data_sheet_note, fit_profile, load_profile

    out = tmp_path / "calibrated.yaml"
    sizes = ["--size", "n_layers=1", "d_model=32", "n_heads=2", "seq_len=16", "batch=2", "vocab=64"]
    tune_args = ["tune", "example:nnx_gpt", "--budget", "1GiB", "--measure", "1",
                 "--measure-steps", "2", "--choices", "recompute", "--no-progress", *sizes]
    assert main([*tune_args, "--profile-out", str(out)]) == 2
    assert re.search(r"--profile-out .* Fix: add --profile NAME", capsys.readouterr().err)
    assert main([*tune_args, "--profile", "h100", "--profile-out", str(out),
                 "--json", str(tmp_path / "t.json")]) == 0
    said = capsys.readouterr().out
    result = json.loads((tmp_path / "t.json").read_text())
    (name, seconds), = result["step_times"].items()
    point = next(p for p in result["points"] if p["name"] == name)
    want, (err,) = fit_profile(load_profile("h100"),
                               [(point["flops"], 2 * point["host_bytes"], seconds)])
    got = load_profile(str(out))
    assert got == want and got.name == "h100-fitted" and abs(err) < 1e-9
    assert got.hbm_bytes == load_profile("h100").hbm_bytes
    assert f"fitted profile h100-fitted: {got.flops_per_s / 1e12:.4g} TFLOP/s" in said
    # the data sheet's profile says it is uncalibrated and how to calibrate it; the fitted one not
    assert "note: the h100 profile is its data sheet's, not calibrated on a device" in said
    assert "--profile h100 --profile-out FILE.yaml" in said
    assert data_sheet_note(got) is None and data_sheet_note(load_profile("v5e")) is not None


def test_a_program_xla_rematerialized_fits_as_compiled_only_where_accepted() -> None:
    """A plan XLA:TPU's own rematerialization pass brought under the device memory (MaxText's
    ``minimal`` for Qwen3 at batch 32 on a v5e: 15.20 GiB compiled, and the fastest step there)
    fits by default only where its peak plus every value the pass recomputes is within the
    budget; with ``accept_xla_remat`` (``remat tune --accept-xla-remat``) the compiled peak, the
    program that runs, decides."""
    said = "... recomputes 12 instructions (4 fusion), 2048.00 MiB of values, in ..."
    point = remat_common.measurement.TunePoint("minimal", {"layers.*": "save"}, None, 15 << 30,
                                               False, 0, 0, 1.0, 1.0, xla_remat=said)
    assert not point.fits(16 << 30) and point.fits(17 << 30)  # 15 GiB + 2 GiB of values
    accepted = dataclasses.replace(point, xla_remat_accepted=True)
    assert accepted.fits(16 << 30) and not accepted.fits((15 << 30) - 1)
    assert not dataclasses.replace(accepted, problems=("a residual",)).fits(16 << 30)


def test_a_plan_the_device_cannot_run_to_time_is_left_out_of_the_choice(
        space: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator each timed plan is measured on its own, so one the device runs out of
    memory for (a TPU v5e's runtime, loading a fourth plan's program after three had run) leaves
    the others' times: it is named in the notes and not chosen. Here JAX's backend is said to
    be a TPU's and the second cheapest plan's step raises the runtime's error when it is built
    to be timed (a first search fills the cache: the second builds only the timed plans)."""
    import jax

    build, cache, everything = space
    budget = budgets(everything)[2]
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    searched = tune(build, budget, choices=CHOICES, cache=cache)
    fitting = sorted((p for p in searched.points if p.fits(budget)), key=lambda p: (p.cost, p.peak))
    first, second = fitting[0], next(p for p in fitting if p.plan != fitting[0].plan)

    def step_out_of_memory(*args: Any) -> Any:
        raise RuntimeError("RESOURCE_EXHAUSTED: E0101: RuntimeProgramAllocationFailure: Error "
                           "loading program 'jit_step'")

    def builder(plan: Any) -> Any:
        target = build(plan)
        if plan is not None and plan == remat_common.Plan.from_mapping(second.plan):
            return dataclasses.replace(target, step_fn=step_out_of_memory)
        return target

    r = tune(builder, budget, choices=CHOICES, cache=cache, measure=2, measure_steps=1)
    assert list(dict(r.step_times)) == [first.name] and r.chosen == first.name
    (note,) = [n for n in r.notes if "was not timed" in n]
    assert note.startswith(f"plan {second.name!r} was not timed: the device ran out of memory")
    assert "RuntimeProgramAllocationFailure" in note and "Fix:" in note
