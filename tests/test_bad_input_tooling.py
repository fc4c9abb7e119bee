"""Bad input to the tooling's functions never crashes or passes silently (issues 13, 27 and 39):
lint, measure, tune and capacity (checked before anything is built or compiled), device profiles,
reports read back, the target compilers' output. The ``remat`` command over them:
tests/test_bad_input_cli.py.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

import remat_common as rc
from remat_common import Plan, PlanError, RematError, resolve

from bad_input import MAX_MESSAGE

pytestmark = pytest.mark.lock_only  # what is refused and the message: checked before JAX runs


# -- lint ------------------------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("line, flagged", [
    ("x = jnp.empty(3)", True),
    ("x = jnp.empty(3)  # noqa: RM002", False),
    ("x = jnp.empty(3)  # noqa:RM002,E501", False),
    ("x = jnp.empty(3)  # NOQA: rm002", False),
    ("x = jnp.empty(3)  # noqa: E501", True),
    ("x = jnp.empty(3)  # noqa: RM007", True),
    ("x = jnp.empty(3)  # noqa", False),
    ("x = jnp.empty(3)  # remat: ignore[RM002]", False),
    ("x = '# noqa: RM002' + str(jnp.empty(3))", True),
])
def test_lint_honours_noqa(line, flagged):
    found = rc.lint.lint_source("import jax.numpy as jnp\n" + line + "\n")
    assert bool(found) is flagged


@pytest.mark.compat
@pytest.mark.parametrize("src, flagged", [
    ("a = jnp.empty((3, 4)).at[...].set(1.0)", False),
    ("a = jnp.empty_like(x).at[:].set(x)", False),
    ("a = jnp.empty((3, 4)).at[:, :].set(x)", False),
    ("b = jnp.empty(3)\nb = b.at[...].set(x)", False),
    ("def f(x):\n    e = jnp.empty(x.shape)\n    return e.at[:].set(x)", False),
    ("a = jnp.empty((3, 4)).at[0].set(1.0)", True),
    ("a = jnp.empty((3, 4)).at[:, 0].set(1.0)", True),
    ("a = jnp.empty((3, 4)).at[...].add(1.0)", True),
    ("b = jnp.empty(3)\nc = b + 1\nb = b.at[...].set(x)", True),
    ("b = jnp.empty(3)\nb = b.at[1:].set(x)", True),
    ("b = jnp.empty(3)\nc = b.at[...].set(b)", False),
    ("b = jnp.empty(3)", True),
    ("z = jnp.empty(0, jnp.int32)", False),
    ("z = jnp.empty((0, 3))", False),
    ("z = jnp.empty((1, 3))", True),
    ("p = jnp.empty((), jnp.float32)\nd = jnp.real(p).real.dtype", False),
    ("d = jnp.empty((2,)).dtype", False),
    ("p = jnp.empty(())\nd = p.dtype\ne = p + 1", True),
    ("def f():\n    p = jnp.empty(())\n    return p.shape\np = 3\nq = p + 1", False),
])
def test_lint_empty_filled_at_once_is_not_flagged(src, flagged):
    found = rc.lint.lint_source("import jax.numpy as jnp\n" + src + "\n")
    assert [f.rule for f in found] == (["RM002"] if flagged else [])


@pytest.mark.compat
def test_lint_silences_syntax_warnings_and_survives_deep_code(tmp_path):
    # pytest turns warnings into errors: a SyntaxWarning leaking out would fail here
    assert rc.lint.lint_source('import jax.numpy as jnp\ns = "\\d"\nx = jnp.empty(3)\n')[0].rule == "RM002"
    deep = "import jax\nx = " + "+".join(["1"] * 50_000) + "\n"
    found = rc.lint.lint_source(deep, "deep.py")
    assert all(f.rule == "RM000" and "cannot" in f.message for f in found)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = rc.lint.lint_paths([_write_py(tmp_path, deep)])
    assert report.findings and report.findings[0].rule == "RM000"


def _write_py(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deep.py"
    path.write_text(text)
    return path


@pytest.mark.compat
@pytest.mark.parametrize("call, error, match", [
    # one path given as a string was walked character by character: '/' first, the whole disk
    (lambda d: rc.lint.lint_paths(str(d)), TypeError, r"lint_paths: paths must be a list of files "
                                                      r"and directories; got str .*Fix: pass \['"),
    (lambda d: rc.lint.lint_paths(d), TypeError, r"got PosixPath"),
    (lambda d: rc.lint.lint_paths(None), TypeError, r"got NoneType None"),
    (lambda d: rc.lint.lint_paths([3]), TypeError, r"each of paths must be a file or directory"),
    (lambda d: rc.lint.lint_paths([d], select=""), ValueError, r"select '' names no rule, so "
                                                               r"nothing would be checked"),
    (lambda d: rc.lint.lint_paths([d], select=[]), ValueError, r"names no rule"),
    (lambda d: rc.lint.lint_paths([d], select=3), TypeError, r"select must be rule ids or names"),
    (lambda d: rc.lint.lint_source(b"x = 1\n"), TypeError, r"lint_source: source must be Python "
                                                           r"source text \(str\), got bytes"),
    (lambda d: rc.lint.lint_source(None), TypeError, r"got NoneType"),
])
def test_lint_api_misuse(tmp_path, call, error, match):
    (tmp_path / "m.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    with pytest.raises(error, match=match):
        call(tmp_path)


@pytest.mark.compat
def test_lint_skips_directories_it_may_not_read(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("x = 1\n")
    (tmp_path / "locked").mkdir()
    real = Path.is_file

    def is_file(self: Path) -> bool:  # what root meets in /proc/1/fdinfo
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    assert [Path(f).name for f in rc.lint.lint_paths([tmp_path]).files] == ["m.py"]


@pytest.mark.compat
def test_lint_says_which_directories_it_could_not_list(tmp_path, monkeypatch):
    """A directory os.walk cannot list (no permission; root is never refused, so the refusal is
    made here) was skipped silently: it is now an RM000 finding naming it, so lint fails."""
    (tmp_path / "m.py").write_text("x = 1\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden_hazard.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    report = rc.lint.lint_paths([tmp_path])
    assert [Path(f).name for f in report.files] == ["m.py"]
    (f,) = report.findings
    assert (f.rule, f.path) == ("RM000", str(locked))
    assert "cannot read this directory (Permission denied)" in f.message and "read access" in f.fix


# -- measure, tune, capacity: checked before anything is built or compiled -------------------------
def _never_built(plan: Any) -> Any:
    raise AssertionError("the target was built: the arguments were not checked first")


@pytest.mark.compat
@pytest.mark.parametrize("call, match", [
    (lambda: rc.verify(lambda x: x, 1.0, plan=rc.compile_plan(resolve(Plan(), [])), strict="no"),
     r"verify: strict must be True or False; got str 'no'"),  # 'no' was strict
    (lambda: rc.saved_residuals(3, 1.0), r"saved_residuals: fun must be a function; got int 3"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, steps="3"),
     r"measure: steps must be an integer >= 0, got str '3'"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, warmup=1.5),
     r"measure: warmup must be an integer >= 0, got float"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, placement="yes"),
     r"measure: placement must be True, False or None"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, check_layouts="no"),
     r"measure: check_layouts must be True or False; got str 'no'"),
])
def test_measure_and_verify_arguments(call, match):
    with pytest.raises(RematError, match=match):
        call()


@pytest.mark.compat
@pytest.mark.parametrize("kwargs, match", [
    ({"choices": "recompute"}, r"choices must be a list of choice names .*got str 'recompute'\. "
                               r"Fix: pass \['recompute'\]"),  # it was split into characters
    ({"choices": 3}, r"choices must be a list"),
    ({"choices": [3]}, r"choice names must be strings"),
    ({"choices": {"mine": "bogus"}}, r"choice 'mine': unknown remat annotation 'bogus'"),  # was dropped
    ({"choices": {"mine": {"save": []}}}, r"choice 'mine': .*names no activations"),
    ({"plans": "minimal.yaml"}, r"plans must be a mapping \{name: plan\}.*got str"),
    ({"plans": ["x"]}, r"plans must be a mapping"),
    ({"plans": {"a": 3}}, r"tune: plans\['a'\]: Plan.coerce: cannot make a plan from int 3"),
    ({"max_compiles": "40"}, r"max_compiles must be an integer >= 1, got str '40'"),
    ({"max_compiles": 2.5}, r"max_compiles must be an integer >= 1, got float"),
    ({"max_compiles": True}, r"max_compiles must be an integer >= 1, got bool"),
    ({"time_limit": "10"}, r"time_limit must be a positive number of seconds"),
    ({"time_limit": -1}, r"time_limit must be a positive number"),  # stopped after one compile
    ({"time_limit": float("nan")}, r"time_limit must be a positive number"),
    ({"measure": "3"}, r"measure must be an integer >= 0, got str"),
    ({"measure": 2.5}, r"measure must be an integer >= 0"),
    ({"measure_steps": 0}, r"measure_steps must be an integer >= 1"),
    ({"objective": "memory"}, r"objective must be one of \['flops', 'time'\], got 'memory'"),
    ({"progress": 3}, r"progress must be a callable"),
    ({"cache": []}, r"cache must be a dict"),
    ({"layers": 3}, r"layers must be the stack's path"),
])
def test_tune_arguments_are_checked_first(kwargs, match):
    with pytest.raises(RematError, match=match) as info:
        rc.tune(_never_built, "1GiB", **kwargs)
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.compat
def test_tune_target_must_be_a_builder():
    with pytest.raises(RematError, match=r"tune: target must be a builder build\(plan\)"):
        rc.tune(3, "1GiB")


@pytest.mark.compat
@pytest.mark.parametrize("kwargs, match", [
    ({"start": "8"}, r"capacity: start must be an integer >= 1, got str '8'"),
    ({"start": 0}, r"start must be an integer >= 1"),
    ({"start": True}, r"start must be an integer >= 1, got bool"),
    ({"start": 4, "step": "1"}, r"step must be an integer >= 1"),
    ({"start": 4, "step": 3}, r"start=4 must be a positive multiple of step=3"),
    ({"start": 4, "limit": 2}, r"limit=2 is below start=4: the search would report start"),
    ({"start": 4, "limit": -1}, r"limit must be an integer >= 1"),
    ({"start": 4, "max_compiles": 0}, r"max_compiles must be an integer >= 1"),
    ({"start": 4, "plans": "x.yaml"}, r"plans must be a mapping"),
    ({"start": 4, "plans": {"ok": None, "bad": 3}}, r"capacity: plans\['bad'\]: Plan.coerce"),
    ({"start": 4, "progress": "x"}, r"progress must be a callable"),
])
def test_capacity_arguments_are_checked_first(kwargs, match):
    kwargs = {"plans": {"r": {"layers.*": "recompute"}}, **kwargs}
    with pytest.raises(RematError, match=match):
        rc.measurement.capacity(lambda v: _never_built, "1GiB", **kwargs)


@pytest.mark.compat
@pytest.mark.parametrize("text, match", [
    ("flops_per_s: true\nhbm_bytes: 80GB\nhost_link_bytes_per_s: 6.4e10\n",
     r"flops_per_s True: it must be a positive, finite number"),  # was 1 FLOP/s
    ("flops_per_s: .nan\nhbm_bytes: 80GB\nhost_link_bytes_per_s: 6.4e10\n", r"flops_per_s nan"),
    ("flops_per_s: .inf\nhbm_bytes: 80GB\nhost_link_bytes_per_s: 6.4e10\n", r"flops_per_s inf"),
    ("base: h100\nhost_link_bytes_per_s: 64GB/s\n", r"host_link_bytes_per_s '64GB/s': units are not "
                                                    r"read"),
    ("base: h100\nhbm_bytes: 80XB\n", r"gpu\.yaml: hbm_bytes '80XB': unknown unit 'XB'"),
    ("base: [h100]\n", r"base \['h100'\] is not a built-in profile"),  # was TypeError: unhashable
    ("base: h100\nname: [a, b]\n", r"name must be a string, got list"),
    ("base: h100\nexposed_transfer_share: 1.5\n", r"exposed_transfer_share 1\.5: it must be a "
                                                    r"number from 0"),
    ("base: h100\nexposed_transfer_share: most\n", r"exposed_transfer_share 'most'"),
])
def test_device_profiles_with_bad_fields(tmp_path, text, match):
    path = tmp_path / "gpu.yaml"
    path.write_text(text)
    with pytest.raises(PlanError, match=match):
        rc.tune(_never_built, "1GiB", profile=str(path))
    with pytest.raises(PlanError, match=r"device profile '.*missing\.yaml' does not exist"):
        rc.tune(_never_built, "1GiB", profile=str(tmp_path / "missing.yaml"))


def test_zero_size_inputs_name_the_size_not_an_nnx_step():
    import jax.numpy as jnp
    from remat_common.measurement import MeasureTarget, measure

    def build(plan):
        w, x = jnp.ones((0, 3)), jnp.ones((2, 0))
        loss = lambda w, x: (x @ w).sum()  # noqa: E731

        def step(w, x):
            return w, loss(w, x)
        return MeasureTarget(loss, (w, x), step, (w, x), None)
    with pytest.raises(RematError, match=r"plan 'none': the training step has no backward pass to "
                                         r"measure: 2 of its inputs hold no element \(shapes "
                                         r"\(0, 3\) float32, \(2, 0\) float32\).*Fix: sizes of at"):
        measure(build, {"none": None}, steps=0)


# -- reports, breakdowns, meshes and the target compilers ------------------------------------------
@pytest.mark.parametrize("mesh, kind", [({"data": 4.5}, "float"), ({"data": 4.0}, "float"),
                                        ({"data": True}, "bool"), ({"data": None}, "NoneType")])
def test_parse_mesh_refuses_what_is_not_an_integer(mesh, kind):
    from remat_common.measurement import parse_mesh
    with pytest.raises(RematError, match=rf"^--mesh .*of 'data' is a {kind}, not an integer"):
        parse_mesh(mesh, 4)
    assert parse_mesh({"data": 4}, 4) == parse_mesh("data=4", 4) == {"data": 4}


def _report_json() -> dict[str, Any]:
    """A small report's JSON, built without compiling (the fields a measured one has)."""
    path = Path(__file__).parent / "data" / "target_offload_report.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(baseline="nope"), r"^Report\.from_json: baseline is 'nope', but it must be "
                                          r"one of its plans 'none', 'offload', 'recompute'"),
    (lambda d: d["plans"][0].update(bytes_by_path="corrupt"),
     r"^Report\.from_json: plans\[0\]\.bytes_by_path is 'corrupt', which is not what the plan's "
     r"own figures give"),
    (lambda d: d.pop("plans"), r"^Report\.from_json: plans is missing \(remat-report/1 has"),
    (lambda d: d.update(format=999), r"^Report\.from_json: the report has format 999; this "
                                     r"version reads 'remat-report/1' only"),
    (lambda d: d.pop("format"), r"the report has no 'format'"),
    (lambda d: d["plans"][1]["memory"].update(temp_size_in_bytes=-1),
     r"plans\[1\]\.memory\.temp_size_in_bytes is -1, but it must be null or a non-negative "
     r"integer"),
    (lambda d: d["plans"][1]["memory"].update(temp_size_in_bytes=float("nan")),
     r"plans\[1\]\.memory\.temp_size_in_bytes is nan, but it must be null or a non-negative "
     r"integer"),
    (lambda d: d["plans"][1]["residuals"][0].update(nbytes=-1),
     r"plans\[1\]\.residuals\[0\]\.nbytes is -1, but it must be a non-negative number"),
    (lambda d: d["plans"][1].update(flops_counted=float("nan")),
     r"plans\[1\]\.flops_counted is nan, but it must be null or a non-negative number"),
    (lambda d: d["plans"][0].update(residuals="abc"), r"plans\[0\]\.residuals is 'abc'"),
    (lambda d: d["plans"][0]["timing"].pop("lower_s"), r"plans\[0\] \('none'\) cannot be read"),
    (lambda d: d["capabilities"].pop("backend"), r"capabilities cannot be read"),
    (lambda d: d["plans"].append(d["plans"][0]), r"one name per plan"),
    (lambda d: d["plans"][0]["breakdown"]["timeline"].update(peak=10 ** 6),
     r"plans\[0\]\.breakdown\.timeline\.peak is 1000000, but it must be a point of the timeline"),
    (lambda d: d["plans"][0]["breakdown"]["timeline"].update(bytes=[[1, 2, 3]]),
     r"plans\[0\]\.breakdown\.timeline is .*one series of bytes per kind"),
    (lambda d: d["plans"][0]["breakdown"]["rows"][0].update(kind="bogus"),
     r"plans\[0\]\.breakdown\.rows\[0\] is .*'bogus'.*with a kind of 'allocator slack'"),
    (lambda d: d["plans"][0]["residuals"][0].update(placement="moon"),
     r"plans\[0\]\.residuals\[0\]\.placement is 'moon', but it must be 'device' or 'host'"),
    (lambda d: d["accelerator"].update(memory_bytes="lots"), r"accelerator\.memory_bytes is 'lots'"),
    (lambda d: d["plans"][0].update(flop_ratio=0), r"plans\[0\]\.flop_ratio is 0, but it must "
                                                   r"be null or a positive number"),
    (lambda d: d["plans"][0]["memory"].update(temp_size_in_bytes=True),
     r"plans\[0\]\.memory\.temp_size_in_bytes is True, but it must be null or a non-negative"),
])
def test_report_from_json_names_the_bad_field(edit, match):
    from remat_common.measurement import Report, ReportFormatError
    data = _report_json()
    Report.from_json(data)  # the file as written reads back
    edit(data)
    with pytest.raises(ReportFormatError, match=match) as info:
        Report.from_json(data)
    assert "Fix: write the report again" in str(info.value) and len(str(info.value)) < MAX_MESSAGE


