"""A framework as the core knows it: the one record its adapter registers (:class:`Framework`), the
class the core makes for an annotated module, and where the module running now is.

The class swap, once for every adapter: a module a plan names gets the class
``annotated_class(name, type(m), path, binding)``, a subclass of its own class made once per
(class, path, binding), of the same name, whose only override is ``__call__`` (the framework's
:attr:`Framework.call`); ``isinstance`` holds and the module's fields are untouched
(:func:`with_class`: in place, or on a shallow copy for immutable modules). Pickling such a class
is refused with the framework's message: it is made at run time. Every other module keeps its
class: :func:`placed_module` places the module running now by identity among the paths of the
nearest bound module running around it (the Python frames whose ``self`` is a module).
"""

from __future__ import annotations

import collections
import copyreg
import dataclasses
import functools
import pickle
import sys
import types
import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, TypeAlias, TypeVar

from ._compile import CompiledPlan
from ._errors import type_error
from ._paths import display

T = TypeVar("T")

#: The class attributes of an annotated class: the original class, its module path, the adapter's
#: binding (its plan and boundary options).
ORIGINAL: Final = "__remat_original__"
PATH: Final = "__remat_path__"
BINDING: Final = "__remat_binding__"


def original_class(cls: type) -> type:
    """The class an annotated class stands for (``cls`` itself when it is not annotated)."""
    return vars(cls)[ORIGINAL] if ORIGINAL in vars(cls) else cls  # type: ignore[no-any-return]


def binding_of(module: Any) -> tuple[str, Any] | None:
    """``(path, binding)`` of a module of an annotated class, None for any other object."""
    ns = vars(type(module))
    return (ns[PATH], ns[BINDING]) if ORIGINAL in ns else None


def annotated_path(obj: Any) -> str | None:
    """The path of an annotated class (the default :attr:`Framework.bound_path`)."""
    bound = binding_of(obj)
    return None if bound is None else bound[0]


def is_annotated(obj: Any) -> bool:
    """Whether ``obj`` is of an annotated class (the default :attr:`Framework.scoped`)."""
    return ORIGINAL in vars(type(obj))


def _none(*args: Any) -> Any:
    return None


def _empty(*args: Any) -> Any:
    return {}


ModelCheck: TypeAlias = Callable[[CompiledPlan, Any], list[str]]
ModelBinder: TypeAlias = Callable[[tuple[tuple[Any, ...], dict[str, Any]]],
                                  tuple[tuple[Any, ...], dict[str, Any]]]
PathFinder: TypeAlias = Callable[[], "tuple[str, bool] | None"]


@dataclasses.dataclass(frozen=True)
class StatefulKind:
    """A framework's kind of in-place object (a Flax NNX module declared ``pytree=False``), which
    measurement turns into arrays and back.

    Attributes:
      name: the framework, for messages (``"flax.nnx"``).
      claims: whether a value (a pytree leaf) is such an object.
      split: ``split(objects) -> (static, state)``: a tuple of objects to a static description and
        a pytree of arrays, shared references kept.
      merge: ``merge(static, state) -> objects``: new objects from them.
      state: ``state(objects) -> state``: the objects' arrays now, in ``split``'s structure.
    """

    name: str
    claims: Callable[[Any], bool]
    split: Callable[[tuple[Any, ...]], tuple[Any, Any]]
    merge: Callable[[Any, Any], tuple[Any, ...]]
    state: Callable[[tuple[Any, ...]], Any]


