"""The repository's scripts as a user runs them: ``./scripts/test`` stopped by its PID leaves
nothing running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.tooling


def _session(sid: int) -> dict[int, str]:
    """The processes of session ``sid``: {pid: command line}."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
        if int(fields[3]) == sid and fields[0] != "Z":
            out[int(d.name)] = cmd
    return out


_DEFAULT_SIGNALS_THEN_EXEC = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopped_test_script_leaves_no_process(tmp_path: Path, sig: signal.Signals) -> None:
    """A run on two pytest-xdist workers whose test has started a child process of its own:
    signalled while the test runs, the script ends pytest, its workers and that child, and exits
    with 128 + the signal's number."""
    started = tmp_path / "started"
    (tmp_path / "test_long.py").write_text(
        "import pathlib, subprocess, time\n"
        "def test_long():\n"
        "    subprocess.Popen(['sleep', '300'])\n"
        f"    pathlib.Path({str(started)!r}).write_text('x')\n"
        "    time.sleep(300)\n")
    # As from a terminal: SIGINT and SIGTERM at their defaults. A process started in the background
    # by a shell without job control (`cmd &` in a script, as CI runners may start this suite)
    # ignores SIGINT, its children inherit that, and bash can neither trap nor reset a signal
    # ignored on entry: the script would then not see the signal this test sends.
    proc = subprocess.Popen([sys.executable, "-c", _DEFAULT_SIGNALS_THEN_EXEC,
                             str(ROOT / "scripts" / "test"), "-n", "2", "-p", "no:cacheprovider",
                             str(tmp_path / "test_long.py")],
                            cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    try:
        deadline = time.monotonic() + 240
        while not started.exists():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the test did not start"
            time.sleep(0.2)
        running = _session(proc.pid)
        assert sum("pytest" in c or "xdist" in c or "execnet" in c for c in running.values()) >= 2
        assert any(c == "sleep 300" for c in running.values()), running
        proc.send_signal(sig)
        out = proc.communicate(timeout=60)[0].decode()  # the script gives pytest 10 s, then kills
        assert proc.returncode == 128 + sig, out
        assert f"stopped by {sig.name}" in out
        left = _session(proc.pid)
        assert not left, left
    finally:
        for pid in _session(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:  # else a later test fails on the unclosed pipe (ResourceWarning)
            proc.stdout.close()



def test_pytest_runs_without_xdist() -> None:
    """``pytest -p no:xdist`` with pytest-xdist installed: the root conftest's scheduler hook is
    optional, so pytest runs (it stopped with INTERNALERROR, "unknown hook")."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "-q", "tests/test_architecture.py", "-k", "cycle_finder"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
