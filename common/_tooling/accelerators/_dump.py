"""Compiling a lowered step with XLA's buffer-assignment and live-range dumps on (the breakdown
reads them).

:func:`dump_compile` compiles with the dumps written into a fresh folder, or takes them from beside
the persistent compilation cache when ``reuse`` is set."""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax


# -- compiling with XLA's dumps ----------------------------------------------------------------

_DUMP_FILES = ("-buffer-assignment.txt", "-buffer-assignment-values.txt", "-live-range.txt")


def dump_compile(lowered: Any, options: Mapping[str, Any] | None = None, *, reuse: bool = False
                 ) -> tuple[Any, str | None]:
    """Compiles ``lowered`` with XLA's buffer-assignment dumps on (and the compiler ``options``);
    ``(compiled, dump folder)``.

    The dump options are not part of JAX's persistent-cache key, so a program the cache already
    holds is not compiled again and nothing is dumped; it is then compiled a second time with a
    cache key of its own (``xla_debug_buffer_assignment_show_max``, which changes only the dump's
    text), so the dump is always XLA's view of this very program. With ``reuse`` and a
    persistent compilation cache configured (``jax_compilation_cache_dir``), the dump files are
    kept there beside it, under a key of the program's text (its metadata included), the JAX and
    jaxlib versions, the devices and ``XLA_FLAGS``: a program compiled before is then taken from
    JAX's cache and its dump from there, one compile at most. The folder is the caller's to
    remove (:func:`breakdown_of` does).
    """
    store = _dump_store(lowered, options) if reuse else None
    if store is not None and os.path.isdir(store):
        folder = tempfile.mkdtemp(prefix="remat-breakdown-")
        for f in glob.glob(os.path.join(store, "*.gz")):
            with gzip.open(f, "rb") as src, open(os.path.join(folder, os.path.basename(f)[:-3]),
                                                  "wb") as dst:
                shutil.copyfileobj(src, dst)
        if _dumped(folder):
            return lowered.compile(), folder
        shutil.rmtree(folder, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix="remat-breakdown-")
    try:  # a refused program (XLA's out-of-memory error) leaves its dump: removed with the folder
        compiled = lowered.compile(compiler_options={**(options or {}), "xla_dump_to": folder})
        if not _dumped(folder):
            bump = int.from_bytes(os.urandom(3), "little") + 16
            compiled = lowered.compile(compiler_options={
                **(options or {}), "xla_dump_to": folder,
                "xla_debug_buffer_assignment_show_max": bump})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if not _dumped(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return compiled, None
    if store is not None:
        _keep_dump(folder, store)
    return compiled, folder


def _dump_store(lowered: Any, options: Mapping[str, Any] | None = None) -> str | None:
    """Where the dump of ``lowered`` is kept beside JAX's persistent compilation cache (``None``
    where no cache is configured)."""
    import hashlib

    try:
        root = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
        enabled = jax.config.jax_enable_compilation_cache  # type: ignore[attr-defined]
    except AttributeError:
        return None
    if not root or not enabled:
        return None
    import jaxlib

    device = jax.devices()[0]
    h = hashlib.sha256()
    for part in (jax.__version__, jaxlib.__version__, device.platform, device.device_kind,
                 str(len(jax.devices())), os.environ.get("XLA_FLAGS", ""),
                 repr(sorted((options or {}).items())),
                 lowered.as_text(debug_info=True)):
        h.update(part.encode() + b"\0")
    return os.path.join(str(root), "remat-buffer-assignment", h.hexdigest())


def _keep_dump(folder: str, store: str) -> None:
    """Copies the files :func:`breakdown_from_dump` reads into ``store``, gzipped (written to a
    fresh folder and renamed into place: another process may read or write the same one)."""
    parent = os.path.dirname(store)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
        for suffix in (".txt", *_DUMP_FILES):
            for f in glob.glob(os.path.join(folder, f"*after_optimizations{suffix}")):
                with open(f, "rb") as src, gzip.open(
                        os.path.join(tmp, os.path.basename(f) + ".gz"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
        os.rename(tmp, store)
    except OSError:  # kept by another process meanwhile, or the cache is not writable
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _dumped(folder: str) -> bool:
    return all(glob.glob(os.path.join(folder, f"*after_optimizations{s}")) for s in _DUMP_FILES)
