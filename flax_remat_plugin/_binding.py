"""What an annotated module's class carries besides its path: the :class:`Binding` of plan and
boundary, which :func:`remat_common.adapter.binding_of` reads back; the class attributes ``@remat``
and the ``remat=`` keyword set; the framework's name (:data:`FRAMEWORK`)."""

from __future__ import annotations

import dataclasses
from typing import Final

from flax import nnx
from remat_common import CompiledPlan
from remat_common.adapter import CUSTOM_METHOD, in_subtree


#: The name this adapter registers its framework under (``_framework.py``).
FRAMEWORK: Final = "flax.nnx"
#: Class attribute set by ``@remat``: ``((relative pattern, Annotation), ...)``.
CLASS_RULES: Final = "__remat_rules__"
#: Instance attribute set by the ``remat=`` constructor keyword of decorated classes.
INSTANCE_RULES: Final = "__remat__"
#: The method a module defines to opt into ``"custom"`` (same signature as ``__call__``).
CUSTOM: Final = CUSTOM_METHOD


@dataclasses.dataclass(frozen=True)
class Binding:
    """What an annotated module's class carries: the compiled plan and the stacks it used."""

    plan: CompiledPlan
    stacks: tuple[tuple[str, int], ...]
    prevent_cse: bool = True
    touched: frozenset[str] = frozenset()  # the real paths annotate swapped
    planned: bool = True  # annotate() was given a plan (False: only what the classes declare)

    def num_layers(self, path: str) -> int | None:
        sizes = self.__dict__.get("_sizes")
        if sizes is None:
            sizes = self.__dict__["_sizes"] = dict(self.stacks)
        return sizes.get(path)  # type: ignore[no-any-return]

    def touched_inside(self, path: str) -> tuple[str, ...]:
        """The touched paths strictly inside ``path``, sorted (worked out once per path: every
        call of an annotated module checks them)."""
        memo = self.__dict__.setdefault("_inside", {})
        got = memo.get(path)
        if got is None:
            got = memo[path] = tuple(sorted(p for p in self.touched
                                            if p != path and in_subtree(p, path)))
        return got  # type: ignore[no-any-return]

    def __hash__(self) -> int:  # the swapped classes are cached by binding: hash the plan once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.plan, self.stacks, self.prevent_cse, self.touched, self.planned))
            object.__setattr__(self, "_hash", h)
        return h


def has_call(cls: type) -> bool:
    return any("__call__" in vars(k) for k in cls.__mro__ if k not in (object, nnx.Module, nnx.Pytree))
