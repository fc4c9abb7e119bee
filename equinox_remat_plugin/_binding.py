"""What an annotated class carries: the original class, the module path and the :class:`Binding`
(plan, boundary options), as class attributes, read back by :func:`binding_of` and
:func:`original_class`."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

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


#: Class attribute of an annotated class: the original class.
ORIGINAL: Final = "__remat_original__"
#: Class attribute of an annotated class: the module path it runs under.
PATH: Final = "__remat_path__"
#: Class attribute of an annotated class: its :class:`Binding`.
BINDING: Final = "__remat_binding__"


@dataclasses.dataclass(frozen=True)
class Binding:
    """What an annotated class carries besides its path: the model's compiled plan (one
    :class:`PlanRef` shared by every module of one ``annotate`` call) and ``prevent_cse``."""

    ref: PlanRef
    prevent_cse: bool

    @property
    def plan(self) -> rc.CompiledPlan:
        return self.ref.plan


def original_class(cls: type) -> type:
    """The class an annotated class stands for (``cls`` itself when it is not annotated)."""
    return vars(cls)[ORIGINAL] if ORIGINAL in vars(cls) else cls


def binding_of(module: Any) -> tuple[str, Binding] | None:
    """``(path, binding)`` of a module of an annotated class, ``None`` for any other object."""
    cls = type(module)
    if ORIGINAL not in vars(cls):
        return None
    return vars(cls)[PATH], vars(cls)[BINDING]
