"""Running a function inside a compiled boundary; the plain-JAX ``checkpoint`` entry point."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, overload

import jax
import numpy as np

from . import _custom
from ._annotation import parse_annotation
from ._capabilities import parse_version
from ._compile import CompiledBoundary, CompiledPlan, compile_plan
from ._errors import CapabilityError, PlanError, sorted_list
from ._plan import ROOT_PATTERN, Plan, Rule
from ._resolve import resolve
from ._scope import boundary_names, effective_path, module_scope, tag

F = TypeVar("F", bound=Callable[..., Any])


class CheckpointImpl(Protocol):
    """``jax.checkpoint``-shaped: what an adapter passes to build its boundary
    (``nnx.remat``, ``eqx.filter_checkpoint`` or ``jax.checkpoint`` itself)."""

    def __call__(self, fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                 static_argnums: tuple[int, ...]) -> Callable[..., Any]: ...


_MSG_NO_CUSTOM = """\
module {path!r} is annotated 'custom' but declares no custom remat rules.
A module opts in by defining ``__remat_custom__(self, *args, **kwargs)``, with the same signature as
its ``__call__``, that computes its output through a remat_common rule set.
Fix: define it on the module's class, or annotate this path with another value ('recompute', ...)."""


_MSG_VMAP_REMAT3 = """\
module {path!r}: this remat boundary keeps values by name ({names}) and runs under jax.vmap
with jax_remat3 on. jax {version} then silently ignores name-based policies: every named value
would be recomputed and every offload dropped (measured; per-example gradients, vmap(grad(...)),
are not affected).
Fix: differentiate inside the vmap (jax.vmap(jax.grad(loss))), or turn jax_remat3 off
(jax.config.update('jax_remat3', False)), or annotate this module 'recompute' or 'dots'."""


def _innermost_trace_is_vmap() -> bool:
    """True when the trace that will process the next primitive is a vmap (batching) trace.

    That is vmap *inside* differentiation (``grad(vmap(f))``), where remat3 drops name policies;
    ``vmap(grad(f))`` differentiates innermost and is fine.
    """
    try:
        from jax._src import core
        from jax._src.interpreters.batching import BatchTrace

        return isinstance(core.trace_ctx.trace, BatchTrace)
    except (ImportError, AttributeError):  # pragma: no cover - depends on the installed JAX
        return False


def remat3_drops_names_under_vmap() -> bool:
    """jax 0.11.x with remat3 on ignores name-based policies under vmap (measured on 0.11.2;
    0.12 honours them)."""
    return bool(jax.config.jax_remat3) and parse_version(jax.__version__) < (0, 12)


def check_vmap(boundary: CompiledBoundary) -> None:
    """Refuses a name-based boundary traced under vmap where JAX would ignore its policy."""
    names = boundary.spec.save | boundary.spec.offload
    if names and remat3_drops_names_under_vmap() and _innermost_trace_is_vmap():
        raise CapabilityError(_MSG_VMAP_REMAT3.format(
            path=boundary.path, names=sorted_list(names), version=jax.__version__))


def _jax_checkpoint(fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                    static_argnums: tuple[int, ...]) -> Callable[..., Any]:
    return jax.checkpoint(fun, policy=policy, prevent_cse=prevent_cse, static_argnums=static_argnums)


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def tag_inputs(args: Sequence[Any], name: str, static_argnums: Sequence[int] = ()) -> tuple[Any, ...]:
    """Tags every floating-point array leaf of the non-static positional ``args`` with ``name``.

    A value passed several times (self-attention's query, key and value) is tagged once, so a
    plan that offloads the inputs moves it to host once.
    """
    static = {i % len(args) for i in static_argnums} if args else set()
    tagged: dict[int, Any] = {}  # id -> tagged value; the args keep every leaf alive meanwhile

    def one(leaf: Any) -> Any:
        # Only floating-point activations are tagged (and so offloaded): integer, bool and typed
        # PRNG key inputs (positions, masks, token ids, dropout keys) stay on device.
        if not _is_array(leaf) or not jax.dtypes.issubdtype(leaf.dtype, np.inexact):
            return leaf
        if id(leaf) not in tagged:
            tagged[id(leaf)] = tag(leaf, name)
        return tagged[id(leaf)]

    return tuple(
        a if i in static else jax.tree_util.tree_map(one, a) for i, a in enumerate(args)
    )


def wrap_call(
    fun: F,
    *,
    path: str | None = None,
    boundary: CompiledBoundary | None = None,
    input_tag: str | None = None,
    prevent_cse: bool = True,
    static_argnums: int | Sequence[int] = (),
    checkpoint_impl: CheckpointImpl = _jax_checkpoint,
) -> F:
    """``fun`` run in module scope ``path``, inputs tagged, inside ``boundary`` (when given).

    This is the one place where a boundary meets a function; the adapters call it with their own
    ``checkpoint_impl``.
    """
    argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    @functools.wraps(fun)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        ctx = module_scope(path) if path is not None else contextlib.nullcontext()
        names = boundary_names(boundary) if boundary is not None else contextlib.nullcontext()
        with ctx, names:
            if input_tag is not None:
                args = tag_inputs(args, input_tag, argnums)
            return fun(*args, **kwargs)

    if boundary is None:
        return scoped  # type: ignore[return-value]
    wrapped = checkpoint_impl(scoped, policy=boundary.policy, prevent_cse=prevent_cse,
                              static_argnums=argnums)

    @functools.wraps(fun)
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_vmap(boundary)
        return wrapped(*args, **kwargs)

    return checked  # type: ignore[return-value]


