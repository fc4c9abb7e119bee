"""Compiling for a target: lowering a step for an accelerator and mesh with no device present
(:func:`compile_for`), what the compiler says about memory and its own rematerialization
(:class:`TargetCompile`), and its stderr captured so that an abort inside XLA is reported."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax

from ..._errors import RematError
from ._hlo import program_remat
from ._accelerators import Accelerator, parse_accelerator, device_count
from ._meshes import parse_mesh, target_mesh, abstract_args


# -- compiling ---------------------------------------------------------------------------------------

_XLA_REMAT = re.compile(r"(Can't reduce memory use below [^\n]*?by rematerialization[^\n]*)")
_OVERFLOW = re.compile(r"overflow in static extent product[^\n]*")
_MSG_OVERFLOW = ("XLA refused the program: {said} (an array with more elements than it "
                 "can count). Fix: a smaller size (remat report --size seq_len=N d_model=N "
                 "vocab=N batch=N).")
#: What an out-of-device-memory error says (XLA:TPU, XLA:GPU, the runtime loading a program).
OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|exceeds? (?:the )?(?:available )?memory")


#: Written to the captured stderr when the block returns: a watcher that reaches the end of the
#: stream without it saw the process die inside the compiler (an XLA ``Check failed`` abort).
_DONE = b"\n\x00remat-compile-returned\x00\n"

#: The watcher of :func:`_captured_stderr`, run as ``python -I -S -c _WATCHER FD PID``: copies what
#: the compiler writes to the file open as ``FD`` (an unnamed temporary file: nothing is left on
#: disk however the process ends) when the block returns; when the process dies first (no
#: ``finally`` runs), writes to the terminal's stderr, which it holds, how it ended and what the
#: compiler said: an abort inside XLA (``Check failed``) with the diagnosis, a crash (SIGSEGV), or
#: a signal from outside (SIGTERM, SIGKILL: the compiler did not fail) named as the signal.
_WATCHER = r"""
import os, select, signal, sys
for s in (signal.SIGINT, signal.SIGTERM):  # the compiling process's to handle; this one says how
    signal.signal(s, signal.SIG_IGN)       # it ended, also when its process group is signalled
out, parent = int(sys.argv[1]), int(sys.argv[2])
try:
    pidfd = os.pidfd_open(parent)
except (AttributeError, OSError):
    pidfd = None
done, data = __DONE__, bytearray()
while not data.endswith(done):
    b = os.read(0, 1 << 16)
    if not b:
        break
    data += b
if data.endswith(done):
    view = memoryview(data)[: -len(done)]
    while view:
        view = view[os.write(out, view):]
    sys.exit(0)


