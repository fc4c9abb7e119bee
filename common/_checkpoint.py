"""Running a function inside a compiled boundary; the plain-JAX ``checkpoint`` entry point."""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar, overload

import jax
import numpy as np

from . import _custom
from ._annotation import Annotation, parse_annotation
from ._arrays import is_array, is_float
from ._compile import CompiledBoundary, CompiledPlan, compile_plan
from ._context import (
    boundary_scope,
    collect_rule_names,
    collect_tags,
    effective_path,
    layer_scope,
    left_out_scope,
    module_runs_collected,
    module_scope,
    plan_scope,
    record_module_run,
)
from ._errors import PlanError, PlanTypeError, check_bool, short, type_error
from ._jaxcompat import (
    is_differentiated,
    local_remat3_off,
    remat3_drops_names_under_vmap,
    remat3_on,
    under_vmap,
)
from ._namecheck import check_produced
from ._pattern import ROOT_PATTERN
from ._plan import Plan, Rule
from ._policy import is_jax_policy
from ._records import ModuleRun, Tag
from ._resolve import resolve
from ._paths import qualify
from ._scope import check_vmap, tag
from ._targets import no_custom_error

F = TypeVar("F", bound=Callable[..., Any])


_MSG_OFFLOAD_ARGS_IGNORED = """remat_common.checkpoint: {given} names the arguments to move to host, \
but {what} offloads no argument: they would stay on device and the option would do nothing. \
Only the annotation 'offload' moves a function's inputs to host. Fix: checkpoint(fn, 'offload', {given}), \
or drop {given} (a policy or {{"offload": [names]}} offloads tagged values, not arguments)."""


class CheckpointImpl(Protocol):
    """``jax.checkpoint``-shaped: what an adapter passes to build its boundary
    (``nnx.remat``, ``eqx.filter_checkpoint`` or ``jax.checkpoint`` itself)."""

    def __call__(self, fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                 static_argnums: tuple[int, ...]) -> Callable[..., Any]: ...


def keeps_names(boundary: CompiledBoundary) -> bool:
    """Whether the boundary's policy keeps values by name (saved or offloaded, inputs included)."""
    return bool(boundary.spec.save | boundary.spec.offload) or boundary.policy_name.startswith("Save")


def _jax_checkpoint(fun: Callable[..., Any], *, policy: Any, prevent_cse: bool,
                    static_argnums: tuple[int, ...]) -> Callable[..., Any]:
    return jax.checkpoint(fun, policy=policy, prevent_cse=prevent_cse, static_argnums=static_argnums)


def _is_input(x: Any) -> bool:
    """An array a plan may tag (and so offload) as a module input: floating-point activations only.
    Integer, bool and typed PRNG key inputs (positions, masks, token ids, dropout keys) stay on
    device."""
    return is_float(x)


class OffloadArgumentsWarning(UserWarning):
    """``checkpoint(fun, "offload")`` without ``offload_argnums`` offloads several differentiated
    array arguments, parameters likely among them."""


_MSG_OFFLOAD_ARGS = """remat_common.checkpoint({fun}, 'offload'): offloading every array argument ({args}) to host, and
they are all differentiated: if some are parameters (weights), they are copied to host too.
Fix: name the activations, e.g. checkpoint({fun}, 'offload', {fix})."""


