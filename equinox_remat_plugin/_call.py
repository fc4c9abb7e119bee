"""An annotated module's call (``Framework.call``): the original call run through ``call_module``
inside a filtered ``jax.checkpoint``, once its children are checked (:func:`check_children`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

import equinox as eqx
import remat_common as rc

from ._binding import PlanRef
from ._checkpoint import filter_checkpoint_impl, shared_filter_checkpoint_impl
from ._paths import children, join
from ._remat import Remat
from ._scan import Stacked


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


def annotated_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The ``__call__`` of an annotated class: the original one, run as the plan says."""
    bound = rc.adapter.binding_of(self)
    assert bound is not None  # only annotated classes have this __call__
    (path, binding), orig = bound, rc.adapter.original_class(type(self))
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


_MSG_CHILD_REPLACED = """\
equinox_remat_plugin: module {path!r} (inside {parent!r}) was replaced after annotate (eqx.tree_at?)
and would run without its plan entry ({ann}). Fix: annotate the model again after the swap:
erp.annotate(model, plan, replace=True)."""


def check_children(module: Any, path: str, ref: PlanRef) -> None:
    """Refuses, when ``module`` runs, a direct child that ``annotate`` bound but that was swapped out
    since (the plan would silently not apply to it)."""
    inside = ref.touched_inside(path)
    if not inside:  # nothing annotate bound below this module (a list layer's usual case)
        return
    canonical = ref.plan.canonical_path
    for keys, child in children(module):
        if not isinstance(child, eqx.Module):
            continue
        at = join(path, keys)
        if at not in inside:
            continue
        node = child.layers if isinstance(child, Stacked) else child
        if isinstance(node, Remat) and node.path == canonical(at):
            continue
        bound = rc.adapter.binding_of(node)
        if bound is not None and bound[0] == canonical(at) and bound[1].ref == ref:
            continue
        res = ref.plan.resolution
        ann = res.annotation(at) if at in res.paths else "inherit"
        raise rc.PlanError(_MSG_CHILD_REPLACED.format(path=at, parent=rc.adapter.display(path), ann=ann))

