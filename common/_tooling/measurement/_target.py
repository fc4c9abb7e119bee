"""The step a model gives a measurement (:class:`MeasureTarget`), the checks it must pass before
anything is compiled (:func:`check_step`, :func:`jittable`), and where it is compiled
(:class:`Where`: this machine or a target accelerator and mesh)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ..._arrays import is_array
from ..._compile import CompiledPlan
from ..._errors import RematError, short
from ..._paths import display
from ..._state import StatePlacement
from ..._stateful import stateful_kind
from ..accelerators._accelerators import Accelerator, device_count, parse_accelerator
from ..accelerators._meshes import abstract_args, parse_mesh, target_mesh
from ..accelerators._compilers import compile_lowered
from ._step import lower_step


class CompilerRefused(RematError):
    """The compiler refused a step as out of memory (XLA:TPU's RESOURCE_EXHAUSTED): for a budget,
    a plan that does not fit. ``error``: the compiler's message."""

    def __init__(self, message: str, error: str | None, seconds: float = 0.0) -> None:
        super().__init__(message)
        self.error = error or ""
        self.seconds = seconds


@dataclasses.dataclass(frozen=True)
class MeasureTarget:
    """One training step under one plan, as a model provides it for measurement.

    Attributes:
      loss_fn: ``loss_fn(*loss_args) -> scalar``; its residuals under reverse-mode AD (w.r.t. all
        its array arguments) are what the plan changes.
      loss_args: the arguments of ``loss_fn``.
      step_fn: one training step (forward, backward, update), jit-able: ``step_fn(*step_args)``.
        Array leaves of ``step_args`` become inputs of the compiled step; any other leaf (an
        activation function in an Equinox module, say) is held fixed as a constant.
      step_args: the arguments of ``step_fn``.
      plan: the compiled plan the model was annotated with (``None`` for the un-annotated model).
      batch_argnums: which of ``step_args`` are batches, split along their leading dimension when
        the step is compiled for an accelerator's devices (default: the last one); the others are
        parameters and optimiser state (replicated, or split by an ``fsdp`` mesh axis).
      state: where the plan keeps the training state between steps (a plan's ``state:``), and
      state_bytes: its bytes per role (``params``, ``optimizer``, ``other``), and
      host_state_bytes: those kept on host per kind (a part of a kind: that part's); all three set
        by :func:`with_state`, which gives the step the host parts in ``pinned_host`` memory. A
        report counts them apart from the device memory (:class:`StateFigures`).

    Leaves of ``loss_args`` and ``step_args`` may be ``jax.ShapeDtypeStruct`` (an abstract model:
    ``nnx.eval_shape``, ``eqx.filter_eval_shape``): such a step is compiled from shapes only and
    not run (``steps=0``).
    """

    loss_fn: Callable[..., Any]
    loss_args: tuple[Any, ...]
    step_fn: Callable[..., Any]
    step_args: tuple[Any, ...]
    plan: CompiledPlan | None = None
    batch_argnums: tuple[int, ...] | None = None
    state: StatePlacement | None = None
    state_bytes: Mapping[str, int] | None = None
    host_state_bytes: Mapping[str, int] | None = None

def _is_input(x: Any) -> bool:
    """An array or an abstract one (``jax.ShapeDtypeStruct``): an input of the compiled step."""
    return is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _batch_flags(t: MeasureTarget, n: int) -> list[bool]:
    """For each input of the step :func:`jittable` makes (``n`` of them), whether it is (a leaf
    of) a batch argument; the state of in-place objects, after the plain leaves, never is."""
    args = tuple(t.step_args)
    which = set(t.batch_argnums) if t.batch_argnums is not None else {len(args) - 1}
    flags = []
    for i, arg in enumerate(args):
        for leaf in jax.tree_util.tree_leaves(arg):
            if _is_input(leaf) and stateful_kind(leaf) is None:
                flags.append(i in which)
    return (flags + [False] * n)[:n]


def jittable(fn: Callable[..., Any], args: tuple[Any, ...]
              ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``fn`` over the array leaves of ``args`` (other leaves fixed), returning its array leaves.

    The step's attribute ``arg_leaves`` holds ``(key path, leaf)`` of each of its inputs, and
    ``out_paths`` (filled when it is traced) the key path of each output, for the breakdown.

    A step that updates its arguments in place (an ``@nnx.jit`` step that calls
    ``optimizer.update(model, grads)`` and returns only the loss) is made functional: the new values
    of the arguments' leaves are returned as well, so the compiled program keeps the backward pass
    that produced them instead of letting XLA drop it. Objects that do not flatten as pytrees but
    that an adapter registered (:mod:`.._stateful`: NNX modules with ``pytree=False``) are split
    into their arrays with the framework's own tools, rebuilt inside the step, and their state after
    the step is returned too; the caller's objects are never touched.
    """
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(args)
    leaves = [leaf for _, leaf in with_paths]
    owned = [i for i, leaf in enumerate(leaves) if stateful_kind(leaf) is not None]
    kinds = {stateful_kind(leaves[i]) for i in owned}
    if len(kinds) > 1:
        raise RematError("remat_common.measurement.measure: the step's arguments hold in-place "
                         f"objects of {len(kinds)} frameworks ({', '.join(sorted(k.name for k in kinds if k))}); "
                         "measure one framework's step at a time.")
    kind = next(iter(kinds)) if kinds else None
    static, state = kind.split(tuple(leaves[i] for i in owned)) if kind else (None, None)
    state_paths, state_def = jax.tree_util.tree_flatten_with_path(state)
    state_leaves = [leaf for _, leaf in state_paths]
    state_mask = [_is_input(leaf) for leaf in state_leaves]
    state_fixed = [None if m else leaf for leaf, m in zip(state_leaves, state_mask)]
    mask = [_is_input(leaf) and i not in owned for i, leaf in enumerate(leaves)]
    fixed = [None if m else leaf for leaf, m in zip(leaves, mask)]
    n_plain = sum(mask)

    def step(*arrays: Any) -> list[Any]:
        it = iter(arrays[:n_plain])
        full = [next(it) if m else leaf for leaf, m in zip(fixed, mask)]
        objects: tuple[Any, ...] = ()
        if kind is not None:
            fed = iter(arrays[n_plain:])
            values = [next(fed) if m else leaf for leaf, m in zip(state_fixed, state_mask)]
            objects = kind.merge(static, jax.tree_util.tree_unflatten(state_def, values))
            for i, obj in zip(owned, objects):
                full[i] = obj
        rebuilt = jax.tree_util.tree_unflatten(treedef, full)
        out = fn(*rebuilt)
        after = [(p, leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(
            kind.state(objects))[0] if isinstance(leaf, jax.Array)] if kind is not None else []
        outs = [(p, leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(out)[0]
                if isinstance(leaf, jax.Array)]
        replaced = _updated_in_place(rebuilt, arrays[:n_plain])
        kept, seen = [], set()  # a value both returned and updated in place: one output
        for p, x in outs + replaced + after:
            if id(x) not in seen:
                seen.add(id(x))
                kept.append((p, x))
        step.out_paths = tuple(p for p, _ in kept)  # type: ignore[attr-defined]
        return [x for _, x in kept]

    step.__name__ = getattr(fn, "__name__", "step")
    step.arg_leaves = (  # type: ignore[attr-defined]
        tuple(pl for pl, m in zip(with_paths, mask) if m)
        + tuple(pl for pl, m in zip(state_paths, state_mask) if m))
    step.out_paths = ()  # type: ignore[attr-defined]
    return step, (tuple(leaf for leaf, m in zip(leaves, mask) if m)
                  + tuple(leaf for leaf, m in zip(state_leaves, state_mask) if m))


def _updated_in_place(rebuilt: Any, arrays: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    """``(key path, leaf)`` of the leaves of the step's arguments that the step replaced (NNX
    objects updated in place)."""
    after = jax.tree_util.tree_flatten_with_path(rebuilt)[0]
    if len(after) < len(arrays):  # the structure changed; keep what the step returned
        return []
    inputs = {id(a) for a in arrays}
    return [(p, leaf) for p, leaf in after if isinstance(leaf, jax.Array) and id(leaf) not in inputs]


_MSG_NO_BACKWARD = """\
remat_common.measurement.measure: plan {name!r}: the compiled training step has no backward pass (no
transposed operation survives compilation), so memory, FLOPs and recomputation would all read as
a forward pass only. Usual cause: the step's gradients or updates never reach its outputs:

  - a step that returns only the loss: return the updated parameters too (plain JAX, Equinox:
    `return eqx.apply_updates(model, updates), opt_state, loss`);
  - an in-place NNX step (`optimizer.update(model, grads); return loss` under @nnx.jit) given
    with the model and optimizer held fixed (not in step_args), or wrapped so that only the loss
    is kept.

Fix: pass the NNX objects a step updates in place in MeasureTarget.step_args
(step_args=(model, optimizer, batch)): measure returns their updated state, which keeps the
backward pass; otherwise make step_fn return the updated state."""

_MSG_NO_PARAMETERS = """\
remat_common.measurement.measure: plan {name!r}: the compiled training step has no backward pass: \
the loss depends on no parameter ({why}), so its gradients are zeros and XLA removes their \
computation. Usual cause: a model without layers or weights on the loss's path (a size of 0: \
n_layers=0), or parameters held static (leaves that are not arrays: fixed constants). \
Fix: sizes that give the model parameters (remat report --size n_layers=N with N >= 1), and \
weights passed to the loss as arrays."""

_MSG_EMPTY = """\
remat_common.measurement.measure: plan {name!r}: the training step has no backward pass to measure: \
{n} of its inputs hold no element (shapes {shapes}), so XLA removes the computation on them. \
Usual cause: a size of 0 (d_model=0, vocab=0, seq_len=0, batch=0). Fix: sizes of at least 1 \
(remat report --size d_model=N with N >= 1)."""


def _empty_inputs(trace: Callable[[], Any]) -> list[str]:
    """The shapes of the traced step's inputs that hold no element (``(0, 128)``)."""
    try:
        avals = trace().in_avals
    except Exception:  # noqa: BLE001 - no trace: the general message stands
        return []
    return [str(tuple(a.shape)) + " " + str(a.dtype) for a in avals
            if getattr(a, "shape", None) is not None and 0 in tuple(a.shape)]


_MSG_NO_BOUNDARY = """\
remat_common.measurement.measure: plan {name!r}: the plan has {n} remat boundar{ies} ({paths}) but the traced
training step contains no checkpoint at all, so the plan cannot change what it keeps. Usual
cause: step_fn builds or closes over a model that was not annotated (a copy made before
annotate, or Equinox's annotate result not used). Fix: build the step from the annotated model
(flax_remat_plugin.annotate works in place; equinox_remat_plugin.annotate returns a new model)."""

# Operations of a backward pass carry ``transpose(jvp(...))`` in their source op names.
_BACKWARD_OP = re.compile(r'op_name="[^"]*transpose\(')
_REMAT_PRIMITIVES = frozenset({"checkpoint", "remat", "remat2", "custom_remat"})


def _has_boundary(jaxpr: Any) -> bool:
    """Whether a (closed) jaxpr runs any remat boundary (``jax.checkpoint``, remat3's hi-primitive)."""
    stack, seen = [jaxpr], set()
    while stack:
        j = stack.pop()
        j = getattr(j, "jaxpr", j) if not hasattr(j, "eqns") else j
        if not hasattr(j, "eqns") or id(j) in seen:
            continue
        seen.add(id(j))
        for eqn in j.eqns:
            prim = type(eqn.params.get("_prim")).__name__
            if eqn.primitive.name in _REMAT_PRIMITIVES or (
                    "Remat" in prim or (prim.startswith("Checkpoint") and "Name" not in prim)):
                return True
            for v in eqn.params.values():
                stack.extend(v if isinstance(v, tuple | list) else (v,))
    return False


def _loss_parameters(t: MeasureTarget) -> tuple[int, int] | None:
    """``(n, reached)``: the floating-point arrays of the loss's parameters (its arguments but the
    last, the batch, and the state of in-place objects), and how many of them the loss depends on
    (traced: each equation's outputs depend on all its inputs); ``None`` where it cannot be told
    (one argument, or the loss does not trace on its own)."""
    args = tuple(t.loss_args)
    if len(args) < 2:
        return None
    try:
        fn: Any
        fn, flat = jittable(t.loss_fn, args)
        closed = jax.make_jaxpr(fn)(*flat)
    except Exception:  # noqa: BLE001 - not known: the general message stands
        return None
    jaxpr = closed.jaxpr
    # the plain leaves come first (jittable), each under its argument's index; then the state
    # of in-place objects (NNX), all parameters
    plain = sum(1 for x in jax.tree_util.tree_leaves(args)
                if _is_input(x) and stateful_kind(x) is None)
    batch = len(args) - 1
    params = [v for v, (path, _) in zip(jaxpr.invars[:plain], fn.arg_leaves[:plain])
              if not (isinstance(path[0], jax.tree_util.SequenceKey) and path[0].idx == batch)]
    params += jaxpr.invars[plain:]
    params = [v for v in params
              if jax.numpy.issubdtype(getattr(v.aval, "dtype", np.int32), jax.numpy.inexact)]
    if not jaxpr.outvars:
        return len(params), 0
    needed = {id(jaxpr.outvars[0])}
    for eqn in reversed(jaxpr.eqns):
        if any(id(o) in needed for o in eqn.outvars):
            needed.update(id(i) for i in eqn.invars)
    return len(params), sum(id(v) in needed for v in params)


def check_step(name: str, compiled: Any, plan: CompiledPlan | None,
               trace: Callable[[], Any], target: MeasureTarget | None = None) -> None:
    """Raises :class:`RematError` when the compiled step has no backward pass (naming the cause
    where ``target``'s loss shows it: no parameter reaches it), or when ``plan`` has boundaries
    and the traced step (``trace()``, a closed jaxpr) runs none of them."""
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - nothing to check against
        text = None
    if text is not None and not _BACKWARD_OP.search(text):
        empty = _empty_inputs(trace)
        if empty:
            raise RematError(_MSG_EMPTY.format(name=name, n=len(empty), shapes=", ".join(
                empty[:4]) + (", ..." if len(empty) > 4 else "")))
        used = _loss_parameters(target) if target is not None else None
        if used is not None and used[1] == 0:
            why = ("its arguments before the batch hold no floating-point array" if not used[0]
                   else f"none of the {used[0]} floating-point arrays of its arguments before "
                        "the batch reaches it")
            raise RematError(_MSG_NO_PARAMETERS.format(name=name, why=why))
        raise RematError(_MSG_NO_BACKWARD.format(name=name))
    if plan is not None and plan.boundaries and not _has_boundary(trace()):
        paths = sorted({display(b.path) for b in plan.boundaries})
        raise RematError(_MSG_NO_BOUNDARY.format(
            name=name, n=len(paths), ies="y" if len(paths) == 1 else "ies",
            paths=", ".join(repr(p) for p in paths[:4]) + (", ..." if len(paths) > 4 else "")))

@dataclasses.dataclass(frozen=True)
class Where:
    """Where and how steps are compiled: an accelerator (``local``: this machine), its mesh, and
    the compiler's options (``{"xla_...": value}``, as ``jax.jit(..., compiler_options=...)``)."""

    acc: Accelerator
    mesh: dict[str, int] | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, accelerator: Any, mesh: Any, compiler_options: Any = None,
           fn: str = "remat_common.measurement.measure") -> Where:
        acc = parse_accelerator(accelerator)
        options = check_compiler_options(fn, compiler_options)
        if acc.is_local and mesh is None:
            return cls(acc, None, options)
        return cls(acc, parse_mesh(mesh, device_count(acc)), options)

    def compile(self, lowered: Any) -> Any:
        """:func:`compile_lowered` with the dump (the breakdown's input) and these options."""
        return compile_lowered(lowered, dump=True, reuse=self.acc.is_local, options=self.options)

    def lower(self, t: MeasureTarget, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``fn`` lowered as a training loop runs it (:func:`._step.lower_step`: the state, every
        input but the batch, donated), for the accelerator (args sharded on its mesh) or locally
        (on this machine's devices, laid out on the mesh when one is given): one path for both."""
        flags = _batch_flags(t, len(args))
        if self.mesh is not None:
            if self.acc.is_local:
                devices = np.array(jax.devices()).reshape(tuple(self.mesh.values()))
                mesh = jax.sharding.Mesh(devices, tuple(self.mesh))
            else:
                mesh = target_mesh(self.acc, self.mesh)
            args = abstract_args(args, flags, mesh)
        return lower_step(fn, args, [i for i, batch in enumerate(flags) if not batch])


LOCAL = Where(parse_accelerator("local"))


def check_compiler_options(fn: str, options: Any) -> dict[str, Any]:
    """``options`` as a dict of XLA option names to values (``None``: none), or a clear refusal.

    >>> check_compiler_options("f", {"xla_disable_hlo_passes": "cse"})
    {'xla_disable_hlo_passes': 'cse'}
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(
            isinstance(k, str) and isinstance(v, bool | int | float | str)
            for k, v in options.items()):
        raise RematError(f"{fn}: compiler_options must be a mapping of XLA option names to values "
                         f"(bool, int, float or str), as jax.jit(..., compiler_options=...) takes "
                         f"them, got {type(options).__name__} {short(options)}. Fix: e.g. "
                         "compiler_options={'xla_disable_hlo_passes': 'cse'}.")
    return dict(options)
