"""A framework as the core knows it: the one record an adapter registers, the classes the core
makes for its annotated modules, and where its module running now is.

An adapter describes its framework once, ``register_framework(Framework(name, ...))``: which
objects are its modules and the paths inside one, the call its annotated classes run, what
``verify`` checks of its models, how ``saved_residuals`` binds them, and its in-place objects. A
measurement's module scopes (``_module_calls.py``), ``verify``, ``saved_residuals`` and a
measurement's in-place objects (``_stateful.py``) read the records registered here; the core never
imports a framework.

The class swap, once for every adapter: an adapter annotates a module by giving it the class
``S = annotated_class(name, type(m), path, binding)``, a subclass of the module's own class made
once per (class, module path, binding) and cached, with the original's name, qualname, module and
docstring, that only overrides ``__call__`` (its framework's :attr:`Framework.call`).
``isinstance`` against the original class holds, and the module's fields, leaves and their order
are untouched: :func:`with_class` swaps the class in place (NNX's mutable modules) or on a shallow
copy (``copy=True``: Equinox's immutable ones). A framework's transforms rebuild ``S`` from its
graph or tree definition, so the plan travels with the model. An annotated class is made at run
time, so pickling it (a module or a definition holding it) is refused with the framework's
:attr:`Framework.pickle_message`.

Every other module keeps its class. :func:`placed_module` places the module running now by
identity: the innermost Python frame whose first argument (``self``) is a module of a registered
framework, looked up among the paths (:attr:`Framework.paths`) of the nearest bound module
running around it (:attr:`Framework.bound_path`).
"""

from __future__ import annotations

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

#: Class attribute of an annotated class: the original class.
ORIGINAL: Final = "__remat_original__"
#: Class attribute of an annotated class: the module path it runs under.
PATH: Final = "__remat_path__"
#: Class attribute of an annotated class: the adapter's binding (its plan and boundary options).
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
    ns = vars(type(obj))
    return ns[PATH] if ORIGINAL in ns else None  # type: ignore[no-any-return]


def is_annotated(obj: Any) -> bool:
    """Whether ``obj`` is of an annotated class (the default :attr:`Framework.scoped`)."""
    return ORIGINAL in vars(type(obj))


def _never(obj: Any) -> bool:
    return False


def _no_paths(module: Any, path: str) -> Mapping[int, str]:
    return {}


def _no_keywords(cls: type) -> Mapping[str, Any]:
    return {}


#: ``verify``'s check of a framework's models among its arguments (``(args, kwargs)``) against
#: the plan: problems (``module 'blocks.3': ...``) for a model whose structure is not the one the
#: plan was compiled for (modules added after ``annotate``).
ModelCheck: TypeAlias = Callable[[CompiledPlan, Any], list[str]]
#: ``saved_residuals``' binding of a framework's models among the arguments of the traced function:
#: ``(args, kwargs)`` back, each model whose annotations are all written in model code (running as
#: one-boundary plans at path ``""``) bound to its module paths as the plan its adapter's
#: ``compiled_plan(model)`` returns, so that names read ``blocks.1/h``; anything else as it is.
ModelBinder: TypeAlias = Callable[[tuple[tuple[Any, ...], dict[str, Any]]],
                                  tuple[tuple[Any, ...], dict[str, Any]]]
#: ``(real module path, exact)`` of the module running now, or None (see :attr:`Framework.find`).
PathFinder: TypeAlias = Callable[[], "tuple[str, bool] | None"]


