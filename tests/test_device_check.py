"""``scripts/device_check`` without an accelerator: on CPU in its quick mode it measures the
donated step, times fed-back steps, checks a time model against them and says that no accelerator
was there; with the TPU compiler installed (``target`` stage), it sets a deviceless ``v5e:1x1``
compile beside this machine's. On a TPU chip its output is docs/tpu.md's tables. It cannot take
the machine down or claim what it did not check: host memory is predicted before anything is
allocated, a signal ends its child and leaves honest partial JSON, and a deviceless compile that
failed fails the run. The check runs in this process (``remat_common.internal.device_check``),
its measurements in children as always; the script itself runs once, stopped by a signal."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.tooling

pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("orbax.checkpoint")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "_device_check.py"


def _run(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], *args: str
         ) -> tuple[int, str, dict]:
    """The device check in this process (``remat_common.internal.device_check``, what the script
    runs; its measurements in children, as always): its status, its output (stdout and stderr)
    and its JSON. The signal test below runs the script itself."""
    from remat_common.internal import device_check

    out = tmp_path / "dc.json"
    code = device_check([*args, "--json", str(out)])
    said = capsys.readouterr()
    return code, said.out + said.err, (json.loads(out.read_text()) if out.is_file() else {})


def test_device_check_on_cpu_measures_and_checks_the_time_model(tmp_path, capsys):
    code, said, data = _run(tmp_path, capsys, "--quick", "--examples", "eqx_gpt", "--plans",
                            "none,offload", "--target", "none", "--profile", "tpu-v5e")
    assert code == 0, said[-6000:]
    assert "NO accelerator: ran on cpu" in said
    info = data["examples"]["eqx_gpt"]
    assert info["backend"] == "cpu" and info["target"] is None
    rows = {r["plan"]: r for r in data["rows"]}
    assert sorted(rows) == ["none", "offload"]
    for r in rows.values():
        assert r["status"] == "fits" and r["verdict"] == "not compiled deviceless"
        assert r["steps_timed"] == 2 and r["step_s"] > 0  # fed-back steps, state donated
        assert r["alias_size_in_bytes"] > 0  # the state takes its own buffers
        assert r["peak_bytes"] == (r["argument_size_in_bytes"] + r["output_size_in_bytes"]
                                   + r["temp_size_in_bytes"] - r["alias_size_in_bytes"])
        # the time model: the data sheet's prediction and the fitted one, each against the step
        # (the offload's transfers overlap the compute: the longer of the two)
        assert r["predicted_s"] == pytest.approx(max(r["flops"] / 197e12,
                                                     r["host_bytes_per_step"] / 32e9))
        assert r["model_error"] == pytest.approx(r["predicted_s"] / r["step_s"] - 1)
        assert r["fitted_error"] == pytest.approx(r["fitted_s"] / r["step_s"] - 1)
    assert rows["offload"]["host_bytes_per_step"] > 0 == rows["none"]["host_bytes_per_step"]
    model = info["time_model"]
    assert model["profile"] == "v5e" and model["fitted"]["name"] == "v5e-fitted"  # tpu-v5e's name
    assert any(line.split()[:2] == ["eqx_gpt", "offload"] for line in said.splitlines())


def test_device_check_is_the_executable_wrapper_over_the_body():
    script = ROOT / "scripts" / "device_check"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert 'source "$(dirname "$0")/_env.sh"' in text and "ensure_venv" in text
    assert '"$VENV/bin/python" "$ROOT/scripts/_device_check.py"' in text
    assert 'cd "$ROOT"' not in text  # --json and plan files are the caller's, where it stands


def test_device_check_reports_what_its_time_budget_left_out(tmp_path, capsys):
    code, said, data = _run(tmp_path, capsys, "--budget-s", "0")
    assert code == 1, said
    assert "INCOMPLETE: 2 measurement(s) missing" in said
    assert [(r["example"], r["missing"]) for r in data["rows"]] == [
        ("nnx_gpt", "out of time"), ("eqx_gpt", "out of time")]


@pytest.mark.target
def test_device_check_sets_a_deviceless_tpu_compile_beside_this_machines(tmp_path, capsys):
    pytest.importorskip("libtpu")
    code, said, data = _run(tmp_path, capsys, "--quick", "--examples", "nnx_gpt", "--plans",
                            "none,offload", "--target", "v5e:1x1")
    assert code == 0, said[-6000:]
    rows = {r["plan"]: r for r in data["rows"]}
    assert all("target_temp_bytes" in r for r in rows.values()), said[-3000:]
    for r in rows.values():  # two compilers: XLA:CPU here, XLA:TPU deviceless
        assert r["target_temp_bytes"] is not None and r["identical"] is False
        assert r["verdict"].startswith("DIFFERS: peak ")
    # the offload is on host only in the TPU compile (XLA:CPU drops host placements)
    assert rows["offload"]["target_host_temp_bytes"] > 0 == rows["offload"]["host_temp_size_in_bytes"]
    assert data["examples"]["nnx_gpt"]["target"] == "v5e:1x1"


@pytest.mark.parametrize("backend, steps", [("tpu", 2), ("cpu", 0)])
def test_measure_holds_one_plans_state_at_a_time(monkeypatch, backend, steps):
    """On an accelerator each plan is timed once measured, its state parked on host only
    meanwhile: when the next plan is built, no earlier plan's state is held (five parked states of
    a 533 M-parameter model ran a 40 GiB TPU host out of memory). Compiled only (``steps=0``,
    the deviceless child), a measured plan's arrays are let go at once. On a CPU with steps, every
    plan's state and its placed copy live together: the 2 x plans copies that device_check's
    prediction counts."""
    import jax
    import jax.numpy as jnp

    from remat_common.measurement import MeasureTarget, measure

    def build(plan):
        step = lambda w, x: (w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w),
                             jnp.sum(w))
        args = (jnp.eye(64) * 1.0, jnp.ones((4, 64)))
        return MeasureTarget(lambda w, x: jnp.sum(jnp.tanh(x @ w)), args, step, args)

    held: list[tuple[str, str | None, int]] = []
    # what an earlier test of this process keeps alive is not this measurement's (after
    # tests/test_flops.py on the same worker six (64, 64) arrays were alive: this test failed)
    before = {id(x) for x in jax.live_arrays() if x.shape == (64, 64)}

    def progress(e):
        held.append((e.stage, e.plan, sum(x.shape == (64, 64) and id(x) not in before
                                          for x in jax.live_arrays())))

    if backend != "cpu":
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
    rep = measure(build, {"a": None, "b": None, "c": None}, steps=steps, warmup=1,
                  progress=progress)
    assert [len(p.timing.steps) for p in rep.plans] == [steps] * 3
    builds = [n for stage, _, n in held if stage == "build"]
    assert builds == [0, 0, 0], held  # nothing of an earlier plan left when the next is built
    if steps:  # plan after plan: each one's steps before the next is built
        assert [(s, p) for s, p, _ in held if s in ("build", "time")] == [
            ("build", "a"), ("time", "a"), ("build", "b"), ("time", "b"), ("build", "c"),
            ("time", "c")]
        assert held[-1][0] == "done" and max(n for _, _, n in held) == 1


def _child_session(parent: int) -> list[int]:
    """The device_check children of ``parent`` (run in sessions of their own)."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"--child" in cmd and int(stat[1]) == parent and stat[0] != "Z":
            out.append(int(d.name))
    return out


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_child_and_leaves_honest_json(tmp_path, sig):
    """Stopped while its child measures, started outside the repository with a relative --json:
    the child is ended (SIGTERM left it running, orphaned, holding the chip), the JSON is written
    where the caller stands, whole and marked incomplete with the signal named, and the exit is
    128 + the signal with one line (Ctrl-C printed a 23-line traceback). No other file is left."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--examples", "eqx_gpt",
                             "--plans", "none", "--target", "none", "--json", "out/dc.json"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (kids := _child_session(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines() == [
        f"device_check: stopped by {sig.name}; wrote {tmp_path / 'out' / 'dc.json'}: 0 plan(s) "
        "measured before, marked incomplete"]
    assert not any(pathlib.Path(f"/proc/{k}").exists() for k in kids)
    data = json.loads((tmp_path / "out" / "dc.json").read_text())
    assert data["incomplete"] is True and data["signal"] == sig.name
    assert data["rows"] == [{"example": "eqx_gpt", "plan": "*", "missing": f"stopped by {sig.name}"}]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["out", "out/dc.json"]


def test_a_measurement_over_the_host_memory_is_refused_before_it_allocates(tmp_path, capsys):
    """The host bytes a measurement holds are predicted from one plan's shapes before anything
    is allocated; over the limit (here ``--host-memory``; by default 90 % of MemAvailable) the
    child refuses with the figures and the fix, and the run fails: five plans of a 533 M-parameter
    model parked ~32 GB on a 40 GiB host, which killed it."""
    code, said, data = _run(tmp_path, capsys, "--quick", "--examples", "eqx_gpt", "--plans",
                            "none,save", "--target", "none", "--host-memory", "1000")
    assert code == 1, said
    (row,) = data["rows"]
    assert row["missing"].startswith(
        "exit 3: device_check: host memory: measuring 2 plan(s) of eqx_gpt on cpu (device) holds "
        "the step's arguments (parameters, optimizer state, batch: 247.27 KiB a plan) 4 time(s) "
        "in host memory (every plan's state and its placed copy, their steps interleaved): "
        "989.06 KiB, over --host-memory 1000 B; ")
    assert row["missing"].endswith(
        "run, it would be killed, or take the machine down. Fix: fewer plans per call (--plans "
        "none,save), or a smaller size (--size n_layers=N batch=N)")
    assert data["incomplete"] is True and "INCOMPLETE: 1 measurement(s) missing" in said


def test_a_failed_deviceless_compile_fails_the_run(tmp_path, capsys, monkeypatch):
    """A deviceless compile that was asked for and failed (here a libtpu that does not load) is
    said and fails the run: it exited 0 and its rows read as a check. Nothing is marked compared."""
    fake = tmp_path / "libtpu.so"
    fake.write_bytes(b"")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(fake))  # for the check and its children
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    code, said, data = _run(tmp_path, capsys, "--quick", "--examples", "eqx_gpt", "--plans",
                            "none", "--target", "v5e:1x1")
    assert code == 1, said[-5000:]
    (row,) = data["rows"]
    assert row["status"] == "fits" and "identical" not in row
    assert row["verdict"].startswith("deviceless compile failed: exit 2: device_check: ")
    assert data["incomplete"] is True
    assert "none compared with a deviceless compile" in said
    assert "FAILED: eqx_gpt (v5e:1x1): deviceless compile failed: " in said
