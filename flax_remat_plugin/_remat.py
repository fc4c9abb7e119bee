"""``@remat``: a model author declares, in the class, what should survive its forward pass."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from flax import nnx

from remat_common.adapter import jax_policy_entry

from ._annotate import annotate, declared_annotation
from ._binding import CLASS_RULES, INSTANCE_RULES
from ._paths import check_module

C = TypeVar("C", bound=type)

_MISSING: Any = object()
_WRAPPED_INIT = "__remat_init__"
_HOOKED = "__remat_hooked__"

_MSG_TARGET = """\
remat: decorates nnx.Module classes, got {what}.
    @flax_remat_plugin.remat("offload")
    class Block(nnx.Module): ...
Fix: {fix}"""

_MSG_REMAT_PARAM = """\
@remat on {cls}: {cls}.__init__ already has a parameter named 'remat', which the decorator would
take over (Block(..., remat="offload") declares a per-instance annotation). Fix: rename that
parameter, or do not decorate the class and use flax_remat_plugin.annotate(model, plan)."""

_local = threading.local()


def _depths() -> dict[int, int]:
    if not hasattr(_local, "depth"):
        _local.depth = {}
    return _local.depth  # type: ignore[no-any-return]


def _wrap_init(init: Callable[..., None], cls: type, *, accept_remat: bool) -> Callable[..., None]:
    """``init`` that takes ``remat=`` (when ``accept_remat``) and, when the outermost ``__init__`` of
    the instance returns, applies what the instance's classes declare (``annotate(self)``)."""
    init = getattr(init, "__wrapped__", init) if getattr(init, _WRAPPED_INIT, False) else init

    @functools.wraps(init)
    def __init__(self: nnx.Module, *args: Any, **kwargs: Any) -> None:
        rules = None
        if accept_remat and "remat" in kwargs:
            value = kwargs.pop("remat")
            if value is not None:
                rules = declared_annotation(value, owner=f"{cls.__qualname__}(remat={value!r})")
        depths = _depths()
        depth = depths.get(id(self), 0)
        depths[id(self)] = depth + 1
        try:
            init(self, *args, **kwargs)
            if rules is not None:
                setattr(self, INSTANCE_RULES, rules)
        finally:
            if depth:
                depths[id(self)] = depth
            else:
                del depths[id(self)]
        if not depth:
            annotate(self)

    setattr(__init__, _WRAPPED_INIT, True)
    return __init__


def _install_subclass_hook(cls: type) -> None:
    """Subclasses that define their own ``__init__`` apply the declarations when it returns."""
    own = vars(cls).get("__init_subclass__")

    def __init_subclass__(sub: type, **kwargs: Any) -> None:
        if own is not None:
            own.__func__(sub, **kwargs)
        else:
            super(cls, sub).__init_subclass__(**kwargs)  # type: ignore[arg-type, misc]
        init = vars(sub).get("__init__")
        if init is not None and not getattr(init, _WRAPPED_INIT, False):
            setattr(sub, "__init__", _wrap_init(init, sub, accept_remat=False))

    setattr(cls, "__init_subclass__", classmethod(__init_subclass__))
    setattr(cls, _HOOKED, True)


def _decorate(cls: C, value: Any) -> C:
    if not (isinstance(cls, type) and issubclass(cls, nnx.Module)):
        raise TypeError(_MSG_TARGET.format(what=f"class {cls!r}",
                                           fix="decorate an nnx.Module subclass."))
    init = cls.__init__
    inner = getattr(init, "__wrapped__", init) if getattr(init, _WRAPPED_INIT, False) else init
    if "remat" in inspect.signature(inner).parameters:
        raise TypeError(_MSG_REMAT_PARAM.format(cls=cls.__qualname__))
    setattr(cls, CLASS_RULES, declared_annotation(value, owner=f"@remat on {cls.__qualname__}"))
    setattr(cls, "__init__", _wrap_init(init, cls, accept_remat=True))
    if not vars(cls).get(_HOOKED, False):
        _install_subclass_hook(cls)
    return cls


def _check_target(target: Any) -> None:
    if isinstance(target, nnx.Module):
        raise TypeError(_MSG_TARGET.format(
            what=f"a {type(target).__name__} instance",
            fix="to annotate a model object use flax_remat_plugin.annotate(model, plan)."))
    if callable(target) and not isinstance(target, type) and jax_policy_entry(target) is None:
        self = getattr(target, "__self__", None)
        if isinstance(self, nnx.Module):
            check_module(target, "remat")  # raises the bound-method error
        raise TypeError(_MSG_TARGET.format(
            what=f"the function {getattr(target, '__qualname__', target)!r}",
            fix="for a function use nnx.remat(fn, policy=...) or remat_common.checkpoint(fn, "
                "annotation); for a module, decorate its class."))


@overload
def remat(target: C, /) -> C: ...
@overload
def remat(annotation: Any = ..., /) -> Callable[[C], C]: ...
def remat(target: Any = _MISSING, /) -> Any:
    """Class decorator: declares what should survive the forward pass of a module class.

    Bare (``@remat``) means ``"recompute"``. With an argument it takes any annotation
    (``"offload"``, ``{"save": ["attn_out"]}``, ...) or a mapping of relative path patterns to
    annotations, ``"."`` being the module itself (``{".": "recompute", "mlp": "offload"}``).
    Decorated classes also take a ``remat=`` constructor keyword with the same values, for one
    instance: ``Block(..., remat="offload")``.

    Declarations take effect when the outermost decorated module is constructed (its subtree is
    annotated with them) and whenever :func:`annotate` runs on a model that holds such modules;
    a plan given to :func:`annotate` overrides them. A module's declaration about its children
    wins over the children's own.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import flax_remat_plugin as frp
    >>> @frp.remat("offload")
    ... class Block(nnx.Module):
    ...     def __init__(self, rngs):
    ...         self.lin = nnx.Linear(4, 4, rngs=rngs)
    ...     def __call__(self, x):
    ...         return jnp.tanh(self.lin(x))
    >>> print(frp.compiled_plan(Block(nnx.Rngs(0), remat="recompute")).describe())
    <root>: nothing_saveable
    """
    if target is _MISSING:
        return functools.partial(_decorate, value="recompute")
    if isinstance(target, type):
        return _decorate(target, "recompute")
    _check_target(target)
    declared_annotation(target, owner="@remat")  # validate now, before any class is decorated
    return functools.partial(_decorate, value=target)
