"""Trace-time check: every name a boundary's plan keeps is produced by a tag traced inside it.

A saved or offloaded name that no ``checkpoint_name`` tag produces makes the policy keep nothing
for it, silently. A boundary knows which names were tagged while its body was traced (the core's
tag collectors, and for JAX's own ``checkpoint_name`` tags the equations of the open trace), so
it can say so when it is traced: an error in strict mode, a warning in lenient mode.
``verify`` and ``measure`` defer the check (:func:`defer_name_checks`) and report the same names
as problems instead.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Collection, Iterable

from ._compile import CompiledBoundary
from ._context import name_checks_deferred
from ._errors import PlanError, sorted_list
from ._jaxcompat import open_trace_equations
from ._paths import INPUT_NAME, SEP, display
from ._records import Tag
from ._residuals import jaxpr_names

_MSG_UNPRODUCED = """\
module {path!r}: the plan keeps {names} at this remat boundary, but no checkpoint_name tag with
that name runs inside it (tags traced here: {seen}), so the policy keeps nothing for it.
Fix: tag the value with remat_common.checkpoint_name(x, name) in this module or a submodule, or
correct the name in the plan{lenient}."""


class UnproducedNameWarning(UserWarning):
    """A lenient plan keeps a name that no tag inside its boundary produces."""


class UnproducedNameError(PlanError):
    """A strict plan keeps a name that no tag inside its boundary produces (raised at trace time)."""


def _leaf(name: str) -> str:
    return name.rpartition(SEP)[2]


def unproduced(boundary: CompiledBoundary, produced: Collection[str]) -> list[str]:
    """The names the plan wrote for ``boundary`` (bare or relative) that no produced tag among the
    boundary's qualified names matches; the rule ``verify`` applies to the whole trace."""
    spec = boundary.spec
    hit = {_leaf(q) for q in (spec.save | spec.offload) & frozenset(produced)}
    return sorted(n for n in spec.requested if _leaf(n) not in hit)


def _traced_names() -> set[str] | None:
    """Every ``checkpoint_name`` tag recorded so far in the open trace (JAX's own included), or
    None when the trace cannot be read."""
    eqns = open_trace_equations()
    if eqns is None:
        return None
    out: set[str] = set()
    jaxpr_names(types.SimpleNamespace(eqns=eqns), out)
    return out


def check_produced(boundary: CompiledBoundary, tags: Iterable[Tag], rule_names: Iterable[str] = (),
                   *, strict: bool) -> None:
    """Raises :class:`UnproducedNameError` (strict) or warns :class:`UnproducedNameWarning`
    (lenient) when a name the plan keeps at ``boundary`` was not tagged while its body was traced
    (``tags``: what the core's collectors saw; ``rule_names``: the residual names of rule sets
    applied inside, which they tag later, when AD runs their forward rule). Called at the end of
    the body's trace."""
    if not boundary.spec.requested or name_checks_deferred():
        return
    produced = {t.name for t in tags} | set(rule_names)
    missing = unproduced(boundary, produced)
    if not missing:
        return
    traced = _traced_names()  # JAX's own tags do not pass the collectors
    if traced is None:
        return  # cannot tell; verify reports it
    produced |= traced
    missing = unproduced(boundary, produced)
    if not missing:
        return
    seen = sorted({_leaf(n) for n in produced if not n.endswith(INPUT_NAME)})
    msg = _MSG_UNPRODUCED.format(
        path=display(boundary.path), names=sorted_list(missing),
        seen=sorted_list(seen) if seen else "none",
        lenient="" if not strict else ", or set defaults.mode: lenient to only warn")
    if strict:
        raise UnproducedNameError(msg)
    warnings.warn(msg, UnproducedNameWarning, stacklevel=2)