@dataclasses.dataclass(frozen=True)
class Framework:
    """What the core needs of a framework, registered once by its adapter: its name and the hooks
    that are its own (each optional).

    Attributes:
      name: the key (``"flax.nnx"``): registering a record of the same name replaces it.
      is_module: whether an object (a ``__call__``'s ``self``) is a module of the framework.
      paths: ``paths(module, path) -> {id(m): path}`` for ``module`` at ``path`` and every module
        inside it, as a plan names them.
      call: the ``__call__`` of the framework's annotated classes: the original call run through
        :func:`remat_common.adapter.call_module`, with the framework's ``jax.checkpoint`` as the
        ``checkpoint_impl`` (``nnx.remat``, a filtered ``jax.checkpoint``).
      class_keywords: the keywords an annotated class is made with (NNX's ``pytree=``).
      pickle_message: why an annotated class cannot be pickled, and the fix (``{cls}``, ``{path}``).
      bound_path: the path ``annotate`` bound an object to, or None (default: an annotated class's).
      scoped: whether a module's call opens its own module scope or only runs other modules (a
        stack's scan), so a measurement opens none (default: an annotated class's).
      find: ``() -> (path, exact) | None``, the framework's own lookup of the module running now.
      check_models: ``(plan, (args, kwargs)) -> problems``: ``verify``'s check of the framework's
        models among its arguments (modules added after ``annotate``).
      bind_models: ``(args, kwargs) -> (args, kwargs)``: ``saved_residuals`` traces each model
        whose annotations are all written in model code as the plan it carries (``blocks.1/h``).
      stateful: the framework's in-place objects, for measurement.
    """

    name: str
    is_module: Callable[[Any], bool] = _none
    paths: Callable[[Any, str], Mapping[int, str]] = _empty
    call: Callable[..., Any] | None = None
    class_keywords: Callable[[type], Mapping[str, Any]] = _empty
    pickle_message: str = "{cls} at {path!r} runs a plan: its class is made at run time."
    bound_path: Callable[[Any], str | None] = annotated_path
    scoped: Callable[[Any], bool] = is_annotated
    find: PathFinder | None = None
    check_models: ModelCheck | None = None
    bind_models: ModelBinder | None = None
    stateful: StatefulKind | None = None


_FRAMEWORKS: dict[str, Framework] = {}  # registered once per adapter at import; not runtime state


def register_framework(framework: Framework) -> None:
    """Registers ``framework`` (or replaces the record registered under its name): what the core
    reads of the framework from then on (see :class:`Framework`)."""
    if not isinstance(framework, Framework):
        raise type_error("register_framework", "framework", framework, "a Framework",
                         "register_framework(Framework(name, is_module=..., paths=..., call=...)).")
    _FRAMEWORKS[framework.name] = framework


def frameworks() -> tuple[Framework, ...]:
    """The registered frameworks, in the order they were first registered."""
    return tuple(_FRAMEWORKS.values())


def stateful_kind(x: Any) -> StatefulKind | None:
    """The registered in-place kind (:attr:`Framework.stateful`) that claims ``x``, if any."""
    return next((fw.stateful for fw in _FRAMEWORKS.values()
                 if fw.stateful is not None and fw.stateful.claims(x)), None)


# -- the class swap and the module running now -----------------------------------------------------

_CLASSES: dict[tuple[type, str, Hashable], type] = {}
_METAS: dict[tuple[type, str], type] = {}


def _refuse_pickle(message: str, cls: type) -> Any:
    raise pickle.PicklingError(message.format(cls=cls.__name__, path=display(vars(cls)[PATH])))


def _meta(meta: type, framework: Framework) -> type:
    """A subclass of the framework's metaclass whose classes refuse pickling with its message."""
    out = _METAS.get((meta, framework.name))
    if out is None:
        out = type(meta)(meta.__name__, (meta,), {"__module__": __name__})
        _METAS[meta, framework.name] = out
        copyreg.pickle(out, functools.partial(_refuse_pickle, framework.pickle_message))
    return out


