"""Annotated classes: a module the plan touches becomes an instance of a subclass of its own class.

``annotate`` gives each module it touches the class ``S = annotated_class(type(m), path, binding)``,
made once per (class, module path, binding) and cached. ``S`` has the original's name, qualname,
module, fields and methods; it only overrides ``__call__`` to run the original one through
:func:`remat_common.adapter.call_module` (module scope, tagged inputs, the boundary). So ``isinstance``
against the original class holds, ``functools.singledispatch`` and ``match`` statements dispatch as
before, the leaves and their order are the plain module's, and Equinox's pytree machinery
(``eqx.tree_at``, ``partition``/``combine``, ``filter_jit``, ``filter_vmap``) rebuilds ``S``
instances from the treedef, so the plan survives every transform. The treedef holds ``S`` where
the plain model has the original class, like ``nnx.graphdef`` after the Flax adapter's swap.
With ``annotate(..., share_alike_layers=True)``, a module inside a list layer that runs as an
earlier alike layer gets the class made for its counterpart there
(``CompiledPlan.canonical_path``): the layers of a group have equal treedefs.
"""

from __future__ import annotations

import copyreg
import functools
import pickle
from collections.abc import Callable
from typing import Any, Final

import remat_common as rc

from ._checkpoint import filter_checkpoint_impl, shared_filter_checkpoint_impl
from ._binding import BINDING, ORIGINAL, PATH, Binding
from ._children import check_children


#: The keyword under which a shared module function receives the module (untagged: its arrays
#: are parameters, not inputs a plan may offload).
MODULE_KEYWORD: Final = "__remat_module__"


@functools.cache
def _method_function(orig: type, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` as one plain function per (class, method) that takes the module by keyword
    (:data:`MODULE_KEYWORD`): the same function object for every layer of a class, so the core's
    shared boundary (and JAX's trace of it) is reused across alike layers."""
    def call(*a: Any, **k: Any) -> Any:
        module = k.pop(MODULE_KEYWORD)
        return method(module, *a, **k)

    call.__name__ = call.__qualname__ = f"{orig.__name__}.{method.__name__}"
    return call


def _annotated_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    cls = type(self)
    orig, path, binding = vars(cls)[ORIGINAL], vars(cls)[PATH], vars(cls)[BINDING]
    plan = binding.plan
    check_children(self, path, binding.ref)
    method = orig.__call__
    custom = getattr(orig, rc.adapter.CUSTOM_METHOD, None)
    if plan.shared:  # annotate(..., share_alike_layers=True): one function per class and method
        return rc.adapter.call_module(
            plan, path, _method_function(orig, method), *args,
            checkpoint_impl=shared_filter_checkpoint_impl, prevent_cse=binding.prevent_cse,
            custom=None if custom is None else _method_function(orig, custom),
            untagged=(MODULE_KEYWORD,), **{MODULE_KEYWORD: self}, **kwargs)

    # Plain closures made per call (never stored): the core wraps them with functools.wraps, and a
    # bound Equinox method would lead Equinox to warn that a transformed callable holds arrays.
    def call(*a: Any, **k: Any) -> Any:
        return method(self, *a, **k)

    def call_custom(*a: Any, **k: Any) -> Any:
        assert custom is not None
        return custom(self, *a, **k)

    return rc.adapter.call_module(
        plan, path, call, *args, checkpoint_impl=filter_checkpoint_impl,
        prevent_cse=binding.prevent_cse, custom=None if custom is None else call_custom, **kwargs)


_CLASSES: dict[tuple[type, str, Binding], type] = {}

_MSG_PICKLE = """\
equinox_remat_plugin: {cls} at {path!r} runs a plan: its class was made by annotate() at run time,
so pickle cannot save it by reference, and a pickled model could not bring the plan back. Fix:
save the arrays, eqx.tree_serialise_leaves(file, model) (annotate does not change them), and load
them into a model built and annotated the same way; or pickle the plain model, erp.unwrap(model),
and annotate it again after loading."""


def _refuse_pickle(cls: type) -> Any:
    raise pickle.PicklingError(_MSG_PICKLE.format(cls=cls.__name__,
                                                  path=rc.adapter.display(vars(cls)[PATH])))


_METAS: dict[type, type] = {}


def _annotated_meta(meta: type) -> type:
    """A subclass of ``meta`` (Equinox's module metaclass) for the annotated classes, whose
    pickling (``copyreg``: the class, so a module or treedef holding it) refuses with
    :data:`_MSG_PICKLE` instead of pickle's 'not the same object'."""
    out = _METAS.get(meta)
    if out is None:
        out = _METAS[meta] = type(meta)(meta.__name__, (meta,), {"__module__": __name__})
        copyreg.pickle(out, _refuse_pickle)
    return out


def annotated_class(orig: type, path: str, binding: Binding) -> type:
    """The subclass of ``orig`` whose ``__call__`` runs under ``binding``'s plan at ``path``."""
    key = (orig, path, binding)
    cls = _CLASSES.get(key)
    if cls is None:
        ns = {"__call__": _annotated_call, "__module__": orig.__module__,
              "__qualname__": orig.__qualname__, "__doc__": orig.__doc__,
              ORIGINAL: orig, PATH: path, BINDING: binding}
        cls = _annotated_meta(type(orig))(orig.__name__, (orig,), ns)
        _CLASSES[key] = cls
    return cls


def with_class(module: Any, cls: type) -> Any:
    """A shallow copy of ``module`` whose class is ``cls`` (the same field values)."""
    new: Any = object.__new__(cls)
    for name, value in vars(module).items():
        object.__setattr__(new, name, value)
    return new