def tag_inputs(args: Sequence[Any], name: str, static_argnums: Sequence[int] = (),
               kwargs: Mapping[str, Any] | None = None, *, only_argnums: Sequence[int] | None = None,
               only_argnames: Collection[str] | None = None) -> Any:
    """Tags every array leaf of the module's inputs with ``name``: the positional ``args`` (except
    ``static_argnums``) and, when given, the keyword ``kwargs``; ``only_argnums``/``only_argnames``, when
    given, restrict the tags to those arguments. Returns the tagged ``args`` (a tuple), or
    ``(args, kwargs)`` when ``kwargs`` is given.

    A value passed several times (self-attention's query, key and value) is tagged once, so a
    plan that offloads the inputs moves it to host once. Only floating-point leaves are tagged
    (:func:`_is_input`): integer, bool and PRNG key inputs stay on device.
    """
    n = len(args)
    static = {i % n for i in static_argnums} if n else set()
    argnums, argnames = only_argnums, only_argnames
    chosen = None if argnums is None else {i % n for i in argnums} if n else set()
    tagged: dict[int, Any] = {}  # id -> tagged value; the args keep every leaf alive meanwhile

    def one(leaf: Any) -> Any:
        if not _is_input(leaf):
            return leaf
        if id(leaf) not in tagged:
            tagged[id(leaf)] = tag(leaf, name)
        return tagged[id(leaf)]

    def pick(i: int) -> bool:
        if i in static:
            return False
        if argnums is None and argnames is None:
            return True
        return chosen is not None and i in chosen

    out = tuple(jax.tree_util.tree_map(one, a) if pick(i) else a for i, a in enumerate(args))
    if kwargs is None:
        return out
    restricted = argnums is not None or argnames is not None
    kw = {k: jax.tree_util.tree_map(one, v) if not restricted or k in (argnames or ()) else v
          for k, v in kwargs.items()}
    return out, kw


def _signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The structure, shapes and dtypes of a call's inputs (what a traced body depends on)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    return tree, tuple((tuple(x.shape), str(x.dtype)) if is_array(x) else type(x) for x in leaves)


