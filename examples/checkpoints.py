"""Orbax checkpoints of the GPT examples' training state, with the run manifest beside each.

Checkpoints hold the state in a flat form (:func:`flatten_state`) that reads the same for Flax NNX
and Equinox; a save that fails for want of room says why and what to do; a restore puts each array
where the array it replaces lives (its sharding and memory kind: a state kept on host between steps
restores to host). Split out of ``examples/training.py``, which re-exports these names.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import signal
import sys
import threading
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np
import remat_common


def _key_str(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def flatten_state(tree: Any) -> dict[str, Any]:
    """A pytree of arrays as ``{"blocks.0.attn.query.kernel": array, ...}``.

    Checkpoints hold this flat form, so what is on disk reads the same for Flax NNX state and for
    Equinox modules (for Equinox, of the model with the plan's wrappers removed).
    """
    flat: dict[str, Any] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = ".".join(_key_str(k) for k in path) or "value"
        if name in flat:
            raise ValueError(f"flatten_state: two leaves share the path {name!r}.")
        flat[name] = leaf
    return flat


def unflatten_state(like: Any, flat: Mapping[str, Any]) -> Any:
    """Puts the arrays of ``flat`` (from :func:`flatten_state`) into the structure of ``like``."""
    names = list(flatten_state(like))
    missing, extra = sorted(set(names) - set(flat)), sorted(set(flat) - set(names))
    if missing or extra:
        raise ValueError(
            f"unflatten_state: the checkpoint does not fit this model: missing {missing[:5]}, "
            f"unexpected {extra[:5]}. Fix: restore with the model hyperparameters it was written with."
        )
    treedef = jax.tree_util.tree_structure(like)
    return jax.tree_util.tree_unflatten(treedef, [flat[n] for n in names])


def run_manifest(plan: remat_common.Plan | remat_common.CompiledPlan | None) -> dict[str, Any]:
    """What is written next to every checkpoint and into the log: :func:`remat_common.manifest`
    (software versions, backend and capabilities, JAX flags, the plan, its fingerprint and, for a
    compiled plan, its boundaries and policies)."""
    return remat_common.manifest(plan)


def manifest_fingerprint(manifest: Mapping[str, Any]) -> str | None:
    """The plan fingerprint recorded in a manifest (``None``: no plan)."""
    plan = manifest.get("plan")
    return plan.get("fingerprint") if isinstance(plan, Mapping) else None


MSG_NO_OVERWRITE = """\
{path} already holds checkpoints up to step {step}, and resume is off: training from scratch
would write over them. Fix: pass a new --workdir, delete {path}, or resume (--resume)."""


MSG_CANNOT_RESTORE = """\
the checkpoint of step {step} in {path} cannot be restored: {problem}
It was written by another model size or framework, or its files are damaged or incomplete.
Fix: start fresh in another --workdir, or delete {path} and rerun (--no-resume alone refuses to
write over it); to continue this run, use the model settings it was written with."""


class CheckpointRestoreError(RuntimeError):
    """A checkpoint in the workdir that does not restore into this model."""


MSG_CANNOT_SAVE = """\
the checkpoint of step {step} could not be written to {path}: {cause}.
Fix: {fix}."""

#: errno -> (what it means here, the fix): the write failures a user can do something about.
_WRITE_FAILURES: Final = {
    errno.EFBIG: ("a file would exceed the largest file size this process may write (errno 27, "
                  "EFBIG, 'File too large'; the limit, `ulimit -f`, is {limit})",
                  "raise the limit before the run (ulimit -f unlimited), then run again (it resumes "
                  "from the last checkpoint written)"),
    errno.ENOSPC: ("the disk is full (errno 28, ENOSPC, 'No space left on device'; {free} free there)",
                   "free space there, or pass a --workdir on a disk with room"),
    errno.EDQUOT: ("the disk quota is used up (errno 122, EDQUOT, 'Disk quota exceeded')",
                   "free space within the quota, or pass a --workdir elsewhere"),
}
_OS_ERROR_CODE = re.compile(r"os_error_code='(\d+)'|\[Errno (\d+)\]")


class CheckpointWriteError(RuntimeError):
    """A checkpoint that could not be written (a full disk, a file-size limit)."""


def write_failure(e: BaseException) -> int | None:
    """The errno of a failed checkpoint write (orbax reports tensorstore's as text, ``[os_error_code='27']``;
    Python's own as ``OSError.errno``), following the exception's causes; ``None`` for anything else."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _WRITE_FAILURES:
            return e.errno
        m = _OS_ERROR_CODE.search(str(e))
        if m is not None and int(m[1] or m[2]) in _WRITE_FAILURES:
            return int(m[1] or m[2])
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


class _OrbaxQuiet(logging.Filter):
    """While a save is in flight: orbax's background threads log a failed write (with its
    traceback) once per thread that sees it, and its cancelled writes report "Event loop is
    closed" as unraisable exceptions. The failure is raised in the main thread as one
    :class:`CheckpointWriteError`; these echoes of it are dropped (everything else passes)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: int | None = None
        self.active = False
        self._unraisable = sys.unraisablehook
        self._logger = logging.getLogger("absl")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or "orbax" not in record.pathname:
            return True
        code = write_failure(record.exc_info[1]) if record.exc_info and record.exc_info[1] else None
        if code is None:
            m = _OS_ERROR_CODE.search(record.getMessage())
            code = int(m[1] or m[2]) if m is not None and int(m[1] or m[2]) in _WRITE_FAILURES else None
        if code is None and self.failed is None:
            return True
        self.failed = self.failed or code
        return False

    def _on_unraisable(self, u: Any) -> None:
        if isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed":
            return
        self._unraisable(u)

    def open(self) -> None:
        if not self.active:
            self.active = True
            self._logger.addFilter(self)
            self._unraisable, sys.unraisablehook = sys.unraisablehook, self._on_unraisable

    def close(self) -> None:
        if self.active:
            self.active = False
            self._logger.removeFilter(self)
            if sys.unraisablehook == self._on_unraisable:
                sys.unraisablehook = self._unraisable


class Checkpoints:
    """Orbax checkpoints every ``every`` steps in ``directory``, with the run manifest beside each.

    Each step directory holds two items: ``state`` (the flat arrays) and ``manifest`` (JSON).
    Saves are asynchronous: :meth:`save` starts one, :meth:`committed` reports the steps whose
    save has been committed to disk since it was last asked, and :meth:`close` waits for the save
    in flight. A save that fails for want of room (errno 27 ``EFBIG`` under a file-size limit, 28
    ``ENOSPC``, 122 ``EDQUOT``) raises :class:`CheckpointWriteError` from whichever of them sees it,
    naming the step, the directory, the cause and the fix, after closing the manager (nothing of
    orbax's is left to fail at shutdown); orbax's own logs of that failure are not printed.
    """

    def __init__(self, directory: str | Path, *, every: int, keep: int = 3) -> None:
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = Path(directory).resolve()
        self.every = every
        self._quiet = _OrbaxQuiet()
        self._mgr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_names=("state", "manifest"),
        )
        self._pending: list[int] = []
        self._closed = False

    @property
    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(self._mgr.all_steps())

    def save(self, step: int, tree: Any, *, manifest: Mapping[str, Any], force: bool = False) -> bool:
        """Saves ``tree`` at ``step`` when the interval says so (or ``force``); returns whether it did."""
        if not (force or (self.every > 0 and step % self.every == 0)):
            return False
        ocp = self._ocp
        self._quiet.open()
        with self._writes(step):  # (orbax raises an earlier save's failure here)
            started = bool(self._mgr.save(step, force=True, args=ocp.args.Composite(
                state=ocp.args.StandardSave(flatten_state(tree)),
                manifest=ocp.args.JsonSave(dict(manifest, step=step)),
            )))
        if started:
            self._pending.append(step)
        return started

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Steps whose save started and has not been reported committed yet."""
        return tuple(self._pending)

    def committed(self, *, wait: bool = False) -> list[int]:
        """Steps whose save has been committed since the last call (``wait``: wait for all).

        A step counts once orbax has finished it: no save is in progress and its directory has
        its final name (orbax writes into a temporary directory and renames it on commit).
        """
        if not self._pending:
            self._quiet.close()
            return []
        with self._writes(self._pending[0]):
            if wait:
                self._mgr.wait_until_finished()
            elif self._mgr.is_saving_in_progress():
                return []
        done = [s for s in self._pending if (self.directory / str(s)).is_dir()]
        self._pending = [s for s in self._pending if s not in done]
        if self._pending and self._quiet.failed is not None and not self._mgr.is_saving_in_progress():
            self._fail(self._pending[0], self._quiet.failed, None)  # failed in the background
        if not self._pending and not self._mgr.is_saving_in_progress():
            self._quiet.close()
        return done

    @contextlib.contextmanager
    def _writes(self, step: int) -> typing.Iterator[None]:
        """Turns a failed write (orbax's, at ``step`` or an earlier pending one) into a
        :class:`CheckpointWriteError`."""
        try:
            yield
        except Exception as e:
            code = write_failure(e) or self._quiet.failed
            if code is None:
                raise
            self._fail(self._pending[0] if self._pending else step, code, e)

    def _fail(self, step: int, code: int, e: BaseException | None) -> typing.NoReturn:
        """Closes the manager (so nothing of it is left to fail at shutdown) and raises the
        error for a write that failed with ``code``."""
        with contextlib.suppress(Exception):
            self._close()
        import gc
        import resource
        import shutil

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        free = shutil.disk_usage(self.directory).free if self.directory.exists() else None
        cause, fix = _WRITE_FAILURES[code]
        gc.collect()  # orbax's cancelled writes finish now, while the interpreter is whole
        raise CheckpointWriteError(MSG_CANNOT_SAVE.format(
            step=step, path=self.directory,
            cause=cause.format(limit="unlimited" if limit == resource.RLIM_INFINITY
                               else f"{limit:,} bytes",
                               free="?" if free is None else f"{free:,} bytes"),
            fix=fix)) from e

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """The state saved at ``step`` (default: the latest) in the structure of ``like``."""
        ocp = self._ocp
        step = self.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError(f"Checkpoints.restore: no checkpoint in {self.directory}.")
        # each array comes back with the sharding of the array it replaces: on the mesh of this
        # run, whatever mesh or number of processes wrote it (orbax reads the shards it needs)
        abstract = {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype,
                                            sharding=v.sharding if isinstance(v, jax.Array) else None)
                    for k, v in flatten_state(like).items()}
        try:
            got = self._mgr.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), manifest=ocp.args.JsonRestore(),
            ))
            saved = got["state"]
            bad = [f"{k}: saved {tuple(np.shape(saved[k]))}, model {a.shape}"
                   for k, a in abstract.items() if k in saved and tuple(np.shape(saved[k])) != a.shape]
            if bad:
                raise ValueError(f"shapes differ ({'; '.join(bad[:3])})")
            return unflatten_state(like, saved), dict(got["manifest"])
        except Exception as e:  # orbax, tensorstore and our own checks: one clear message
            raise self.cannot_restore(step, e) from e

    def cannot_restore(self, step: int | None, e: Exception) -> CheckpointRestoreError:
        """The error for a checkpoint that does not restore: directory, problem, choices."""
        problem = " ".join(f"{type(e).__name__}: {e}".split())
        problem = problem.split(" Truncating/padding is disabled")[0]  # orbax's API advice
        if len(problem) > 300:
            problem = problem[:297] + "..."
        return CheckpointRestoreError(MSG_CANNOT_RESTORE.format(
            step=step, path=self.directory, problem=problem))

    def close(self) -> list[int]:
        """Waits for the save in flight, closes the manager; returns the steps committed last."""
        if self._closed:
            return []
        try:
            done = self.committed(wait=True)
        finally:
            self._close()
        return done

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._mgr.close()
            finally:
                self._quiet.close()


@contextlib.contextmanager
def stop_on_signals() -> typing.Iterator[None]:
    """SIGTERM raises ``SystemExit(143)`` in the main thread, as Ctrl-C raises KeyboardInterrupt,
    so a ``finally`` can wait for the checkpoint in flight (both restored on exit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
