"""``scan_layers``: stacked layers run with ``nnx.scan``, the plan applied to the scan body."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

import remat_common as rc
from remat_common.adapter import (Group, LayerGroup, binding_of, call_module, layer_groups,
                                  layer_scope, original_class, scan_groups)

from ._binding import CUSTOM
from ._paths import check_module, num_layers

C = TypeVar("C")

# Where scan_layers puts the per-layer splits of call-time nnx.Rngs, for the duration of a call.
_CALL_RNGS = "_remat_call_rngs"


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _RngsSlot:
    """Stands for an ``nnx.Rngs`` given at call time; each layer gets its own split of it."""

    slot: str


class _CallRngs(nnx.Module):
    """The per-layer splits of the call-time ``nnx.Rngs``, one attribute per slot."""


def _split_rngs(rngs: nnx.Rngs, n: int) -> nnx.Rngs:
    split = getattr(rngs, "split", None)  # flax >= 0.12.9; fork(split=n) before
    return split(n) if split is not None else rngs.fork(split=n)


def _take_call_rngs(layers: nnx.Module, n: int, args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any], bool]:
    """Replaces each ``nnx.Rngs`` argument by a :class:`_RngsSlot` and attaches its split into
    ``n`` (one stream state per layer, a leading layer axis) to ``layers``, where every path of
    the scan finds it as per-layer state: scanned with the layers, each layer's slice its own."""
    holder = _CallRngs()
    found = False

    def take(slot: str, v: Any) -> Any:
        nonlocal found
        if not isinstance(v, nnx.Rngs):
            return v
        found = True
        setattr(holder, slot, _split_rngs(v, n))
        return _RngsSlot(slot)

    args = tuple(take(f"arg{i}", a) for i, a in enumerate(args))
    kwargs = {k: take(f"kw_{k}", v) for k, v in kwargs.items()}
    if found:
        setattr(layers, _CALL_RNGS, holder)
    return args, kwargs, found


