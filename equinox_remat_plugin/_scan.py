"""Stacked layers: ``Stacked`` holds layers stacked with ``eqx.filter_vmap`` and runs them with
``jax.lax.scan`` (:func:`scan_layers`), the plan applied to the scan body."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import remat_common as rc
from remat_common.adapter import binding_of, original_class

from ._checkpoint import filter_checkpoint_impl
from ._remat import Remat

M = TypeVar("M")


_MSG_NO_LAYERS = """\
equinox_remat_plugin.{fn}: {what} has no array leaves, so there is no leading layer axis to scan
over. Fix: build the stack with eqx.filter_vmap, e.g. Stacked.from_keys(make_block, jax.random.split(key, n))."""

_MSG_RAGGED = """\
equinox_remat_plugin.{fn}: the array leaves of {what} have different leading sizes {sizes}; a stack
of layers needs one leading layer axis on every array. Fix: build it with eqx.filter_vmap over one
key per layer, and keep per-model (unstacked) parameters outside the stack."""

_MSG_SCALAR = """
Size 0 means scalar array leaves: a jax transformation (jax.jit, jax.eval_shape, ...) applied to
the model turns its Python numbers (a dropout rate, a flag) into arrays. Use the eqx.filter_*
versions (eqx.filter_jit, eqx.filter_eval_shape, ...), which keep them static."""


def _shaped(a: Any) -> bool:
    """An array, or an abstract one (``jax.ShapeDtypeStruct``: an ``eqx.filter_eval_shape`` model)."""
    return eqx.is_array(a) or isinstance(a, jax.ShapeDtypeStruct)


def num_layers(layers: Any, *, fn: str = "num_layers") -> int:
    """The size of the leading layer axis shared by every array leaf of ``layers``.

    >>> import jax, equinox as eqx
    >>> num_layers(eqx.filter_vmap(lambda k: eqx.nn.Linear(2, 2, key=k))(jax.random.split(jax.random.key(0), 3)))
    3
    """
    arrays = [a for a in jax.tree_util.tree_leaves(layers) if _shaped(a)]
    what = type(_inner(layers)).__name__
    if not arrays:
        raise rc.PlanError(_MSG_NO_LAYERS.format(fn=fn, what=what))
    sizes = sorted({a.shape[0] if a.ndim else 0 for a in arrays})
    if len(sizes) != 1 or sizes[0] == 0:
        msg = _MSG_RAGGED.format(fn=fn, what=what, sizes=sizes)
        if sizes[0] == 0:
            msg += _MSG_SCALAR
        raise rc.PlanError(msg)
    return int(sizes[0])


def _inner(layers: Any) -> Any:
    return layers.module if isinstance(layers, Remat) else layers


def scan_layers(layers: Any, carry: Any, *args: Any, key: jax.Array | None = None,
                unroll: int | bool = 1, **kwargs: Any) -> Any:
    """Runs stacked layers one after the other with ``jax.lax.scan``: ``carry = layer_i(carry, *args)``.

    ``layers`` is one module whose array leaves carry a leading layer axis (``eqx.filter_vmap``
    over per-layer keys). Its parameters are split off with ``eqx.partition`` and scanned over;
    ``args`` and ``kwargs`` are passed to every layer unchanged; ``key``, when given, is split into
    one key per layer and passed as ``key=``.

    Inside a model annotated with :func:`annotate` (through :class:`Stacked`) the plan is applied to
    the scan body, ``scan(remat(layer))``: the stack is split into the layer groups of
    :func:`remat_common.adapter.layer_groups` (one scan each), and each group's body runs under
    :func:`remat_common.adapter.layer_scope`, so a layer and its submodules get the boundaries and qualified
    names of ``blocks.<first layer of the group>...``. A standalone :class:`Remat` around the layers
    puts its boundary around each layer. A plan that treats every layer alike runs one scan over
    the stack as it is; several groups run under one ``jax.custom_vjp``
    (:func:`remat_common.adapter.scan_groups`) that reads each layer's parameters out of the stack
    and writes its gradient into the stack's one gradient (a ``custom`` layer still scans slices,
    which the backward pass keeps; ``verify`` reports them). A stack
    annotated with ``nested`` (``{"remat": "recompute", "nested": "sqrt"}``) runs each group as a
    scan over blocks of layers under the same ``custom_vjp``: the forward pass keeps only each
    block's input, the backward pass runs one block again at a time. Forward-mode AD
    (``jax.jvp``) of a grouped or nested stack is refused with :class:`remat_common.RematError`:
    plan one annotation for the stack, without ``nested``. Parameters in host memory
    (``remat_common.state.fetch(params, stream="blocks")``) stream a layer at a time through the
    same ``custom_vjp``; a stack that cannot (``custom`` layers, no plan) is brought to the
    device whole with a :class:`remat_common.adapter.StreamWarning`.

    Args:
      layers: the stacked layers (plain, or as wrapped by :func:`annotate` / :class:`Remat`).
      carry: the input of the first layer; each layer returns a value of the same structure.
      *args: extra positional arguments for every layer.
      key: an optional PRNG key, split per layer.
      unroll: as in ``jax.lax.scan``.
      **kwargs: extra keyword arguments for every layer.

    Returns:
      The last layer's output.

    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> keys = jax.random.split(jax.random.key(0), 4)
    >>> layers = eqx.filter_vmap(lambda k: eqx.nn.Linear(3, 3, key=k))(keys)
    >>> scan_layers(layers, jnp.ones(3)).shape
    (3,)
    """
    n = num_layers(layers, fn="scan_layers")
    annotated = binding_of(layers)
    bound = annotated is not None or (isinstance(layers, Remat) and layers.path is not None)
    if annotated is not None:
        stack, plan = annotated[0], annotated[1].plan
        groups = rc.adapter.layer_groups(plan.resolution, stack, n)
    elif isinstance(layers, Remat) and layers.path is not None:
        plan, stack = layers.plan, layers.path
        groups = rc.adapter.layer_groups(plan.resolution, stack, n)
    else:
        stack, groups = "", (rc.adapter.LayerGroup(0, n, "0"),)
    keys = None if key is None else jax.random.split(key, n)
    if bound and _nested_spec(plan.resolution, stack) is not None:
        _check_nestable(plan, stack, groups)
        blocks = [plan.resolution.nested_block(stack, g.size) for g in groups]
        return _scan_groups_indexed(layers, stack, groups, blocks, carry, args, kwargs, keys)
    dynamic, static = eqx.partition(layers, eqx.is_array)
    streamed = rc.adapter.streams(dynamic)  # a stack in host memory streams (scan_groups)
    custom = getattr(_inner(layers), rc.adapter.CUSTOM_METHOD, None) is not None
    if bound and (len(groups) > 1 or streamed) and not custom:
        return _scan_groups_indexed(layers, stack, groups, [None] * len(groups), carry, args,
                                    kwargs, keys)
    dynamic = rc.adapter.fetch_whole(
        dynamic, stack=stack, fn="equinox_remat_plugin.scan_layers",
        why="its layers are annotated 'custom'" if bound else "it is not a stack of the plan",
        fix=("annotate the layers without 'custom'" if bound else "annotate the model with a "
             "plan (equinox_remat_plugin.annotate)") + ", or keep the parameters on device.")
    for group in groups:
        xs = jax.tree_util.tree_map(lambda a, g=group: a[g.start:g.stop], dynamic)
        ks = None if keys is None else keys[group.start:group.stop]

        def body(h: Any, x: Any, group: rc.adapter.LayerGroup = group) -> tuple[Any, None]:
            params, k = x
            layer = eqx.combine(params, static)
            if not bound:  # measured without a plan: the layer's path
                rc.adapter.place_scanned_layer(layers, layer, n)
            kw = kwargs if k is None else {**kwargs, "key": k}
            scope = rc.adapter.layer_scope(stack, group.path) if bound else contextlib.nullcontext()
            with scope:
                return layer(h, *args, **kw), None

        carry, _ = jax.lax.scan(body, carry, (xs, ks), unroll=unroll)
    return carry


_MSG_NESTED_UNSUPPORTED = """\
equinox_remat_plugin.scan_layers: the plan nests the stack at {path!r} (nested: {spec}), but
{why}, so its layers cannot run inside nested blocks exactly as the plan says.
Fix: {fix}"""


def _nested_spec(resolution: Any, stack: str) -> Any:
    return dict(resolution.nested).get(stack)


def _check_nestable(plan: Any, stack: str, groups: tuple[rc.adapter.LayerGroup, ...]) -> None:
    spec = _nested_spec(plan.resolution, stack)
    for g in groups:
        if plan.resolution.annotation(g.path).kind == "custom":
            raise rc.PlanError(_MSG_NESTED_UNSUPPORTED.format(
                path=stack, spec=spec, why=f"its layers {g.start}-{g.stop - 1} are annotated "
                "'custom'", fix=f"give {stack!r} a non-custom annotation, or drop 'nested'."))


def _scan_groups_indexed(layers: Any, stack: str, groups: tuple[rc.adapter.LayerGroup, ...],
                         blocks: list[int | None], carry: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any], keys: jax.Array | None) -> Any:
    """The layer groups, nested (``blocks``) or not, scanned one after the other with one
    gradient of the stack (:func:`remat_common.adapter.scan_groups`): each layer's parameters are
    read out of the stack, and neither they nor a slice of the stack are kept for the backward
    pass, which reads the stack in place and writes each layer's gradient into the stack's one
    gradient. ``unroll`` does not apply (each group is one scan of its own)."""
    annotated = binding_of(layers)
    call_of: Callable[[Any], Callable[..., Any]]
    if annotated is not None:  # an annotated stack: its class runs the plan at the stack's path
        path, binding = annotated
        method = original_class(type(layers)).__call__
        stacked, static = eqx.partition(layers, eqx.is_array)

        def call_of(params: Any) -> Callable[..., Any]:
            def call(*a: Any, **kk: Any) -> Any:
                return method(eqx.combine(params, static), *a, **kk)

            def run(h: Any, *a: Any, **kw: Any) -> Any:
                return rc.adapter.call_module(binding.plan, path, call, h, *a,
                                              checkpoint_impl=filter_checkpoint_impl,
                                              prevent_cse=binding.prevent_cse, **kw)
            return run
    else:  # a Remat around the stack
        stacked, static = eqx.partition(layers.module, eqx.is_array)
        path = layers.path or ""

        def call_of(params: Any) -> Callable[..., Any]:
            return Remat._bound(eqx.combine(params, static),  # type: ignore[no-any-return]
                                annotation=layers.annotation, path=layers.path,
                                plan=layers._plan, prevent_cse=layers._prevent_cse)

    shared, fixed = eqx.partition((args, kwargs), eqx.is_array)

    def step_of(group: rc.adapter.LayerGroup) -> rc.adapter.Step:
        def step(h: Any, params: Any, k: Any, arrays: Any) -> tuple[Any, None]:
            a, kw = eqx.combine(arrays, fixed)
            kw = kw if k is None else {**kw, "key": k}
            with rc.adapter.layer_scope(path, group.path):
                return call_of(params)(h, *a, **kw), None
        return step

    carry, _ = rc.adapter.scan_groups(
        [rc.adapter.Group(step_of(g), g.start, g.stop, b) for g, b in zip(groups, blocks)], carry,
        stacked, keys, shared, stack=stack, fn="equinox_remat_plugin.scan_layers")
    return carry


class Stacked(eqx.Module, Generic[M]):
    """Layers stacked along a leading axis, run with :func:`scan_layers` when called.

    Plans see the stack at its own path with one virtual path per layer: a ``Stacked`` at
    ``blocks`` of ``n`` layers reads as ``blocks.0`` ... ``blocks.{n-1}``, each with the layer's
    submodules (``blocks.3.attn``), exactly like a Python list of blocks. The ``layers`` field does
    not appear in paths. An annotation on ``blocks`` applies to each layer (the scan body); layers
    that the plan treats differently are scanned in separate groups.

    Attributes:
      layers: one module whose array leaves have a leading layer axis.

    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> stack = Stacked.from_keys(lambda k: eqx.nn.Linear(3, 3, key=k),
    ...                           jax.random.split(jax.random.key(0), 4))
    >>> stack.num_layers, stack(jnp.ones(3)).shape
    (4, (3,))
    """

    layers: M
    _ranks: tuple[int, ...] = eqx.field(static=True, repr=False)
    _n: int = eqx.field(static=True, repr=False)
    __remat_per_layer__ = True  # a standalone Remat around the stack wraps each layer (_remat.py)

    def __init__(self, layers: M) -> None:
        self.layers = layers
        self._n = num_layers(layers, fn="Stacked")
        self._ranks = _ranks(layers)

    @classmethod
    def from_keys(cls, make_layer: Callable[[jax.Array], M], keys: jax.Array) -> Stacked[M]:
        """``Stacked(eqx.filter_vmap(make_layer)(keys))``: one layer per key."""
        return cls(eqx.filter_vmap(make_layer)(keys))

    @property
    def num_layers(self) -> int:
        return num_layers(self.layers)

    def __call__(self, x: Any, *args: Any, key: jax.Array | None = None, **kwargs: Any) -> Any:
        """``scan_layers(self.layers, x, *args, key=key, **kwargs)``.

        Inside a scan the model runs itself over the stack (each step gets one layer: every array
        has lost its leading axis), the one layer is called instead, under the plan's annotation
        for the stack's layers, which must then be the same for every layer.
        """
        if _ranks(self.layers) == tuple(r - 1 for r in self._ranks):
            return _one_layer(self.layers, self._n, x, *args, key=key, **kwargs)
        return scan_layers(self.layers, x, *args, key=key, **kwargs)


_MSG_SELF_SCANNED = """\
equinox_remat_plugin.Stacked: the model scans the stack at {path!r} itself (each scan step calls
one layer), but the plan treats its layers differently ({groups}); one scan body has one policy.
Fix: call the Stacked (self.{attr}(x)) and let it run the scan, split into these layer groups; or
give every layer the same annotation ('{path}.*')."""


_MSG_SELF_SCANNED_NESTED = """\
equinox_remat_plugin.Stacked: the model scans the stack at {path!r} itself (each scan step calls
one layer), but the plan nests it (nested: {spec}): only the Stacked's own scan can be split into
checkpointed blocks. Fix: call the Stacked (self.{attr}(x)) and let it run the scan, or drop
'nested' from the plan."""


def _ranks(layers: Any) -> tuple[int, ...]:
    return tuple(len(a.shape) for a in jax.tree_util.tree_leaves(layers) if _shaped(a))


def _one_layer(layer: Any, n: int, x: Any, *args: Any, key: jax.Array | None, **kwargs: Any) -> Any:
    kw = kwargs if key is None else {**kwargs, "key": key}
    annotated = binding_of(layer)
    if annotated is not None:
        stack, plan = annotated[0], annotated[1].plan
    elif isinstance(layer, Remat) and layer.path is not None:
        stack, plan = layer.path, layer.plan
    else:
        return layer(x, *args, **kw)
    spec = _nested_spec(plan.resolution, stack)
    if spec is not None:
        raise rc.PlanError(_MSG_SELF_SCANNED_NESTED.format(
            path=stack, spec=spec, attr=stack.rpartition(".")[2] or "layers"))
    groups = rc.adapter.layer_groups(plan.resolution, stack, n)
    if len(groups) > 1:
        desc = ", ".join(f"layers {g.start}-{g.stop - 1}: {plan.resolution.annotation(g.path)}"
                         for g in groups)
        raise rc.PlanError(_MSG_SELF_SCANNED.format(
            path=stack, groups=desc, attr=stack.rpartition(".")[2] or "layers"))
    with rc.adapter.layer_scope(stack, groups[0].path):
        return layer(x, *args, **kw)
