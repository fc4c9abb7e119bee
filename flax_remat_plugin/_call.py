"""An annotated module's call (``Framework.call``): the original run through the module's remat
boundary (``nnx.remat``, unbound form), once the module is checked to be still where ``annotate``
put it (:func:`check_touched`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Final

import flax.errors
import jax
from flax import nnx
from flax.nnx import graphlib
from remat_common import PlanError, RematError
from remat_common.adapter import (
    binding_of,
    call_module,
    display,
    effective_path,
    is_array,
    layer_groups,
    layer_scope,
    original_class,
)

from ._binding import CUSTOM, Binding
from ._checkpoint import nnx_checkpoint
from ._paths import graph_paths


_MSG_GROUPS = """\
module {path!r} is a stack of {n} layers called as a whole (by the model's own nnx.scan, or
directly), but the plan treats its layers differently: {groups}. One scan body has one policy.
Fix: run the stack with flax_remat_plugin.scan_layers(self.{attr}, x), which splits the scan into
these layer groups, or give every layer the same annotation."""

_MSG_NESTED = """\
module {path!r} is a stack of {n} layers called as a whole (by the model's own nnx.scan, or
directly), but the plan nests it (nested: {spec}): only scan_layers can split its scan into
checkpointed blocks. Fix: run the stack with flax_remat_plugin.scan_layers(self.{attr}, x), or
drop 'nested' from the plan."""


# ------------------------------------------------------------------------------------------------
# The call: arrays are the module's inputs (tagged, differentiated); modules and rng streams pass
# through nnx.remat as graph nodes; everything else (flags, shapes, None) stays static.

def _bind(orig: type, method: Callable[..., Any], treedef: Any,
          slots: Sequence[tuple[str, Any]]) -> Callable[..., Any]:
    """``method`` as a function of the call's arrays, the module and its graph-node arguments
    (by keyword), the call's structure and static leaves closed over."""
    def body(arrays: Sequence[Any], *, module: nnx.Module, nodes: Sequence[Any]) -> Any:
        rebuilt = [arrays[v] if k == "array" else nodes[v] if k == "node" else v for k, v in slots]
        a, kw = jax.tree_util.tree_unflatten(treedef, rebuilt)
        return method(module, *a, **kw)

    body.__name__ = body.__qualname__ = f"{orig.__name__}.{method.__name__}"
    return body


def _static_key(kind: str, value: Any) -> tuple[Any, ...]:
    """A slot as a cache key: statics by type and value (``1``, ``1.0`` and ``True`` are equal
    Python values but trace differently; so are ``0.0`` and ``-0.0``)."""
    if kind != "static":
        return (kind, value)
    if isinstance(value, float | complex):
        return (kind, type(value), value, repr(value))
    return (kind, type(value), value)


@functools.lru_cache(maxsize=1024)
def _shared_body(orig: type, method: Callable[..., Any], treedef: Any,
                 key: tuple[tuple[Any, ...], ...]) -> Callable[..., Any]:
    return _bind(orig, method, treedef, [(k[0], k[-1] if k[0] != "static" else k[2]) for k in key])


def _body(orig: type, method: Callable[..., Any], treedef: Any, slots: Sequence[tuple[str, Any]],
          share: bool) -> Callable[..., Any]:
    """The function a module call runs. With ``share`` (a plan that shares alike layers), one
    function object per (class, method, call structure and static values), so JAX reuses the
    trace of an alike layer's boundary; a call whose static values cannot be hashed gets its own
    function (no sharing), as every call does without ``share``."""
    if share:
        try:
            return _shared_body(orig, method, treedef, tuple(_static_key(k, v) for k, v in slots))
        except TypeError:  # an unhashable static value (or tree structure): no sharing
            pass
    return _bind(orig, method, treedef, slots)


#: Python containers NNX does not treat as graph nodes: the call's own ``(args, kwargs)`` are
#: walked without asking NNX (a deep model calls this per layer).
_PLAIN: Final = frozenset(t for t in (tuple, list, dict) if not graphlib.is_graph_node(t()))


def _is_node(x: Any) -> bool:
    return type(x) not in _PLAIN and graphlib.is_graph_node(x)


def _invoke(module: nnx.Module, orig: type, path: str, binding: Binding,
            args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_node)
    arrays: list[Any] = []
    nodes: list[Any] = []
    slots: list[tuple[str, Any]] = []
    for leaf in leaves:
        if _is_node(leaf):
            slots.append(("node", len(nodes)))
            nodes.append(leaf)
        elif is_array(leaf):
            slots.append(("array", len(arrays)))
            arrays.append(leaf)
        else:
            slots.append(("static", leaf))

    share = bool(binding.plan.shared)
    custom = getattr(orig, CUSTOM, None)
    try:
        return _call(module, orig, path, binding, treedef, slots, share, custom, arrays, nodes)
    except flax.errors.TraceContextError as e:
        if binding.plan.boundary(effective_path(path)) is None:
            raise  # not this module's boundary: an inner one says it (or NNX's own words hold)
        raise RematError(_MSG_OUTER_TRACE.format(path=display(path))) from e