def _with_rngs(layer: nnx.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` with each :class:`_RngsSlot` replaced by this layer's split."""
    def put(v: Any) -> Any:
        return getattr(getattr(layer, _CALL_RNGS), v.slot) if isinstance(v, _RngsSlot) else v

    return tuple(put(a) for a in args), {k: put(v) for k, v in kwargs.items()}


def _scan(layers: nnx.Module, n: int, carry: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
          ) -> Any:
    def body(c: Any, layer: nnx.Module) -> Any:
        rc.adapter.place_scanned_layer(layers, layer, n)  # measured without a plan: its path
        a, kw = _with_rngs(layer, args, kwargs)
        return layer(c, *a, **kw)

    return nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(carry, layers)


def _scan_groups_indexed(layers: nnx.Module, path: str, binding: Any, groups: list[LayerGroup],
                         blocks: list[int | None], carry: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    """Layer groups, nested (``blocks``) or not, scanned one after the other with one gradient of
    the stack (:func:`remat_common.adapter.scan_groups`): each layer's parameters are read out of
    the stack, and neither they nor a slice of the stack are kept for the backward pass, which
    reads the stack in place and writes each layer's gradient into the stack's one gradient. The
    layer's other state (rng counts, batch statistics) is scanned per layer and written back; a
    plan that offloads the layer's inputs moves only the activations.
    """
    orig = original_class(type(layers))
    graphdef, params, rest = nnx.split(layers, nnx.Param, ...)  # type: ignore[misc]
    tree = jax.tree_util.tree_structure((carry, args, kwargs))

    def boundary(*leaves: Any, layer_params: Any, layer_rest: Any) -> Any:
        c, a, kw = jax.tree_util.tree_unflatten(tree, leaves)
        layer = nnx.merge(graphdef, layer_params, layer_rest)
        a, kw = _with_rngs(layer, a, kw)
        out = orig.__call__(layer, c, *a, **kw)
        return out, nnx.state(layer, nnx.Not(nnx.Param))

    boundary.__name__ = boundary.__qualname__ = f"{orig.__name__}.__call__"

    def step_of(g: LayerGroup) -> Any:
        def step(c: Any, p: Any, r: Any, shared: Any) -> tuple[Any, Any]:
            with layer_scope(path, g.path):
                return call_module(binding.plan, path, boundary,  # type: ignore[no-any-return]
                                   *jax.tree_util.tree_leaves((c, *shared)), layer_params=p,
                                   layer_rest=r, prevent_cse=binding.prevent_cse,
                                   untagged=("layer_params", "layer_rest"))  # not inputs
        return step

    carry, ys = scan_groups([Group(step_of(g), g.start, g.stop, b) for g, b in zip(groups, blocks)],
                            carry, params, rest, (args, kwargs), stack=path,
                            fn="flax_remat_plugin.scan_layers")
    if jax.tree_util.tree_leaves(ys):
        first, last = groups[0].start, groups[-1].stop
        new = jax.tree_util.tree_map(lambda *u: jnp.concatenate(u), *ys)
        nnx.update(layers, jax.tree_util.tree_map(lambda f, u: f.at[first:last].set(u), rest, new))
    return carry


def _plain_arrays(tree: Any) -> bool:
    return all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(tree))


def _indexable(layers: nnx.Module, carry: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> bool:
    """Whether the layers can be called on parameters read out of the stack per layer (no
    ``custom`` rules, array arguments only)."""
    return getattr(original_class(type(layers)), CUSTOM, None) is None and _plain_arrays(
        (carry, args, kwargs))


def _scan_group_sliced(layers: nnx.Module, g: LayerGroup, carry: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """One layer group scanned over its slice of the stack (``custom`` layers, layers given
    non-array arguments): the backward pass keeps the slice, which ``verify`` reports."""
    graphdef, state = nnx.split(layers)
    part = nnx.merge(graphdef, jax.tree_util.tree_map(lambda a: a[g.start:g.stop], state))
    carry = _scan(part, g.size, carry, args, kwargs)
    # Write back what the layers updated (rng counts, batch statistics); parameters are read-only.
    changed = nnx.state(part, nnx.Not(nnx.Param))
    if jax.tree_util.tree_leaves(changed):
        full = nnx.state(layers, nnx.Not(nnx.Param))
        nnx.update(layers, jax.tree_util.tree_map(
            lambda f, u: f.at[g.start:g.stop].set(u), full, changed))
    return carry


_MSG_NESTED_UNSUPPORTED = """\
flax_remat_plugin.scan_layers: the plan nests the stack at {path!r} ({spec}), but {why}, so its
layers cannot run inside nested blocks exactly as the plan says.
Fix: {fix}"""


def _check_nestable(layers: nnx.Module, path: str, g: LayerGroup, plan: Any, carry: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    spec = dict(plan.resolution.nested)[path]
    ann = plan.resolution.annotation(g.path)
    if ann.kind == "custom":
        raise rc.PlanError(_MSG_NESTED_UNSUPPORTED.format(
            path=path, spec=f"nested: {spec}", why=f"its layers {g.start}-{g.stop - 1} are "
            "annotated 'custom'", fix=f"give {path!r} a non-custom annotation, or drop 'nested'."))
    if not _plain_arrays((carry, args, kwargs)):
        raise rc.PlanError(_MSG_NESTED_UNSUPPORTED.format(
            path=path, spec=f"nested: {spec}", why="the layers are given non-array arguments "
            "(modules or Python objects)", fix="pass arrays only (close over the rest in the "
            "layer), or drop 'nested'."))


def scan_layers(layers: nnx.Module, carry: C, *args: Any, **kwargs: Any) -> C:
    """Runs stacked layers with ``nnx.scan``: ``carry = layer(carry, *args, **kwargs)`` per layer.

    ``layers`` is one module whose variables have a leading layer axis (built with ``nnx.vmap``).
    When the model is annotated with ``layers`` declared a stack (``annotate(..., stacks=[...])`` or
    a class's ``__remat_stacks__``), the plan's annotation for the layers applies to the scan body
    (``scan(remat(layer))``, never the whole scan), and a plan that treats layers differently
    (``layers.[0-1]: offload``) splits the scan into one scan per layer group
    (:func:`remat_common.adapter.layer_groups`). Inside the body the layers' paths read as those of the
    group's first layer (``layers.attn`` → ``layers.2.attn``), so tags and boundaries match the plan.
    The groups run under one ``jax.custom_vjp`` (:func:`remat_common.adapter.scan_groups`): each
    layer's parameters are read out of the whole stack and its gradient written into the stack's
    one gradient, and no slice of the stacked parameters is kept for the backward pass (a
    ``custom`` layer, or a layer given Python objects as arguments, still scans slices; ``verify``
    reports the copy). A stack annotated with ``nested`` (``{"remat": "recompute", "nested": "sqrt"}``)
    runs each group as a scan over blocks of layers under the same ``custom_vjp``: the forward
    pass keeps only each block's input, the backward pass runs one block again at a time.
    Forward-mode AD (``jax.jvp``) of a grouped or nested stack is refused with
    :class:`remat_common.RematError`: plan one annotation for the stack, without ``nested``.
    Parameters in host memory (``remat_common.state.fetch(params, stream="blocks")``) stream a
    layer at a time through the same ``custom_vjp``; a stack that cannot (``custom`` layers,
    non-array arguments, no plan) is brought to the device whole with a
    :class:`remat_common.adapter.StreamWarning`.

    Args:
      layers: the stacked layers (an ``nnx.Module``, not a bound method).
      carry: the activation threaded through the layers; each layer returns the same structure.
      *args, **kwargs: passed unchanged to every layer (masks, positions, flags), except an
        ``nnx.Rngs`` given at call time (``scan_layers(self.layers, x, rngs=rngs)``, as ViT
        implementations and Flax's randomness guide do): it is split into one ``nnx.Rngs`` per
        layer (``rngs.split(L)``, advancing ``rngs``) and layer ``i`` gets the ``i``-th, in one
        scan or in layer groups alike.

    Returns:
      The carry after the last layer.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import flax_remat_plugin as frp
    >>> @nnx.split_rngs(splits=3)
    ... @nnx.vmap(in_axes=(0,), out_axes=0)
    ... def create(rngs):
    ...     return nnx.Linear(4, 4, rngs=rngs)
    >>> stack = frp.annotate(create(nnx.Rngs(0)), {".": "recompute"})  # every layer recomputed
    >>> frp.scan_layers(stack, jnp.ones((2, 4))).shape
    (2, 4)
    """
    check_module(layers, "scan_layers")
    bound = binding_of(layers)
    path, binding = bound if bound is not None else (None, None)
    n = num_layers(layers, fn="scan_layers", path=path or "")
    args, kwargs, call_rngs = _take_call_rngs(layers, n, args, kwargs)
    try:
        return _scan_layers(layers, n, path, binding, carry, args, kwargs)
    finally:
        if call_rngs:
            delattr(layers, _CALL_RNGS)


def _scan_layers(layers: nnx.Module, n: int, path: str | None, binding: Any, carry: C,
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> C:
    declared = not (binding is None or path is None or binding.num_layers(path) is None)
    streamed = rc.adapter.streams(nnx.state(layers, nnx.Param))
    if streamed and not (declared and _indexable(layers, carry, args, kwargs)):
        nnx.update(layers, rc.adapter.fetch_whole(
            nnx.state(layers, nnx.Param), stack=path or "", fn="flax_remat_plugin.scan_layers",
            why=("its layers are annotated 'custom' or given non-array arguments" if declared
                 else "it is not a stack of the plan"),
            fix=("pass arrays only to the layers, and annotate them without 'custom'" if declared
                 else "annotate the model with the stack declared (annotate(model, plan, "
                      "stacks=(path,)))") + ", or keep the parameters on device."))
        streamed = False
    if binding is None or path is None or binding.num_layers(path) is None:
        # Not a declared stack: the module's own annotation (if any) holds for every layer.
        return _scan(layers, n, carry, args, kwargs)  # type: ignore[no-any-return]
    resolution = binding.plan.resolution
    groups = list(layer_groups(resolution, path, n))
    blocks = [resolution.nested_block(path, g.size) for g in groups]
    if any(b is not None for b in blocks):
        for g in groups:
            _check_nestable(layers, path, g, binding.plan, carry, args, kwargs)
    elif len(groups) == 1 and not streamed:  # a stack in host memory streams (scan_groups)
        with layer_scope(path, groups[0].path):
            return _scan(layers, n, carry, args, kwargs)  # type: ignore[no-any-return]
    elif not _indexable(layers, carry, args, kwargs):
        for g in groups:
            with layer_scope(path, g.path):
                carry = _scan_group_sliced(layers, g, carry, args, kwargs)
        return carry
    with layer_scope(path, groups[0].path):
        return _scan_groups_indexed(layers, path, binding, groups, blocks,  # type: ignore[no-any-return]
                                    carry, args, kwargs)
