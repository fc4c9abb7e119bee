"""All runtime state of the core: what is open around the code being traced now.

Every piece of state is a :mod:`contextvars` variable, set only by a context manager here (so it is
restored on exit, per thread and per task) and read only through the typed accessors here. No
other core file declares a context variable.

=================  ===========================================  ==================================
state              set by                                       read by
=================  ===========================================  ==================================
module path        :func:`module_scope` (adapters, per call)    :func:`current_module_path`
stack rewrites     :func:`layer_scope` (scanned layer groups)   :func:`effective_path`
tag collectors     :func:`collect_tags`                         :func:`tag_collectors`
open boundary      :func:`boundary_scope` (``wrap_call``)       :func:`open_boundary`
left-out boundary  :func:`left_out_scope` (``call_module``)     :func:`left_out_boundary`
rule-run records   :func:`collect_rule_runs`                    :func:`record_rule_run`
custom-rule impl   :func:`impl_scope` (``custom_impl``)         :func:`current_impl`
forced impl        :func:`forced_scope` (fallback re-traces)    :func:`forced_impl`
active plan        :func:`plan_scope` (``call_module``)         :func:`active_plan`
deferred checks    :func:`defer_name_checks` (``verify``)       :func:`name_checks_deferred`
rule-set names     :func:`collect_rule_names` (``wrap_call``)   :func:`promise_rule_names`
module runs        :func:`collect_module_runs` (``verify``)     :func:`record_module_run`
module calls       :func:`module_calls_scope` (measurement)     :func:`module_calls`
=================  ===========================================  ==================================
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

import jax

from ._compile import CompiledBoundary, CompiledPlan
from ._records import Impl, ModuleRun, RuleRun, Tag
from ._framework import placed_module

V = TypeVar("V")

_PATH: contextvars.ContextVar[str | None] = contextvars.ContextVar("remat_module_path", default=None)
_REWRITE: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "remat_path_rewrite", default=())
_TAGS: contextvars.ContextVar[tuple[list[Tag], ...]] = contextvars.ContextVar(
    "remat_tag_collectors", default=())
_BOUNDARY: contextvars.ContextVar[CompiledBoundary | None] = contextvars.ContextVar(
    "remat_boundary", default=None)
_LEFT_OUT: contextvars.ContextVar[CompiledBoundary | None] = contextvars.ContextVar(
    "remat_left_out_boundary", default=None)
_RUNS: contextvars.ContextVar[tuple[list[RuleRun], ...]] = contextvars.ContextVar(
    "remat_rule_runs", default=())
_IMPL: contextvars.ContextVar[str] = contextvars.ContextVar("remat_custom_impl", default="auto")
_FORCED: contextvars.ContextVar[tuple[Impl, str] | None] = contextvars.ContextVar(
    "remat_custom_forced", default=None)
_PLAN: contextvars.ContextVar[CompiledPlan | None] = contextvars.ContextVar(
    "remat_custom_plan", default=None)
_DEFER: contextvars.ContextVar[bool] = contextvars.ContextVar("remat_defer_name_checks", default=False)
_RULE_NAMES: contextvars.ContextVar[tuple[set[str], ...]] = contextvars.ContextVar(
    "remat_rule_names", default=())
_MODULE_RUNS: contextvars.ContextVar[tuple[list[ModuleRun], ...]] = contextvars.ContextVar(
    "remat_module_runs", default=())
_CALLS: contextvars.ContextVar[object | None] = contextvars.ContextVar("remat_module_calls",
                                                                      default=None)


class _set(Generic[V]):  # noqa: N801 - used like a function
    """``var`` set to ``value`` inside the block (a class, not a generator: adapters open one per
    module call, and a generator-based context manager costs several Python calls more)."""

    __slots__ = ("_token", "_value", "_var")

    def __init__(self, var: contextvars.ContextVar[V], value: V) -> None:
        self._var, self._value = var, value

    def __enter__(self) -> V:
        self._token = self._var.set(self._value)
        return self._value

    def __exit__(self, *exc: object) -> None:
        self._var.reset(self._token)


# -- module paths ----------------------------------------------------------------------------------

def running_module() -> tuple[str | None, bool]:
    """``(path, exact)`` of the module running now: the open scope's path, refined by the core's
    lookup of the running module (``_framework.placed_module``: modules inside an annotated one keep
    their class, so they open no scope of their own); ``(None, True)`` outside any module."""
    path = _PATH.get()
    if path is None:
        return None, True
    found = placed_module()
    if found is not None:
        return effective_path(found[0]), found[1]
    return path, True


def current_module_path() -> str | None:
    """The dotted path of the module running now (set by the adapters), or None outside any."""
    return running_module()[0]


def effective_path(path: str) -> str:
    """``path`` as seen inside the scan body of a layer group (see :func:`layer_scope`).

    Stacked layers are one module at ``stack`` whose children are ``stack.attn`` ...; inside the
    scan body of the group starting at layer ``k`` they run as ``stack.k.attn``, the path the plan
    was resolved for.
    """
    for src, dst in reversed(_REWRITE.get()):
        if path == dst or path.startswith(dst + "."):
            return path
        if path == src:
            return dst
        if path.startswith(src + "."):
            return dst + path[len(src):]
    return path


@contextlib.contextmanager
def layer_scope(stack_path: str, layer_path: str) -> Iterator[str]:
    """Inside the block, module paths under ``stack_path`` read as under ``layer_path``."""
    with _set(_REWRITE, _REWRITE.get() + ((stack_path, layer_path),)), module_scope(layer_path):
        yield layer_path


@contextlib.contextmanager
def module_scope(path: str) -> Iterator[str]:
    """Sets the module path that :func:`checkpoint_name` qualifies names with.

    The path is rewritten by an enclosing :func:`layer_scope`, if any. The block also runs in a
    ``jax.named_scope`` of that path (not for the root), so every operation traced in it carries
    the module path in its HLO ``op_name`` metadata (``jvp(layers.0.mlp)/dot_general``): what the
    peak breakdown attributes compiled buffers by, and what profilers show.
    """
    eff = effective_path(path)
    scope = jax.named_scope(eff) if eff else contextlib.nullcontext()
    calls = _CALLS.get()
    if calls is not None:  # a measurement records the module scopes its trace opened
        calls.scoped.add(eff)  # type: ignore[attr-defined]
    with _set(_PATH, eff), scope:
        yield eff


# -- records ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def collect_tags() -> Iterator[list[Tag]]:
    """Records every :func:`checkpoint_name` call traced inside the block."""
    out: list[Tag] = []
    with _set(_TAGS, _TAGS.get() + (out,)):
        yield out


def tag_collectors() -> tuple[list[Tag], ...]:
    """The lists that :func:`collect_tags` blocks open now are collecting into."""
    return _TAGS.get()


@contextlib.contextmanager
def collect_rule_runs() -> Iterator[list[RuleRun]]:
    """Records every rule-set application traced inside the block (see :class:`RuleRun`).

    >>> import jax, jax.numpy as jnp
    >>> from remat_common.rules import collect_rule_runs, rms_norm_rules
    >>> norm = rms_norm_rules()
    >>> with collect_rule_runs() as runs:
    ...     _ = jax.jit(jax.grad(lambda x: jnp.sum(norm(x, jnp.ones(4)))))(jnp.ones((2, 4)))
    >>> runs[-1].rule, runs[-1].impl in ("custom_remat", "custom_vjp")
    ('rms_norm', True)
    """
    out: list[RuleRun] = []
    with _set(_RUNS, _RUNS.get() + (out,)):
        yield out


def record_rule_run(run: RuleRun) -> None:
    """Appends ``run`` to every open :func:`collect_rule_runs` block."""
    for out in _RUNS.get():
        out.append(run)


# -- boundaries, plans and custom-rule paths -------------------------------------------------------

@contextlib.contextmanager
def boundary_scope(boundary: CompiledBoundary | None) -> Iterator[CompiledBoundary | None]:
    """Marks the block as running inside ``boundary`` (the innermost plan boundary)."""
    with _set(_BOUNDARY, boundary):
        yield boundary


def open_boundary() -> CompiledBoundary | None:
    """The innermost plan boundary open around this call (set by the core's ``wrap_call``)."""
    return _BOUNDARY.get()


@contextlib.contextmanager
def left_out_scope(boundary: CompiledBoundary) -> Iterator[CompiledBoundary]:
    """Marks the block as a ``custom`` module's call whose own boundary was left out (its rule
    sets run the portable path, which a remat3 checkpoint would defeat): the rule sets still keep,
    name and offload what that boundary would have."""
    with _set(_LEFT_OUT, boundary):
        yield boundary


def left_out_boundary() -> CompiledBoundary | None:
    """The boundary :func:`left_out_scope` marks, or None."""
    return _LEFT_OUT.get()


def plan_scope(plan: CompiledPlan | None) -> contextlib.AbstractContextManager[CompiledPlan | None]:
    """Inside the block, rule sets know the plan they run under (for its strict/lenient mode)."""
    return _set(_PLAN, plan)


def active_plan() -> CompiledPlan | None:
    """The compiled plan of the module call being traced, or None."""
    return _PLAN.get()


@contextlib.contextmanager
def impl_scope(impl: str) -> Iterator[str]:
    """Sets the custom-rule implementation (validated by ``custom_impl``) for the block."""
    with _set(_IMPL, impl):
        yield impl


def current_impl() -> str:
    """The custom-rule implementation set by ``custom_impl`` (``auto`` unless changed)."""
    return _IMPL.get()


@contextlib.contextmanager
def forced_scope(impl: Impl, reason: str) -> Iterator[tuple[Impl, str]]:
    """Every rule set in the block runs ``impl`` (a re-trace after JAX rejected a rule)."""
    with _set(_FORCED, (impl, reason)):
        yield impl, reason


def forced_impl() -> tuple[Impl, str] | None:
    """The implementation a fallback re-trace forces, with why, or None."""
    return _FORCED.get()


@contextlib.contextmanager
def defer_name_checks() -> Iterator[bool]:
    """Inside the block, boundaries do not raise or warn about names no tag produces: the caller
    (``verify``, ``measure``) reports them itself."""
    with _set(_DEFER, True):
        yield True


def name_checks_deferred() -> bool:
    """Whether an enclosing :func:`defer_name_checks` block reports unproduced names itself."""
    return _DEFER.get()


@contextlib.contextmanager
def collect_rule_names() -> Iterator[set[str]]:
    """Collects the qualified residual names of every rule set applied inside the block: a rule
    set tags its residuals only when its forward rule runs (during AD, after the boundary's body
    has been traced), so a boundary counts them as produced from here."""
    out: set[str] = set()
    with _set(_RULE_NAMES, _RULE_NAMES.get() + (out,)):
        yield out


def promise_rule_names(names: Iterable[str]) -> None:
    """Adds ``names`` to every open :func:`collect_rule_names` block (called by rule sets)."""
    collectors = _RULE_NAMES.get()
    if collectors:
        names = tuple(names)
        for out in collectors:
            out.update(names)


@contextlib.contextmanager
def collect_module_runs() -> Iterator[list[ModuleRun]]:
    """Records every module call that ``call_module`` runs under a plan, and every boundary
    ``wrap_call`` enters, inside the block: what ``verify`` compares with the plan it is given."""
    out: list[ModuleRun] = []
    with _set(_MODULE_RUNS, _MODULE_RUNS.get() + (out,)):
        yield out


def module_runs_collected() -> bool:
    """Whether a :func:`collect_module_runs` block is open (a caller builds its record only then)."""
    return bool(_MODULE_RUNS.get())


def record_module_run(run: ModuleRun) -> None:
    """Appends ``run`` to every open :func:`collect_module_runs` block."""
    for out in _MODULE_RUNS.get():
        out.append(run)


@contextlib.contextmanager
def module_calls_scope(calls: object) -> Iterator[object]:
    """Marks the block as traced for a measurement that records module calls (``calls``: a
    :class:`remat_common._module_calls.ModuleCalls`)."""
    with _set(_CALLS, calls):
        yield calls


def module_calls() -> object | None:
    """The module-call record of the enclosing :func:`module_calls_scope`, or None."""
    return _CALLS.get()
