"""The repository's scripts as a user runs them: ``./scripts/test`` stopped by its PID leaves
nothing running, and it prints progress from its first second."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ./scripts/test builds its environments from the locks (the index, or uv's cache): in a git
# checkout, where it has; not in an unpacked sdist, whose tests run against the installed package.
pytestmark = [pytest.mark.tooling,
              pytest.mark.skipif(not (ROOT / ".git").exists(), reason="runs ./scripts/test, which "
                                 "builds .venv from requirements/lock.txt: needs a git checkout")]


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


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_test_script_prints_progress_from_the_start(tmp_path: Path) -> None:
    """``./scripts/test -n 2`` on two files: a line within 10 s, before pytest starts; a line per
    worker once it has collected; a file's "started" line while its test still runs (the test
    waits for that line: xdist alone printed "bringing up nodes..." until the first test ended),
    and the file's counts when it ends."""
    go = tmp_path / "go"
    (tmp_path / "test_wait.py").write_text(
        "import pathlib, time\n"
        "def test_waits_for_its_started_line():\n"
        f"    go, deadline = pathlib.Path({str(go)!r}), time.monotonic() + 180\n"
        "    while not go.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.1)\n"
        "    assert go.exists()\n")
    (tmp_path / "test_quick.py").write_text("def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    proc = subprocess.Popen([str(ROOT / "scripts" / "test"), "-n", "2", "-p", "no:cacheprovider",
                             str(tmp_path)], cwd=ROOT, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
    t0 = time.monotonic()
    reader = threading.Thread(target=lambda: [*(lines.put((time.monotonic() - t0, ln))
                                                 for ln in proc.stdout or ()), lines.put((0, None))],
                              daemon=True)
    reader.start()
    seen: list[tuple[float, str]] = []
    try:
        while True:
            at, line = lines.get(timeout=240)
            if line is None:
                break
            seen.append((at, line.rstrip()))
            if "test_wait.py: started" in line:
                go.write_text("x")
        assert proc.wait(timeout=60) == 0, "\n".join(ln for _, ln in seen)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    # The files' ids are relative to the inner pytest's rootdir, the common ancestor of the
    # checkout and tmp_path: '/' (ids without a folder), or '/tmp' for a checkout under /tmp, as a
    # CI clone may be ('pytest-of-root/.../test_wait.py'): compared without the folder.
    text = [re.sub(r"^\S+/(test_\w+\.py: )", r"\1", ln) for _, ln in seen]
    assert seen[0][0] < 10 and seen[0][1].startswith("scripts/test: checking "), seen[:3]
    assert sum(bool(re.match(r"\[gw[01]\] collected 3 tests in \d+ s$", ln)) for ln in text) == 2
    started = text.index("test_wait.py: started (1 tests)")
    ended = next(i for i, ln in enumerate(text) if ln.startswith("test_wait.py: 1 passed in "))
    assert started < ended, text
    assert any(re.match(r"test_quick\.py: 2 passed in \d+ s \(\d/3 tests, ", ln) for ln in text)
