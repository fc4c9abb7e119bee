"""A model as a plan sees it, and the one pipeline from a plan to a compiled plan for it.

Every adapter describes its model the same way (:class:`ModelView`: module paths, stacks, what
model code declares, what is not a module, what each path is) and calls :func:`plan_model`, which
runs the same steps in the same order for every framework, so the same mistake raises the same
error type with the same message: coerce the plan; put the declared rules first (the plan's own
rules win); refuse rules aimed at something that is not a module; resolve; compile; refuse
modules that cannot be wrapped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from ._compile import CompiledPlan, compile_plan
from ._errors import PlanError
from ._paths import display
from ._pattern import PathIndex
from ._plan import Plan, Rule
from ._policy import jax_policy_entry
from ._resolve import resolve
from ._targets import check_modules, check_targets

#: What every entry point accepts as a plan: a :class:`Plan`, a mapping ``{pattern: annotation}``,
#: ``(pattern, annotation)`` pairs, a YAML/TOML/JSON file, ``None`` (only what model code
#: declares) or a function ``fn(path, module) -> annotation | None``.
PlanLike: TypeAlias = (Plan | Mapping[str, Any] | Iterable[tuple[str, Any]] | str | os.PathLike[str]
                       | Callable[[str, Any], Any] | None)

_MSG_POLICY_PLAN = """\
annotate(model, jax.checkpoint_policies.{entry}...): a jax.checkpoint policy is an annotation
(what one module keeps), not a plan (which modules get which annotation); as a plan it would be
called as a rule function fn(path, module). Fix: say where it goes, e.g. {{".": policy}} for the
whole model or {{"layers.*": policy}} for each layer."""

_MSG_SHARED = """\
{source}pattern {pattern!r} ({ann}) names {alias!r}, the same module object as {first!r} (shared:
one object at two paths). A module runs one plan entry wherever it is called, under its first path.
Fix: annotate {first!r}; the annotation applies at {alias!r} too."""


@dataclasses.dataclass(frozen=True)
class ModelView:
    """What a plan sees of a model, in terms every adapter can give.

    Attributes:
      paths: every module path (``""`` the root; stacked layers once per layer, ``blocks.3.mlp``).
      stacks: the stacked-layer paths (``blocks``).
      declared: rules that model code declares (``@remat``, ``Remat(...)``), children first.
      others: non-module attribute paths with what they are (``'jax.Array float32[4, 4]'``).
      stacked: real paths inside a stack (``blocks.mlp``) with the stack's path and size.
      aliases: a shared module's other paths, each with its first path.
      describe: for a path, ``(class name, has __call__, has __remat_custom__)`` or ``None``.
      modules: ``(path, module)`` pairs a callable plan is asked about.
    """

    paths: tuple[str, ...]
    stacks: tuple[str, ...] = ()
    declared: tuple[Rule, ...] = ()
    others: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stacked: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    describe: Callable[[str], tuple[str, bool, bool] | None] = lambda _: None
    modules: tuple[tuple[str, Any], ...] = ()


def coerce_plan(plan: PlanLike, view: ModelView) -> Plan:
    """A :class:`Plan` from what users pass: a Plan, a mapping, pairs, a file, ``None`` (nothing
    but what model code declares), or a function ``fn(path, module) -> annotation | None``."""
    if plan is None:
        return Plan()
    if callable(plan) and not isinstance(plan, Plan | Mapping | str | os.PathLike):
        entry = jax_policy_entry(plan)
        if entry is not None:
            raise PlanError(_MSG_POLICY_PLAN.format(entry=entry))
        rules = []
        for p, m in view.modules:
            ann = plan(p, m)
            if ann is not None:
                rules.append((p or ".", ann))
        return Plan.from_rules(rules)
    return Plan.coerce(plan)


def _check_shared(plan: Plan, view: ModelView) -> None:
    if not plan.strict:
        return  # lenient: resolve warns about a rule that matches nothing
    index = PathIndex(view.paths)  # every rule against every path was quadratic
    for rule in plan.rules:
        if index.matching(rule.pattern):
            continue
        for alias, first in view.aliases.items():
            if rule.matches(alias):
                raise PlanError(_MSG_SHARED.format(
                    source=f"{rule.source}: " if rule.source else "", pattern=rule.pattern,
                    ann=rule.annotation, alias=alias, first=display(first)))


def plan_model(view: ModelView, plan: PlanLike, *, share_alike_layers: bool = False) -> CompiledPlan:
    """The compiled plan for a model: what both adapters' ``annotate`` run.

    ``share_alike_layers`` is passed to :func:`compile_plan`.

    Raises:
      PlanError: a rule names a shared module's second path, something that is not a module, a real
        path inside stacked layers, or matches nothing; a module that cannot be wrapped.
      AnnotationError: an annotation outside the vocabulary.
    """
    full = coerce_plan(plan, view)
    if view.declared:
        full = dataclasses.replace(full, rules=tuple(view.declared) + full.rules)
    _check_shared(full, view)
    check_targets(full, view.paths, view.others, stacked=view.stacked, describe=view.describe)
    compiled = compile_plan(resolve(full, view.paths, stacks=view.stacks),
                            share_alike_layers=share_alike_layers)
    check_modules(compiled, view.describe)
    custom = tuple(p for p in view.paths if (d := view.describe(p)) is not None and d[2])
    return dataclasses.replace(compiled, custom_paths=custom) if custom else compiled
