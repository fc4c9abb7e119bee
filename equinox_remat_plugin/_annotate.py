"""``annotate``: a plan applied to an Equinox model by module path; ``unwrap`` undoes it."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import equinox as eqx
import jax
import remat_common as rc

from remat_common.adapter import binding_of

from ._binding import PlanRef
from ._paths import Walk, bind, strip, touched_paths, walk
from ._remat import Remat

M = TypeVar("M")

_MSG_ROOT = """\
equinox_remat_plugin.{fn}: expected an eqx.Module (the model), got {type}.
Fix: pass the model object itself, e.g. {fn}(model, {{"blocks.*": "recompute"}})."""



def _check_root(model: Any, fn: str) -> None:
    if not isinstance(model, eqx.Module):
        raise TypeError(_MSG_ROOT.format(fn=fn, type=type(model).__name__))


_MSG_SCANS_ITSELF = """\
equinox_remat_plugin.annotate: pattern {pattern!r} addresses layers of {path!r}, one {cls} whose
arrays share a leading axis of {n}: a stack the model scans itself. A plan sees it as one module,
and {path!r} applies to every layer (its scan body). Fix: annotate {path!r}; for per-layer control
hold the stack in erp.Stacked and call it (self.{attr}(x)), which runs the scan in layer groups."""


def _check_self_scanned(plan: Any, walked: Walk) -> None:
    full = rc.adapter.coerce_plan(plan, walked.view())
    for rule in full.rules:
        if any(rule.matches(p) for p in walked.paths):
            continue
        segs = rule.pattern.split(".")
        for k in range(1, len(segs)):
            path = ".".join(segs[:k])
            module = walked.modules.get(path)
            if (module is None or path in walked.stacks or path in walked.stacked
                    or not re.fullmatch(r"\d+|\[\d+-\d+\]", segs[k])):
                continue
            sizes = {a.shape[0] if a.shape else 0
                     for a in jax.tree_util.tree_leaves(module)
                     if eqx.is_array(a) or isinstance(a, jax.ShapeDtypeStruct)}
            if len(sizes) == 1 and min(sizes) >= 2:
                raise rc.PlanError(_MSG_SCANS_ITSELF.format(
                    pattern=rule.pattern, path=path, cls=type(module).__name__, n=sizes.pop(),
                    attr=path.rpartition(".")[2]))


_MSG_ANNOTATED = """\
equinox_remat_plugin.annotate: this model already runs a plan given to an earlier annotate() call
({where}); annotating it again would silently drop that plan's
boundaries. Fix: erp.annotate(model, plan, replace=True) to replace it, or annotate the plain
model (erp.unwrap(model)); to keep both, annotate once with one plan holding both plans' rules."""


def _check_not_annotated(walked: Walk) -> None:
    where = sorted({rc.adapter.display(walked.real[p]) for p, m in walked.modules.items()
                    if binding_of(m) is not None}
                   | {rc.adapter.display(p) for p, w in walked.wrappers.items() if w.path is not None},
                   key=lambda p: (p.count("."), p))
    if where:
        shown = ", ".join(map(repr, where[:4])) + (f", ... ({len(where) - 4} more)"
                                                   if len(where) > 4 else "")
        raise rc.PlanError(_MSG_ANNOTATED.format(where=f"modules {shown}"))


_MSG_NESTED_LIST = """\
equinox_remat_plugin.annotate: pattern {pattern!r} nests {path!r} (nested: {spec}), but {path!r} is
a Python list of {n} modules, not a stack: nesting splits one scan over stacked layers into
checkpointed blocks, and a list is called layer by layer. Fix: hold the layers in erp.Stacked
(erp.Stacked.from_keys(make_layer, keys), whose arrays have a leading layer axis) and call it
(self.{attr}(x)); then {pattern!r}: {{remat: recompute, nested: {spec}}} applies. Without
nesting, annotate the layers of the list ('{path}.*')."""