def _restore_arrays(out: Any, kinds: Mapping[Any, Sequence[Any]], signature: Callable[[], Any]
                    ) -> Any:
    """Outputs that were arrays inside the boundary but come back as Python scalars (JAX returns
    a constant output of ``jax.checkpoint`` as a Python value) as arrays of their dtype again:
    ``kinds`` holds the output dtypes recorded per input ``signature()`` (worked out only when
    an output is not an array, rarely)."""
    if isinstance(out, jax.Array):
        return out
    leaves, treedef = jax.tree_util.tree_flatten(out)
    if all(is_array(v) for v in leaves):
        return out
    got = kinds.get(signature(), ())
    if len(leaves) != len(got) or all(k is None or is_array(v) for v, k in zip(leaves, got)):
        return out
    fixed = [jax.numpy.asarray(v, dtype=k) if k is not None and not is_array(v) else v
             for v, k in zip(leaves, got, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, fixed)


def _check_offload_arguments(f: Callable[..., Any], nums: Sequence[int] | None,
                             names: Collection[str] | None) -> None:
    """``offload_argnums``/``offload_argnames`` that name no argument of ``f`` would offload
    nothing, silently: refused (where ``f``'s signature is known)."""
    given = [("offload_argnums", nums), ("offload_argnames", names)]
    if any(v is not None for _, v in given) and not any(v for _, v in given):
        raise PlanTypeError(
            "remat_common.checkpoint: offload_argnums=() / offload_argnames=() offload no "
            "argument, so 'offload' would recompute everything and move nothing to host. Fix: "
            "name the activations (offload_argnums=(1,)), or use 'recompute'.")
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return
    kinds = {p.kind for p in params}
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if nums and inspect.Parameter.VAR_POSITIONAL not in kinds:
        bad = [n for n in nums if not -len(positional) <= n < len(positional)]
        if bad:
            raise PlanTypeError(
                f"remat_common.checkpoint: offload_argnums={tuple(nums)!r}: {short(f)} takes "
                f"{len(positional)} positional argument(s) ({', '.join(positional) or 'none'}), "
                f"so {bad} name(s) none and would offload nothing. Fix: positions from 0 to "
                f"{len(positional) - 1}.")
    if names and inspect.Parameter.VAR_KEYWORD not in kinds:
        known = {p.name for p in params if p.kind != p.POSITIONAL_ONLY}
        bad_names = sorted(set(names) - known)
        if bad_names:
            raise PlanTypeError(
                f"remat_common.checkpoint: offload_argnames={tuple(names)!r}: {short(f)} has no "
                f"argument(s) {bad_names}; its arguments: {sorted(known)}. Fix: name arguments it "
                "takes.")


def wrap_call(
    fun: F,
    *,
    path: str | None = None,
    boundary: CompiledBoundary | None = None,
    input_tag: str | None = None,
    prevent_cse: bool = True,
    static_argnums: int | Sequence[int] = (),
    checkpoint_impl: CheckpointImpl = _jax_checkpoint,
    untagged: Collection[str] = (),
    offload_argnums: Sequence[int] | None = None,
    offload_argnames: Collection[str] | None = None,
    names_under_vmap_only: bool = False,
    strict: bool = True,
) -> F:
    """``fun`` run in module scope ``path``, inputs tagged, inside ``boundary`` (when given).

    This is the one place where a boundary meets a function; the adapters call it with their own
    ``checkpoint_impl``. Inputs are the array leaves of the positional and keyword arguments,
    except ``static_argnums`` and the keywords in ``untagged`` (what an adapter passes through),
    or only ``offload_argnums``/``offload_argnames`` when either is given.

    On jax 0.11.x with ``jax_remat3`` on, a boundary that keeps values by name runs with remat3
    off locally (``_jaxcompat.local_remat3_off``;
    https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#vmap-under-remat3):
    always, or with ``names_under_vmap_only`` (a boundary around ``custom`` modules, whose rules
    want remat3's ``custom_remat``) only when a ``vmap`` runs inside the differentiation.
    """
    argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    skip = frozenset(untagged)
    # Output dtypes per input signature, recorded when the body is traced: a wrapper reused across
    # calls (``call_module`` with shared layers) may be traced for several signatures. ``calling``
    # holds the arguments of the call running now, for the signature (worked out at trace time).
    kinds: dict[Any, list[Any]] = {}
    calling: list[tuple[tuple[Any, ...], dict[str, Any]] | None] = [None]

    def signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return _signature(args, {k: v for k, v in kwargs.items() if k not in skip})

    @functools.wraps(fun)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        ctx = module_scope(path) if path is not None else contextlib.nullcontext()
        names = boundary_scope(boundary) if boundary is not None else contextlib.nullcontext()
        watch = boundary is not None and bool(boundary.spec.requested)
        seen: contextlib.AbstractContextManager[list[Tag]] = (
            collect_tags() if watch else contextlib.nullcontext([]))
        rules: contextlib.AbstractContextManager[set[str]] = (
            collect_rule_names() if watch else contextlib.nullcontext(set()))
        with ctx, names, seen as tags, rules as rule_names:
            if input_tag is not None:
                own = {k: v for k, v in kwargs.items() if k not in skip}
                args, own = tag_inputs(args, input_tag, argnums, own, only_argnums=offload_argnums,
                                       only_argnames=offload_argnames)
                kwargs = {**kwargs, **own}
            out = fun(*args, **kwargs)
            if watch:
                assert boundary is not None
                check_produced(boundary, tags, rule_names, strict=strict)
        if calling[0] is not None:
            kinds[signature(*calling[0])] = [getattr(v, "dtype", None) if is_array(v) else None
                                             for v in jax.tree_util.tree_leaves(out)]
        return out

    if boundary is None:
        return scoped  # type: ignore[return-value]
    wrapped = checkpoint_impl(scoped, policy=boundary.policy, prevent_cse=prevent_cse,
                              static_argnums=argnums)
    local: list[Callable[..., Any]] = []  # the boundary built with remat3 off, once (see below)
    # What every call checks, worked out once: whether the policy keeps values by name (then
    # remat3 under vmap matters).
    by_name = keeps_names(boundary)
    named = bool(boundary.spec.save | boundary.spec.offload)

    @functools.wraps(fun)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if module_runs_collected():  # (verify): the record is built only then
            record_module_run(ModuleRun(effective_path(path) if path is not None else "", boundary))
        calling[0] = (args, kwargs)
        drops = by_name and remat3_drops_names_under_vmap()
        try:
            if drops and (not names_under_vmap_only
                          or under_vmap(path, "boundary around 'custom' modules")):
                # Built and traced with remat3 off for this boundary only
                # (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/jax_behaviour.md#vmap-under-remat3).
                with local_remat3_off():
                    if not local:  # built once, so a reused wrapper (shared layers) reuses its trace
                        local.append(checkpoint_impl(scoped, policy=boundary.policy,
                                                     prevent_cse=prevent_cse, static_argnums=argnums))
                    out = local[0](*args, **kwargs)
            else:
                if named and drops:  # (check_vmap refuses only where remat3 drops names)
                    check_vmap(boundary)
                out = wrapped(*args, **kwargs)
        finally:
            calling[0] = None
        return _restore_arrays(out, kinds, lambda: signature(args, kwargs))

    return checked  # type: ignore[return-value]


def call_module(
    plan: CompiledPlan,
    path: str,
    fun: Callable[..., Any],
    *args: Any,
    checkpoint_impl: CheckpointImpl = _jax_checkpoint,
    prevent_cse: bool = True,
    custom: Callable[..., Any] | None = None,
    untagged: Collection[str] = (),
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
      untagged: keyword arguments that are not the module's inputs (what the adapter passes
        through to ``fun``); every other positional and keyword array is an input.
    """
    eff = effective_path(path)
    site = _site(plan, eff)
    if site.runs_as is not None:  # a list layer the plan treats like an earlier one: run as that one
        with layer_scope(eff, site.runs_as):
            return call_module(plan, path, fun, *args, checkpoint_impl=checkpoint_impl,
                               prevent_cse=prevent_cse, custom=custom, untagged=untagged, **kwargs)
    if site.custom:
        if custom is None:
            raise no_custom_error(eff)
        fun = custom
    skip = untagged if isinstance(untagged, tuple) else tuple(untagged)

    def build(boundary: CompiledBoundary | None) -> Any:
        if plan.shared and boundary is not None:
            return _shared_call(fun, site, prevent_cse, checkpoint_impl, skip)(*args, **kwargs)
        return wrap_call(fun, **site.options(boundary, prevent_cse, checkpoint_impl, skip)
                         )(*args, **kwargs)

    def call() -> Any:
        boundary = site.boundary
        if module_runs_collected():  # (verify): the record is built only then
            record_module_run(ModuleRun(eff, boundary, plan))
        if site.custom and boundary is not None and _custom.skip_custom_boundary():
            if remat3_drops_names_under_vmap() and under_vmap(eff, "'custom' module"):
                # Under vmap, jax 0.11.x's remat3 would defeat the boundary: run this module as
                # with remat3 off (portable rules inside a kept boundary), locally.
                with local_remat3_off():
                    return build(boundary)
            # Rule sets run the portable path, which a remat3 checkpoint defeats: the boundary is
            # left out, and the rule sets keep, name and offload what it would have.
            with left_out_scope(boundary):
                return build(None)
        return build(boundary)

    with plan_scope(plan):
        out = _custom.with_fallbacks(call)
    if site.output_tag is None:
        return out
    # A plan's {"tag": NAME}: the output, outside the module's own boundary, named as the caller's
    # checkpoint_name(module(x), NAME) would name it (qualified by the parent's path).
    qualified = qualify(eff.rpartition(".")[0], site.output_tag)
    return jax.tree_util.tree_map(lambda v: tag(v, qualified) if _is_input(v) else v, out)


class _Site:
    """What ``call_module`` decides for one module path of one plan, worked out on the first call
    and kept on the plan: a layer that runs as an earlier alike one (``runs_as``), or its
    annotation, boundary, input tag and checks. A list layer of a deep model then costs a dict
    lookup here, not a pass over the plan (``_encloses_custom`` read every annotation per call).

    ``key`` is the boundary's options as a value, hashed once (:func:`_shared_call` looks the
    shared boundary up by it on every call)."""

    __slots__ = ("boundary", "custom", "input_tag", "key", "output_tag", "path", "runs_as", "strict",
                 "under_custom")

    def __init__(self, plan: CompiledPlan, path: str) -> None:
        self.path = path
        self.runs_as = plan.shared_as(path)
        self.custom = plan.resolution.annotation(path).kind == "custom"
        self.boundary = plan.boundary(path)
        self.input_tag = plan.input_tag(path)
        self.under_custom = self.boundary is not None and any(
            not path or p == path or p.startswith(path + ".") for p in _custom_paths(plan))
        self.strict = plan.resolution.plan.strict
        self.output_tag = plan.resolution.annotation(path).tag
        self.key = _Hashed((path, self.boundary, self.input_tag, self.under_custom, self.strict))

    def options(self, boundary: CompiledBoundary | None, prevent_cse: bool,
                checkpoint_impl: CheckpointImpl, untagged: tuple[str, ...]) -> dict[str, Any]:
        """``wrap_call``'s keywords for this path (``boundary``: the site's, or None where a
        ``custom`` module's boundary is left out)."""
        return dict(path=self.path, boundary=boundary, input_tag=self.input_tag,
                    prevent_cse=prevent_cse, checkpoint_impl=checkpoint_impl,
                    untagged=frozenset(untagged),
                    names_under_vmap_only=boundary is not None and self.under_custom,
                    strict=self.strict)


