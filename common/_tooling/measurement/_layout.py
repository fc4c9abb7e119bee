"""The layout check of :func:`~remat_common.measurement.measure`: a stack the plan splits into layer
groups or nests costs what one scan of its layers costs.

A plan that treats a scanned stack's layers differently (``layers.[0-3]: recompute``,
``layers.[4-7]: save``) or nests it (``{remat: recompute, nested: sqrt}``) changes how the stack
is scanned, not what its layers keep. Its compiled temp should stay near that of the same step with
every layer of the stack under one annotation (one scan): the layout's reference, the largest temp
among the one-scan plans of the annotations its groups use. A temp above the reference by more than
5 % of the stack's parameter bytes ``S`` means the step holds a buffer of the stack's size that the
plan does not ask for (a gradient of the whole stack per group, or the parameters sliced per group
and kept): a problem of the plan's report, naming the stack and the bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np

from ..._annotation import INHERIT
from ..._paths import in_subtree
from ..._plan import Plan, Rule
from ..._resolve import LayerGroup, Resolution, layer_groups, resolve
from ..breakdown._breakdown import leaf_keys

#: How far above its layout's reference a grouped or nested stack's temp may be, as a fraction of
#: the stack's parameter bytes.
MARGIN: Final = 0.05

_MSG_OVER = """\
stack {stack!r} ({layout}): the compiled step's temp is {temp:,} bytes, {over:,} bytes ({ratio:.2f} S)
above its layout's reference, more than {margin:.0%} of the stack's parameter bytes S = {s:,}.
The reference is the same step with every layer of {stack!r} under one annotation, one scan
({refs}). Splitting a stack into layer groups or nesting it changes how it is scanned, not what
its layers keep: the step holds a buffer of the stack's size that the plan does not ask for (a
gradient of the whole stack per group, or the stack's parameters sliced per group and kept).
Fix: run the stack with the adapter's stack runner (flax_remat_plugin.scan_layers,
equinox_remat_plugin.Stacked), which runs its groups under one gradient of the stack; or give
every layer of {stack!r} one annotation (e.g. {example!r}: {first})."""


@dataclasses.dataclass(frozen=True)
class LayoutCheck:
    """One grouped or nested stack of one plan, against its layout's reference.

    Attributes:
      stack: the stack's module path.
      layout: how the plan runs it (``2 layer groups (0-3, 4-7)``, ``nested, blocks of 3``).
      temp: the plan's compiled ``temp_size_in_bytes``.
      references: ``(annotation, temp)`` of each one-scan reference plan (every layer of the stack
        treated as the first layer of one of its groups, not nested).
      param_bytes: ``S``, the bytes of the stack's floating-point parameters.
    """

    stack: str
    layout: str
    temp: int
    references: tuple[tuple[str, int], ...]
    param_bytes: int

    @property
    def reference(self) -> int:
        """The largest temp of the references."""
        return max(t for _, t in self.references)

    @property
    def over(self) -> int:
        """Bytes of temp above the reference (negative: below)."""
        return self.temp - self.reference

    @property
    def flagged(self) -> bool:
        """More than :data:`MARGIN` of the stack's parameter bytes above the reference."""
        return self.over > MARGIN * self.param_bytes

    def problem(self) -> str:
        refs = ", ".join(f"{a}: {t:,} bytes" for a, t in self.references)
        first = self.references[0][0]
        return _MSG_OVER.format(stack=self.stack, layout=self.layout, temp=self.temp,
                                over=self.over, ratio=self.over / max(self.param_bytes, 1),
                                margin=MARGIN, s=self.param_bytes, refs=refs,
                                example=self.stack, first=first)

    def note(self) -> str:
        """One line: the stack, its temp against the reference, in bytes and in ``S``."""
        return (f"stack {self.stack!r} ({self.layout}): temp {self.over:+,} bytes "
                f"({self.over / max(self.param_bytes, 1):+.2f} S) against one scan of its layers "
                f"({self.reference:,} bytes; S = {self.param_bytes:,} parameter bytes, margin "
                f"{MARGIN:.0%})")

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "layout": self.layout, "temp": self.temp,
                "references": [[a, t] for a, t in self.references],
                "param_bytes": self.param_bytes, "reference": self.reference,
                "over": self.over, "flagged": self.flagged}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LayoutCheck:
        return cls(str(data["stack"]), str(data["layout"]), int(data["temp"]),
                   tuple((str(a), int(t)) for a, t in data["references"]),
                   int(data["param_bytes"]))


def _num_layers(r: Resolution, stack: str) -> int:
    prefix = f"{stack}." if stack else ""
    return sum(1 for p in r.paths if p.startswith(prefix) and p[len(prefix):].isdigit())


def checked_stacks(r: Resolution) -> list[tuple[str, tuple[LayerGroup, ...], str]]:
    """``(stack, groups, layout)`` of each scanned stack the plan splits into groups or nests."""
    out = []
    nested = dict(r.nested)
    for stack in r.stacks:
        n = _num_layers(r, stack)
        if not n:
            continue
        groups = layer_groups(r, stack, n)
        if len(groups) < 2 and stack not in nested:
            continue
        parts = []
        if len(groups) > 1:
            parts.append(f"{len(groups)} layer groups "
                         f"({', '.join(f'{g.start}-{g.stop - 1}' for g in groups)})")
        if stack in nested:
            parts.append(f"nested: {nested[stack]}")
        out.append((stack, groups, ", ".join(parts)))
    return out


def reference_plans(r: Resolution, stack: str, groups: Iterable[LayerGroup]
                    ) -> list[tuple[str, Plan]]:
    """``(annotation, plan)`` per distinct treatment of the stack's groups: the plan with every
    layer of ``stack`` (and each of its submodules) annotated as the group's first layer, and the
    stack itself ``inherit`` (no nesting). The plan's other rules stay."""
    n = _num_layers(r, stack)
    prefix = f"{stack}." if stack else ""
    out: list[tuple[str, Plan]] = []
    for g in groups:
        rules = [Rule(stack or ".", INHERIT)]
        for p in r.paths:
            if in_subtree(p, g.path):
                rules.append(Rule(f"{prefix}[0-{n - 1}]{p[len(g.path):]}", r.annotation(p)))
        inner = any(r.annotation(p) != INHERIT for p in r.paths
                    if in_subtree(p, g.path) and p != g.path)
        label = str(r.annotation(g.path)) + (" (and its submodules' rules)" if inner else "")
        plan = dataclasses.replace(r.plan, rules=(*r.plan.rules, *rules), source=None)
        out.append((label, plan))
    return out


def resolution_key(r: Resolution) -> Hashable:
    """What a resolution makes the adapters run: two plans with equal keys compile alike."""
    return (r.annotations, r.boundaries, r.tagged_inputs, r.nested, r.stacks)


def reference_key(r: Resolution, plan: Plan) -> Hashable:
    """:func:`resolution_key` of ``plan`` resolved over ``r``'s modules and stacks."""
    return resolution_key(resolve(plan, r.paths, stacks=r.stacks))


def stack_param_bytes(loss_args: tuple[Any, ...], stack: str) -> int:
    """Bytes of the floating-point arrays among ``loss_args`` under the module path ``stack``
    (their key paths, argument positions and a Variable's ``value`` left out)."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(tuple(loss_args))[0]:
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            continue
        dotted = ".".join(leaf_keys(path))
        if in_subtree(dotted, stack):
            total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total
