"""``scripts/capacity_check`` without an accelerator: at tiny sizes on CPU it grows the model
until the step no longer fits a budget, per kind of plan (none, activation plan, state on host),
trains the largest for a few steps on the shipped text and reports falling losses side by side.
On a TPU chip the same script, with the chip's compiler as the judge, is docs/tpu.md's table.
The search and training run in this process (``remat_common.internal.capacity_check``); the
script itself runs once, stopped by a signal."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

# the examples' optax steps, built in this process: AdamW's bias correction needs standard promotion
pytestmark = [pytest.mark.tooling, pytest.mark.usefixtures("standard_promotion")]

pytest.importorskip("equinox")
pytest.importorskip("optax")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The capacity check in this process (``remat_common.internal.capacity_check``, what the
    script runs): its status, stdout and stderr. The signal test below runs the script."""
    from remat_common.internal import capacity_check

    code = capacity_check(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_capacity_check_on_cpu(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The three kinds of row on CPU, tiny. The check lifts the examples' guard against building
    a large model on this host (it makes the state on the device) for its run only: lifted for
    good, a later test of the same process that expects the refusal built 8 B parameters and was
    killed for memory."""
    from remat_common.internal import example_model

    guard = example_model("eqx_gpt").MAX_CONCRETE_BYTES
    out = tmp_path / "cap.json"
    code, stdout, stderr = _check(
        ["--quick", "--examples", "eqx_gpt", "--plans", "recompute", "--states", "both",
         "--budget", "1100000", "--json", str(out)], capsys)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["incomplete"] is False
    rows = {r["kind"].split(":")[0]: r for r in data["rows"]}
    assert sorted(rows) == ["a", "b", "c"]
    # no plan: two layers overflow the budget; recomputing the blocks fits two (CPU cannot see
    # state on host: its compiler drops the placement, so (c) is no larger here)
    assert rows["a"]["n_layers"] == 1 and rows["b"]["n_layers"] == 2
    assert rows["a"]["next"]["n_layers"] == 2 and rows["b"]["next"]["n_layers"] == 3
    assert rows["a"]["next"]["device_bytes"] > 1100000 >= rows["b"]["device_bytes"]
    assert rows["b"]["params"] > rows["a"]["params"]
    for r in rows.values():
        assert r["falling"] and len(r["losses"]) == 6 and r["step_ms"] > 0
        assert r["device_bytes"] <= 1100000
    # the state on host is priced apart: both parts in and out per step, at the profile's link
    assert rows["a"]["transfer_bytes"] == 0 == rows["b"]["transfer_bytes"]
    assert rows["c"]["transfer_bytes"] == 2 * rows["c"]["state_host_bytes"] > 0
    assert rows["c"]["transfer_ms"] == pytest.approx(1e3 * rows["c"]["transfer_bytes"] / 32e9)
    assert "falling" in stdout and stdout.count(" yes") >= 3
    assert (ROOT / "scripts" / "capacity_check").stat().st_mode & 0o111
    assert example_model("eqx_gpt").MAX_CONCRETE_BYTES == guard


def test_capacity_check_checks_a_searched_row(tmp_path: pathlib.Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``--check``: a search's row, as a device checks what a deviceless search found: the size
    fits and trains with the loss falling, the next size is refused, and the figures of both
    compiles are kept beside the search's. Here the batch grows (``--grow batch``: what ``remat
    tune --maximize batch`` answers, checked the same way on a chip)."""
    found = tmp_path / "found.json"
    run = ["--quick", "--examples", "eqx_gpt", "--plans", "recompute", "--states", "", "--kinds",
           "b", "--grow", "batch", "--budget", "700000"]
    code, out, err = _check([*run, "--json", str(found)], capsys)
    assert code == 0, out[-3000:] + err[-3000:]
    searched = json.loads(found.read_text())
    assert [r["kind"][:1] for r in searched["rows"]] == ["b"]
    assert searched["grow"] == "batch" and searched["rows"][0]["batch"] == 2  # of at most 4
    assert searched["rows"][0]["next"]["batch"] == 3
    checked = tmp_path / "checked.json"
    code, out, err = _check([*run, "--check", str(found), "--json", str(checked)], capsys)
    assert code == 0, out[-3000:] + err[-3000:]
    row = json.loads(checked.read_text())["rows"][0]
    assert row["fits"] and row["next_refused"] and row["falling"] and len(row["losses"]) == 6
    assert row["same_bytes"] and row["deviceless"]["batch"] == row["batch"] == 2


@pytest.mark.parametrize("sig, wait", [(signal.SIGTERM, 1), (signal.SIGINT, 0)],
                         ids=["SIGTERM", "SIGINT"])
def test_capacity_check_stopped_by_a_signal_writes_what_it_finished(tmp_path, sig, wait):
    """Stopped mid-search (a compile or a step running: the search runs in a worker thread, so the
    signal is taken at once), it writes the rows it finished, whole, marked incomplete with the
    signal named, and exits 128 + the signal with one line. It printed a traceback (Ctrl-C) or
    wrote nothing (SIGTERM: the JSON came at the end only)."""
    out = tmp_path / "cap.json"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "_capacity_check.py"), "--quick", "--examples",
         "eqx_gpt,nnx_gpt", "--plans", "recompute", "--states", "", "--kinds", "a", "--json",
         str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while True:  # the JSON is there once the search has started, its rows as they finish
            try:
                if len(json.loads(out.read_text())["rows"]) >= wait:
                    break
            except (OSError, ValueError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    data = json.loads(out.read_text())
    n = len(data["rows"])
    assert proc.returncode == 128 + sig and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"capacity_check: stopped by {sig.name}; wrote {out}: "
                                            f"{n} row(s) finished, marked incomplete")
    assert data["incomplete"] is True and data["signal"] == sig.name and n >= wait
    assert all(r["falling"] and len(r["losses"]) == 6 for r in data["rows"])  # finished rows only
    assert data["grow"] == "n_layers" and data["base"]["d_model"] == 32  # the search's own fields
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap.json"]  # no temporary file left

