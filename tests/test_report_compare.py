"""``remat report --compare``: drift between two reports' compilers, plan by plan and figure by
figure (issue 50).

The pair compared is built from what is committed: the example GPT's figures on a TPU v5e compiled
by libtpu 0.0.42.1 (``docs/device_check/nnx_gpt-v5e-2026-12-05.json``), and the same with the
recompute plan's temp that libtpu 0.0.48 gave, 4,613.6 MiB (docs/targets.md: +24 %). No two files
of ``docs/device_check`` hold the same example, sizes and plans under both versions (they are
``scripts/device_check`` rows, not report JSONs), so the 0.0.48 side is constructed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.lock_only  # reports read from JSON and compared: no JAX

ROOT = Path(__file__).resolve().parents[1]

needs_report = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("rich", "matplotlib")),
    reason="remat report needs the 'report' extra, not installed here")

#: The recompute plan's temp on a TPU v5e under libtpu 0.0.48 (docs/targets.md), bytes.
TEMP_0048 = round(4613.6 * 2**20)


def _pair() -> tuple[Any, Any]:
    """``(old, new)`` reports: libtpu 0.0.42.1's compiled figures per plan (the committed device
    check's none, recompute, and default for the report's offload plan), and the same under
    libtpu 0.0.48.1 but the recompute plan's temp."""
    from remat_common.measurement import Compiler, Report

    base = Report.load(ROOT / "tests" / "data" / "target_offload_report.json")
    check = json.loads((ROOT / "docs" / "device_check" / "nnx_gpt-v5e-2026-12-05.json").read_text())
    rows = {r["plan"]: r for r in check["rows"]}
    old = Compiler.from_json(check["examples"]["nnx_gpt"]["compiler"])
    assert dict(old.plugins) == {"libtpu": "0.0.42.1"}
    new = dataclasses.replace(old, plugins=(("libtpu", "0.0.48.1"),))
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "host_temp_size_in_bytes")
    out = []
    for compiler, temp in ((old, None), (new, TEMP_0048)):
        plans = []
        for p in base.plans:
            src = rows[{"offload": "default"}.get(p.name, p.name)]
            memory = dataclasses.replace(p.memory, **{k: src[k] for k in fields})
            if temp is not None and p.name == "recompute":
                memory = dataclasses.replace(memory, temp_size_in_bytes=temp)
            plans.append(dataclasses.replace(p, memory=memory, breakdown=None))
        out.append(dataclasses.replace(base, plans=tuple(plans), compiler=compiler))
    return out[0], out[1]


def _files(tmp_path: Path) -> tuple[Path, Path]:
    old, new = _pair()
    return old.save(tmp_path / "old.json"), new.save(tmp_path / "new.json")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from remat_common.internal import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_recompute_temp_that_moved_between_libtpu_versions_is_flagged():
    from remat_common.measurement import report_drift

    old, new = _pair()
    drift = report_drift(old, new, old_name="old.json", new_name="new.json")
    assert not drift.holds
    assert [(m.plan, m.figure) for m in drift.moved] == [("recompute", "peak/device"),
                                                          ("recompute", "temp")]
    temp = drift.moved[1]
    assert (temp.then, temp.now) == (3894679040, TEMP_0048) and round(temp.change, 3) == 0.242
    assert drift.steady == ("none", "offload") and drift.layout is None
    assert drift.lines() == [
        "compare old.json (XLA:TPU, libtpu 0.0.42.1, jax 0.11.2 / jaxlib 0.11.2) with new.json "
        "(XLA:TPU, libtpu 0.0.48.1, jax 0.11.2 / jaxlib 0.11.2):",
        "  MOVED recompute: peak/device 5.87 GiB -> 6.75 GiB (+15.0%)",
        "  MOVED recompute: temp 3.63 GiB -> 4.51 GiB (+24.2%)",
        "  within 5%: none, offload",
        "2 figure(s) of 1 plan(s) (recompute) moved more than 5% between libtpu 0.0.42.1 and "
        "libtpu 0.0.48.1."]
    assert report_drift(old, new, threshold=0.25).holds  # +24.2 % is within 25 %
    again = report_drift(old, old)
    assert again.holds and again.lines()[-1] == ("no figure of the 3 plan(s) compared moved "
                                                 "more than 5% between the same compiler.")
    assert json.loads(json.dumps(drift.to_json()))["moved"][1]["figure"] == "temp"


