"""Rules that point at something a remat boundary cannot wrap, found before resolution.

Adapters list what they see in a model; these checks turn a pattern aimed at a weight, at a real
path inside stacked layers, at a module without ``__call__`` or at a ``custom`` module without
rules into one clear error, the same for every framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ._compile import CompiledPlan
from ._errors import PlanError, type_error
from ._paths import CUSTOM_METHOD, display, join
from ._pattern import PathIndex, compiled
from ._plan import Plan
from ._resolve import str_sequence

_MSG_NOT_MODULE = """\
{source}pattern {pattern!r} (annotation {ann}) names {what}, not a module.
A remat boundary sits around a module call, so only modules can be annotated.
Fix: annotate the module that holds it: {fix}."""

_MSG_NOT_MODULE_CALLABLE = """\
{source}pattern {pattern!r} (annotation {ann}) names {what}, not a module.
A remat boundary sits around a module call, so only modules can be annotated.
Fix: annotate the module whose __call__ runs it: {fix}; or wrap it in a module of its own
(eqx.nn.Lambda(fn) in Equinox, a small nnx.Module in Flax) to annotate it alone."""

_MSG_IN_STACK = """\
{source}pattern {pattern!r} (annotation {ann}) names {paths}, inside the stacked layers {stack!r}.
Stacked layers are addressed per layer. Fix: write {fix!r} (every layer) or a range such as
{example!r}."""

_MSG_NO_CALL = """\
module {path!r} ({cls}) is annotated {ann} but has no __call__: a remat boundary wraps a module
call, and this module is never called as a whole. Fix: annotate the modules it holds ({fix!r})."""

_MSG_NO_CUSTOM = """\
module {path!r}{cls} is annotated 'custom' but {missing}.
A 'custom' module computes its output through remat_common.rules rule sets in its {custom}(self, ...)
method, which has the same signature as its __call__.
Fix: define it on the module's class, or annotate {path!r} with another value ('recompute', 'offload',
...)."""


def no_custom_error(path: str, cls: str | None = None) -> PlanError:
    """The error for a module annotated ``custom`` that has no :data:`CUSTOM_METHOD` (``cls``: its
    class name, when known). Raised at annotation time by :func:`check_modules`, at call time by
    ``call_module`` for a plain function."""
    missing = (f"{cls} defines no {CUSTOM_METHOD}(self, ...) with its\ncustom remat rules" if cls
               else "declares no custom remat rules")
    return PlanError(_MSG_NO_CUSTOM.format(path=display(path), cls=f" ({cls})" if cls else "",
                                           missing=missing, custom=CUSTOM_METHOD))


def check_targets(plan: Plan, module_paths: Iterable[str], others: Mapping[str, str], *,
                  stacked: Mapping[str, tuple[str, int]] | None = None,
                  describe: Callable[[str], tuple[str, bool, bool] | None] | None = None) -> None:
    """Raises :class:`PlanError` for a rule that matches no module path but names something else.

    Rules that match nothing at all are left to :func:`resolve`, which lists the nearest module
    paths. In lenient mode nothing is raised here (:func:`resolve` warns).

    Args:
      plan: the plan.
      module_paths: every module path, as passed to :func:`resolve` (stacked layers per layer).
      others: non-module attribute paths (``blocks.0.attn.weight``), each with what it is
        (``'Array float32[16, 16]'``).
      stacked: real module paths inside stacked layers (``blocks.attn``, as the attribute path
        reads), each with its stack's path and number of layers (``('blocks', 4)``).
      describe: ``path -> (class name, has __call__, has custom rules)`` (see
        :func:`check_modules`): the fix names the nearest ancestor module that can be called, not
        a container (an ``nnx.List``) that holds the value.

    >>> try:
    ...     check_targets(Plan.from_mapping({"mlp.weight": "recompute"}), ["", "mlp"],
    ...                   {"mlp.weight": "jax.Array float32[4, 4]"})
    ... except PlanError as e:
    ...     print(e)
    pattern 'mlp.weight' (annotation recompute) names 'mlp.weight' (a jax.Array float32[4, 4]), not a module.
    A remat boundary sits around a module call, so only modules can be annotated.
    Fix: annotate the module that holds it: 'mlp'.
    """
    if not isinstance(plan, Plan):
        raise type_error("check_targets", "plan", plan, "a remat_common.Plan",
                         "build one with Plan.coerce(...).")
    if not plan.strict:
        return
    modules = PathIndex(str_sequence("check_targets", "module_paths", module_paths))
    stacked = stacked or {}
    stacked_index: PathIndex | None = None
    others_index: PathIndex | None = None
    for rule in plan.rules:
        pat = compiled(rule.pattern)
        if modules.matching(pat):
            continue
        src = f"{rule.source}: " if rule.source else ""
        stacked_index = stacked_index or PathIndex(stacked)
        inside = sorted(stacked_index.matching(pat))
        if inside:
            stack, n = stacked[inside[0]]
            rest = inside[0][len(stack):].lstrip(".")
            raise PlanError(_MSG_IN_STACK.format(
                source=src, pattern=rule.pattern, ann=rule.annotation,
                paths=", ".join(repr(p) for p in inside[:3]), stack=stack,
                fix=join(stack, "*", rest), example=join(stack, f"[0-{max(n - 2, 0)}]", rest)))
        others_index = others_index or PathIndex(others)
        hit = sorted(others_index.matching(pat))
        if hit:
            holder = hit[0].rpartition(".")[0]
            while holder and not (modules.matching(compiled(holder)) and (
                    describe is None or (describe(holder) or ("", True, False))[1])):
                holder = holder.rpartition(".")[0]  # a list, or a module without __call__
            what = others[hit[0]]
            msg = _MSG_NOT_MODULE if "Array" in what or "[" in what else _MSG_NOT_MODULE_CALLABLE
            raise PlanError(msg.format(
                source=src, pattern=rule.pattern, ann=rule.annotation,
                what=f"{hit[0]!r} (a {what})",
                fix=repr(holder) if holder else "'.' (the root)"))


def check_modules(plan: CompiledPlan, describe: Callable[[str], tuple[str, bool, bool] | None]) -> None:
    """Raises :class:`PlanError` when the plan wraps a module that cannot be wrapped.

    A boundary, a tagged input or ``custom`` needs the module's ``__call__``; ``custom`` also needs
    the module's rules (``__remat_custom__``).

    Args:
      plan: the compiled plan.
      describe: for a module path, ``(class name, has __call__, has __remat_custom__)``, or
        ``None`` when the path is not a module the adapter can describe.

    >>> from remat_common import Plan, compile_plan, resolve
    >>> plan = compile_plan(resolve(Plan.from_mapping({"mlp": "custom"}), ["mlp"]))
    >>> try:
    ...     check_modules(plan, lambda path: ("MLP", True, False))
    ... except PlanError as e:
    ...     print(str(e).splitlines()[0])
    module 'mlp' (MLP) is annotated 'custom' but MLP defines no __remat_custom__(self, ...) with its
    """
    res = plan.resolution
    wrapped = {b.path for b in res.boundaries} | {p for p, _ in res.tagged_inputs}
    custom = {p for p, a in res.annotations if a.kind == "custom"}
    for p in res.paths:
        if p not in wrapped and p not in custom:
            continue
        info = describe(p)
        if info is None:
            continue
        cls, has_call, has_custom = info
        if not has_call:
            raise PlanError(_MSG_NO_CALL.format(path=display(p), cls=cls, ann=res.annotation(p),
                                                fix=f"{p}.*" if p else "*"))
        if p in custom and not has_custom:
            raise no_custom_error(p, cls)