def test_report_load_of_a_file_that_is_not_json(tmp_path):
    from remat_common.measurement import Report, ReportFormatError
    (tmp_path / "r.json").write_text('{"format": "remat-report/1",\n "plans": [')
    with pytest.raises(ReportFormatError, match=r"r\.json:2: not JSON"):
        Report.load(tmp_path / "r.json")
    with pytest.raises(ReportFormatError, match=r"cannot read .*missing\.json"):
        Report.load(tmp_path / "missing.json")


def test_a_breakdown_takes_the_compilers_peak_with_the_difference_as_a_row():
    """Compiled for v5e:2x2 the breakdown's rows summed to 166.5 KiB where memory_analysis()
    (what XLA accepts or refuses a program by) gave 293 KiB: one peak now, the difference a row."""
    from remat_common.measurement import MemoryBreakdown, PeakRow, Timeline
    b = MemoryBreakdown((PeakRow("parameter", None, "w", 100), PeakRow("allocator slack", None,
                                                                         None, 20)),
                        Timeline((), (), None, 0))
    assert b.reconciled(None) == b and b.reconciled(120) == b
    more = b.reconciled(300)
    assert more.total == 300 and more.rows[-1].kind == "compiler accounting"
    assert more.rows[-1].bytes == 180 and "memory_analysis()" in more.rows[-1].note
    assert more.reconciled(300) == more  # once
    less = b.reconciled(110)  # the compiler counts less: out of the slack, and a line (issue 50)
    assert less.total == less.peak == 110 and less.taken == (("allocator slack", 10),)
    assert all(r.bytes >= 0 for r in less.rows) and "memory_analysis()" in less.accounting()
    fit = more.will_it_fit(1000)
    assert sum(v for _, v in fit.parts) == 300


