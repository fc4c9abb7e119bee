"""Running a test script in a fresh process with N CPU devices (XLA_FLAGS must be set before JAX
initialises, so a mesh test cannot share the suite's process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_cpu_devices(script: str, where: Path, n: int = 8, *,
                       timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Writes ``script`` under ``where`` and runs it with ``n`` CPU devices, the repository and
    tests/ on its path; its output is captured."""
    path = where / "on_devices.py"
    path.write_text(script)
    env = {**os.environ, "XLA_FLAGS": with_devices(n),
           "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def with_devices(n: int) -> str:
    """``XLA_FLAGS`` with ``n`` host devices added to the flags this process was started with
    (``./scripts/test``'s optimization level among them)."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={n}"]).strip()
