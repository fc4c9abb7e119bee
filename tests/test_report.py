"""`remat report CONFIG`, the report config, and rendering (rich table, text, PNG figures)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import jax
import matplotlib
import pytest

from remat_common.internal import (ConfigError, ReportConfig, fmt_bytes, layers_path, load_function, main,
                                   stacked_label)
from remat_common.measurement import Report, measure, plot_report, render_text
from versions import SAVE_AND_OFFLOAD

DATA = Path(__file__).parent / "data"
CONFIG = DATA / "report.yaml"
TINY = ["--size", "batch=8", "d_model=16", "n_layers=2", "--steps", "1", "--warmup", "0"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("report")
    rc = main(["report", str(CONFIG), *TINY, "--no-progress", "--json", str(out / "r.json"),
               "--plot", str(out / "r.png"), "--html", str(out / "r.html"),
               "--timeline-by", "module"])
    return rc, out


def test_cli_writes_json_and_both_figures(cli_run: tuple[int, Path]) -> None:
    rc, out = cli_run
    assert rc == 0
    rep = Report.load(out / "r.json")
    assert rep.names == ("none", "recompute", "hidden", "offload")
    assert rep.baseline == "none"
    # --size reached the model: 2 layers of batch 8, width 16 (hidden 64).
    assert rep["hidden"].bytes_by_path("device")["layers.1"] == 8 * 64 * 4
    assert set(rep["offload"].bytes_by_path("host")) == {"layers.0", "layers.1"}
    assert all(len(p.timing.steps) == 1 for p in rep.plans)
    for name in ("r.png", "r.layers.png", "r.timeline.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    html = (out / "r.html").read_text()  # --timeline-by module: the page opens stacked by module
    assert '"by":"module"' in html and '"modules":["layers.' in html


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["report", str(CONFIG), *TINY, "--plans", "none", "offload"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "remat plans: ratios (x) vs 'none'" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "none" in rows and "offload" in rows and "recompute" not in rows
    assert "yes (2/2)" in rows["offload"]
    assert "512 B host" in out  # activation residuals by module: 8 x 16 float32 per layer
    assert f"offload: boundary layers.0: {SAVE_AND_OFFLOAD}" in out


def test_no_progress_prints_a_line_per_stage(capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-progress``: no bar, but a heartbeat on stderr, a line as each stage of each plan
    begins (and again every 30 s while one runs), so a long report never looks like a hang."""
    rc = main(["report", str(CONFIG), *TINY, "--plans", "none", "recompute", "--no-progress"])
    assert rc == 0
    lines = [ln.rsplit(",", 1)[0] for ln in capsys.readouterr().err.splitlines()
             if ln.startswith("remat report: ")]
    assert lines[0] == "remat report: none: build (1 of 9)", lines
    assert "remat report: recompute: compile (6 of 9)" in lines, lines
    assert "remat report: timing steps (9 of 9)" in lines and lines[-1] == "remat report: done"