@pytest.mark.parametrize("text, kept", [
    ("Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
     "accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually\n"
     "WARNING: Logging before InitGoogle() is written to STDERR\n"
     "E0000 00:00:1796509291.580208   19473 common_lib.cc:835] INVALID_ARGUMENT: Error: unexpected "
     "worker hostname 'WARNING: could not determine TPU worker hostnames' from env var "
     "TPU_WORKER_HOSTNAMES.\n=== Source Location Trace: === \n"
     "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:370\n", ""),
    ("E0000 00:00:1.2 7 tpu_compiler.cc:9] RESOURCE_EXHAUSTED: out of memory\n",
     "E0000 00:00:1.2 7 tpu_compiler.cc:9] RESOURCE_EXHAUSTED: out of memory\n"),
    ("F1205 heap_simulator.cc:1] Check failed: x\n", "F1205 heap_simulator.cc:1] Check failed: x\n"),
])
def test_libtpu_start_up_lines_are_left_out_and_real_errors_kept(text, kept):
    """Every XLA:TPU target run's stderr opened with libtpu lines that read as failures (captured
    on this machine from .venv-target's libtpu, off a TPU VM)."""
    from remat_common.internal import quiet_stderr
    assert quiet_stderr(text) == kept


def test_report_json_takes_a_compiler_peak_below_the_rows():
    import dataclasses
    from remat_common.measurement import Report
    rep = Report.from_json(_report_json())
    p = rep.plans[0]
    less = dataclasses.replace(p, breakdown=p.breakdown.reconciled(p.breakdown.total - 5))
    rep = dataclasses.replace(rep, plans=(less, *rep.plans[1:]))
    assert less.breakdown.over == 5 and all(r.bytes >= 0 for r in less.breakdown.rows)  # no -5
    assert Report.from_json(json.loads(json.dumps(rep.to_json()))) == rep


