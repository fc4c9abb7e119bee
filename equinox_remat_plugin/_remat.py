"""``Remat``: an annotation written in model code, a wrapper that runs a module's call the way a
plan (or its own annotation) says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import equinox as eqx
import remat_common as rc

from ._binding import PlanRef
from ._checkpoint import filter_checkpoint_impl

M = TypeVar("M")

_FIELDS = frozenset({"module", "annotation", "_path", "_plan", "_prevent_cse"})

_MSG_NOT_MODULE = """\
equinox_remat_plugin.Remat: {what} is a {type}, not a callable eqx.Module.
Remat wraps a module's __call__: annotations apply to modules, not to arrays or functions.
Fix: wrap the module that owns it, e.g. Remat(model.blocks[0].mlp, "recompute")."""

_MSG_TWICE = """\
equinox_remat_plugin.Remat: the module is already wrapped (annotation {inner}); wrapping it again
with {outer} would nest two boundaries. Fix: Remat(unwrap(module), {outer_cfg!r}), or give the
module one annotation."""


def _check_module(module: Any, what: str) -> None:
    if not isinstance(module, eqx.Module) or not callable(module):
        raise TypeError(_MSG_NOT_MODULE.format(what=what, type=type(module).__name__))


class Remat(eqx.nn.StatefulLayer, Generic[M]):
    """A module whose call runs inside the remat boundary its annotation (or plan) says.

    ``Remat(module, annotation)`` marks one module in model code. Inside a model passed to
    :func:`annotate` it is a rule for its own path (plan rules written later win); called on its
    own it is one boundary around the module's call, with names tagged by
    :func:`remat_common.checkpoint_name` inside it left unqualified. The boundary is built at call
    time with ``eqx.filter_checkpoint`` (non-array arguments are static); no ``jax.checkpoint``-wrapped
    callable is stored, so parameters keep training, and the wrapper adds no array leaves, so
    ``eqx.tree_serialise_leaves`` files interchange with the plain model.

    Attribute access falls through to the wrapped module (``wrapped.weight``), except for the
    wrapper's own fields ``module`` and ``annotation``. Methods other than ``__call__`` run
    unwrapped; ``isinstance`` sees a ``Remat`` (use :func:`unwrap` for the plain module), which is an
    ``eqx.nn.StatefulLayer`` that is stateful exactly when the wrapped module is, so
    ``eqx.nn.Sequential`` passes ``state`` to a wrapped ``BatchNorm`` as to the plain one.
    See https://docs.jax.dev/en/latest/gradient-checkpointing.html for what a boundary does.

    Args:
      module: a callable ``eqx.Module``.
      annotation: what should survive its forward pass (see :func:`remat_common.parse_annotation`).
      prevent_cse: as in ``jax.checkpoint``.

    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> lin = Remat(eqx.nn.Linear(3, 3, key=jax.random.key(0)), "recompute")
    >>> lin.weight.shape  # forwarded to the wrapped module
    (3, 3)
    >>> g = eqx.filter_grad(lambda m, x: jnp.sum(jnp.tanh(m(x))))(lin, jnp.ones(3))
    >>> g.module.weight.shape
    (3, 3)
    """

    module: M
    annotation: rc.Annotation | None = eqx.field(static=True)
    _path: str | None = eqx.field(static=True)
    _plan: PlanRef = eqx.field(static=True)
    _prevent_cse: bool = eqx.field(static=True)

    def __init__(self, module: M, annotation: Any = "recompute", *, prevent_cse: bool = True) -> None:
        if isinstance(module, Remat):
            ann = rc.parse_annotation(annotation)
            raise TypeError(_MSG_TWICE.format(inner=module.annotation, outer=ann,
                                              outer_cfg=ann.to_config()))
        _check_module(module, "the wrapped value")
        ann = rc.parse_annotation(annotation)
        plan = rc.adapter.compile_annotation(ann)
        rc.adapter.check_modules(plan, lambda _: (type(module).__name__, True,
                                          getattr(module, rc.adapter.CUSTOM_METHOD, None) is not None))
        self.module = module
        self.annotation = ann
        self._path = None
        self._plan = PlanRef(plan)
        self._prevent_cse = prevent_cse

    @classmethod
    def _bound(cls, module: M, *, annotation: rc.Annotation | None, path: str | None, plan: PlanRef,
               prevent_cse: bool) -> Remat[M]:
        """The wrapper :func:`annotate` places at ``path`` (built the way Equinox unflattens)."""
        self = object.__new__(cls)
        for name, value in (("module", module), ("annotation", annotation), ("_path", path),
                            ("_plan", plan), ("_prevent_cse", prevent_cse)):
            object.__setattr__(self, name, value)
        return self

    @property
    def path(self) -> str | None:
        """The module path this wrapper runs under (``None`` for a standalone ``Remat``)."""
        return self._path

    @property
    def plan(self) -> rc.CompiledPlan:
        """The compiled plan: the whole model's after :func:`annotate`, else this one annotation's."""
        return self._plan.plan

    def is_stateful(self) -> bool:
        """What the wrapped module says (``eqx.nn.Sequential`` asks whether to pass it ``state``)."""
        module: Any = self.module
        return isinstance(module, eqx.nn.StatefulLayer) and module.is_stateful()

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: forward to the wrapped module.
        if name in _FIELDS or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        try:
            module = object.__getattribute__(self, "module")
        except AttributeError:
            raise AttributeError(name) from None
        return getattr(module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module: Any = self.module
        plan = self._plan.plan
        if self._path is None and getattr(type(module), "__remat_per_layer__", False):  # Stacked
            layers = Remat._bound(module.layers, annotation=self.annotation, path=None,
                                  plan=self._plan, prevent_cse=self._prevent_cse)
            return type(module)(layers)(*args, **kwargs)
        path = "" if self._path is None else self._path
        custom = getattr(module, rc.adapter.CUSTOM_METHOD, None)
        return rc.adapter.call_module(
            plan, path, _plain(module), *args, checkpoint_impl=filter_checkpoint_impl,
            prevent_cse=self._prevent_cse, custom=None if custom is None else _plain(custom),
            **kwargs,
        )


def _plain(fun: Callable[..., Any]) -> Callable[..., Any]:
    """``fun`` behind a plain closure.

    The core names its wrapper after ``fun`` with ``functools.wraps``; were ``fun`` the module,
    the wrapper's ``__wrapped__`` would lead to arrays and Equinox would warn that a transformed
    callable holds parameters. The closure is made at call time and never stored.
    """
    def call(*args: Any, **kwargs: Any) -> Any:
        return fun(*args, **kwargs)

    return call