def test_cli_strict_fails_on_a_plan_problem(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        target: {DATA / 'report_target.py'}:measure_target
        model: {{d_model: 16, n_layers: 2}}
        batch: 4
        plans:
          typo: {{"layers.*": {{save: [hiden]}}}}
        """))
    assert main(["report", str(cfg), "--steps", "0", "--strict"]) == 1
    cap = capsys.readouterr()
    assert "PROBLEM" in cap.out and "'hiden'" in cap.out
    assert "2 verification problem(s); failing (--strict)" in cap.err
    assert main(["report", str(cfg), "--steps", "0"]) == 0


def _write(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "report.yaml"
    cfg.write_text(textwrap.dedent(body))
    return cfg


@pytest.mark.parametrize("body, match", [
    ("target: m.py:f\nplans: {a: null}\nsteps: 3\nmodle: {}\n", "unknown key\\(s\\) 'modle'"),
    ("plans: {a: null}\n", "missing key\\(s\\) 'target'"),
    ("target: m.py\nplans: {a: null}\n", "target must be 'FILE.py:FUNCTION' or 'package.module:FUNCTION', "
     "got 'm.py'"),
    ("target: m.py:f\nplans: {}\n", "plans must be a non-empty mapping"),
    ("target: m.py:f\nplans: {a: 3}\n", "plan 'a' must be null, a plan file path"),
    ("target: m.py:f\nplans: {a: null}\nbatch: -1\n", "batch must be a non-negative integer"),
    ("target: m.py:f\nplans: {a: null}\nbaseline: b\n", "baseline 'b' is not one of the plans"),
    ("- 1\n", "holds a list, not a mapping"),
    ("target: [\n", "invalid YAML"),
])
def test_config_errors(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ReportConfig.load(_write(tmp_path, body))


def test_cli_reports_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _write(tmp_path, f"target: {DATA / 'report_target.py'}:measure_target\n"
                           "plans: {a: null}\nbatch: 2\n")
    assert main(["report", str(cfg), "--size", "widht=3"]) == 2
    err = capsys.readouterr().err
    assert "takes no argument(s) 'widht'" in err and "'d_model'" in err
    assert main(["report", str(cfg), "--plans", "b"]) == 2
    assert "no plan(s) named 'b'; plans: 'a'" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", str(cfg), "--size", "batch"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_config_plans_files_inline_rules_and_full_plans(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "r.yaml").write_text('rules:\n  "layers.*": recompute\n')
    cfg = _write(tmp_path, f"""\
        target: {DATA / 'report_target.py'}:measure_target
        plans:
          none: null
          file: plans/r.yaml
          inline: {{"layers.*": offload}}
          full: {{defaults: {{mode: lenient}}, rules: {{"layers.*": dots}}}}
        """)
    plans = ReportConfig.load(cfg).plan_objects()
    assert plans["none"] is None
    assert [(r.pattern, str(r.annotation)) for r in plans["file"].rules] == [("layers.*", "recompute")]
    assert str(plans["inline"].rules[0].annotation) == "offload"
    assert plans["full"].strict is False and str(plans["full"].rules[0].annotation) == "dots"


def test_target_file_in_a_package_uses_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "mymodel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sizes.py").write_text("WIDTH = 7\n")
    (pkg / "model.py").write_text("from .sizes import WIDTH\n\ndef f(plan, *, batch):\n"
                                  "    return WIDTH * batch\n")
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "helper.py").write_text("K = 3\n")
    (flat / "model.py").write_text("from helper import K\n\ndef g(plan, *, batch):\n"
                                   "    return K + batch\n")
    assert load_function(pkg / "model.py", "f")(None, batch=2) == 14
    assert load_function(flat / "model.py", "g")(None, batch=2) == 5
    with pytest.raises(ConfigError, match="defines no function 'h'; its functions: 'g'"):
        load_function(flat / "model.py", "h")
    with pytest.raises(ConfigError, match="is not an existing .py file"):
        load_function(flat / "nope.py", "g")


def test_target_file_in_a_package_chain_imports_its_own_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target in a chain of packages (``proj/models/model.py``, as ``examples/llms/``) imports
    its own project absolutely (``from proj.sizes import ...``) wherever ``remat`` runs from: it
    is imported by its dotted name from the folder above the chain (it failed with
    ``ModuleNotFoundError: No module named 'examples'`` outside the repository root)."""
    top = tmp_path / "projx"
    (top / "models").mkdir(parents=True)
    for init in (top / "__init__.py", top / "models" / "__init__.py"):
        init.write_text("")
    (top / "sizes.py").write_text("WIDTH = 11\n")
    (top / "models" / "model.py").write_text(
        "from projx.sizes import WIDTH\n\ndef f(plan, *, batch):\n    return WIDTH * batch\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_function(top / "models" / "model.py", "f")(None, batch=3) == 33
    assert str(tmp_path) not in __import__("sys").path  # nothing left on the path


def test_a_target_compiled_for_an_accelerator_is_built_abstract(tmp_path: Path) -> None:
    """A target function taking ``abstract`` gets ``abstract=True`` when the config compiles for
    another machine (nothing of its model is allocated here); given, the sizes' value wins."""
    import dataclasses

    (tmp_path / "m.py").write_text("def f(plan, *, batch, abstract=False):\n    return abstract\n"
                                   "def g(plan, *, batch):\n    return batch\n")
    for fn, want in (("f", {"batch": 2, "abstract": True}), ("g", {"batch": 2})):
        (tmp_path / f"{fn}.yaml").write_text(f"target: m.py:{fn}\nmodel: {{}}\nbatch: 2\n"
                                             "plans: {none: null}\n")
        config = ReportConfig.load(tmp_path / f"{fn}.yaml")
        assert config.kwargs() == {"batch": 2}
        assert dataclasses.replace(config, accelerator="h100").kwargs() == want
    config = ReportConfig.load(tmp_path / "f.yaml").with_sizes({"abstract": False})
    assert dataclasses.replace(config, accelerator="h100").kwargs()["abstract"] is False


def test_target_module_imports_from_the_config_folder_or_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``target: mypkg.model:f`` without PYTHONPATH: found next to the config, or in the working
    directory (as ``python -m`` and pytest find it); elsewhere the message says where it looked."""
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # restored after the test
    for name, k in (("near_cfg_pkg", 3), ("in_cwd_pkg", 5)):
        pkg = tmp_path / f"project_of_{name}" / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "model.py").write_text(f"def f(plan, *, batch):\n    return {k} * batch\n")
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    (tmp_path / "project_of_near_cfg_pkg" / "report.yaml").write_text(
        "target: near_cfg_pkg.model:f\nbatch: 2\nplans: {none: null}\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "report.yaml").write_text(
        "target: in_cwd_pkg.model:f\nbatch: 2\nplans: {none: null}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"(?s)target module 'in_cwd_pkg.model' cannot be "
                       r"imported .*looked on sys.path, in the config's folder and the working "
                       r"directory.*Fix: install"):
        ReportConfig.load(tmp_path / "elsewhere" / "report.yaml").builder()
    assert ReportConfig.load(tmp_path / "project_of_near_cfg_pkg" / "report.yaml").builder()(
        None) == 6
    monkeypatch.chdir(tmp_path / "project_of_in_cwd_pkg")
    assert ReportConfig.load(tmp_path / "elsewhere" / "report.yaml").builder()(None) == 10


def test_plot_and_text_from_a_measured_report(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(DATA))
    import report_target

    backend = matplotlib.get_backend()
    rep = measure(lambda p: report_target.measure_target(p, batch=8, d_model=16, n_layers=2),
                  {"none": None, "offload": {"layers.*": "offload"}}, steps=0)
    first, second = plot_report(rep, tmp_path / "sub" / "fig")
    assert first == tmp_path / "sub" / "fig.png" and second == layers_path(first)
    assert first.read_bytes().startswith(PNG) and second.read_bytes().startswith(PNG)
    assert matplotlib.get_backend() == backend  # the global backend is left alone
    text = render_text(rep, width=200)
    assert "not meaningful here" in text or rep.capabilities.backend != "cpu"
    assert "(no module)" in text and "layers.1" in text  # the loss's residuals: outside the model


def test_a_stacked_residual_is_labelled_with_its_layer_count() -> None:
    """A scanned layer group's residual is named after its first layer and holds every layer of
    the group: the per-module table says so instead of crediting one layer with all of it."""
    from remat_common import Residual

    stacked = Residual(kind="named", name="blocks.1.attn/q", path="blocks.1.attn", shape=(3, 8, 16),
                       dtype="float32", nbytes=3 * 512, placement="device", source="", layers=3)
    one = Residual(kind="named", name="blocks.1.attn/q", path="blocks.1.attn", shape=(8, 16),
                   dtype="float32", nbytes=512, placement="device", source="")
    scoped = Residual(kind="other", name=None, path=None, shape=(3, 8, 16), dtype="float32",
                      nbytes=3 * 512, placement="device", source="", layers=3, module="blocks.1.mlp")
    outside = Residual(kind="other", name=None, path=None, shape=(8, 16), dtype="float32",
                       nbytes=512, placement="device", source="")
    assert [stacked_label(r) for r in (stacked, one, scoped, outside)] == [
        "blocks.1.attn (stacked x3)", "blocks.1.attn", "blocks.1.mlp (stacked x3)", "(no module)"]
    assert stacked.per_layer == one.nbytes


def test_fmt_bytes() -> None:
    assert [fmt_bytes(n) for n in (None, 0, 1023, 1024, 5 * 2**30)] == [
        "-", "0 B", "1023 B", "1.00 KiB", "5.00 GiB"]


def test_help_lists_report(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    for flag in ("--plans", "--json", "--plot", "--steps", "--size", "--strict"):
        assert flag in out


def _json_keys(d: Any) -> set[str]:
    return set(d) if isinstance(d, dict) else set()


def test_json_has_the_documented_fields(cli_run: tuple[int, Path]) -> None:
    data = json.loads((cli_run[1] / "r.json").read_text())
    assert data["format"] == "remat-report/1"
    plan = data["plans"][3]
    assert {"residuals", "memory", "flops", "flop_ratio", "placement", "timing",
            "step_time_ratio", "device_bytes", "host_bytes", "host_transfer_bytes",
            "bytes_by_path"} <= _json_keys(plan)
    assert plan["placement"]["placed"] is True
    assert plan["host_transfer_bytes"] == 2 * plan["host_bytes"] == 2 * 2 * 8 * 16 * 4


EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.tooling  # the CLI over both examples: runs in the jax 0.11.2 stage only
@pytest.mark.slow
@pytest.mark.parametrize("example", ["nnx_gpt", "eqx_gpt"])
def test_cli_on_the_example_configs(example: str, tmp_path: Path) -> None:
    for needed in ("flax" if example == "nnx_gpt" else "equinox", "optax"):  # the target's
        pytest.importorskip(needed)
    cfg = EXAMPLES / example / "report.yaml"
    if not cfg.is_file():
        pytest.skip(f"{cfg} is not there yet")
    if example == "eqx_gpt":  # the same config, its target named as package.module:function
        text = cfg.read_text().replace("target: model.py:measure_target",
                                       "target: examples.eqx_gpt.model:measure_target")
        text = text.replace(": plans/", f": {EXAMPLES / example}/plans/")
        assert "examples.eqx_gpt.model:" in text and ": plans/" not in text
        cfg = tmp_path / "report.yaml"
        cfg.write_text(text)
    plans = ["none", "recompute", "names"]
    # optax's AdamW raises a float to an int32 power, which the suite's strict promotion forbids.
    with jax.numpy_dtype_promotion("standard"):
        rc = main(["report", str(cfg), "--plans", *plans, "--steps", "1", "--warmup", "0",
                  "--no-progress", "--json", str(tmp_path / "r.json"), "--size", "n_layers=2",
                  "d_model=32", "n_heads=2", "seq_len=16", "vocab=64", "batch=2"])
    assert rc == 0
    rep = Report.load(tmp_path / "r.json")
    assert rep.names == tuple(plans) and rep.problems == ()
    none, rec, names = rep["none"], rep["recompute"], rep["names"]
    assert rec.device_bytes < names.device_bytes < none.device_bytes
    assert 1.1 < rec.flop_ratio < 1.5  # a transformer block's forward pass, recomputed
    assert rec.flop_ratio > names.flop_ratio > 1.0  # names keeps the attention matmuls
    # names offloads each later block's MLP hidden activation: on host, placed for cuda.
    assert set(names.bytes_by_path("host")) == {"blocks.1.mlp"}
    assert names.placement is not None and names.placement.placed


@pytest.mark.tooling
def test_the_example_gpt_json_is_small_at_its_default_size(tmp_path: Path,
                                                          standard_promotion: None) -> None:
    """``remat report example:nnx_gpt --json`` at the config's own sizes, every plan (six
    compiles): at most 250 KB, holding every figure of the tables and the peak breakdown (its
    tables read the same as those of the report with timelines); the timeline of live bytes is
    ``--timeline-json``'s."""
    for needed in ("flax", "optax"):  # the example's target
        pytest.importorskip(needed)
    small, full = tmp_path / "r.json", tmp_path / "t.json"
    assert main(["report", "example:nnx_gpt", "--steps", "0", "--no-progress", "--json",
                 str(small), "--timeline-json", str(full)]) == 0
    assert small.stat().st_size <= 250_000, small.stat().st_size
    rep, with_timeline = Report.load(small), Report.load(full)
    assert len(rep.plans) == 6 and rep == with_timeline
    assert all(p.breakdown and p.breakdown.timeline is None for p in rep.plans)
    assert all(p.breakdown and p.breakdown.timeline for p in with_timeline.plans)
    assert render_text(rep) == render_text(with_timeline)
    assert full.stat().st_size > 2 * small.stat().st_size
