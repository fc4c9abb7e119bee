"""The ``remat`` command-line tool."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

from .._errors import RematError
from .._version import __version__

#: Subcommands: (name, module under remat_common). Each module defines
#: ``register(subparsers) -> None``, which adds its parser and sets ``func(args) -> int``.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("doctor", "._cli_doctor"),
    ("lint", "._cli_lint"),
    ("report", "._cli_report"),
    ("tune", "._cli_tune"),
)
#: What a subcommand imports beyond the core's dependencies: (modules, the extra that installs them).
NEEDS: dict[str, tuple[tuple[str, ...], str]] = {"report": (("rich", "matplotlib"), "report"),
                                                  "tune": (("rich",), "report")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remat",
        description="Declarative, verified rematerialization plans for JAX, Flax NNX and Equinox.",
    )
    parser.add_argument("--version", action="version", version=f"remat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _, module in SUBCOMMANDS:
        importlib.import_module(module, __package__).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    missing = [m for m in NEEDS.get(args.command, ((), ""))[0] if importlib.util.find_spec(m) is None]
    if missing:
        extra = NEEDS[args.command][1]
        print(f"remat {args.command}: needs {' and '.join(missing)}, not installed.\n"
              f"Fix: pip install 'jax-remat-plan[{extra}]'", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (``remat lint ... | head``): stop quietly. Point stdout at devnull
        # so the interpreter's final flush does not fail again.
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        print(f"remat {args.command}: interrupted", file=sys.stderr)
        return 130
    except RematError as e:  # plan, annotation, capability, verification: the message says it all
        print(f"remat {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # reading a config, writing an output
        print(f"remat {args.command}: error: {e.strerror or e}: {e.filename!r}. Fix: check the path.",
              file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