def annotated_class(framework: str, orig: type, path: str, binding: Hashable) -> type:
    """The subclass of ``orig`` whose ``__call__`` is ``framework``'s :attr:`Framework.call`, at
    ``path`` under ``binding`` (see :func:`binding_of`); one per (``orig``, ``path``, ``binding``)."""
    key = (orig, path, binding)
    cls = _CLASSES.get(key)
    if cls is None:
        fw = _FRAMEWORKS.get(framework)
        if fw is None or fw.call is None:
            raise KeyError(f"annotated_class: no framework {framework!r} with a call is registered "
                           f"({sorted(_FRAMEWORKS)}). Fix: its adapter registers one when imported,"
                           " register_framework(Framework(name, call=...)).")
        ns = {"__call__": fw.call, "__module__": orig.__module__, "__qualname__": orig.__qualname__,
              "__doc__": orig.__doc__, ORIGINAL: orig, PATH: path, BINDING: binding}
        kwds = {**fw.class_keywords(orig), "metaclass": _meta(type(orig), fw)}
        cls = types.new_class(orig.__name__, (orig,), kwds, lambda body: body.update(ns))
        _CLASSES[key] = cls
    return cls


def with_class(module: T, cls: type, *, copy: bool = False) -> T:
    """``module`` with the class ``cls``: in place, or on a shallow copy (``copy``: the same field
    values, for frameworks whose modules are immutable)."""
    if not copy:
        module.__class__ = cls
        return module
    new: Any = object.__new__(cls)
    for name, value in vars(module).items():
        object.__setattr__(new, name, value)
    return new  # type: ignore[no-any-return]


def placed_module() -> tuple[str, bool] | None:
    """``(real path, exact)`` of the module running now, placed under the nearest bound module
    running around it (see the module's documentation), or None when none runs. ``exact`` is
    False when the innermost module could not be placed (a copy made by a framework transform in
    model code, e.g. ``nnx.vmap``) and the path is its nearest placed caller's."""
    fws = frameworks()
    frame = sys._getframe(1) if fws else None
    chain: list[Any] = []  # modules running inside the nearest bound one, innermost first
    while frame is not None:
        code = frame.f_code
        if code.co_argcount:
            obj = frame.f_locals.get(code.co_varnames[0])
            for fw in fws:
                if fw.is_module(obj):
                    path = fw.bound_path(obj)
                    if path is not None:
                        if not chain:
                            return path, True
                        where = fw.paths(obj, path)
                        for k, m in enumerate(chain):
                            if id(m) in where:
                                return where[id(m)], k == 0
                        return path, False
                    if not chain or chain[-1] is not obj:
                        chain.append(obj)
                    break
        frame = frame.f_back
    for fw in fws:
        found = fw.find() if fw.find is not None else None
        if found is not None:
            return found
    return None


# -- the interface before Framework, for one release: each call registers a one-hook record -------

_MSG_DEPRECATED = """\
remat_common.adapter.{fn} is deprecated and will be removed in the next release. Fix: describe
the framework once: register_framework(Framework(name, {field}=..., ...))."""

#: Deprecated: :class:`Framework`'s ``is_module``, ``scoped`` and ``paths``.
ModuleLocator = collections.namedtuple("ModuleLocator", ["is_module", "scoped", "paths"])


def _deprecated(fn: str, field: str) -> Callable[[Any], None]:
    def register(hook: Any) -> None:
        warnings.warn(_MSG_DEPRECATED.format(fn=fn, field=field), DeprecationWarning, stacklevel=2)
        hooks = hook._asdict() if isinstance(hook, ModuleLocator) else {field: hook}
        register_framework(Framework(f"{fn}({hook!r})", **hooks))

    register.__name__ = register.__qualname__ = fn
    register.__doc__ = f"Deprecated: ``register_framework(Framework(name, {field}=...))``."
    return register


register_path_finder = _deprecated("register_path_finder", "find")
register_module_locator = _deprecated("register_module_locator", "is_module")
register_model_check = _deprecated("register_model_check", "check_models")
register_model_binder = _deprecated("register_model_binder", "bind_models")
register_stateful = _deprecated("register_stateful", "stateful")
