"""The ``remat`` command's entry point (``[project.scripts]``): a guard around what it imports.

A console script imports its entry module before any code of ours runs. Were that
``remat_common._tooling.cli``, JAX would be imported (a second or two) outside every handler: a
Ctrl-C then printed a ``KeyboardInterrupt`` traceback (or an ``ImportError`` of a half-imported
jaxlib at shutdown), and JAX refusing an environment variable (``JAX_ENABLE_X64=maybe``) a
``ValueError`` traceback. This module imports the standard library only until :func:`main` runs,
so each of those ends in one line: ``remat report: interrupted`` (status 130), or what is wrong
with the environment and how to fix it. (``python -m remat_common`` imports the package first,
outside this guard.)
"""

from __future__ import annotations

import os
import re
import signal
import sys

TYPE_CHECKING = False  # (typing itself takes a while to import: not before the guard is up)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType
    from typing import NoReturn

#: The values JAX reads as true or false in its boolean environment variables (any case).
TRUTH_VALUES = ("1", "0", "true", "false", "yes", "no", "on", "off", "y", "n", "t", "f")
_BAD_TRUTH = re.compile(r"invalid truth value '(?P<value>.*)' for environment '(?P<name>\w+)'")


def _command(argv: Sequence[str]) -> str:
    """``remat report``: the command as messages name it (the first argument when it is a word)."""
    return f"remat {argv[0]}" if argv and re.fullmatch(r"[a-z]+", argv[0]) else "remat"


def _stop(command: str) -> NoReturn:
    """Ends the process after a Ctrl-C: one line, status 130, and no interpreter shutdown, whose
    exit hooks would run into what the interrupt left half-done (a half-imported jaxlib)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sys.stdout.flush()
    finally:
        os.write(2, f"{command}: interrupted\n".encode())
        os._exit(130)


def cannot_start(command: str, error: BaseException) -> tuple[str, int]:
    """The message and exit status for an exception raised while importing JAX (``remat
    doctor``: a failed diagnosis, status 1; another command: an error, status 2)."""
    bad = _BAD_TRUTH.search(str(error))
    if bad is not None:
        name, value = bad["name"], bad["value"]
        what = (f"the environment variable {name}={os.environ.get(name, value)!r} is not a truth "
                f"value; JAX accepts {', '.join(TRUTH_VALUES)} (any case)")
        fix = f"{name}=1 or {name}=0, or unset {name}"
    else:
        set_vars = sorted(k for k in os.environ if k.startswith(("JAX_", "XLA_")))
        what = f"importing JAX raised {type(error).__name__}: {' '.join(str(error).split())}"
        fix = (f"check the JAX environment variables set here ({', '.join(set_vars)}), or unset them"
               if set_vars else "reinstall JAX: pip install --force-reinstall 'jax[cpu]'")
    if command == "remat doctor":
        return f"remat doctor: FAILED: JAX cannot start: {what}.\n  fix: {fix}", 1
    return f"{command}: error: JAX cannot start: {what}. Fix: {fix}.", 2


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``remat`` (``remat_common._tooling.cli._main.main``) behind the guard.

    While JAX and the subcommands are imported, a Ctrl-C ends the process at once (raising
    ``KeyboardInterrupt`` inside an extension module's initialisation can abort the interpreter:
    nanobind's "Critical nanobind error"). While a command runs it raises ``KeyboardInterrupt``,
    which the command turns into "interrupted" after cleaning up; a second Ctrl-C (the first one
    swallowed by code that catches everything) ends the process at once.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    original = signal.getsignal(signal.SIGINT)
    guarded = original is signal.default_int_handler
    if guarded:  # (a SIGINT ignored by whoever started us stays ignored)
        signal.signal(signal.SIGINT, lambda signum, frame: _stop(command))
    try:
        import importlib

        from remat_common._tooling.cli import _main as _cli

        for _, module, _ in _cli.SUBCOMMANDS:
            importlib.import_module(module, _cli.__package__)
    except Exception as e:
        message, status = cannot_start(command, e)
        print(message, file=sys.stderr)
        return status
    finally:
        if guarded:
            signal.signal(signal.SIGINT, original)
    interrupted: list[bool] = []

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        if interrupted:
            _stop(command)
        interrupted.append(True)
        raise KeyboardInterrupt

    # A KeyboardInterrupt that lands in a gc callback (JAX has one) is printed as ignored, and
    # the command would go on: it is raised again in the command instead, and not printed.
    unraisable = sys.unraisablehook

    def quiet_unraisable(u: object) -> None:
        if not (interrupted and isinstance(getattr(u, "exc_value", None), KeyboardInterrupt)):
            unraisable(u)  # type: ignore[arg-type]
            return
        import _thread

        interrupted.clear()
        _thread.interrupt_main()  # (on_interrupt again, at the main thread's next instruction)

    if guarded:
        signal.signal(signal.SIGINT, on_interrupt)
        sys.unraisablehook = quiet_unraisable
    try:
        status = _cli.main(argv)
    except BaseException:
        if interrupted:
            _stop(command)
        raise
    finally:
        sys.unraisablehook = unraisable
        if guarded:
            signal.signal(signal.SIGINT, original)
    if interrupted:
        if status != 130:  # the interrupt was swallowed and the command went on
            _stop(command)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # without the shutdown hooks of what the interrupt left half-done
    if guarded:  # a Ctrl-C while the interpreter shuts down (its exit hooks, JAX's) ends it quietly
        import atexit

        atexit.register(signal.signal, signal.SIGINT, _exit_130)  # runs before JAX's (LIFO)
    return status


def _exit_130(signum: int, frame: FrameType | None) -> None:
    os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
