"""Bad input to the ``remat`` command never ends in a traceback, a hang or a silent pass (issues
13, 27 and 39): in this process (``_cli``), and as a user runs it, a process of its own
(``_remat``), where the process is the subject (interrupts, JAX's flags, a full disk, sizes the
compiler cannot plan).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.lock_only  # what is refused and the message: checked before JAX runs


# -- the command line ------------------------------------------------------------------------------
def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from remat_common.internal import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.compat
def test_cli_lint_empty_directory_and_fifo(tmp_path, capsys):
    code, _, err = _cli(["lint", str(tmp_path)], capsys)
    assert code == 2 and "no Python files found" in err and "Traceback" not in err
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "ok.py").write_text("import jax\n")
    code, out, _ = _cli(["lint", str(tmp_path)], capsys)  # the FIFO is skipped, not read (a hang)
    assert code == 0 and "no problems in 1 file(s)" in out
    code, _, err = _cli(["lint", str(tmp_path / "pipe.py")], capsys)
    assert code == 2 and "not a regular file" in err


@pytest.mark.compat
@pytest.mark.parametrize("value", ["", ",", "remat3,", " "])
def test_cli_doctor_empty_require(capsys, value):
    code, _, err = _cli(["doctor", "--require", value], capsys)
    assert code == 2 and "holds an empty feature name" in err


def _report_config(tmp_path: Path, plans: str = "{a: null}", target: str = "t.py:f") -> Path:
    cfg = tmp_path / "report.yaml"
    cfg.write_text(f"target: {target}\nplans: {plans}\n")
    return cfg


#: `remat report` needs the `report` extra (rich, matplotlib); without it, it says so (test_doctor.py).
needs_report = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("rich", "matplotlib")),
    reason="remat report needs the 'report' extra, not installed here")


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("setup, argv, match", [
    (lambda d: _report_config(d, "{a: missing.yaml}"), [], r"plan file '.*missing\.yaml' does not"),
    (lambda d: _report_config(d, "{a: {layers.0: off}}"), [], r"unknown remat annotation False.*YAML"),
    (lambda d: _report_config(d, "{a: {'layers.[0-3]*': save}}"), [], r"not a numeric range"),
    (lambda d: _report_config(d), ["--size", "d=[1"], r"--size d(:\d+)?: invalid YAML"),
    (lambda d: _report_config(d), ["--json", "{dir}"], r"--json '.*' is a directory"),
    (lambda d: _report_config(d), ["--plot", "{dir}"], r"--plot '.*' is a directory"),
    (lambda d: _report_config(d, "{a: null, a: null}"), [], r"appears twice"),
    (lambda d: (d / "x.yaml").write_text("a: [") and d / "x.yaml", [], r"x\.yaml:\d+: invalid YAML"),
    (lambda d: d, [], r"report config '.*' is a directory"),
])
def test_cli_report_errors_without_traceback(tmp_path, capsys, setup, argv, match):
    cfg = setup(tmp_path)
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    code, _, err = _cli(["report", str(cfg), "--no-progress", *argv], capsys)
    assert code == 2, err
    assert re.search(match, err, re.S), err
    assert "Traceback" not in err


@pytest.mark.compat
@needs_report
def test_cli_report_target_import_error(tmp_path, capsys):
    (tmp_path / "t.py").write_text("import numpy\nimport not_a_module_anywhere\n")
    code, _, err = _cli(["report", str(_report_config(tmp_path)), "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in err
    assert re.search(r"importing the target file '.*t\.py' failed: .*t\.py:2: ModuleNotFoundError",
                     err), err


@pytest.mark.compat
@needs_report
def test_cli_report_error_in_the_users_target_code(tmp_path, capsys):
    """An error raised by the target function itself was a traceback through the tool's code."""
    (tmp_path / "t.py").write_text("def f(plan):\n    raise ValueError('boom in user code')\n")
    code, _, err = _cli(["report", str(_report_config(tmp_path)), "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in err
    assert re.search(r"the target .*t\.py:f raised while building the model for plan None \(no "
                     r"plan\): .*t\.py:2: ValueError: boom in user code\. Fix: make f\(plan\) run",
                     err), err


_RAISING_LOSS = """\
import jax, jax.numpy as jnp
from remat_common.measurement import MeasureTarget


def f(plan):
    w, x = jnp.eye(4), jnp.ones((2, 4))

    def loss(w, x):
        h = jnp.tanh(x @ w)
        raise ValueError("boom in the loss")

    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x)

    return MeasureTarget(loss, (w, x), step, (w, x), None)
"""


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("command, argv, what", [
    ("report", [], r"measuring plan 'a' \(compile\)"),
    ("tune", ["--budget", "1GiB"], r"measuring the model before any plan \(its first build and "
                                   r"trace, no plan\)"),
])
def test_cli_report_and_tune_error_in_the_users_loss(tmp_path, capsys, command, argv, what):
    """The target builds, but its loss raises while a plan is measured: was a traceback through
    measure and jax.jit."""
    (tmp_path / "t.py").write_text(_RAISING_LOSS)
    code, _, err = _cli([command, str(_report_config(tmp_path)), "--no-progress", *argv], capsys)
    assert code == 2 and "Traceback" not in err
    assert re.search(rf"report\.yaml: the target's code raised while {what}: .*t\.py:10: ValueError: "
                     r"'boom in the loss'\. Fix: make the target's loss and step run on their own: "
                     r"t = f\(plan\) \(plan=None first\), then t\.loss_fn\(\*t\.loss_args\), "
                     r"jax\.grad\(t\.loss_fn\)\(\*t\.loss_args\) \(measuring differentiates the "
                     r"loss with JAX's own transforms, not your framework's\) and "
                     r"jax\.jit\(t\.step_fn\)\(\*t\.step_args\)", " ".join(err.split())), err
    from remat_common.internal import load_function

    t = load_function(tmp_path / "t.py", "f")(None)  # the fix's first step: the full traceback
    with pytest.raises(ValueError, match="boom in the loss") as info:
        t.loss_fn(*t.loss_args)
    assert info.traceback[-1].lineno + 1 == 10 and info.traceback[-1].path.name == "t.py"


@pytest.mark.compat
@needs_report
def test_cli_report_creates_output_folders_before_measuring(tmp_path, capsys):
    out = tmp_path / "new" / "sub" / "report.json"
    cfg = _report_config(tmp_path, "{a: missing.yaml}")  # fails after the outputs are checked
    code, _, err = _cli(["report", str(cfg), "--json", str(out)], capsys)
    assert code == 2 and "does not exist" in err
    assert out.parent.is_dir() and not out.exists()


_TARGET = "def f(plan, *, batch=1, n_layers=4, lr=0.1, act='gelu'):\n    raise AssertionError('built')\n"


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("command", ["report", "tune"])
@pytest.mark.parametrize("config, argv, match", [
    ("plans: {a: null}\nmodel: []\n", [], r"model must be a mapping of keyword arguments, got \[\]"),
    ("plans: {a: null}\nmodel: 0\n", [], r"model must be a mapping"),  # `or {}` read it as {}
    ("plans: {a: null}\nbaseline: [a]\n", [], r"baseline \['a'\] is not one of the plans"),
    ("plans: {a: {layers.0: bogus}}\n", ["--plans", "a"], r"module 'layers.0' \(.*report\.yaml: plans\.a\): "
                                           r"unknown remat annotation 'bogus'"),
    ("plans: {a: {rules: {x: save}, mode: strict}}\n", ["--plans", "a"], r"plans\.a: a full plan has the keys "
                                                          r"'defaults' and 'rules' only"),
    ("plans: {a: null}\n", ["--size", "n_layers=two"], r"n_layers='two' \(str\), but .*t\.py:f "
                                                         r"has n_layers=4 \(int\) as its default"),
    ("plans: {a: null}\n", ["--size", "n_layers=2.5"], r"n_layers=2\.5 \(float\).*Fix: give "
                                                         r"n_layers an int"),
    ("plans: {a: null}\n", ["--size", "act=3"], r"act=3 \(int\), but .* has act='gelu' \(str\)"),
    ("plans: {a: null}\n", ["--json", "{dir}/report.yaml"], r"--json '.*report\.yaml' is '.*report"
                                                            r"\.yaml', which this run reads"),
    ("plans: {a: null}\n", ["--json", "{dir}/t.py"], r"which this run reads: it would be "
                                                     r"overwritten"),  # the target's own source
    ("plans: {a: null}\n", ["--json", "{dir}/fifo.json"], r"--json '.*fifo\.json' cannot be written"),
    ("plans: {a: null}\n", ["--plot", "{dir}/t.py/x.png"], r"--plot '.*': '.*t\.py' is a file, not "
                                                           r"a folder"),
    ("plans: {a: null}\n", ["--plot", "{dir}/out.txt"], r"--plot '.*out\.txt': unknown format "
                                                        r"'\.txt'\. Allowed: '\.png'"),  # it wrote out.txt.png
])
def test_cli_report_and_tune_refuse_before_measuring(tmp_path, capsys, command, config, argv, match):
    (tmp_path / "t.py").write_text(_TARGET)
    os.mkfifo(tmp_path / "fifo.json")  # nobody reads it: opening it to write would block
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\n" + config)
    budget = ["--budget", "1GiB"] if command == "tune" else []
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    code, _, err = _cli([command, str(cfg), "--no-progress", *budget, *argv], capsys)
    assert code == 2, err
    assert re.search(match, err, re.S), err
    assert "Traceback" not in err and "built" not in err
    assert (tmp_path / "t.py").read_text() == _TARGET and cfg.read_text().startswith("target")


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("argv, match", [
    (["--budget", "-1GiB"], r"argument --budget: budget '-1GiB': a size cannot be negative"),
    ([], r"--budget is required"),
    (["--budget", "1GiB", "--out", "{dir}/plan.toml"], r"--out '.*plan\.toml': unknown format "
                                                      r"'\.toml'\. Allowed: '\.json', '\.yaml'"),
    (["--budget", "1GiB", "--step", "2"], r"--step 2 is used by --maximize, which is not given"),
    (["--budget", "1GiB", "--limit", "9"], r"--limit 9 is used by --maximize"),
    (["--budget", "1GiB", "--measure-steps", "3"], r"--measure-steps 3 is used by --measure"),
    (["--budget", "1GiB", "--maximize", "batch", "--limit", "4"], r"--limit 4 is below the batch "
                                                                   r"the search starts from \(8\)"),
    (["--budget", "1GiB", "--maximize", "seq"], r"--maximize seq: the config sets no seq_len"),
    (["--budget", "1GiB", "--plans", "{dir}/more.toml"], r"--plans .*more\.toml: no such plan "
                                                         r"file"),  # was "no plan named"
])
def test_cli_tune_refuses_before_searching(tmp_path, capsys, argv, match):
    (tmp_path / "t.py").write_text(_TARGET)
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\nbatch: 8\nplans: {a: null}\n")
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    try:
        code, _, err = _cli(["tune", str(cfg), "--no-progress", "--json",
                             str(tmp_path / "out" / "t.json"), *argv], capsys)
    except SystemExit as e:  # argparse's own errors
        code, err = int(e.code or 0), capsys.readouterr().err
    assert code == 2, err
    assert re.search(match, err, re.S), err
    assert "built" not in err
    if not argv:  # the missing budget is found before any output folder is made
        assert not (tmp_path / "out").exists()


@pytest.mark.compat
@pytest.mark.parametrize("flag", ["--steps", "--warmup"])
def test_cli_report_negative_counts(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as info:
        _cli(["report", str(_report_config(tmp_path)), flag, "-1"], capsys)
    assert info.value.code == 2
    assert "-1 is negative" in capsys.readouterr().err


@pytest.mark.compat
def test_cli_survives_a_closed_pipe(tmp_path):
    import subprocess
    import sys

    for i in range(40):
        (tmp_path / f"m{i}.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", "from remat_common.internal import main; "
                             "import sys; sys.exit(main())", "lint", "--format", "json",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.compat
@pytest.mark.parametrize("select", ["", " , "])
def test_cli_lint_empty_select_fails(tmp_path, capsys, select):
    (tmp_path / "m.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    code, _, err = _cli(["lint", str(tmp_path), "--select", select], capsys)
    assert code == 2 and "names no rule, so nothing would be checked" in err  # it passed, exit 0


def test_compose_sizes_layers():
    from remat_common.internal import ConfigError, compose_sizes
    presets = {"p": {"a": 1, "b": 2}}
    assert compose_sizes({"a": 9, "c": 3}, {"preset": "p"}, presets, "c") == {"a": 1, "b": 2, "c": 3}
    assert compose_sizes({"preset": "p"}, {"a": 5}, presets, "c") == {"a": 5, "b": 2}
    assert compose_sizes({}, {"preset": "p", "a": 1}, presets, "c") == {"a": 1, "b": 2}
    with pytest.raises(ConfigError, match=r"model sets preset: p and a: 5, but the preset sets a=1"):
        compose_sizes({"preset": "p", "a": 5}, {}, presets, "c")
    assert compose_sizes({"a": 1}, {"preset": "q"}, None, "c") == {"a": 1, "preset": "q"}


# -- the command as a user runs it: a process of its own -------------------------------------------
@pytest.mark.tooling  # a fresh interpreter that asks JAX for a TPU
def test_doctor_when_jax_cannot_start_its_backend():
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "tpu"}
    done = subprocess.run([sys.executable, "-m", "remat_common", "doctor"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr  # was a traceback
    assert "remat doctor: FAILED: JAX cannot start a backend" in done.stderr
    assert "JAX_PLATFORMS=tpu" in done.stderr and "fix: unset JAX_PLATFORMS" in done.stderr
    env.pop("JAX_PLATFORMS")
    env["JAX_PLATFORMS"] = "cpu"  # the fix
    done = subprocess.run([sys.executable, "-m", "remat_common", "doctor"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert "Backend" in done.stdout and "cpu" in done.stdout


@pytest.mark.tooling  # fresh interpreters, each failing as JAX is imported
def test_remat_with_a_jax_flag_jax_cannot_read(monkeypatch):
    """JAX_ENABLE_X64=maybe (or =2) made `import remat_common` raise ValueError('invalid truth
    value') with a traceback, `remat doctor` included."""
    import subprocess
    import sys

    import _remat_cli

    import tomllib

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["remat"] == "_remat_cli:main"  # the `remat` command is this guarded entry
    for value, argv, code, want in (
        ("maybe", ["doctor"], 1, "remat doctor: FAILED: JAX cannot start: the environment variable "
         "JAX_ENABLE_X64='maybe' is not a truth value; JAX accepts 1, 0, true, false, yes, no, on, "
         "off, y, n, t, f (any case).\n  fix: JAX_ENABLE_X64=1 or JAX_ENABLE_X64=0, or unset "
         "JAX_ENABLE_X64\n"),
        ("2", ["report", "r.yaml"], 2, "remat report: error: JAX cannot start: the environment "
         "variable JAX_ENABLE_X64='2' is not a truth value; JAX accepts 1, 0, true, false, yes, no, "
         "on, off, y, n, t, f (any case). Fix: JAX_ENABLE_X64=1 or JAX_ENABLE_X64=0, or unset "
         "JAX_ENABLE_X64.\n"),
    ):
        done = subprocess.run([sys.executable, "-m", "_remat_cli", *argv], capture_output=True,
                              text=True, cwd=root, env={**os.environ, "JAX_ENABLE_X64": value},
                              timeout=300)
        assert (done.returncode, done.stdout, done.stderr) == (code, "", want)
    from jax._src.config import bool_env  # the values named are the ones JAX reads: the fix works

    for value in (*_remat_cli.TRUTH_VALUES, *(v.upper() for v in _remat_cli.TRUTH_VALUES)):
        monkeypatch.setenv("JAX_REMAT_PLAN_PROBE", value)
        assert bool_env("JAX_REMAT_PLAN_PROBE", False) is (value.lower() in ("1", "true", "yes", "on", "y", "t"))


_SIGINT_DEFAULT_THEN_EXEC = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)  # as from a terminal (a background pytest ignores it)\n"
    "os.execv(sys.executable, [sys.executable, '-m', '_remat_cli', *sys.argv[1:]])\n")


@pytest.mark.tooling  # fresh interpreters interrupted while they import JAX
@pytest.mark.parametrize("command, delays", [("report", (0.3, 0.8, 1.5)), ("tune", (0.6,))])
def test_ctrl_c_while_remat_starts_is_one_line(command, delays):
    """A Ctrl-C in the first second or two (while JAX is imported) printed a KeyboardInterrupt
    traceback, once an ImportError of a half-imported jaxlib, or aborted in nanobind; later it
    printed "interrupted". Now every moment ends in that one line, status 130."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    argv = [command, "tests/data/report.yaml", "--no-progress"]
    if command == "tune":
        argv += ["--budget", "1GiB"]
    for delay in delays:
        proc = subprocess.Popen([sys.executable, "-c", _SIGINT_DEFAULT_THEN_EXEC, *argv], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        lines = err.splitlines()
        assert proc.returncode == 130 and out == "", (delay, err)
        assert lines[-1] == f"remat {command}: interrupted", (delay, err)
        assert all(line.startswith(f"remat {command}: ") for line in lines), (delay, err)  # heartbeats


@pytest.mark.tooling  # the example's training entry point (checked before anything is built)
def test_example_workdir_that_is_a_file(tmp_path):
    for needed in ("flax", "optax", "orbax.checkpoint"):  # the example's training code
        pytest.importorskip(needed)
    from examples import training
    from examples.nnx_gpt import train

    blocker = tmp_path / "run"
    blocker.write_text("")
    for workdir, match in ((blocker, r"--workdir .*run: it is a file, not a directory"),
                           (blocker / "sub", r"--workdir .*sub: .*run is a file, not a directory")):
        with pytest.raises(SystemExit, match=match + r"(.|\n)*Fix: give a directory path") as info:
            training.cli(train.main, ["--workdir", str(workdir), "--steps", "1", "--no-report"],
                         config=train.CONFIG)  # was mkdir's bare 'File exists'
        fix = re.search(r"--workdir (\S+)\.$", str(info.value)).group(1)
        assert not Path(fix).exists() and Path(fix).parent.is_dir() or fix.endswith("/sub")


def _remat(*argv: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """``remat ARGV`` in this process (``main(argv)``, as ``remat`` runs it: JAX's standard dtype
    promotion, warnings not errors, in ``cwd``): its exit code, first line of stderr, and stdout.
    What only a process of its own shows (the entry point, JAX failing to start, signals, exit
    statuses) is checked by the process tests of this file; these check what the command refuses
    and says, and a process each cost ~3 s of CPU importing JAX and the examples again."""
    import contextlib
    import io
    import warnings

    import jax

    from remat_common.internal import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(jax.numpy_dtype_promotion("standard"))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's own refusals
            code = int(e.code or 0)
    lines = [ln for ln in err.getvalue().splitlines() if not ln.startswith("remat report: ")
             or ln.startswith("remat report: error")]
    return code, (lines[0] if lines else ""), out.getvalue()


_TINY_TARGET = '''
import jax, jax.numpy as jnp
from remat_common.measurement import MeasureTarget
PRESETS = {"wide": {"d": 64, "layers": 2}}

def f(plan, *, batch=2, d=8, layers=1, preset=""):
    w = jnp.ones((layers, d, d))
    x = jnp.ones((batch, d))
    def loss(w, x):
        for i in range(layers):
            x = jnp.tanh(x @ w[i])
        return x.sum()
    def step(w, x):
        l, g = jax.value_and_grad(loss)(w, x)
        return w - 0.1 * g, l
    return MeasureTarget(loss, (w, x), step, (w, x), None)
'''


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
def test_cli_sizes_and_presets_compose_by_one_rule(tmp_path):
    """A preset sets every size it names, the rest from the config; a conflict on one command
    line is refused; the table and the JSON state the sizes measured (issue 39: the config's
    sizes overrode `--size preset=llama3-8b` without a word)."""
    (tmp_path / "t.py").write_text(_TINY_TARGET)
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\nmodel: {d: 16, layers: 1}\nbatch: 4\nplans: {none: null}\n")
    code, first, out = _remat("report", str(cfg), "--steps", "0", "--no-progress", "--size",
                              "preset=wide", "layers=2", "--json", str(tmp_path / "r.json"))
    assert code == 0, first
    assert "sizes measured: d=64 layers=2 batch=4" in " ".join(out.split())
    sizes = json.loads((tmp_path / "r.json").read_text())["sizes"]
    assert sizes == {"d": 64, "layers": 2, "batch": 4}
    code, first, _ = _remat("report", str(cfg), "--steps", "0", "--no-progress", "--size",
                            "preset=wide", "d=32")
    assert code == 2
    assert re.match(r"remat report: error: .*report\.yaml: --size d=32 and --size preset=wide "
                    r"disagree: the preset sets d=64\..*Fix: drop --size d=32", first), first
    code, first, _ = _remat("report", str(cfg), "--size", "preset=nope")
    assert code == 2 and re.match(r"remat report: error: .*--size preset='nope' is not a preset "
                                  r"of the target; presets: 'wide'\. Fix:", first), first
    code, first, _ = _remat("report", str(cfg), "--size", "d=8", "d=16")
    assert code == 2 and first == ("remat report: error: --size d=8 and --size d=16: one size "
                                   "given twice. Fix: give d once."), first


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
def test_cli_example_preset_conflict_is_refused_before_measuring():
    code, first, _ = _remat("report", "example:nnx_gpt", "--steps", "0", "--plans", "none",
                            "--size", "preset=llama3-8b", "abstract=true", "n_heads=16", "batch=1")
    assert code == 2
    assert re.match(r"remat report: error: .*--size n_heads=16 and --size preset=llama3-8b "
                    r"disagree: the preset sets n_heads=32\.", first), first


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("size, shape", [
    ("seq_len=1000000000 d_model=64", r"\(1, 2, 1000000000, 1000000000\) f32"),  # was SIGABRT
    ("d_model=1000000000", r"\(.*1000000000.*\) f32"),  # was a raw XLA traceback
])
def test_cli_sizes_beyond_what_xla_can_plan_are_refused_before_compiling(size, shape):
    code, first, _ = _remat("report", "example:nnx_gpt", "--steps", "0", "--plans", "none",
                            "--no-progress", "--size", "abstract=true", "n_layers=1", "n_heads=2",
                            "batch=1", *size.split())
    assert code == 2, first
    assert re.match(rf"remat report: error: the program holds an array of shape {shape}", first), first
    assert first.endswith("Fix: a smaller size (remat report --size seq_len=N d_model=N vocab=N "
                          "batch=N).")


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("example, size, match", [
    # unrolled: minutes and gigabytes (200 layers: 165 s, 2.7 GB); refused at once
    ("nnx_gpt", "n_layers=1000000 d_model=64 n_heads=2 seq_len=16 batch=2",
     r"ValueError: GPT: n_layers=1000000 in layout 'list' builds, traces and compiles each layer "
     r"on its own.*Fix: layout='scan' \(remat report --size layout=scan\)"),
    ("eqx_gpt", "n_layers=1000 d_model=64 n_heads=2 seq_len=16 batch=2",
     r"GPT: n_layers=1000 in layout 'list'.*Fix: layout='scan'"),
    # without abstract=true a preset allocated ~90 GiB on this machine before compiling
    ("nnx_gpt", "preset=llama3-8b abstract=false",
     r"GPT: these sizes hold about 89\.9 GiB of float32 parameters and AdamW state.*Fix: "
     r"abstract=true"),
    ("eqx_gpt", "preset=llama3-8b abstract=false", r"about 89\.9 GiB.*Fix: abstract=true"),
    # an Equinox model of size zero was told to fix "an in-place NNX step"
    ("eqx_gpt", "d_model=0", r"GPT: d_model=0 must be a positive integer\. Fix: --size d_model=N"),
    ("nnx_gpt", "seq_len=64.0", r"GPT: seq_len=64\.0 must be a positive integer"),
    # own round: `rope=maybe` was read as true, n_heads=0 a ZeroDivisionError
    ("nnx_gpt", "rope=maybe", r"GPT: rope='maybe' must be true or false\. Fix: --size rope=true"),
    ("eqx_gpt", "n_heads=0", r"GPT: n_heads=0 must be a positive integer"),
    ("eqx_gpt", "abstract=maybe", r"GPT: abstract='maybe' must be true or false"),
    ("nnx_gpt", "dtype=int8", r"GPT: dtype='int8' is not a compute dtype; allowed: 'bfloat16', "),
    # the model's own message was cut in the middle ('CausalSelfAttention: d_mode....')
    ("nnx_gpt", "d_model=130",
     r"CausalSelfAttention: d_model=130, n_heads=4, n_kv_heads=4: n_heads must divide d_model "
     r"and n_kv_heads must divide n_heads\. Fix: choose heads that do \(measure_target\(None, "),
])
def test_cli_example_sizes_the_model_refuses_at_once(example, size, match):
    if "abstract=" not in size:
        size += " abstract=true"
    code, first, _ = _remat("report", f"example:{example}", "--steps", "0", "--plans", "none",
                            "--no-progress", "--size", *size.split())
    assert code == 2, first
    assert first.startswith(f"remat report: error: ") and re.search(match, first), first
    assert first.endswith("shows the full traceback).")


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
def test_cli_json_to_a_full_disk_names_the_option_and_the_reason(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    code, first, out = _remat("report", "example:nnx_gpt", "--steps", "0", "--plans", "none",
                              "--no-progress", "--size", "n_layers=1", "d_model=32", "seq_len=16",
                              "batch=1", "--json", "/dev/full")
    assert code == 2 and "remat plans" in out  # the measurements were printed
    assert first == ("remat report: error: --json '/dev/full' could not be written: No space left "
                     "on device. The measurements are printed above. Fix: free space, or give "
                     "another path to --json.")


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
def test_cli_tune_reserve_beside_budget_is_refused():
    code, first, _ = _remat("tune", "example:nnx_gpt", "--budget", "1GiB", "--reserve", "0.1")
    assert code == 2
    assert first.startswith("remat tune: error: remat tune: --reserve 0.1 and --budget 1.00 GiB: "
                            "the reserve is what the default budget"), first


@pytest.mark.tooling  # `remat report`'s building and measuring (a `remat` command)
@pytest.mark.compat
@needs_report
def test_a_configs_accelerator_file_is_read_next_to_the_config(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "t.py").write_text("def f(plan):\n    pass\n")
    (sub / "report.yaml").write_text("target: t.py:f\nplans: {a: null}\naccelerator: mine.txtpb\n")
    code, first, _ = _remat("report", str(sub / "report.yaml"), "--no-progress", cwd=tmp_path)
    assert code == 2
    assert first.startswith("remat report: error: accelerator ") and first.endswith(
        f": the target-config file '{sub / 'mine.txtpb'}' does not exist."), first


def _tpu_compiler_missing() -> str | None:
    from remat_common.measurement import compiler_available
    return compiler_available("tpu")


@pytest.mark.target
@needs_report
@pytest.mark.skipif(_tpu_compiler_missing() is not None, reason="no XLA:TPU compiler here "
                    "(./scripts/test's target stage)")
def test_cli_v5e_one_peak_and_a_clean_stderr(tmp_path):
    """Compiled for v5e:2x2: the table's peak/device, the breakdown's peak and the JSON agree
    with memory_analysis(); libtpu's start-up lines are not in a clean run's stderr."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "_remat_cli", "report", "example:nnx_gpt", "--steps", "0",
         "--plans", "none", "--accelerator", "v5e:2x2", "--no-progress", "--json",
         str(tmp_path / "r.json"), "--size", "n_layers=1", "d_model=32", "seq_len=16", "batch=4",
         "vocab=64"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "400"})  # no line of ours wrapped (a long tmp path)
    assert done.returncode == 0, done.stderr
    assert all(ln.startswith(("remat report: ", "wrote ")) for ln in done.stderr.splitlines()), \
        done.stderr
    from remat_common.measurement import Report
    p = Report.load(tmp_path / "r.json")["none"]
    assert p.breakdown is not None and p.breakdown.total == p.memory.device_total
    assert sum(r.bytes for r in p.breakdown.rows) == p.memory.device_total
    assert all(r.bytes >= 0 for r in p.breakdown.rows)
    # XLA:TPU's heap peak packs the buffer assignment's rows into whole allocations: what it counts
    # beyond them is a row of its own, what it counts less comes out of the bytes that hold no
    # live value at the peak (recorded in `taken`), never a negative row
    accounted = p.breakdown.rows[-1].kind == "compiler accounting"
    assert not (accounted and p.breakdown.taken), (p.breakdown.rows, p.breakdown.taken)
