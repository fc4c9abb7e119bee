"""``remat doctor``: versions, floors, JAX surface and flags, and what to do about each problem."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..doctor._doctor import (FEATURES, FLOORS, JAX_RANGE, OPTIONAL, Diagnosis, floor_spec,
                              range_spec, diagnose)


EPILOG = "features for --require:\n" + "\n".join(
    f"  {name:<16}{f.meaning}" for name, f in sorted(FEATURES.items())
) + """

exit status: 0 when every floor is met and every required feature is available, 1 otherwise,
2 for a usage error (e.g. an unknown feature name)."""


_MSG_NO_BACKEND = """\
remat doctor: FAILED: JAX cannot start a backend, so nothing else can be checked.
  JAX says: {error}
  JAX_PLATFORMS={platforms}
  fix: unset JAX_PLATFORMS (or set it to a platform this machine has, e.g. cpu), or install the
       backend's plugin (pip install 'jax[tpu]' / 'jax[cuda12]') on a machine with that device."""


ABOUT = ("Prints what is installed and active (versions, backend, memory kinds, "
         "jax_remat3, which JAX remat surface exists), checks the JAX 0.11 floors "
         "(Python >= 3.12, NumPy >= 2.1, SciPy >= 1.15) and says what to do about each problem.")


def register(p: Any) -> None:
    """``remat doctor``'s arguments (its parser made by the ``remat`` command line)."""
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--require", action="append", default=[], metavar="FEATURE[,FEATURE...]",
                   help="exit non-zero unless these features are available (repeatable)")
    p.set_defaults(func=run)


def _floor(dist: str) -> str:
    if dist in FLOORS:
        return floor_spec(FLOORS[dist])
    if dist == "jax":
        return range_spec(*JAX_RANGE)
    if dist == "jaxlib":
        return "== the jax version"
    if dist in OPTIONAL:  # the extras require the floor; a newer release only warns
        lo, hi, _ = OPTIONAL[dist]
        return f"{floor_spec(lo)} (tested below {'.'.join(map(str, hi))})"
    return ""


def _yes(v: bool) -> str:
    return "yes" if v else "no"


def render(d: Diagnosis) -> str:
    """The human-readable report."""
    c = d.capabilities
    lines = ["remat doctor", "", "Versions"]
    for dist, v in (("python", c.python), *d.versions):
        lines.append(f"  {dist:<18}{v or 'not installed':<14}{_floor(dist)}")
    lines += [
        "", "Backend",
        f"  {'backend':<18}{c.backend} ({c.device_count} x {c.device_kind})",
        f"  {'memory kinds':<18}{', '.join(c.memory_kinds) or '(none)'}",
        "", "JAX remat surface",
        f"  {'jax_remat3':<40}{'on' if c.remat3 else 'off'}",
        f"  {'jax.custom_remat':<40}{_yes(c.custom_remat)}",
        f"  {'policy classes (SaveOnlyTheseNames…)':<40}{_yes(c.policy_classes)}",
        f"  {'jax.Inline':<40}{_yes(c.inline)}",
        f"  {'import jax.checkpoint_policies':<40}"
        f"{'works' if c.checkpoint_policies_importable else 'fails (use attribute access)'}",
        f"  {'saved_residuals reads the jaxprs':<40}{_yes(dict(d.features)['saved_residuals'])}",
        "", "Features (--require)",
    ]
    req = set(d.required)
    for name, ok in d.features:
        mark = " (required)" if name in req else ""
        lines.append(f"  {name:<16}{_yes(ok):<5}{FEATURES[name].meaning}{mark}")
    lines += ["", "Targets (--accelerator: compile for a device this machine does not have)"]
    for kind, why in d.targets:
        lines.append(f"  {kind:<58}{'yes' if why is None else 'no: ' + why}")
    lines += ["", "Problems" if d.problems else "Problems: none"]
    for p in d.problems:
        lines.append(f"  [{p.severity}] {p.message}")
        lines.append(f"      fix: {p.fix}")
    status = "OK" if d.ok else "FAILED"
    lines += ["", f"remat doctor: {status} ({d.count('error')} error(s), "
                  f"{d.count('warning')} warning(s), {d.count('note')} note(s))"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    for item in args.require:
        if not item.strip() or any(not part.strip() for part in item.split(",")):
            print(f"remat doctor: error: --require {item!r} holds an empty feature name. Allowed: "
                  f"{', '.join(sorted(FEATURES))} (comma-separated). Fix: name the features, "
                  "or leave --require out.", file=sys.stderr)
            return 2
    try:
        d = diagnose(require=args.require)
    except ValueError as e:
        print(f"remat doctor: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # JAX cannot start its backend: the moment a doctor is needed
        if "backend" not in str(e):
            raise
        print(_MSG_NO_BACKEND.format(error=str(e).strip(),
                                     platforms=os.environ.get("JAX_PLATFORMS", "(unset)")),
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(d.to_json(), indent=2))
    else:
        print(render(d))
    return 0 if d.ok else 1