def test_refused_plans_and_plans_in_one_report_only():
    from remat_common.measurement import RefusedPlan, report_drift

    old, new = _pair()
    kept = tuple(p for p in new.plans if p.name != "recompute")
    gone = dataclasses.replace(new, plans=kept, refused=(
        RefusedPlan("recompute", None, "RESOURCE_EXHAUSTED: Ran out of memory", 1.0),))
    drift = report_drift(old, gone)
    assert [(m.plan, m.then, m.now) for m in drift.moved] == [
        ("recompute", old["recompute"].device_peak, None)]
    assert "recompute: peak/device (none: refused as out of device memory) 5.87 GiB -> none" \
        in "\n".join(drift.lines())
    fewer = dataclasses.replace(new, plans=kept)
    drift = report_drift(old, fewer, old_name="old.json", new_name="new.json")
    assert drift.holds and drift.unmatched == (("recompute", "old.json"),)
    assert "  recompute: only in old.json" in drift.lines()
    assert report_drift(old, new, plans=("none",)).holds  # --plans: only those


@pytest.mark.compat
@needs_report
def test_cli_compare_two_files_compiles_nothing_and_exits_1_when_a_figure_moved(tmp_path, capsys):
    old, new = _files(tmp_path)
    code, out, err = _cli(["report", "--compare", str(old), str(new)], capsys)
    assert code == 1 and err == "", err
    assert out.splitlines()[-1] == ("2 figure(s) of 1 plan(s) (recompute) moved more than 5% "
                                    "between libtpu 0.0.42.1 and libtpu 0.0.48.1.")
    assert "  MOVED recompute: temp 3.63 GiB -> 4.51 GiB (+24.2%)" in out.splitlines()
    code, out, _ = _cli(["report", "--compare", str(old), str(new), "--threshold", "25%"], capsys)
    assert code == 0 and "within 25%: none, recompute, offload" in out
    code, out, _ = _cli(["report", "--compare", str(old), str(new), "--plans", "none"], capsys)
    assert code == 0 and "within 5%: none\n" in out


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("argv, match", [
    ([], r"no report config given\. Fix: remat report CONFIG .*or remat report --compare "
         r"OLD\.json NEW\.json"),
    (["{old}"], r"--compare .*old\.json: one report is compared with CONFIG measured now, and no "
                r"CONFIG is given"),
    (["{old}", "{new}", "{old}"], r"--compare takes one report .* or two .*, got 3"),
    (["{old}", "{new}", "--json", "x.json", "--size", "a=1"],
     r"--compare OLD\.json NEW\.json reads two reports and measures nothing, so --json, --size "
     r"would be ignored"),
    (["{old}", "{new}", "--check", "{old}"], r"--check and --compare: both compare a stored "
                                             r"report.*Fix: give one of them"),
    (["{old}", "--threshold", "lots"], r"argument --threshold: 'lots' is not a percentage"),
    (["{old}", "--threshold", "-5"], r"argument --threshold: '-5': a percentage from 0"),
    (["{old}", "{dir}/report.yaml"], r"--compare '.*report\.yaml': Report\.load: .*not JSON"),
    (["", "{new}"], r"--compare '': an empty path names no report"),
])
def test_cli_compare_refuses_what_it_cannot_do(tmp_path, capsys, argv, match):
    old, new = _files(tmp_path)
    (tmp_path / "report.yaml").write_text("target: t.py:f\nplans: {a: null}\n")
    argv = [a.format(old=old, new=new, dir=tmp_path) for a in argv]
    code, out, err = _cli(["report", *(["--compare", *argv] if argv else [])], capsys)
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert re.search(match, " ".join(err.split())), err


@pytest.mark.compat
@needs_report
def test_cli_threshold_without_compare_is_refused(tmp_path, capsys):
    (tmp_path / "t.py").write_text("def f(plan):\n    raise AssertionError('built')\n")
    (tmp_path / "report.yaml").write_text("target: t.py:f\nplans: {a: null}\n")
    code, _, err = _cli(["report", str(tmp_path / "report.yaml"), "--threshold", "3"], capsys)
    assert code == 2 and "built" not in err
    assert "--threshold 3% is used by --compare, which is not given" in err


@pytest.mark.tooling  # remat report's measurement
@needs_report
def test_cli_compare_with_the_config_measured_now(tmp_path, capsys):
    cfg = str(ROOT / "tests" / "data" / "report.yaml")
    base = ["report", cfg, "--steps", "0", "--plans", "none", "--no-progress"]
    stored = tmp_path / "stored.json"
    assert _cli([*base, "--json", str(stored)], capsys)[0] == 0
    code, out, _ = _cli([*base, "--compare", str(stored)], capsys)
    assert code == 0, out
    assert re.search(r"compare .*stored\.json \(XLA:CPU, jax \S+ / jaxlib \S+\) with this run "
                     r"\(the same compiler\):\n  within 5%: none\nno figure of the 1 plan\(s\) "
                     r"compared moved more than 5% between the same compiler\.", out), out
    code, out, _ = _cli([*base, "--size", "batch=64", "--compare", str(stored)], capsys)
    said = " ".join(out.split())
    assert code == 1 and "MOVED none: temp" in said
    assert "the reports were compiled for other devices or sizes" in said
