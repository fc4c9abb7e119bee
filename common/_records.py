"""What is recorded while a model runs: tagged activations and rule-set applications.

Frozen value types only; the context that collects them is ``_context.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from ._paths import qualify

Location = Literal["device", "host", "recompute"]
Impl = Literal["custom_remat", "custom_vjp", "plain"]


@dataclasses.dataclass(frozen=True)
class Tag:
    """One activation tagged during tracing: its qualified name, module path and abstract value."""

    name: str
    path: str | None
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class Ambient:
    """What the enclosing remat policy says about one rule set's residuals.

    Attributes:
      path: the module path the rule runs in (its residual names are qualified with it), or None.
      locations: ``(residual name, location)`` for every residual the rule set declares; a
        location is ``device`` (kept), ``host`` (moved to host memory and back) or ``recompute``.
      source: where the locations come from: ``plan`` (what the plan says for the module, tracked
        by the plugin), ``policy`` (the policy object JAX handed to the forward rule) or ``rule``
        (no plan and no boundary: the rule set's own defaults).
      policy: the name of the JAX policy the forward rule received (``custom_remat`` path only).
      offload_src, offload_dst: memory kinds for ``host`` residuals.

    >>> amb = Ambient(None, (("lse", "device"), ("out", "recompute")), "rule")
    >>> amb.location("lse"), sorted(amb.kept)
    ('device', ['lse'])
    """

    path: str | None
    locations: tuple[tuple[str, Location], ...]
    source: Literal["plan", "policy", "rule"]
    policy: str | None = None
    offload_src: str = "device"
    offload_dst: str = "pinned_host"

    def location(self, name: str) -> Location:
        """Where residual ``name`` goes (``recompute`` for a name the rule set does not declare)."""
        return dict(self.locations).get(name, "recompute")

    @property
    def kept(self) -> frozenset[str]:
        return frozenset(n for n, loc in self.locations if loc != "recompute")

    def qualified(self, name: str) -> str:
        return qualify(self.path, name)


@dataclasses.dataclass(frozen=True)
class RuleRun:
    """One traced application of a rule set: which path ran and what its forward rule saw.

    A record with ``impl`` ``custom_remat`` or ``custom_vjp`` is written by the forward rule itself,
    when it runs (reverse-mode AD); ``plain`` is written when the plain function ran instead.

    Attributes:
      rule: the rule set's name.
      path: the module path, or None outside any module.
      impl: ``custom_remat``, ``custom_vjp`` or ``plain``.
      reason: why this path was taken.
      ambient: what the forward rule saw (None for ``plain``).
      plan_locations: what the plan says about the residuals, when a plan is active.
    """

    rule: str
    path: str | None
    impl: Impl
    reason: str
    ambient: Ambient | None = None
    plan_locations: tuple[tuple[str, Location], ...] | None = None

    @property
    def forward_ran(self) -> bool:
        return self.impl != "plain"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rule": self.rule, "path": self.path, "impl": self.impl,
                             "reason": self.reason}
        if self.ambient is not None:
            d["locations"] = dict(self.ambient.locations)
            d["source"] = self.ambient.source
            d["policy"] = self.ambient.policy
        if self.plan_locations is not None:
            d["plan_locations"] = dict(self.plan_locations)
        return d


@dataclasses.dataclass(frozen=True)
class ModuleRun:
    """One module call traced under a plan, or one boundary entered (see ``collect_module_runs``).

    Attributes:
      path: the module path the call ran as (after stack and shared-layer rewrites).
      boundary: the compiled boundary it ran inside (a ``CompiledBoundary``), or None.
      plan: the compiled plan ``call_module`` ran it under; None for a record written where the
        boundary is entered (``wrap_call``: plain-JAX ``checkpoint`` calls included).
    """

    path: str
    boundary: Any = None
    plan: Any = None