_ABORT = """
import os
from remat_common._tooling.accelerators._compilers import _captured_stderr
with _captured_stderr() as log:
    os.write(2, b"I0000 00:00:1764972601.1 42 tpu_initializer.cc:60] libtpu started\\nsaid\\n")
print(repr(log[0]), flush=True)
with _captured_stderr():
    os.write(2, b"F1205 heap_simulator.cc:1234] Check failed: size >= 0\\n")
    os.abort()
"""


def _without_runtime_warnings(stderr: str) -> list[str]:
    """``stderr``'s lines but the warnings JAX's TPU runtime prints at ``import jax`` on a TPU
    host (``jax/_src/cloud_tpu_init.py:90: UserWarning: Transparent hugepages ...``, then the
    warning's source line), which come before anything the process itself writes."""
    out: list[str] = []
    skip = False
    for line in stderr.splitlines():
        if re.match(r".*/jax/_src/\w+\.py:\d+: UserWarning: ", line):
            skip = True
        elif not (skip and line.startswith(" ")):
            skip = False
            out.append(line)
    return out


@pytest.mark.tooling  # a process that XLA aborts
def test_a_compiler_abort_says_what_xla_said_and_the_fix():
    """XLA aborts the process (`Check failed`): no `finally` runs, and the captured stderr was
    lost (issue 39: exit 134, nothing printed). The watcher prints it with the diagnosis."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ABORT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode in (-6, 134)
    assert done.stdout.strip() == repr("I0000 00:00:1764972601.1 42 tpu_initializer.cc:60] "
                                       "libtpu started\nsaid\n")  # the log keeps everything
    lines = _without_runtime_warnings(done.stderr)
    assert lines[0] == "said", lines  # libtpu's start-up line is not passed on
    assert re.match(r"remat: error: the XLA compiler aborted the process while compiling .*XLA "
                    r"said: F1205 heap_simulator\.cc:1234\] Check failed: size >= 0\. .*Fix: a "
                    r"smaller size", lines[1]), lines
    assert lines[2] == "F1205 heap_simulator.cc:1234] Check failed: size >= 0"
