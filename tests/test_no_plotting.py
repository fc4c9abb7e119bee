"""`remat report` and `remat tune` where matplotlib cannot be imported: only `--plot` needs it.

Each run is a subprocess whose ``PYTHONPATH`` puts first a ``matplotlib`` package that raises
ImportError on import (a machine without it, or with a broken one, as the TPU host's packed
environment is).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tooling,
              pytest.mark.skipif(__import__("importlib.util").util.find_spec("rich") is None,
                                 reason="rich draws the tables: the 'report' extra")]

DATA = Path(__file__).parent / "data"
SIZE = ["--size", "batch=8", "d_model=16", "n_layers=2", "--no-progress"]
TINY = {"report": [*SIZE, "--steps", "0"], "tune": [*SIZE, "--budget", "1GiB", "--max-compiles", "3"]}


def _remat(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\' (shim)")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(shim.parent), *filter(None, [os.environ.get("PYTHONPATH")])]), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "remat_common", *args], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=600)


def test_report_and_tune_need_matplotlib_only_for_plot(tmp_path: Path) -> None:
    out = _remat(tmp_path, "report", str(DATA / "report.yaml"), *TINY["report"], "--plans", "none",
                 "recompute", "--json", "r.json", "--html", "r.html")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "remat plans" in out.stdout and "recompute" in out.stdout  # the table
    assert (tmp_path / "r.json").is_file() and (tmp_path / "r.html").is_file()
    out = _remat(tmp_path, "tune", str(DATA / "report.yaml"), *TINY["tune"], "--json", "t.json")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "t.json").is_file()
    for command in ("report", "tune"):
        out = _remat(tmp_path, command, str(DATA / "report.yaml"), *TINY[command], "--plot", "r.png")
        assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
        assert (f"remat {command}: error: remat {command} --plot draws its figures with matplotlib, "
                "which cannot be imported here (No module named 'matplotlib' (shim)).") in out.stderr
        assert "Fix: pip install 'jax-remat-plan[report]'" in out.stderr
        assert "leave --plot out" in out.stderr
        assert not (tmp_path / "r.png").exists()
