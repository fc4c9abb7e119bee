"""The examples' checkpoints: logged once committed, awaited on a stop, clear when unrestorable.

Small arrays and orbax only: no model, no compilation.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("orbax.checkpoint")

from examples.training import CheckpointRestoreError, Checkpoints, stop_on_signals  # noqa: E402

TREE = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}


def _saved(tmp_path: Path, steps: tuple[int, ...] = (2,)) -> Checkpoints:
    ckpt = Checkpoints(tmp_path / "ckpt", every=2)
    for s in steps:
        assert ckpt.save(s, TREE, manifest={"plan": None})
    return ckpt


def test_a_checkpoint_is_reported_once_committed(tmp_path):
    ckpt = _saved(tmp_path)
    assert ckpt.in_flight == (2,)
    done = ckpt.committed(wait=True)  # what train() logs as the "checkpoint" event
    assert done == [2] and ckpt.in_flight == ()
    assert (ckpt.directory / "2" / "state").is_dir()
    assert ckpt.committed() == []  # reported once
    assert not ckpt.save(3, TREE, manifest={})  # not on the interval
    assert ckpt.close() == []
    restored, manifest = Checkpoints(tmp_path / "ckpt", every=2).restore(TREE)
    np.testing.assert_array_equal(restored["w"], TREE["w"])
    assert manifest["step"] == 2


def test_close_waits_for_the_save_in_flight(tmp_path):
    ckpt = Checkpoints(tmp_path / "ckpt", every=1)
    big = {"x": jnp.ones((512, 512))}
    assert ckpt.save(1, big, manifest={})
    assert ckpt.close() == [1]  # waited, then reported
    assert Checkpoints(tmp_path / "ckpt", every=1).latest_step == 1


def test_sigterm_becomes_a_stop_that_finally_can_handle():
    with pytest.raises(SystemExit) as info:
        with stop_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1) if hasattr(signal, "sigtimedwait") else None
    assert info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored



# orbax leaves tensorstore reads of a failed restore to finish on a closed event loop; that noise
# is orbax's, so it is collected inside this test (not blamed on the next) and not an error here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage, like, problem", [
    ("none", {"w": jnp.zeros((4, 3)), "b": jnp.ones(3)}, r"shape: \(4, 3\) is not compatible with the stored shape: \(2, 3\)\.?\n|shapes differ"),
    ("none", {"w": TREE["w"], "c": jnp.ones(3)}, r"does not fit this model|not found|KeyError|ValueError"),
    ("delete_state", TREE, r"\w+Error"),
    ("truncate", TREE, r"\w+Error"),
    ("zero", TREE, r"\w+Error"),
])
def test_a_checkpoint_that_cannot_be_restored_says_what_to_do(tmp_path, damage, like, problem):
    _saved(tmp_path).close()
    step_dir = tmp_path / "ckpt" / "2"
    if damage == "delete_state":
        import shutil
        shutil.rmtree(step_dir / "state")
    elif damage == "zero":
        for f in (step_dir / "state").rglob("*"):
            if f.is_file():
                f.write_bytes(bytes(f.stat().st_size))
    elif damage == "truncate":
        for f in (step_dir / "state").rglob("*"):
            if f.is_file() and f.stat().st_size > 0:
                f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 3)])
    ckpt = Checkpoints(tmp_path / "ckpt", every=2)
    with pytest.raises(CheckpointRestoreError) as info:
        ckpt.restore(like)
    msg = str(info.value)
    assert f"the checkpoint of step 2 in {ckpt.directory} cannot be restored" in msg
    assert "another --workdir" in msg and "--no-resume" in msg
    import re
    assert re.search(problem, msg), msg
    assert len(msg) < 900
    ckpt.close()
    del info
    time.sleep(0.5)
    gc.collect()


_KILLED_DURING_SAVE = """
import os, signal, sys
sys.path.insert(0, {root!r})
import jax.numpy as jnp
from examples.training import Checkpoints, stop_on_signals
ckpt = Checkpoints({directory!r}, every=1)
try:
    with stop_on_signals():
        ckpt.save(1, {{"x": jnp.ones((1024, 1024))}}, manifest={{}})
        os.kill(os.getpid(), signal.SIGTERM)  # while the save may still be in flight
        signal.pause()
except SystemExit:
    print("committed", ckpt.close())  # what train() does: wait, then log the committed steps
    raise
"""


def test_sigterm_during_a_save_waits_for_it(tmp_path):
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    script = _KILLED_DURING_SAVE.format(root=root, directory=str(tmp_path / "ckpt"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "committed [1]" in done.stdout
    restored, _ = Checkpoints(tmp_path / "ckpt", every=1).restore({"x": jnp.zeros((1024, 1024))})
    np.testing.assert_array_equal(restored["x"], np.ones((1024, 1024)))


_UNDER_A_FILE_SIZE_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.path.insert(0, {root!r})
import jax.numpy as jnp, numpy as np
from examples.config import cli
from examples.training import Checkpoints

def main(workdir: str = {directory!r}) -> None:
    ckpt = Checkpoints(workdir, every=1)
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)  # 64 KiB
    ckpt.save(1, {{"x": jnp.asarray(x)}}, manifest={{}})
    print("committed", ckpt.close())

cli(main, [])
"""


def test_a_checkpoint_that_cannot_be_written_is_one_error_line(tmp_path):
    """Under `ulimit -f` (a file-size limit below a checkpoint's data file) the run printed
    hundreds of lines of orbax tracebacks, "Event loop is closed", and "sys.meta_path is None"
    at shutdown, and no `error:` line: now the example's one error, and nothing else."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[1])
    directory = tmp_path / "ckpt"
    limit = 32 * 1024

    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", _UNDER_A_FILE_SIZE_LIMIT.format(
        root=root, directory=str(directory), limit=limit)], capture_output=True, text=True,
        timeout=300, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        f"error: the checkpoint of step 1 could not be written to {directory}: a file would exceed "
        "the largest file size this process may write (errno 27, EFBIG, 'File too large'; the "
        f"limit, `ulimit -f`, is {limit:,} bytes).\nFix: raise the limit before the run (ulimit -f "
        "unlimited), then run again (it resumes from the last checkpoint written).\n")
    ckpt = Checkpoints(directory, every=1)  # the fix: without the limit the same save succeeds
    assert ckpt.save(1, TREE, manifest={}) and ckpt.close() == [1]


def test_write_failures_are_read_from_orbax_text_and_os_errors():
    import errno

    pytest.importorskip("rich")  # (examples.training prints with it)

    from examples.training import write_failure

    orbax = ValueError("OUT_OF_RANGE: Error writing \"a/0.0\" ... Failed to write 11623 bytes to "
                       "file 4: File too large [os_error_code='27']")
    assert write_failure(orbax) == errno.EFBIG
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert write_failure(wrapped) == errno.ENOSPC
    assert write_failure(OSError(errno.EACCES, "Permission denied")) is None