def call_module(
    plan: CompiledPlan,
    path: str,
    fun: Callable[..., Any],
    *args: Any,
    checkpoint_impl: CheckpointImpl = _jax_checkpoint,
    prevent_cse: bool = True,
    custom: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Runs one module call the way ``plan`` says: what every adapter does for every module.

    The module path is resolved through any enclosing :func:`layer_scope` (stacked layers), then
    the call runs in that module scope (so :func:`checkpoint_name` qualifies names), with its inputs
    tagged when the plan offloads them, inside the module's boundary when it has one.

    Args:
      custom: the module's custom-rule implementation (same signature as ``fun``), which runs
        instead of ``fun`` when the plan annotates this path ``"custom"``. Adapters pass the
        module's ``__remat_custom__`` method when it has one.
    """
    eff = effective_path(path)
    is_custom = plan.resolution.annotation(eff).kind == "custom"
    if is_custom:
        if custom is None:
            raise PlanError(_MSG_NO_CUSTOM.format(path=eff))
        fun = custom

    def call() -> Any:
        boundary = plan.boundary(eff)
        if is_custom and boundary is not None and _custom.skip_custom_boundary():
            boundary = None  # rule sets run the portable path, which a remat3 checkpoint defeats
        return wrap_call(
            fun, path=eff, boundary=boundary, input_tag=plan.input_tag(eff),
            prevent_cse=prevent_cse, checkpoint_impl=checkpoint_impl,
        )(*args, **kwargs)

    with _custom.plan_context(plan):
        return _custom.with_fallbacks(call)


def compile_annotation(
    annotation: Any, *, path: str | None = None, offload_src: str | None = None,
    offload_dst: str | None = None,
) -> CompiledPlan:
    """Compiles a single annotation as a one-module plan rooted at ``path``."""
    ann = parse_annotation(annotation, path=path)
    defaults = {k: v for k, v in (("offload_src", offload_src), ("offload_dst", offload_dst)) if v}
    pattern = path if path else ROOT_PATTERN
    plan = Plan(rules=(Rule(pattern, ann),)).with_defaults(**defaults)
    return compile_plan(resolve(plan, [path] if path else []))


_RECOMPUTE: Any = type("_Default", (), {"__repr__": lambda self: "'recompute'"})()


@overload
def checkpoint(fun: F, annotation: Any = ..., *, prevent_cse: bool = ...,
               static_argnums: int | Sequence[int] = ..., offload_src: str | None = ...,
               offload_dst: str | None = ..., path: str | None = ...) -> F: ...
@overload
def checkpoint(fun: None = ..., annotation: Any = ..., *, prevent_cse: bool = ...,
               static_argnums: int | Sequence[int] = ..., offload_src: str | None = ...,
               offload_dst: str | None = ..., path: str | None = ...) -> Callable[[F], F]: ...
def checkpoint(
    fun: Any = None,
    annotation: Any = _RECOMPUTE,
    *,
    prevent_cse: bool = True,
    static_argnums: int | Sequence[int] = (),
    offload_src: str | None = None,
    offload_dst: str | None = None,
    path: str | None = None,
) -> Any:
    """``jax.checkpoint`` that takes an annotation instead of a policy.

    ``"recompute"`` keeps only the inputs; ``"offload"`` moves the function's array inputs to host
    memory (``offload_dst``) and recomputes the rest; ``{"save": [...], "offload": [...]}`` keeps the
    values tagged with those names (:func:`checkpoint_name`) on device or host; ``"dots"`` /
    ``"dots_no_batch"`` keep matmul outputs; ``"save"`` and ``"inherit"`` add no boundary. The policy
    is one of the name-based classes that JAX honours with ``jax_remat3`` off and on. See
    https://docs.jax.dev/en/latest/gradient-checkpointing.html for what rematerialization does.

    Args:
      fun: the function. Omit it (or pass the annotation first) to use ``checkpoint`` as a decorator.
      annotation: an annotation value (see :func:`parse_annotation`).
      prevent_cse, static_argnums: as in ``jax.checkpoint``.
      offload_src, offload_dst: memory kinds for offloading (defaults ``device``, ``pinned_host``).
      path: a module path to qualify names with (names are then looked up as ``path/name``).

    Returns:
      The wrapped function.

    >>> import jax, jax.numpy as jnp
    >>> from remat_common import checkpoint, checkpoint_name
    >>> @checkpoint({"save": ["h"]})
    ... def layer(w, x):
    ...     return jnp.sum(jnp.tanh(checkpoint_name(x @ w, "h")))
    >>> float(jax.grad(layer)(jnp.eye(2), jnp.ones(2))[0, 0]) > 0
    True
    """
    if fun is not None and not callable(fun):  # @checkpoint("offload")
        if annotation is not _RECOMPUTE:
            raise TypeError(
                f"remat_common.checkpoint: got annotation {fun!r} as the first argument and "
                f"annotation={annotation!r}. Fix: pass the annotation once."
            )
        fun, annotation = None, fun
    if annotation is _RECOMPUTE:
        annotation = "recompute"
    compiled = compile_annotation(annotation, path=path, offload_src=offload_src,
                                  offload_dst=offload_dst)
    key = path or ""

    def decorate(f: F) -> F:
        return wrap_call(f, path=path, boundary=compiled.boundary(key),
                         input_tag=compiled.input_tag(key), prevent_cse=prevent_cse,
                         static_argnums=static_argnums)

    return decorate if fun is None else decorate(fun)