class _Hashed:
    """A hashable value whose hash is computed once (a boundary's hash walks its policy and
    name sets)."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: Any) -> None:
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Hashed) and self._hash == other._hash
                                 and self.value == other.value)


def _site(plan: CompiledPlan, path: str) -> _Site:
    sites: dict[str, _Site] = plan.__dict__.setdefault("_call_sites", {})
    got = sites.get(path)
    if got is None:
        got = sites[path] = _Site(plan, path)
    return got


def _custom_paths(plan: CompiledPlan) -> tuple[str, ...]:
    """The paths the plan annotates ``custom`` (usually none), listed once per plan."""
    got: tuple[str, ...] | None = plan.__dict__.get("_custom_annotated")
    if got is None:
        got = plan.__dict__["_custom_annotated"] = tuple(
            p for p, a in plan.resolution.annotations if a.kind == "custom")
    return got


class _WeakFun:
    """Calls a function it holds weakly (a cached boundary must not keep the caller's function,
    and what it closes over, alive)."""

    def __init__(self, fun: Callable[..., Any]) -> None:
        self._ref = weakref.ref(fun)
        self.__name__ = getattr(fun, "__name__", "fun")
        self.__qualname__ = getattr(fun, "__qualname__", self.__name__)
        self.__doc__ = getattr(fun, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fun = self._ref()
        assert fun is not None, "a shared boundary outlived its function"
        return fun(*args, **kwargs)


#: id(function) -> (a weak reference to it, {options: its boundary}). One boundary function per
#: (function, path, boundary): JAX caches a checkpoint's traced body on the function object, so
#: layers that run as the same path with the same function reuse one trace (and one
#: differentiated body). Keyed by identity (a callable module may define ``__eq__``); an entry
#: goes when its function does.
_SHARED: dict[int, tuple[weakref.ref[Any], dict[Any, Callable[..., Any]]]] = {}


def _shared_call(fun: Callable[..., Any], site: _Site, prevent_cse: bool,
                 checkpoint_impl: CheckpointImpl, untagged: tuple[str, ...]) -> Callable[..., Any]:
    # The boundary is built for the jax_remat3 value it is first called under (jax.checkpoint
    # picks its implementation when it wraps): one per value.
    key = (site.key, prevent_cse, checkpoint_impl, untagged, remat3_on())
    entry = _SHARED.get(id(fun))
    if entry is None or entry[0]() is not fun:
        ident = id(fun)

        def forget(_: Any) -> None:
            _SHARED.pop(ident, None)

        options = site.options(site.boundary, prevent_cse, checkpoint_impl, untagged)
        try:
            ref = weakref.ref(fun, forget)
        except TypeError:  # not weakly referable: no sharing
            return wrap_call(fun, **options)
        entry = _SHARED[ident] = (ref, {})
    call = entry[1].get(key)
    if call is None:
        options = site.options(site.boundary, prevent_cse, checkpoint_impl, untagged)
        call = entry[1][key] = wrap_call(_WeakFun(fun), **options)
    return call


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


def _warn_offload_arguments(fun: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                            static: Sequence[int]) -> None:
    skip = {i % len(args) for i in static} if args else set()
    inputs: list[tuple[int | str, Any]] = [(i, a) for i, a in enumerate(args) if i not in skip]
    inputs += list(kwargs.items())
    arrays = [(n, [x for x in jax.tree_util.tree_leaves(a) if _is_input(x)]) for n, a in inputs]
    arrays = [(n, xs) for n, xs in arrays if xs]
    if len(arrays) > 1 and all(any(is_differentiated(x) for x in xs) for _, xs in arrays):
        name = getattr(fun, "__name__", "fun")
        last = arrays[-1][0]
        fix = f"offload_argnames=({last!r},)" if isinstance(last, str) else f"offload_argnums=({last},)"
        warnings.warn(_MSG_OFFLOAD_ARGS.format(fun=name, args=", ".join(str(n) for n, _ in arrays),
                                               fix=fix), OffloadArgumentsWarning, stacklevel=3)


_RECOMPUTE: Any = type("_Default", (), {"__repr__": lambda self: "'recompute'"})()


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


@overload
def checkpoint(fun: F, annotation: Any = ..., *, prevent_cse: bool = ..., policy: Any = ...,
               static_argnums: int | Sequence[int] = ..., offload_src: str | None = ...,
               offload_dst: str | None = ..., path: str | None = ...,
               offload_argnums: int | Sequence[int] | None = ...,
               offload_argnames: str | Sequence[str] | None = ...) -> F: ...
@overload
def checkpoint(fun: None = ..., annotation: Any = ..., *, prevent_cse: bool = ...,
               policy: Any = ..., static_argnums: int | Sequence[int] = ...,
               offload_src: str | None = ..., offload_dst: str | None = ..., path: str | None = ...,
               offload_argnums: int | Sequence[int] | None = ...,
               offload_argnames: str | Sequence[str] | None = ...) -> Callable[[F], F]: ...
def checkpoint(
    fun: Any = None,
    annotation: Any = _RECOMPUTE,
    *,
    prevent_cse: bool = True,
    policy: Any = None,
    static_argnums: int | Sequence[int] = (),
    offload_src: str | None = None,
    offload_dst: str | None = None,
    path: str | None = None,
    offload_argnums: int | Sequence[int] | None = None,
    offload_argnames: str | Sequence[str] | None = None,
) -> Any:
    """``jax.checkpoint`` that takes an annotation instead of a policy.

    ``"recompute"`` keeps only the inputs; ``"offload"`` moves the function's array inputs to host
    memory (``offload_dst``) and recomputes the rest; ``{"save": [...], "offload": [...]}`` keeps the
    values tagged with those names (:func:`checkpoint_name`) on device or host; ``"dots"`` /
    ``"dots_no_batch"`` keep matmul outputs; ``"save"`` and ``"inherit"`` add no boundary. The policy
    is one of the name-based classes that JAX honours with ``jax_remat3`` off and on.
    ``checkpoint(f, policy=jax.checkpoint_policies.X)`` migrates ``jax.checkpoint`` code: the
    policy is read as the annotation that means the same (:func:`parse_annotation`). See
    https://docs.jax.dev/en/latest/gradient-checkpointing.html for what rematerialization does.

    Args:
      fun: the function. Omit it (or pass the annotation first) to use ``checkpoint`` as a decorator.
      annotation: an annotation value (see :func:`parse_annotation`).
      prevent_cse, static_argnums: as in ``jax.checkpoint``.
      policy: a ``jax.checkpoint`` policy, instead of ``annotation`` (``None``, the default, is
        ``jax.checkpoint``'s: recompute everything).
      offload_src, offload_dst: memory kinds for offloading (defaults ``device``, ``pinned_host``).
      path: a module path to qualify names with (names are then looked up as ``path/name``).
      offload_argnums, offload_argnames: for ``"offload"``, the positional and keyword arguments
        that are activations (moved to host); by default every array argument, positional and
        keyword, is. When the default would offload several differentiated arguments (typically
        ``fun(params, x)`` under ``jax.grad``), an :class:`OffloadArgumentsWarning` says to name
        the activations: the parameters would be copied to host too.

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
    if fun is not None and not callable(fun) and not isinstance(fun, str | Mapping | Annotation):
        raise type_error("remat_common.checkpoint", "fun", fun,
                         "a function (or, to decorate, the annotation)",
                         "checkpoint(fn, 'recompute'), or @checkpoint('recompute') above a def.")
    if fun is not None and not callable(fun):  # @checkpoint("offload")
        if annotation is not _RECOMPUTE:
            raise TypeError(
                f"remat_common.checkpoint: got annotation {short(fun)} as the first argument and "
                f"annotation={short(annotation)}. Fix: pass the annotation once."
            )
        fun, annotation = None, fun
    if policy is not None:
        if annotation is not _RECOMPUTE:
            raise TypeError(
                f"remat_common.checkpoint: got annotation={short(annotation)} and policy="
                f"{short(policy)}; they say the same thing twice. Fix: pass one of them."
            )
        if not is_jax_policy(policy):
            raise TypeError(
                f"remat_common.checkpoint: policy={short(policy)} is not a jax.checkpoint policy "
                "(a callable such as jax.checkpoint_policies.dots_saveable). Fix: pass an "
                "annotation as the second argument instead: checkpoint(f, 'recompute')."
            )
        annotation = policy
    if annotation is _RECOMPUTE:
        annotation = "recompute"
    check_bool("remat_common.checkpoint", "prevent_cse", prevent_cse)
    for arg, value in (("static_argnums", static_argnums), ("offload_argnums", offload_argnums)):
        if value is not None and not (_is_int(value) or (isinstance(value, Sequence) and not isinstance(
                value, str) and all(_is_int(v) for v in value))):
            raise type_error("remat_common.checkpoint", arg, value, "an int or a sequence of ints",
                             f"{arg}=2 or {arg}=(0, 2): positions of arguments, as in jax.checkpoint.")
    if parse_annotation(annotation, path=path).kind == "custom":
        raise PlanError(
            f"remat_common.checkpoint: annotation 'custom' on {short(fun) if fun else 'a function'}"
            ": 'custom' runs a module's own rules (its __remat_custom__), and a plain function has "
            "none, so the boundary would silently recompute everything. Fix: annotate a module "
            "that defines __remat_custom__ through an adapter, call remat_common.adapter.call_module(..., "
            "custom=rules_fn), or use 'recompute' / {'save': [...]} here."
        )
    compiled = compile_annotation(annotation, path=path, offload_src=offload_src,
                                  offload_dst=offload_dst)
    key = path or ""
    if (offload_argnums is not None or offload_argnames is not None) and (
            compiled.input_tag(key) is None):  # the arguments were silently left on device
        given = " and ".join(f"{a}={v!r}" for a, v in (("offload_argnums", offload_argnums),
                                                          ("offload_argnames", offload_argnames))
                             if v is not None)
        what = (f"policy={getattr(policy, '__name__', None) or short(policy)}" if policy is not None
                else f"the annotation {short(annotation)}")
        raise PlanTypeError(_MSG_OFFLOAD_ARGS_IGNORED.format(given=given, what=what))

    nums = (offload_argnums,) if isinstance(offload_argnums, int) else offload_argnums
    names = (offload_argnames,) if isinstance(offload_argnames, str) else offload_argnames
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    def decorate(f: F) -> F:
        if not callable(f):  # @checkpoint("recompute") above something that is not a function
            raise type_error("remat_common.checkpoint", "the decorated object", f, "a function",
                             "put @checkpoint('recompute') above a def, or call "
                             "checkpoint(fn, 'recompute') with the function itself.")
        _check_offload_arguments(f, nums, names)
        inner = wrap_call(f, path=path, boundary=compiled.boundary(key),
                          input_tag=compiled.input_tag(key), prevent_cse=prevent_cse,
                          static_argnums=static_argnums,
                          offload_argnums=None if nums is None else tuple(nums),
                          offload_argnames=None if names is None else frozenset(names),
                          strict=compiled.resolution.plan.strict)
        if compiled.input_tag(key) is None or nums is not None or names is not None:
            return inner

        @functools.wraps(f)
        def warned(*args: Any, **kwargs: Any) -> Any:
            _warn_offload_arguments(f, args, kwargs, static)
            return inner(*args, **kwargs)

        return warned  # type: ignore[return-value]

    return decorate if fun is None else decorate(fun)