@dataclasses.dataclass(frozen=True)
class StatefulKind:
    """A framework's kind of in-place object: one a training step updates instead of returning
    (a Flax NNX module declared ``pytree=False``), which measurement turns into arrays and back.

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


_MSG_PICKLE = """\
{cls} at {path!r} runs a plan: its class was made by annotate() at run time, so pickle cannot
save it by reference. Fix: save the model's arrays (annotate does not change them) and load them
into a model built and annotated the same way."""


@dataclasses.dataclass(frozen=True)
class Framework:
    """What the core needs of a framework: its name and the hooks that are its own.

    Every hook has a default, so a record names only what its framework has.

    Attributes:
      name: the framework (``"flax.nnx"``, ``"equinox"``), for messages and as the key:
        registering a record under a name replaces the one registered before.
      is_module: whether an object (a ``__call__``'s first argument) is a module of a model of the
        framework (not one of the framework's own wrappers).
      paths: ``paths(module, path) -> {id(m): path of m}`` for ``module`` (at ``path``) and every
        module inside it, named as a plan names them.
      call: the ``__call__`` of the classes :func:`remat_common.adapter.annotated_class` makes for
        the framework: it runs the original class's call through
        :func:`remat_common.adapter.call_module`, with the framework's ``jax.checkpoint``
        (``nnx.remat``, a filtered ``jax.checkpoint``) as the
        :class:`~remat_common.adapter.CheckpointImpl`.
      class_keywords: the keywords an annotated class is made with, given the original class
        (NNX's ``pytree=``).
      pickle_message: why an annotated class cannot be pickled, and the fix (``{cls}``, ``{path}``).
      bound_path: the module path ``annotate`` bound an object to, None for an unbound one: by
        default, an annotated class's.
      scoped: whether a module's call opens its own module scope (through ``call_module``) or only
        runs other modules (a stack's scan): by default, an annotated class's.
      find: the framework's own lookup of the module running now, where the core's (the Python
        frames whose first argument is a module, up to a bound one) cannot place its modules.
      check_models: :data:`ModelCheck`, for ``verify``.
      bind_models: :data:`ModelBinder`, for ``saved_residuals`` (so ``verify``, and ``measure``).
      stateful: the framework's in-place objects, for measurement.
    """

    name: str
    is_module: Callable[[Any], bool] = _never
    paths: Callable[[Any, str], Mapping[int, str]] = _no_paths
    call: Callable[..., Any] | None = None
    class_keywords: Callable[[type], Mapping[str, Any]] = _no_keywords
    pickle_message: str = _MSG_PICKLE
    bound_path: Callable[[Any], str | None] = annotated_path
    scoped: Callable[[Any], bool] = is_annotated
    find: PathFinder | None = None
    check_models: ModelCheck | None = None
    bind_models: ModelBinder | None = None
    stateful: StatefulKind | None = None


_FRAMEWORKS: dict[str, Framework] = {}  # registered once per adapter at import; not runtime state
_IN_ORDER: tuple[Framework, ...] = ()  # the same, as read on every tag and module call


def register_framework(framework: Framework) -> None:
    """Registers ``framework`` (or replaces the record registered under its name): what the core
    reads of the framework from then on (see :class:`Framework`)."""
    if not isinstance(framework, Framework):
        raise type_error("register_framework", "framework", framework, "a Framework",
                         "register_framework(Framework(name, is_module=..., paths=..., call=...)).")
    global _IN_ORDER
    _FRAMEWORKS[framework.name] = framework
    _IN_ORDER = tuple(_FRAMEWORKS.values())


def frameworks() -> tuple[Framework, ...]:
    """The registered frameworks, in the order they were first registered."""
    return _IN_ORDER


def registered(name: str) -> Framework:
    """The framework registered under ``name``; a KeyError naming the registered ones otherwise."""
    try:
        return _FRAMEWORKS[name]
    except KeyError:
        raise KeyError(f"no framework {name!r} is registered (registered: {sorted(_FRAMEWORKS)}); "
                       "its adapter calls register_framework(Framework(name, ...)) when imported"
                       ) from None


# -- the class swap and the module running now -----------------------------------------------------

_CLASSES: dict[tuple[type, str, Hashable], type] = {}
_METAS: dict[tuple[type, str], type] = {}


def _refuse_pickle(message: str, cls: type) -> Any:
    raise pickle.PicklingError(message.format(cls=cls.__name__, path=display(vars(cls)[PATH])))


def _meta(meta: type, framework: Framework) -> type:
    """A subclass of ``meta`` (the framework's module metaclass) for annotated classes, whose
    pickling (``copyreg``) refuses with the framework's message instead of pickle's 'not the
    same object'."""
    out = _METAS.get((meta, framework.name))
    if out is None:
        out = type(meta)(meta.__name__, (meta,), {"__module__": __name__})
        _METAS[meta, framework.name] = out
        copyreg.pickle(out, functools.partial(_refuse_pickle, framework.pickle_message))
    return out


def annotated_class(framework: str, orig: type, path: str, binding: Hashable) -> type:
    """The subclass of ``orig`` whose ``__call__`` is the registered ``framework``'s
    :attr:`Framework.call`, running at ``path`` under ``binding`` (read back by
    :func:`binding_of`); one class per (``orig``, ``path``, ``binding``)."""
    key = (orig, path, binding)
    cls = _CLASSES.get(key)
    if cls is None:
        fw = registered(framework)
        if fw.call is None:
            raise TypeError(f"annotated_class: the framework {framework!r} has no call "
                            "(Framework.call): its modules cannot be annotated.")
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


# -- the interface before Framework: one record per hook, for one release --------------------------

_MSG_DEPRECATED = """\
remat_common.adapter.{fn} is deprecated and will be removed in the next release. Fix: describe
the framework once, register_framework(Framework(name, {field}=..., ...)): one record holds every
hook an adapter gives the core."""


@dataclasses.dataclass(frozen=True)
class ModuleLocator:
    """Deprecated: :class:`Framework`'s ``is_module``, ``scoped`` and ``paths``, for
    :func:`register_module_locator`."""

    is_module: Callable[[Any], bool]
    scoped: Callable[[Any], bool]
    paths: Callable[[Any, str], Mapping[int, str]]


def _register(fn: str, field: str, hook: Any, **hooks: Any) -> None:
    warnings.warn(_MSG_DEPRECATED.format(fn=fn, field=field), DeprecationWarning, stacklevel=3)
    register_framework(Framework(f"{fn}({hook!r})", **hooks))


def register_path_finder(finder: PathFinder) -> None:
    """Deprecated: ``register_framework(Framework(name, find=finder))``."""
    _register("register_path_finder", "find", finder, find=finder)


def register_module_locator(locator: ModuleLocator) -> None:
    """Deprecated: ``register_framework(Framework(name, is_module=..., scoped=..., paths=...))``."""
    _register("register_module_locator", "is_module", locator, is_module=locator.is_module,
              scoped=locator.scoped, paths=locator.paths)


def register_model_check(check: ModelCheck) -> None:
    """Deprecated: ``register_framework(Framework(name, check_models=check))``."""
    _register("register_model_check", "check_models", check, check_models=check)


def register_model_binder(binder: ModelBinder) -> None:
    """Deprecated: ``register_framework(Framework(name, bind_models=binder))``."""
    _register("register_model_binder", "bind_models", binder, bind_models=binder)


def register_stateful(kind: StatefulKind) -> None:
    """Deprecated: ``register_framework(Framework(name, stateful=kind))``."""
    _register("register_stateful", "stateful", kind.name, stateful=kind)