def _check_nested_on_list(plan: Any, walked: Walk) -> None:
    """Refuses ``nested`` aimed at a Python list of layers, saying how to declare a stack."""
    full = rc.adapter.coerce_plan(plan, walked.view())
    for rule in full.rules:
        if rule.annotation.nested is None or any(rule.matches(p) for p in walked.paths):
            continue
        path = rule.pattern
        layers = [p for p in walked.paths if p.startswith(path + ".")
                  and p[len(path) + 1:].isdigit()]
        if layers:
            raise rc.PlanError(_MSG_NESTED_LIST.format(
                pattern=rule.pattern, path=path, spec=rule.annotation.nested, n=len(layers),
                attr=path.rpartition(".")[2]))


def annotate(model: M, plan: rc.PlanLike, *, prevent_cse: bool = True,
             share_alike_layers: bool = True, replace: bool = False) -> M:
    """A copy of ``model`` whose modules run the way ``plan`` says when called.

    Each module the plan names (or acts on) becomes an instance of a cached subclass of its own
    class whose ``__call__`` runs in its module scope and, where the plan puts a boundary, inside a
    filtered ``jax.checkpoint`` with the compiled policy. Every other module, the root included
    unless the plan names it (``.``) and the modules inside a named one, is the same object as
    before; names tagged with :func:`remat_common.checkpoint_name` inside any of them read
    ``blocks.0.attn/attn_out`` (the core places the running module by identity).
    Paths are what Equinox users write: attribute names, list/tuple indices and dict keys joined by
    dots (``blocks.0.attn``); the root is ``.``; a :class:`Stacked` at ``blocks`` reads as
    ``blocks.0``, ``blocks.1``, ...

    ``isinstance`` against the original classes holds; the leaves and their order are the plain
    model's, so ``eqx.tree_serialise_leaves`` files, ``eqx.partition``/``combine`` and optimiser
    states interchange leaf for leaf with the plain model. An annotated model is refused unless
    ``replace=True`` (then its plan is replaced); :class:`Remat` annotations written in model
    code come first and the plan's rules after them (later rules win).

    Args:
      model: the model, an ``eqx.Module``.
      plan: a :class:`remat_common.Plan`, a ``{pattern: annotation}`` mapping, a list of
        ``(pattern, annotation)`` pairs, a YAML/TOML/JSON plan file, or a function
        ``fn(path, module) -> annotation | None`` called for every module.
      prevent_cse: as in ``jax.checkpoint``.
      share_alike_layers: list layers the plan treats alike (a Python list or tuple of modules
        called in a loop; see :func:`remat_common.compile_plan`) run as the first layer of their
        group: one class, one boundary, one policy and the first layer's names (``layers.0/h``
        for every layer of the group), so JAX traces the layer body once per group instead of
        once per layer. The layer's non-array fields and arguments must be hashable for its trace
        to be shared (otherwise it traces as without sharing). :class:`Remat` wrappers written
        in model code run as their group's first layer too, but trace per layer. On by default
        (the build of a 96-layer model costs what hand-written ``eqx.filter_checkpoint`` does);
        ``verify`` and the report count a shared boundary's residuals once per layer it runs for
        and list those layers. ``False`` gives every layer its own boundary and names
        (``layers.7/h``), traced per layer.
      replace: annotate a model that an earlier ``annotate`` call gave a plan, replacing that
        plan. Without it such a model is refused: a second plan never silently drops the first.

    Returns:
      The annotated model (an instance of ``model``'s class; call it the same way).

    Raises:
      PlanError: a pattern matches no module (the nearest paths are listed), names an attribute
        that is not a module, or names a real path inside a :class:`Stacked` (write
        ``blocks.*.attn``); the plan wraps a module without ``__call__``, or annotates ``custom`` a
        module without ``__remat_custom__``; the plan cannot be resolved; or the model already
        runs a plan (without ``replace``).
      TypeError: ``model`` is not an ``eqx.Module``.

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
    rc.adapter.check_bool("equinox_remat_plugin.annotate", "prevent_cse", prevent_cse)
    rc.adapter.check_bool("equinox_remat_plugin.annotate", "share_alike_layers", share_alike_layers)
    rc.adapter.check_bool("equinox_remat_plugin.annotate", "replace", replace)
    if not replace:
        _check_not_annotated(walk(model))
    model = strip(model, keep_remat=True)  # replace=True: the earlier plan goes
    walked = walk(model)
    try:
        compiled = rc.adapter.plan_model(walked.view(), plan, share_alike_layers=share_alike_layers)
    except rc.PlanError:
        _check_self_scanned(plan, walked)  # a clearer error for per-layer patterns, when it applies
        _check_nested_on_list(plan, walked)
        raise
    touched = touched_paths(walked, compiled)
    ref = PlanRef(compiled, tuple(sorted(touched | set(walked.wrappers))))
    return bind(model, "", touched, ref, prevent_cse)  # type: ignore[no-any-return]


def unwrap(model: M) -> M:
    """``model`` with every :class:`Remat` replaced by the module it wraps: the plain model.

    >>> import jax, equinox as eqx
    >>> lin = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    >>> type(unwrap(annotate(lin, {".": "recompute"}))).__name__
    'Linear'
    """
    return strip(model)  # type: ignore[no-any-return]


_MSG_REPLACED = """\
equinox_remat_plugin.plan_of: module {path!r} ({ann}) was replaced after annotate (eqx.tree_at?),
so its plan entry no longer runs. Fix: annotate the model again after the swap:
erp.annotate(model, plan, replace=True)."""

_MSG_MOVED = """\
equinox_remat_plugin.plan_of: the module at {path!r} was annotated for {other!r} and moved there
after annotate (eqx.tree_at?), so it would run {other!r}'s plan entry. Fix: annotate the model
again after the change: erp.annotate(model, plan, replace=True)."""

_MSG_SEVERAL = """\
equinox_remat_plugin.plan_of: modules of this model were annotated by {n} separate annotate()
calls (at {paths}). Fix: annotate the whole model once."""


_MSG_ADDED = """\
{fn}module {path!r} ({cls}) is not in the model the plan was compiled for: it was added after
annotate (eqx.tree_at on a longer list?), so it runs outside the plan. Fix: annotate the model
again after the change, erp.annotate(model, plan, replace=True), and verify with
erp.plan_of(model)."""


def _added(walked: Walk, plan: rc.CompiledPlan) -> list[tuple[str, str]]:
    """``(path, class name)`` of the outermost modules the plan was not resolved for."""
    known = set(plan.resolution.paths)
    out: list[tuple[str, str]] = []
    for path in walked.paths:
        if path not in known and not any(rc.adapter.in_subtree(path, p) for p, _ in out):
            module = walked.modules.get(path)
            out.append((path, type(module).__name__))
    return out


def check_verified_models(plan: rc.CompiledPlan, arguments: Any) -> list[str]:
    """``verify``'s check of the Equinox models among its arguments (see
    :attr:`remat_common.adapter.Framework.check_models`): modules added after ``annotate``."""
    out: list[str] = []
    for leaf in jax.tree_util.tree_leaves(arguments, is_leaf=lambda x: isinstance(x, eqx.Module)):
        if not isinstance(leaf, eqx.Module):
            continue
        walked = walk(leaf)
        plans = [b[1].plan for b in map(binding_of, walked.modules.values()) if b is not None]
        plans += [w.plan for w in walked.wrappers.values() if w.path is not None]
        if any(p is plan for p in plans) or plan in plans:
            out += [_MSG_ADDED.format(fn="", path=rc.adapter.display(p), cls=c)
                    for p, c in _added(walked, plan)]
    return out


_MSG_NESTED_WRAPPERS = """\
equinox_remat_plugin.plan_of: the erp.Remat wrapper at {inner!r} is inside the one at {outer!r},
and no annotate() call has bound them: each runs standalone as its own jax.checkpoint, one inside
the other (what JAX keeps then differs between its versions), which no plan describes: a plan
merges a boundary inside a boundary into one policy. Fix: bind them once,
model = erp.annotate(model, {{}}) (the wrappers become the plan's rules, merged at {outer!r}), and
verify with erp.plan_of(model); or wrap only one of the two modules."""

_MSG_UNBOUND_ADDED = """\
equinox_remat_plugin.plan_of: the erp.Remat wrapper at {path!r} was put into the model after
annotate (eqx.tree_at?): no annotate() call bound it, so it runs standalone (unqualified names)
beside the plan the rest of the model runs. Fix: annotate the model again after the change,
erp.annotate(model, plan, replace=True) (the wrapper becomes one of the plan's rules)."""


def _unbound_wrappers(walked: Walk) -> list[str]:
    """The paths of the :class:`Remat` wrappers that no ``annotate`` call bound."""
    return sorted((p for p, w in walked.wrappers.items() if w.path is None), key=len)


def _nested_wrappers(walked: Walk) -> tuple[str, str] | None:
    """``(outer, inner)`` paths of an unbound wrapper that holds another wrapper, if any."""
    for outer in _unbound_wrappers(walked):
        held = [w for w in jax.tree_util.tree_leaves(walked.wrappers[outer].module,
                                                     is_leaf=lambda x: isinstance(x, Remat))
                if isinstance(w, Remat)]
        if held:
            inner = next((p for p in walked.wrappers if p != outer and rc.adapter.in_subtree(p, outer)),
                         outer)
            return outer, inner
    return None


def _declared_plan(model: Any, walked: Walk) -> tuple[rc.CompiledPlan, Any] | None:
    """The plan a model carries whose annotations are all :class:`Remat` wrappers written in model
    code (no ``annotate`` call bound any part of it), and the model with the wrappers bound to it:
    what ``annotate(model, {})`` gives, each wrapper keeping its ``prevent_cse``. ``None`` for a
    model with no such wrapper or with a bound part. A model that is itself a wrapper carries its
    own one-boundary plan (its path is the root: nothing to qualify). Wrappers nested in each other
    are refused (see ``_MSG_NESTED_WRAPPERS``)."""
    if not _unbound_wrappers(walked) or any(w.path is not None for w in walked.wrappers.values()) \
            or any(binding_of(m) is not None for m in walked.modules.values()):
        return None
    nested = _nested_wrappers(walked)
    if nested is not None:
        outer, inner = nested
        raise rc.PlanError(_MSG_NESTED_WRAPPERS.format(outer=rc.adapter.display(outer),
                                                        inner=rc.adapter.display(inner)))
    if isinstance(model, Remat):
        return model.plan, model
    compiled = rc.adapter.plan_model(walked.view(), {}, share_alike_layers=True)
    touched = touched_paths(walked, compiled)
    ref = PlanRef(compiled, tuple(sorted(touched | set(walked.wrappers))))
    return compiled, bind(model, "", touched, ref, True, own_prevent_cse=True)


def bind_declared_models(arguments: Any) -> Any:
    """``saved_residuals``' (and so ``verify``'s) binding of its Equinox model arguments (see
    :attr:`remat_common.adapter.Framework.bind_models`): a model whose annotations are all
    :class:`Remat` wrappers written in model code is traced as the plan :func:`plan_of` returns for
    it (each wrapper at its path, names ``blocks.1/__input__``). Whatever else, or a model that
    ``plan_of`` refuses, is traced as it is."""
    def is_model(x: Any) -> bool:
        return isinstance(x, eqx.Module)

    leaves, treedef = jax.tree_util.tree_flatten(arguments, is_leaf=is_model)
    changed = False
    for i, leaf in enumerate(leaves):
        if not is_model(leaf) or isinstance(leaf, Remat) or not any(
                isinstance(w, Remat) and w.path is None
                for w in jax.tree_util.tree_leaves(leaf, is_leaf=lambda x: isinstance(x, Remat))):
            continue
        try:
            got = _declared_plan(leaf, walk(leaf))
        except rc.PlanError:
            continue  # (plan_of says why; the trace shows the wrappers as they run)
        if got is not None:
            leaves[i] = got[1]
            changed = True
    return jax.tree_util.tree_unflatten(treedef, leaves) if changed else arguments


def plan_of(model: Any) -> rc.CompiledPlan | None:
    """The compiled plan an annotated model runs with (``None`` if no module runs one).

    Pass it to :func:`remat_common.verify` to check what a step really keeps. It is checked
    against the model: a module the plan acts on that was swapped out afterwards (``eqx.tree_at``),
    a module added afterwards, or parts annotated by separate :func:`annotate` calls raise
    :class:`~remat_common.PlanError`.

    A model whose annotations are all :class:`Remat` wrappers written in model code carries the
    plan those wrappers declare, with path-qualified names: what ``annotate(model, {})`` would
    compile (``blocks.1/__input__``, one boundary per wrapper at its path). The model runs the
    wrappers standalone, each with its own one-boundary policy and unqualified names
    (``__input__``), which keeps what that plan's boundary at its path keeps;
    :func:`remat_common.verify` and :func:`remat_common.saved_residuals` trace such a model as
    that plan, so their residuals carry the qualified names. Wrappers nested in each other run
    as nested checkpoints, which no plan describes: refused, with the fix.

    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> keys = jax.random.split(jax.random.key(0), 3)
    >>> layers = [eqx.nn.Linear(4, 4, key=k) for k in keys]
    >>> mlp = eqx.nn.Sequential([Remat(layers[0], "offload"), layers[1], Remat(layers[2])])
    >>> print(plan_of(mlp).describe())  # doctest: +ELLIPSIS
    layers.0: ... offload=['layers.0/__input__'] device->pinned_host
    layers.2: nothing_saveable
    """
    walked = walk(model)
    found: dict[str, PlanRef] = {}
    moved: dict[str, str] = {}
    for p, m in walked.modules.items():
        b = binding_of(m)
        if b is not None:
            if b[0] != b[1].plan.canonical_path(walked.real[p]):  # moved (or shared: canonical)
                moved[walked.real[p]] = b[0]
            else:
                found.setdefault(walked.real[p], b[1].ref)
    for p, w in walked.wrappers.items():
        if w.path is not None:
            found.setdefault(p, w._plan)
    refs = list(dict.fromkeys(found.values()))
    if not refs:
        declared = _declared_plan(model, walked)
        return None if declared is None else declared[0]
    if len(refs) > 1:
        where = sorted({rc.adapter.display(min((p for p, r in found.items() if r == ref), key=len))
                        for ref in refs})
        raise rc.PlanError(_MSG_SEVERAL.format(n=len(refs), paths=", ".join(map(repr, where))))
    if moved:
        p, q = next(iter(moved.items()))
        raise rc.PlanError(_MSG_MOVED.format(path=rc.adapter.display(p), other=rc.adapter.display(q)))
    for p in _unbound_wrappers(walked)[:1]:
        raise rc.PlanError(_MSG_UNBOUND_ADDED.format(path=rc.adapter.display(p)))
    ref = refs[0]
    for p, c in _added(walked, ref.plan)[:1]:
        raise rc.PlanError(_MSG_ADDED.format(fn="equinox_remat_plugin.plan_of: ",
                                             path=rc.adapter.display(p), cls=c))
    missing = [p for p in ref.touched if p not in found]
    if missing:
        res = ref.plan.resolution
        p = missing[0]
        raise rc.PlanError(_MSG_REPLACED.format(path=rc.adapter.display(p), ann=res.annotation(
            next((v for v, r in walked.real.items() if r == p), p))))
    return ref.plan


compiled_plan = plan_of


def module_paths(model: Any) -> tuple[str, ...]:
    """The module paths a plan is matched against, root (``""``) first, stacked layers per layer.

    >>> import jax, equinox as eqx
    >>> module_paths(eqx.nn.MLP(2, 2, 4, depth=1, key=jax.random.key(0)))
    ('', 'layers.0', 'layers.1')
    """
    _check_root(model, "module_paths")
    return tuple(dict.fromkeys(["", *walk(model).paths]))
