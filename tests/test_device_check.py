"""``scripts/device_check`` without an accelerator: on CPU in its quick mode it measures the
donated step, times fed-back steps, checks a time model against them and says that no accelerator
was there; with the TPU compiler installed (``target`` stage), it sets a deviceless ``v5e:1x1``
compile beside this machine's. On a TPU chip its output is docs/tpu.md's tables."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tooling

pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("orbax.checkpoint")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "_device_check.py"


def _run(tmp_path: pathlib.Path, *args: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "dc.json"
    # the Python body with this interpreter: scripts/device_check would build/choose .venv itself
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return proc, (json.loads(out.read_text()) if out.is_file() else {})


def test_device_check_on_cpu_measures_and_checks_the_time_model(tmp_path):
    proc, data = _run(tmp_path, "--quick", "--examples", "eqx_gpt", "--plans", "none,offload",
                      "--target", "none", "--profile", "tpu-v5e")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "NO accelerator: ran on cpu" in proc.stdout
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
    assert model["profile"] == "tpu-v5e" and model["fitted"]["name"] == "tpu-v5e-fitted"
    assert any(line.split()[:2] == ["eqx_gpt", "offload"] for line in proc.stdout.splitlines())


def test_device_check_is_the_executable_wrapper_over_the_body():
    script = ROOT / "scripts" / "device_check"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert 'source "$(dirname "$0")/_env.sh"' in text and "ensure_venv" in text
    assert '"$VENV/bin/python" "$ROOT/scripts/_device_check.py"' in text


def test_device_check_reports_what_its_time_budget_left_out(tmp_path):
    proc, data = _run(tmp_path, "--budget-s", "0", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "INCOMPLETE: 2 measurement(s) missing" in proc.stdout
    assert [(r["example"], r["missing"]) for r in data["rows"]] == [
        ("nnx_gpt", "out of time"), ("eqx_gpt", "out of time")]


@pytest.mark.target
def test_device_check_sets_a_deviceless_tpu_compile_beside_this_machines(tmp_path):
    pytest.importorskip("libtpu")
    proc, data = _run(tmp_path, "--quick", "--examples", "nnx_gpt", "--plans", "none,offload",
                      "--target", "v5e:1x1", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = {r["plan"]: r for r in data["rows"]}
    assert all("target_temp_bytes" in r for r in rows.values()), proc.stdout[-3000:]
    for r in rows.values():  # two compilers: XLA:CPU here, XLA:TPU deviceless
        assert r["target_temp_bytes"] is not None and r["identical"] is False
        assert r["verdict"].startswith("DIFFERS: peak ")
    # the offload is on host only in the TPU compile (XLA:CPU drops host placements)
    assert rows["offload"]["target_host_temp_bytes"] > 0 == rows["offload"]["host_temp_size_in_bytes"]
    assert data["examples"]["nnx_gpt"]["target"] == "v5e:1x1"
