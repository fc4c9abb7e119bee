"""What ``remat tune`` tells its user besides the plan: it stops at save-all when that fits, it
shows it is alive without a progress bar, it warns when the compiled peaks are blind to the
candidates, it prices offload's host transfers, and a signal that stops it while it compiles is
named as the signal, not taken for the compiler's abort."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flax")
pytest.importorskip("rich")

from fixtures.tune_space import TINY, config  # noqa: E402
from remat_common import tune  # noqa: E402
from remat_common.internal import fmt_bytes, main  # noqa: E402

pytestmark = [pytest.mark.tooling, pytest.mark.usefixtures("standard_promotion")]

ROOT = Path(__file__).resolve().parents[1]
#: So small that the compiled step's peak is its arguments and outputs: every plan that keeps its
#: residuals on device compiles to the same peak (1.85 MiB, measured).
BLIND = {"seq_len": 8, "batch": 1}


@pytest.fixture(scope="module")
def blind(standard_promotion: None) -> Any:
    return config("nnx_gpt", **BLIND).builder()


def test_tune_stops_after_one_compile_when_save_fits(blind: Any) -> None:
    r = tune(blind, "1TiB")
    assert r.compiles == 1 and [p.name for p in r.points] == ["save"] and r.chosen == "save"
    (note,) = [n for n in r.notes if n.startswith("save-all fits")]
    assert note == (f"save-all fits 1.00 TiB (compiled peak {fmt_bytes(r['save'].peak)}): no plan "
                    f"recomputes less, so the {len(r.choices) - 1} other candidates were not "
                    "compiled. A budget below save-all's peak makes the search choose.")
    assert r.message.endswith("1 compiles, " + r.message.rsplit("compiles, ", 1)[1])


def test_blind_peaks_warn_and_offload_pays_its_transfers(blind: Any) -> None:
    """Below save-all's peak on a model too small for activations to show: save and recompute
    compile to the same peak, offload 'fits' only by the host bytes it subtracts (an estimate
    on CPU). The warning says so, and offload's cost counts its bytes to host and back."""
    cache: dict[str, Any] = {}
    save = tune(blind, "1TiB", cache=cache)["save"]
    r = tune(blind, save.peak - 1, choices=["recompute", "offload"], max_compiles=2, cache=cache)
    assert [p.name for p in r.points] == ["save", "offload", "recompute"]
    assert r["recompute"].peak == r["save"].peak and r["offload"].estimated
    (warning,) = r.warnings
    assert warning.startswith(f"the compiled peaks cannot tell the candidates apart: save, "
                              f"recompute all compile to {fmt_bytes(save.peak)}.")
    assert "(the offloading ones, offload, differ only by the host bytes" in warning
    assert "Fix: tune at the size you train (--size batch=N seq_len=N)" in warning
    off = r["offload"]
    assert off.host_bytes > 0 and r.host_link is not None and r.host_link.name == "h100"
    assert off.cost == pytest.approx(off.flops + 2 * off.host_bytes / 64e9 * 989.4e12)
    assert r["recompute"].cost == r["recompute"].flops  # nothing moved: FLOPs only
    assert any("offload is ranked with its transfer cost" in n and "64 GB/s per direction, the "
               "h100 profile's host link" in n for n in r.notes)
    assert r.to_json()["warnings"] == [warning]
    assert r.chosen == "offload"  # the only plan under the budget, by its estimate
    assert f"{fmt_bytes(off.host_bytes)} to host and back per step (" in r.yaml()  # says so


def test_no_progress_prints_a_heartbeat(capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-progress``: a line when each compile begins, one with its peak when it ends, and
    one when the search ends (it printed nothing for minutes), and the current line again every
    30 s while a compile runs."""
    cfg = ROOT / "examples" / "nnx_gpt" / "report.yaml"
    size = ["--size", *(f"{k}={v}" for k, v in {**TINY, **BLIND}.items())]
    assert main(["tune", str(cfg), *size, "--budget", "1TiB", "--no-progress"]) == 0
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("remat tune: ")]
    peak = re.search(r"^remat tune: save: peak ([\d.]+ [KMG]?i?B), \d+ s$", lines[1], re.M)
    assert peak is not None, lines
    assert [ln.rsplit(",", 1)[0] for ln in lines] == [
        "remat tune: compiling save (1 of at most 40)", f"remat tune: save: peak {peak[1]}",
        "remat tune: done (1 compiles)"]
    assert f"compiled peak {peak[1]}" in captured.out  # the figure the line gave
    assert "note: save-all fits 1.00 TiB" in captured.out

    from rich.console import Console

    from remat_common.internal import Heartbeat

    buf = io.StringIO()
    with Heartbeat(Console(file=buf, width=200), "remat tune", interval=0.05) as beat:
        beat.update("compiling recompute (2 of at most 7)")
        time.sleep(0.3)  # a long compile: the line comes again, with the time
    out = buf.getvalue().splitlines()
    assert len(out) >= 3 and all(ln.startswith("remat tune: compiling recompute (2 of at most 7), ")
                                 for ln in out)


#: A process inside a compile (the block ``remat report`` and ``remat tune`` compile in, whose
#: stderr a watcher process reads, so that an abort inside XLA is still reported): it writes what
#: a compiler writes, then compiles for long.
_COMPILING = """
import os, time
from remat_common._tooling.accelerators._compilers import _captured_stderr
with _captured_stderr():
    os.write(2, b"compiling\\n")
    time.sleep(300)
"""


def _watching(pid: int) -> bool:
    """Whether a child of ``pid`` holds a pidfd (the watcher, ready to read how ``pid`` ends)."""
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                return any(os.readlink(f) == "anon_inode:[pidfd]" for f in (d / "fd").iterdir())
        except OSError:
            continue
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_during_a_compile_is_named_not_taken_for_an_abort(tmp_path: Path,
                                                                     sig: signal.Signals) -> None:
    """Stopped from outside while compiling, the process was reported as "the XLA compiler
    aborted the process ... Fix: a smaller size", and left an empty /tmp/remat-stderr-* file.
    Now the signal is named, and no file is left (the captured text lives in an unnamed file)."""
    proc = subprocess.Popen([sys.executable, "-c", _COMPILING], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 120
    while not _watching(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -sig
    assert (f"remat: stopped by {sig.name} while compiling, the compiler having reported no "
            "failure: a signal comes from outside the process (a user, a job's time limit, or, "
            "as SIGKILL, the kernel's out-of-memory killer).\ncompiling\n") in err, err
    assert "aborted" not in err and "smaller size" not in err
    assert list(tmp_path.iterdir()) == []
