"""The ``remat`` command-line tool."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence

from ..._errors import RematError
from ..._version import __version__

#: Subcommands: (name, module under remat_common, the line ``remat --help`` gives it). Each module
#: defines ``ABOUT`` (its ``--help``'s description), an ``EPILOG`` where it has one (kept as
#: written), and ``register(parser) -> None``, which adds its arguments and sets
#: ``func(args) -> int``.
SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("docs", "._docs", "read the documentation shipped with the package (offline)"),
    ("doctor", "._doctor", "check versions, floors and JAX remat capabilities"),
    ("lint", "._lint", "find JAX 0.11 remat hazards in Python files"),
    ("report", "._report", "measure what each plan of a model costs (memory, FLOPs, time)"),
    ("tune", "._tune", "find the cheapest plan whose compiled step fits a memory budget"),
    ("verify", "._verify",
     "check what each plan keeps, or (--parity) its gradients on this device"),
)
#: What a subcommand imports beyond the core's dependencies: (modules, the extra that installs them).
#: rich draws the tables and the progress bar, so they cannot run without it; matplotlib only
#: draws ``--plot``'s figures, which check for it themselves (``require_matplotlib``).
NEEDS: dict[str, tuple[tuple[str, ...], str]] = {"report": (("rich",), "report"),
                                                  "tune": (("rich",), "report")}
#: What each needed module does for a subcommand, for the message when it is missing.
_NEEDED_FOR = {"rich": "its tables and progress bar"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remat",
        description="Declarative, verified rematerialization plans for JAX, Flax NNX and Equinox.",
    )
    parser.add_argument("--version", action="version", version=f"remat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help in SUBCOMMANDS:
        mod = importlib.import_module(module, __package__)
        epilog = getattr(mod, "EPILOG", None)
        mod.register(sub.add_parser(
            name, help=help, description=mod.ABOUT, epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter if epilog
            else argparse.HelpFormatter))
    return parser


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings, of the parser and its subcommands, that take one value."""
    out: set[str] = set()
    for action in parser._actions:  # argparse keeps them here; there is no public list
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _value_options(sub)
        elif action.option_strings and action.nargs is None:
            out.update(action.option_strings)
    return out


def _join_negative_values(argv: Sequence[str], options: set[str]) -> list[str]:
    """``--budget -1GiB`` as ``--budget=-1GiB``: argparse reads a value that starts with '-' and
    is not a plain number as another option and says "expected one argument"; joined, the
    option's own check says what is wrong with the value."""
    out: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        tok = argv[i]
        if tok in options and i + 1 < len(argv) and re.match(r"^-[0-9.]", argv[i + 1]):
            out.append(f"{tok}={argv[i + 1]}")
            next(it, None)
        else:
            out.append(tok)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = f"remat {argv[0]}" if argv and re.fullmatch(r"[a-z]+", argv[0]) else "remat"
    try:  # a Ctrl-C while the subcommands' modules are imported is an interrupt like any other
        parser = build_parser()
        args = parser.parse_args(_join_negative_values(argv, _value_options(parser)))
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 0 if args.command is None else 2
        name = f"remat {args.command}"
        missing = [m for m in NEEDS.get(args.command, ((), ""))[0] if not _importable(m)]
        if missing:
            extra = NEEDS[args.command][1]
            why = "; ".join(f"{m} ({_NEEDED_FOR[m]})" if m in _NEEDED_FOR else m for m in missing)
            print(f"{name}: needs {why}, which cannot be imported here.\n"
                  f"Fix: pip install 'jax-remat-plan[{extra}]' (or: pip install "
                  f"{' '.join(missing)})", file=sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (``remat lint ... | head``): stop quietly. Point stdout at devnull
        # so the interpreter's final flush does not fail again.
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except RematError as e:  # plan, annotation, capability, verification: the message says it all
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # reading a config, writing an output
        where = f": {e.filename!r}" if e.filename is not None else ""
        print(f"{name}: error: {e.strerror or e}{where}. Fix: check the path"
              f"{'' if e.filename is not None else ' and the free space'}.", file=sys.stderr)
        return 2


def _importable(module: str) -> bool:
    """Whether ``import module`` works (a package that is found but fails to import is missing)."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
