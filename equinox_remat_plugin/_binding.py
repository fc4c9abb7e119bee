"""What an annotated class carries besides its path: the :class:`Binding` (plan, boundary options)
that :func:`remat_common.adapter.binding_of` reads back; the framework's name (:data:`FRAMEWORK`)."""

from __future__ import annotations

import dataclasses
from typing import Final

import remat_common as rc


class PlanRef:
    """A compiled plan as a static field: hashed once, compared by identity first.

    ``eqx.filter_jit`` hashes and compares static fields on every call; a whole
    :class:`~remat_common.CompiledPlan` (every module path, every rule) would be re-hashed each
    time. Every wrapper of one annotated model holds the same ``PlanRef``.
    """

    __slots__ = ("_hash", "_inside", "plan", "touched")

    def __init__(self, plan: rc.CompiledPlan, touched: tuple[str, ...] = ()) -> None:
        self.plan = plan
        #: the real module paths :func:`annotate` bound to this plan (``plan_of`` checks them).
        self.touched = touched
        self._hash = hash(plan)
        self._inside: dict[str, frozenset[str]] = {}

    def touched_inside(self, path: str) -> frozenset[str]:
        """The touched paths strictly inside ``path``, worked out once per path (every call of
        an annotated module checks its children against them)."""
        got = self._inside.get(path)
        if got is None:
            got = self._inside[path] = frozenset(
                p for p in self.touched if p != path and (not path or p.startswith(path + ".")))
        return got

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanRef):
            return NotImplemented
        return self.plan is other.plan or (self._hash == other._hash and self.plan == other.plan)

    def __repr__(self) -> str:
        return (f"CompiledPlan(plan={self.plan.resolution.plan.fingerprint()}, "
                f"boundaries={len(self.plan.boundaries)})")


#: The name this adapter registers its framework under (``_framework.py``).
FRAMEWORK: Final = "equinox"


@dataclasses.dataclass(frozen=True)
class Binding:
    """What an annotated class carries besides its path: the model's compiled plan (one
    :class:`PlanRef` shared by every module of one ``annotate`` call) and ``prevent_cse``."""

    ref: PlanRef
    prevent_cse: bool

    @property
    def plan(self) -> rc.CompiledPlan:
        return self.ref.plan
