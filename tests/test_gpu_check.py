"""``scripts/gpu_check`` on CPU in its quick mode: it runs, says the GPU figures are absent, and
still reports the compiled figures of an offload plan (one example, one plan, one process)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

# Tooling (the GPU check script): slow, marked `tooling` (`-m "not tooling"` leaves it out of a
# quick local run); every stage of scripts/test runs it.
pytestmark = pytest.mark.tooling

pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("orbax.checkpoint")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu_and_says_the_gpu_figures_are_absent(tmp_path):
    out = tmp_path / "gpu.json"
    # the Python body with this interpreter: scripts/gpu_check would build/choose .venv itself,
    # which is not the environment under test in the jax 0.11.0 stage
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "_gpu_check.py"), "--quick", "--examples", "eqx_gpt",
         "--plans", "offload", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "NO GPU: ran on cpu. GPU figures are ABSENT" in proc.stdout
    data = json.loads(out.read_text())
    assert (data["backend"], data["gpu"], data["per_plan_processes"]) == ("cpu", False, False)
    [row] = data["rows"]
    assert (row["example"], row["plan"]) == ("eqx_gpt", "offload")
    assert row["peak_bytes_in_use"] is None and row["lowers_peak_vs_save"] is None
    # the compiled figures are there: the offload moves the blocks' inputs to host, out and back
    assert row["host_residual_bytes"] > 0 and row["offloads"]
    assert row["transfer_bytes_per_step"] == 2 * row["host_residual_bytes"]
    assert row["placed_on_host_in_cuda_export"] is True and row["problems"] == []
    assert row["steps_timed"] == 1 and row["step_time_median_s"] > 0
    # the table's row for the plan, in the printed output
    assert any(line.split()[:2] == ["eqx_gpt", "offload"] for line in proc.stdout.splitlines())
    # no GPU: no target config to compile for, and the output says how to compare anyway
    assert "not compiled for a target config: not a GPU" in proc.stdout and "--target" in proc.stdout
    assert row["target_accelerator"] is None


def test_gpu_check_is_the_executable_wrapper_over_the_body():
    script = ROOT / "scripts" / "gpu_check"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert 'source "$(dirname "$0")/_env.sh"' in text and "ensure_venv" in text
    assert '"$VENV/bin/python" "$ROOT/scripts/_gpu_check.py"' in text


def test_gpu_check_reports_what_its_time_budget_left_out(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "_gpu_check.py"), "--budget-s", "0", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "INCOMPLETE: 8 of 8 measurements missing" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["example"], r["plan"], r["missing"]) for r in rows] == [
        (e, p, "out of time") for e in ("nnx_gpt", "eqx_gpt")
        for p in ("save", "recompute", "offload", "names")]