_MSG_OUTER_TRACE = """\
module {path!r}: its remat boundary (nnx.remat) writes the module's variables back, and they
were made outside the JAX transform running now (jax.vmap, jax.grad, jax.jit over a function that
closes over the model), so Flax refuses (TraceContextError, below). Fix: use the NNX transform,
nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(model, xs) (likewise nnx.grad, nnx.jit), or split
the model and merge inside: graphdef, state = nnx.split(model);
jax.vmap(lambda s, x: nnx.merge(graphdef, s, copy=True)(x), in_axes=(None, 0))(state, xs)."""


def _call(module: nnx.Module, orig: type, path: str, binding: Binding, treedef: Any,
          slots: list[tuple[str, Any]], share: bool, custom: Any, arrays: list[Any],
          nodes: list[Any]) -> Any:
    return call_module(
        binding.plan, path,
        _body(orig, orig.__call__, treedef, slots, share),  # type: ignore[attr-defined]
        arrays, checkpoint_impl=nnx_checkpoint, prevent_cse=binding.prevent_cse,
        custom=None if custom is None else _body(orig, custom, treedef, slots, share),
        untagged=("module", "nodes"), module=module, nodes=nodes,
    )


_MSG_REPLACED = """\
{fn}module {path!r} ({ann}) {what} after annotate, so its plan entry would
not run. Fix: annotate the model again after the change: frp.annotate(model, plan, replace=True)."""


def check_touched(anchor: nnx.Module, path: str, binding: Binding, *, fn: str = "") -> None:
    """Refuses a module that ``annotate`` swapped under ``anchor`` (at ``path``) but that is no
    longer there: replaced by assignment, or annotated again by a separate ``annotate`` call."""
    inside = binding.touched_inside(path)
    if not inside:
        return
    here = graph_paths(anchor, path)
    nodes = {here[id(m)]: m for _, m in nnx.iter_graph(anchor) if isinstance(m, nnx.Module)}
    canonical = binding.plan.canonical_path
    for p in inside:
        b = binding_of(nodes[p]) if p in nodes else None
        if b is not None and b[0] == canonical(p) and b[1] == binding:
            continue
        what = ("was annotated again by a separate annotate() call" if b is not None
                else "was replaced (or removed)")
        ann = binding.plan.resolution.annotation(p) if p in binding.plan.resolution.paths else "inherit"
        # a layer that runs as an earlier alike one (annotate's default) has that layer's class,
        # so ``path`` is the first layer's: the module may be the counterpart in any of them
        group = next((ls for first, ls in binding.plan.shared_groups() if first == path), ())
        if group:
            others = [q for q in group if q != path]
            shown = ", ".join(others[:4]) + (f", ... ({len(others) - 4} more)" if len(others) > 4 else "")
            ann = f"{ann}; in {path!r} or a layer that runs as it: {shown}"
        raise PlanError(_MSG_REPLACED.format(fn=f"{fn}: " if fn else "", path=p, ann=ann, what=what))


def annotated_call(self: nnx.Module, *args: Any, **kwargs: Any) -> Any:
    """The ``__call__`` of an annotated class: the original one, run as the plan says."""
    bound = binding_of(self)
    assert bound is not None  # only annotated classes have this __call__
    (path, binding), orig = bound, original_class(type(self))
    check_touched(self, path, binding)
    n = binding.num_layers(path)
    if n is not None and effective_path(path) == path:
        # A stack called outside scan_layers: fine when one annotation covers every layer.
        nested = dict(binding.plan.resolution.nested).get(path)
        if nested is not None:
            raise PlanError(_MSG_NESTED.format(path=path, n=n, spec=nested,
                                               attr=path.rpartition(".")[2] or "layers"))
        groups = layer_groups(binding.plan.resolution, path, n)
        if len(groups) > 1:
            desc = ", ".join(f"layers {g.start}-{g.stop - 1}: "
                             f"{binding.plan.resolution.annotation(g.path)}" for g in groups)
            raise PlanError(_MSG_GROUPS.format(path=path, n=n, groups=desc,
                                               attr=path.rpartition(".")[2] or "layers"))
        with layer_scope(path, groups[0].path):
            return _invoke(self, orig, path, binding, args, kwargs)
    return _invoke(self, orig, path, binding, args, kwargs)