def status():
    # how the process ended: its wait status, read before its parent reaps it (/proc/PID/stat's
    # exit_code) or after (the pidfd's PIDFD_GET_INFO, Linux 6.15+); None: unknown
    if pidfd is not None:
        select.select([pidfd], [], [], 5)  # readable once every thread has ended
    try:
        with open(f"/proc/{parent}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[49])
    except (OSError, IndexError, ValueError):
        pass
    try:
        import fcntl, struct
        info = bytearray(64)
        struct.pack_into("Q", info, 0, 8)  # PIDFD_INFO_EXIT
        fcntl.ioctl(pidfd, 0xC040FF0B, info)  # PIDFD_GET_INFO
        exited = struct.unpack_from("Q", info)[0] & 8
        return struct.unpack_from("i", info, 60)[0] if exited else None
    except (OSError, TypeError, ImportError):
        return None


code = status()
text = data.decode(errors="replace")
lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
failed = [ln for ln in lines if "Check failed" in ln]
sig = None if code is None else code & 0x7F
if sig == signal.SIGABRT or (sig is None and failed):
    said = failed[0] if failed else lines[-1] if lines else "nothing"
    msg = __ABORT__.format(said=said if len(said) <= 300 else said[:297] + "...")
elif sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
    msg = __CRASHED__.format(sig=signal.Signals(sig).name)
else:
    msg = __STOPPED__.format(how=f"stopped by {signal.Signals(sig).name}" if sig else
                             f"ended (exit status {code >> 8})" if code is not None else
                             "stopped from outside")
nl = chr(10)
os.write(2, (msg + nl + text + ("" if not text or text.endswith(nl) else nl)).encode())
"""

_MSG_ABORT = (
    "remat: error: the XLA compiler aborted the process while compiling (exit 134, SIGABRT: "
    "an internal check failed, which no Python code can catch). XLA said: {said}. This happens "
    "when an array is beyond what the compiler can plan (sizes whose bytes near 2**63). Fix: "
    "a smaller size (remat report --size seq_len=N d_model=N batch=N); its full output follows.")
_MSG_CRASHED = (
    "remat: error: the process crashed with {sig} while compiling (a fault inside the compiler or "
    "a library it runs, which no Python code can catch); its output follows.")
_MSG_STOPPED = (
    "remat: {how} while compiling, the compiler having reported no failure: a signal comes from "
    "outside the process (a user, a job's time limit, or, as SIGKILL, the kernel's out-of-memory "
    "killer).")


@contextlib.contextmanager
def quiet_libtpu() -> Iterator[None]:
    """A block whose stderr is passed on without libtpu's start-up lines (:func:`quiet_stderr`),
    for the first use of a TPU topology, which starts libtpu."""
    with _captured_stderr():
        yield


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """What the C++ compiler writes to file descriptor 2 while the block runs (also passed on,
    start-up noise of libtpu left out: :func:`quiet_stderr`). A watcher process reads it through
    a pipe, so that what the compiler said reaches the user, with a diagnosis and the fix, even
    when it aborts the process (``Check failed``), where no ``finally`` runs."""
    import subprocess
    import sys

    out: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no fd 2
        yield out
        return
    kept = tempfile.TemporaryFile()  # unnamed: nothing on disk, however the process ends
    read, write = os.pipe()
    code = (_WATCHER.replace("__DONE__", repr(_DONE)).replace("__ABORT__", repr(_MSG_ABORT))
            .replace("__CRASHED__", repr(_MSG_CRASHED))
            .replace("__STOPPED__", repr(_MSG_STOPPED)))
    try:
        watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, str(kept.fileno()),
                                    str(os.getpid())],
                                   stdin=read, stdout=subprocess.DEVNULL, stderr=saved,
                                   pass_fds=(kept.fileno(),))
    except OSError:  # no process to spare: the file, as before (an abort then loses the text)
        os.close(read)
        os.close(write)
        kept.close()
        with _captured_to_file(saved) as out:
            yield out
        return
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    try:
        yield out
    finally:
        try:
            os.write(2, _DONE)
        except OSError:  # pragma: no cover - the watcher is gone
            pass
        os.dup2(saved, 2)
        os.close(saved)
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a child holds the pipe open
            watcher.kill()
            watcher.wait()
        kept.seek(0)
        data = kept.read().decode(errors="replace")
        kept.close()
        out.append(data)
        shown = quiet_stderr(data)
        if shown:
            os.write(2, shown.encode())


@contextlib.contextmanager
def _captured_to_file(saved: int) -> Iterator[list[str]]:
    """:func:`_captured_stderr` through a temporary file (``saved``: the real fd 2, closed)."""
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read().decode(errors="replace")
            out.append(data)
            shown = quiet_stderr(data)
            if shown:
                os.write(2, shown.encode())


#: What libtpu writes to stderr whenever it starts, on a run that goes well: absl's notices that
#: logging is not set up, its INFO/WARNING lines (``I1205 22:10:01.123 12345 file.cc:12] ...``),
#: and, off a TPU VM (a deviceless compile needs none), that it found no TPU host, worker or
#: accelerator type (an ``E0000 ... INVALID_ARGUMENT`` line and its source trace). They read as
#: failures; left out of what is passed on (``TargetCompile.log`` keeps them).
_LIBTPU_NOISE = re.compile("|".join((
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"WARNING: Logging before InitGoogle\(\) is written to STDERR",
    r"Failed to find host bounds for accelerator type: .*",  # not on a TPU VM: nothing to find
    r"[IW]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] .*",  # absl INFO and WARNING lines
    r"E\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] .*(?:TPU_WORKER_HOSTNAMES|TPU_ACCELERATOR_TYPE).*",
    r"=== Source Location Trace: ===\s*",
    r"[\w./-]+/libtpu_init_utils\.cc:\d+",
)).join(("^(?:", ")$")))


def quiet_stderr(text: str) -> str:
    r"""``text`` without libtpu's start-up lines (:data:`_LIBTPU_NOISE`): absl's INFO and WARNING
    lines, its logging notices, and the TPU host it did not find off a TPU VM. Other errors
    (``E...``, ``F...``, ``Check failed``) and anything else stay.

    >>> quiet_stderr("WARNING: All log messages before absl::InitializeLog() is called are "
    ...              "written to STDERR\nI0000 00:00:1764972601.1 4242 tpu_initializer.cc:60] "
    ...              "libtpu started\nreal problem\n")
    'real problem\n'
    """
    if not text:
        return text
    kept = [ln for ln in text.splitlines(keepends=True) if not _LIBTPU_NOISE.match(ln.rstrip("\n"))]
    return "".join(kept)


#: The largest array, in bytes, a program may hold before it is compiled: past it no accelerator
#: could run it, and near 2**63 bytes XLA's heap simulator aborts the process ("Check failed").
MAX_ARRAY_BYTES = 2 ** 52  # 4 PiB

_TENSOR = re.compile(r"tensor<((?:\d+x)+)([a-z]\w*)>")
_BITS = re.compile(r"(\d+)$")

_MSG_HUGE = (
    "the program holds an array of shape ({shape}) {dtype}, {size}: more than any "
    "accelerator holds, and near what XLA's compiler can count (it aborts the process on arrays "
    "near 2**63 bytes, or refuses dimensions whose product overflows). Fix: a smaller size "
    "(remat report --size seq_len=N d_model=N vocab=N batch=N).")


def check_array_sizes(text: str) -> None:
    """Refuses (:class:`RematError`) a lowered program (its StableHLO ``text``) holding an array
    over :data:`MAX_ARRAY_BYTES`, before the compiler aborts on it."""
    for m in _TENSOR.finditer(text):
        dims = [int(d) for d in m.group(1).rstrip("x").split("x")]
        n = math.prod(dims)
        bits = _BITS.search(m.group(2))
        nbytes = n * max(1, int(bits.group(1)) // 8 if bits else 1)
        if nbytes > MAX_ARRAY_BYTES:
            from ._units import fmt_bytes

            raise RematError(_MSG_HUGE.format(shape=", ".join(map(str, dims)), dtype=m.group(2),
                                              size=fmt_bytes(nbytes)))


@dataclasses.dataclass(frozen=True)
class TargetCompile:
    """One step compiled for an accelerator (the entry point other tools build on).

    Attributes:
      compiled: the ``jax.stages.Compiled`` (``memory_analysis()``, ``as_text()``); ``None`` when
        the compiler refused the program (``error``).
      lower_s, compile_s: seconds to lower, and to compile.
      xla_remat: what the target compiler's own rematerialization pass changed to bring the
        program under the device memory (:func:`xla_remat_of`: read from the compiled program, so
        a program from the persistent compilation cache shows it too, with the compiler's message
        where it could not), else ``None``.
      error: the compiler's refusal (out of memory), else ``None``.
      log: what the compiler wrote to stderr.
      dump: with ``dump=True``, the folder of XLA's dump of the compile (buffer assignment: the
        breakdown's input; the reader removes it), else ``None``.
    """

    compiled: Any
    lower_s: float
    compile_s: float
    xla_remat: str | None = None
    error: str | None = None
    log: str = ""
    dump: str | None = None


def compile_lowered(lowered: Any, *, dump: bool = False, reuse: bool = False,
                    options: Mapping[str, Any] | None = None) -> TargetCompile:
    """Compiles a lowered program with the compiler ``options`` (``{"xla_...": value}``), keeping
    what the compiler says about memory (and, with ``dump``, XLA's buffer-assignment dump:
    :func:`._dump.dump_compile`, which ``reuse`` lets take it from beside the persistent
    compilation cache)."""
    from ._dump import dump_compile

    try:
        text = lowered.as_text()
    except Exception:  # noqa: BLE001 - no text: the compiler is the judge
        text = ""
    check_array_sizes(text)
    t0 = time.perf_counter()
    compiled, error, folder = None, None, None
    with _captured_stderr() as log:
        try:
            if dump:
                compiled, folder = dump_compile(lowered, options, reuse=reuse)
            else:
                compiled = lowered.compile(compiler_options=dict(options) if options else None)
        except Exception as e:  # noqa: BLE001 - an out-of-memory refusal is a figure, not a crash
            if (over := _OVERFLOW.search(str(e))) is not None:
                raise RematError(_MSG_OVERFLOW.format(said=over.group(0))) from None
            if not OUT_OF_MEMORY.search(str(e)):
                raise
            error = (str(e).strip().splitlines() or [""])[0][:500]
    dt = time.perf_counter() - t0
    text = "".join(log)
    return TargetCompile(compiled, 0.0, dt, xla_remat_of(compiled, text), error, text, folder)


def xla_remat_of(compiled: Any, log: str = "") -> str | None:
    """What XLA's own rematerialization pass did to a compiled program (``None``: nothing): what
    it changed, read from the program (:func:`program_remat`), and, where the compiler said so
    while compiling (``log``, its stderr), that it could not bring the program under the device
    memory ("Can't reduce memory use below ... by rematerialization")."""
    found = _XLA_REMAT.findall(log)  # the last one is the whole program's
    said = found[-1].strip() if found else None
    changed = None
    if compiled is not None:
        try:
            changed = program_remat(compiled.as_text())
        except Exception:  # noqa: BLE001 - no program text: what the compiler said stands alone
            changed = None
    return "; ".join(m for m in (said, changed) if m) or None


_VALUES = re.compile(r"([\d.]+) MiB of values")


def xla_remat_fits(said: str | None, peak: int, budget: int) -> bool:
    """Whether a program XLA's rematerialization pass changed (``said``: :func:`xla_remat_of`)
    fits ``budget`` as written: its compiled ``peak`` plus every value the pass recomputes (each
    kept live instead, all at the peak at worst) is within it. XLA:TPU's pass also runs on steps
    whose device peak is far under the device memory when the step keeps gigabytes in host memory
    (training state on host: a 110-layer GPT at 8.6 GiB of its 15.75 recomputed 3.3 GiB of
    attention values): such a step fits as written and is not refused for it.

    >>> xla_remat_fits("... recomputes 30 instructions (16 fusion), 3218.56 MiB of values, in ...",
    ...                8 << 30, 15 << 30)
    True
    """
    found = _VALUES.findall(said or "")
    if not found:
        return False
    return peak + int(sum(float(x) for x in found) * 2**20) <= budget


_ORIGINALLY = re.compile(r"down from [\d.]+\w+ \((\d+) bytes\) originally")


def xla_remat_original(said: str | None) -> int | None:
    """The bytes a program needed as written, before XLA's rematerialization pass, where its
    message says so (``... down from 83.09GiB (89220883536 bytes) originally``: the last, the
    whole program's), else ``None`` (the pass brought it under the device memory silently).

    >>> xla_remat_original("Can't reduce memory use below 60.68GiB (65158918135 bytes) by "
    ...     "rematerialization; only reduced to 82.84GiB (88951841832 bytes), down from 83.09GiB "
    ...     "(89220883536 bytes) originally")
    89220883536
    """
    found = _ORIGINALLY.findall(said or "")
    return int(found[-1]) if found else None


def compile_for(fn: Any, args: Sequence[Any], acc: str | Accelerator, *,
                batch: Sequence[bool] | None = None, mesh: str | Mapping[str, int] | None = None,
                ) -> TargetCompile:
    """``jax.jit(fn)`` compiled for ``acc`` from the shapes of ``args`` (arrays or
    ``ShapeDtypeStruct``; nothing is allocated), laid out on ``mesh`` (default: data parallel over
    all of ``acc``'s devices). ``batch`` flags the arguments split along their leading dimension
    (default: the last one).

    Raises:
      RematError: the compiler is not installed, the topology is refused, the batch does not split.
    """
    acc = parse_accelerator(acc)
    flags = list(batch) if batch is not None else [i == len(args) - 1 for i in range(len(args))]
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    if acc.is_local:
        structs: tuple[Any, ...] = tuple(args)
    else:
        m = target_mesh(acc, parse_mesh(mesh, device_count(acc)))
        structs = abstract_args(args, flags, m)
    t0 = time.perf_counter()
    lowered = jitted.lower(*structs)
    lower_s = time.perf_counter() - t0
    return dataclasses.replace(compile_lowered(lowered), lower_s=lower_s)
