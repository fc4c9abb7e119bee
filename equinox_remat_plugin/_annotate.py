"""``annotate``: a plan applied to an Equinox model by module path; ``unwrap`` undoes it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import equinox as eqx
import jax

import remat_common as rc

from ._remat import PlanRef, Remat
from ._tree import bind, rules_from_callable, strip, walk

M = TypeVar("M")

_MSG_ROOT = """\
equinox_remat_plugin.{fn}: expected an eqx.Module (the model), got {type}.
Fix: pass the model object itself, e.g. {fn}(model, {{"blocks.*": "recompute"}})."""

PlanArg: TypeAlias = (rc.Plan | Mapping[str, Any] | Sequence[tuple[str, Any]] | str | os.PathLike[str]
                      | Callable[[str, Any], Any])


def _check_root(model: Any, fn: str) -> None:
    if not isinstance(model, eqx.Module):
        raise TypeError(_MSG_ROOT.format(fn=fn, type=type(model).__name__))


def _coerce(plan: Any, walked: Any) -> rc.Plan:
    if callable(plan) and not isinstance(plan, rc.Plan | Mapping | str | os.PathLike):
        return rc.Plan.from_rules(rules_from_callable(plan, walked))
    return rc.Plan.coerce(plan)


def annotate(model: M, plan: PlanArg, *, prevent_cse: bool = True) -> M:
    """A copy of ``model`` whose modules run the way ``plan`` says when called.

    Every callable ``eqx.Module`` in the tree is wrapped in a :class:`Remat` bound to its path, so
    that it runs in its module scope (names tagged with :func:`remat_common.checkpoint_name` inside it
    read ``blocks.0.attn/attn_out``) and, where the plan puts a boundary, inside
    ``eqx.filter_checkpoint`` with the compiled policy. Paths are what Equinox users write:
    attribute names, list/tuple indices and dict keys joined by dots (``blocks.0.attn``); the root
    is ``.``; a :class:`Stacked` at ``blocks`` reads as ``blocks.0``, ``blocks.1``, ...

    The wrappers add no array leaves and keep their order, so ``eqx.tree_serialise_leaves`` files,
    ``eqx.partition``/``combine`` and optimiser states interchange leaf for leaf with the plain
    model. Annotating an annotated model replaces its plan; :class:`Remat` annotations written in
    model code come first and the plan's rules after them (later rules win).

    Args:
      model: the model, an ``eqx.Module``.
      plan: a :class:`remat_common.Plan`, a ``{pattern: annotation}`` mapping, a list of
        ``(pattern, annotation)`` pairs, a YAML/TOML/JSON plan file, or a function
        ``fn(path, module) -> annotation | None`` called for every module.
      prevent_cse: as in ``jax.checkpoint``.

    Returns:
      The annotated model (same type as ``model`` unless the root is wrapped: call it the same way).

    Raises:
      PlanError: a pattern matches no module (the nearest paths are listed), names an attribute
        that is not a module, or names a real path inside a :class:`Stacked` (write
        ``blocks.*.attn``); the plan wraps a module without ``__call__``, or annotates ``custom`` a
        module without ``__remat_custom__``; or the plan cannot be resolved.
      TypeError: ``model`` is not an ``eqx.Module``.
      CapabilityError: jax 0.11.0 with ``jax_remat3`` on (``eqx.filter_checkpoint`` fails there).

    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> mlp = eqx.nn.MLP(4, 4, 8, depth=2, key=jax.random.key(0))
    >>> fast = annotate(mlp, {"layers.[0-1]": "recompute"})
    >>> print(plan_of(fast).describe())
    layers.0: nothing_saveable
    layers.1: nothing_saveable
    >>> g0 = eqx.filter_grad(lambda m, x: jnp.sum(m(x)))(mlp, jnp.ones(4))
    >>> g1 = eqx.filter_grad(lambda m, x: jnp.sum(m(x)))(fast, jnp.ones(4))
    >>> bool(jnp.allclose(unwrap(g1).layers[0].weight, g0.layers[0].weight))
    True
    """
    _check_root(model, "annotate")
    walked = walk(model)
    full = _coerce(plan, walked)
    if walked.declared:
        full = dataclasses.replace(full, rules=tuple(walked.declared) + full.rules)
    rc.check_targets(full, walked.paths, walked.others, stacked=walked.stacked)
    compiled = rc.compile_plan(rc.resolve(full, walked.paths, stacks=walked.stacks))
    rc.check_modules(compiled, walked.describe)
    return bind(model, "", PlanRef(compiled), prevent_cse)  # type: ignore[no-any-return]


def unwrap(model: M) -> M:
    """``model`` with every :class:`Remat` replaced by the module it wraps: the plain model.

    >>> import jax, equinox as eqx
    >>> lin = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    >>> type(unwrap(annotate(lin, {".": "recompute"}))).__name__
    'Linear'
    """
    return strip(model)  # type: ignore[no-any-return]


def _bound_wrappers(model: Any) -> list[Remat[Any]]:
    leaves = jax.tree_util.tree_leaves(model, is_leaf=lambda x: isinstance(x, Remat))
    return [x for x in leaves if isinstance(x, Remat) and x.path is not None]


def plan_of(model: Any) -> rc.CompiledPlan | None:
    """The compiled plan an annotated model runs with (``None`` if it is not annotated).

    Pass it to :func:`remat_common.verify` to check what a step really keeps.
    """
    bound = _bound_wrappers(model)
    return bound[0].plan if bound else None


def module_paths(model: Any) -> tuple[str, ...]:
    """The module paths a plan is matched against, root (``""``) first, stacked layers per layer.

    >>> import jax, equinox as eqx
    >>> module_paths(eqx.nn.MLP(2, 2, 4, depth=1, key=jax.random.key(0)))
    ('', 'layers.0', 'layers.1')
    """
    _check_root(model, "module_paths")
    return tuple(dict.fromkeys(["", *walk(model).paths]))
