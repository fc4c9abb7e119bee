"""``remat lint``: a static check for the JAX 0.11 remat hazards in user code."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._args import bounded
from ..lint._lint import lint_paths
from ..lint._rules import LINT_RULES, LintReport

EPILOG = "rules:\n" + "\n".join(
    f"  {r.id}  {r.name:<36}{r.summary}" for r in LINT_RULES.values()
) + """

Silence a finding with a trailing comment on its line: `# remat: ignore[RM002]` (ids or names,
comma-separated) or `# remat: ignore` for every rule; flake8-style `# noqa: RM002` and a bare
`# noqa` work too.
exit status: 0 when nothing is found, 1 when something is, 2 for a usage error (including
no Python file to check)."""


ABOUT = ("Checks Python files (directories: every *.py below, skipping hidden "
         "directories and virtual environments) for code that JAX 0.11 breaks or silently "
         "changes. The files are parsed, never imported.")


def register(p: Any) -> None:
    """``remat lint``'s arguments (its parser made by the ``remat`` command line)."""
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="output format (default: text)")
    p.add_argument("--select", metavar="RULES", help="report only these rules (ids or names)")
    p.add_argument("--ignore", metavar="RULES", help="skip these rules (ids or names)")
    p.add_argument("-j", "--jobs", metavar="N",
                   type=bounded(int, "an integer",
                                message="--jobs takes a positive integer, got {text!r}"),
                   help="worker processes (default: one per core, up to 8, from 32 files on)")
    p.set_defaults(func=run)



def render(report: LintReport) -> str:
    lines = []
    for f in report.findings:
        lines.append(str(f))
        lines.append(f"    fix: {f.fix}")
    lines.append(report.summary())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        report = lint_paths(args.paths, select=args.select, ignore=args.ignore, jobs=args.jobs)
    except (ValueError, OSError) as e:
        print(f"remat lint: error: {e}", file=sys.stderr)
        return 2
    if not report.files:
        print(f"remat lint: error: no Python files found in {', '.join(map(repr, args.paths))}; "
              "nothing was checked. Fix: pass .py files or directories that contain some "
              "(hidden directories and virtual environments are skipped).", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render(report))
    return 0 if report.ok else 1
