"""Gradient parity: the loss and gradients of each plan against the model as written, on this
machine's default device, compared with a tolerance derived from the backend and the compute dtype.

A plan changes where values are computed, never what is computed (invariant 1 of the design), so
a plan's gradients differ from the un-annotated model's by round-off alone. A wrong gradient is
the worst failure of remat and offload: it trains on, silently. The suite checks gradients on the
CPU; :func:`verify_parity` (``remat verify --parity``) checks them on the backend at hand, where
the compiler that places offloaded values and the precision of its matrix products are that
device's (https://github.com/jax-remat-plan/jax-remat-plan/blob/main/docs/semantics.md#gradient-parity).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..._errors import RematError, clip
from ..._plan import Plan
from ..._state import StatePlacement
from ._target import MeasureTarget, jittable

#: Round-off allowance in units of the compared precision's epsilon, as the suite's
#: ``fixtures/tolerance.py``: ``|plan - reference| <= ULPS * eps * (|reference| + max|reference|)``
#: elementwise, the max over every leaf of the compared tree. 256 eps is 3.1e-5 in float32.
ULPS = 256
#: Off the CPU the float32 allowance is this many times larger (the suite's rule): a TPU's float32
#: elementwise functions are approximations that a recomputation evaluates again (1.8x seen).
DEVICE_FACTOR = 8
#: The allowance for precisions of 11 significant bits or fewer (bfloat16, float16, TF32): a plan
#: may round an intermediate where the model as written kept it in a wider fusion (a saved
#: residual is stored in the compute dtype); one rounding, carried through the backward pass,
#: stays within a few units. 8 eps of bfloat16 is 0.0625 of ``|reference| + max|reference|``;
#: a wrong gradient is off by the size of the gradient itself.
LOW_ULPS = 8
#: Matrix products of float32 at the default precision: one bfloat16 pass on a TPU, TF32 on a GPU.
_DEFAULT_MATMUL = {"tpu": ("bfloat16", float(jnp.finfo(jnp.bfloat16).eps)),
                   "gpu": ("tensorfloat32", 2.0 ** -10), "cuda": ("tensorfloat32", 2.0 ** -10),
                   "rocm": ("tensorfloat32", 2.0 ** -10)}
_FLOAT32_EPS = float(np.finfo(np.float32).eps)
_EXACT_PRECISIONS = ("highest", "float32")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a plan's values may be from the reference's: ``value * (|reference| +
    max|reference|)`` elementwise, ``value = ulps * eps(precision) * factor``."""

    value: float
    ulps: int
    precision: str
    factor: int
    why: str

    def __str__(self) -> str:
        factor = f" x {self.factor}" if self.factor != 1 else ""
        return (f"{self.value:.3g} = {self.ulps} x eps({self.precision}){factor}, of |reference| + "
                f"max|reference| ({self.why})")


def parity_tolerance(compute_dtype: Any, *, backend: str | None = None,
                     precision: str | None = None) -> Tolerance:
    """The tolerance of a gradient comparison: from the compute dtype, the backend and the matrix
    product precision (``None``: JAX's ambient ``jax_default_matmul_precision``).

    float32 on the CPU: the suite's 256 eps; float32 on a TPU at the default precision: its matrix
    products are bfloat16 passes, so bfloat16's precision; on a GPU, TF32's; at ``"highest"``
    float32's, times :data:`DEVICE_FACTOR` off the CPU; bfloat16 compute: bfloat16's.

    >>> parity_tolerance("float32", backend="cpu").value
    3.0517578125e-05
    >>> parity_tolerance("float32", backend="tpu").precision
    'bfloat16'
    >>> parity_tolerance("float32", backend="tpu", precision="highest").factor
    8
    """
    backend = backend or jax.default_backend()
    precision = precision if precision is not None else jax.config.jax_default_matmul_precision
    dtype = np.dtype(compute_dtype)
    name, eps = dtype.name, float(jnp.finfo(dtype).eps)
    why = f"{name} compute on {backend}"
    matmul = _DEFAULT_MATMUL.get(backend)
    if matmul is not None and eps <= _FLOAT32_EPS and str(precision or "default") not in _EXACT_PRECISIONS:
        name, eps = matmul
        why = (f"float32 matrix products at {precision or 'default'} precision are {name} on "
               f"{backend}; run at precision 'highest' for float32's")
    if eps > _FLOAT32_EPS:
        return Tolerance(LOW_ULPS * eps, LOW_ULPS, name, 1, why)
    factor = 1 if backend == "cpu" else DEVICE_FACTOR
    return Tolerance(ULPS * eps * factor, ULPS, name, factor, why)


def compute_dtype(jaxpr: Any, args: Sequence[Any] = ()) -> np.dtype:
    """The narrowest floating dtype a matrix product of ``jaxpr`` (a traced loss, its sub-jaxprs
    included) takes: what the model computes in. Without matrix products, the widest floating
    dtype of ``args``' leaves (float32 when none)."""
    seen: set[np.dtype] = set()

    def walk(j: Any) -> None:
        for eqn in j.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated", "ragged_dot_general"):
                seen.update(np.dtype(v.aval.dtype) for v in eqn.invars
                            if jnp.issubdtype(v.aval.dtype, jnp.floating))
            for p in eqn.params.values():
                for sub in p if isinstance(p, tuple | list) else (p,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(getattr(jaxpr, "jaxpr", jaxpr))
    if seen:
        return max(seen, key=lambda d: float(jnp.finfo(d).eps))
    floats = [np.dtype(x.dtype) for x in jax.tree.leaves(args)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    return min(floats, key=lambda d: float(jnp.finfo(d).eps), default=np.dtype(np.float32))


@dataclasses.dataclass(frozen=True)
class Difference:
    """A comparison of a tree of values with the reference's: the largest absolute difference,
    the largest relative one (of a leaf's ``max|Δ|`` to its ``max|reference|``), the leaf that
    uses most of the tolerance and how much of it (``used <= 1`` passes)."""

    abs: float
    rel: float
    used: float
    worst: str

    @property
    def ok(self) -> bool:
        return self.used <= 1.0

    def to_json(self) -> dict[str, Any]:
        return {k: _finite(v) if isinstance(v, float) else v
                for k, v in dataclasses.asdict(self).items()}


def _finite(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


def compare(got: Sequence[tuple[str, Any]], ref: Sequence[tuple[str, Any]], tol: float) -> Difference:
    """``got`` against ``ref`` (``(path, array)`` pairs, leaf for leaf) at tolerance ``tol``:
    ``|got - ref| <= tol * (|ref| + max|ref|)``, the max over every floating leaf of ``ref``.
    Integer leaves must be equal; a NaN where the reference has a number uses the whole
    tolerance and more (``used`` is infinite)."""
    if len(got) != len(ref):
        return Difference(float("inf"), float("inf"), float("inf"),
                          f"{len(got)} leaves where the reference has {len(ref)}")
    refs = [np.asarray(b) for _, b in ref]
    scale = max((float(np.max(np.abs(b.astype(np.float64)))) for b in refs
                 if b.size and np.issubdtype(b.dtype, np.inexact)), default=0.0)
    out = Difference(0.0, 0.0, 0.0, "")
    for (path, a), b in zip(got, refs):
        a = np.asarray(a)
        if a.shape != b.shape:
            return Difference(float("inf"), float("inf"), float("inf"),
                              f"{path}: shape {a.shape} where the reference has {b.shape}")
        if not np.issubdtype(b.dtype, np.inexact):
            same = bool(np.array_equal(a, b))
            d = Difference(0.0 if same else float("inf"), 0.0 if same else float("inf"),
                           0.0 if same else float("inf"), path)
        elif not b.size:
            continue
        else:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            diff = np.abs(a64 - b64)
            bound = tol * (np.abs(b64) + scale)
            with np.errstate(divide="ignore", invalid="ignore"):
                used = np.where(diff == 0, 0.0, diff / bound)
            top = float(np.max(diff)) if not np.isnan(diff).any() else float("inf")
            peak = float(np.max(np.abs(b64)))
            d = Difference(top, top / peak if peak else (0.0 if top == 0 else float("inf")),
                           float(np.nanmax(used)) if not np.isnan(used).any() else float("inf"), path)
        out = Difference(max(out.abs, d.abs), max(out.rel, d.rel),
                         max(out.used, d.used), d.worst if d.used > out.used or not out.worst else out.worst)
    return out


@dataclasses.dataclass(frozen=True)
class PlanParity:
    """One plan's parity with the model as written.

    Attributes:
      name: the plan's name.
      status: ``"ok"``, ``"fail"`` (a loss, gradient or state step beyond the tolerance),
        ``"refused"`` (the project refused the plan as a :class:`~remat_common.PlanError`, or JAX
        refused to trace or compile it: not a failure) or ``"error"`` (anything else raised).
      loss, grads: the loss's and the gradients' :class:`Difference` (``None`` when refused).
      step: for a plan that keeps training state on host (``state:``), the training step's
        outputs (new state and loss) against the same plan's step with the state on device.
      message: why it was refused or raised.
      plan: the plan's config (:meth:`remat_common.Plan.to_config`), to reproduce it.
      seconds: building, compiling and running it.
    """

    name: str
    status: str
    loss: Difference | None = None
    grads: Difference | None = None
    step: Difference | None = None
    message: str = ""
    plan: Mapping[str, Any] | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status,
                **{k: None if v is None else v.to_json()
                   for k, v in (("loss", self.loss), ("grads", self.grads), ("step", self.step))},
                "message": self.message, "plan": self.plan, "seconds": round(self.seconds, 2)}


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """:func:`verify_parity`'s result: where it ran, the tolerance, and each plan's parity."""

    backend: str
    device: str
    jax_version: str
    compute_dtype: str
    precision: str
    tolerance: Tolerance
    plans: tuple[PlanParity, ...]

    @property
    def ok(self) -> bool:
        """No plan failed or raised (refused plans are not failures)."""
        return all(p.status in ("ok", "refused") for p in self.plans)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("ok", "fail", "refused", "error"), 0)
        for p in self.plans:
            out[p.status] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "jax": self.jax_version,
                "compute_dtype": self.compute_dtype, "precision": self.precision,
                "tolerance": dataclasses.asdict(self.tolerance), "ok": self.ok,
                "counts": self.counts(), "plans": [p.to_json() for p in self.plans]}

    def __str__(self) -> str:
        head = (f"parity on {self.backend} ({self.device}), jax {self.jax_version}; compute "
                f"{self.compute_dtype}, matrix products at precision {self.precision}\n"
                f"reference: the model as written (no plan); tolerance {self.tolerance}")
        w = max([len(p.name) for p in self.plans] + [4])
        cols = (f"{'plan':<{w}}  {'status':<7}  {'loss |Δ|':>9}  {'loss rel':>9}  "
                f"{'grad |Δ|':>9}  {'grad rel':>9}  {'tol used':>8}  worst parameter")
        lines = [head, cols]
        for p in self.plans:
            if p.loss is None or p.grads is None:
                lines.append(f"{p.name:<{w}}  {p.status:<7}  {clip(p.message, 400)}")
                continue
            used = max(p.loss.used, p.grads.used)
            lines.append(f"{p.name:<{w}}  {p.status:<7}  {_g(p.loss.abs):>9}  {_g(p.loss.rel):>9}  "
                         f"{_g(p.grads.abs):>9}  {_g(p.grads.rel):>9}  {_g(used):>8}  "
                         f"{p.grads.worst if p.grads.abs else '-'}")
            if p.step is not None:
                lines.append(f"{'':<{w}}  {'':<7}  state on host: step outputs against the same "
                             f"plan's with its state on device: max |Δ| {_g(p.step.abs)}, tol used "
                             f"{_g(p.step.used)} ({p.step.worst if p.step.abs else '-'})")
            if p.status != "ok":
                lines.append(f"{'':<{w}}  {'':<7}  {p.message}")
        for p in self.plans:
            if p.status != "ok" and p.plan is not None:
                shown = {k: v for k, v in p.plan.items() if k in ("rules", "state")}
                lines.append(f"plan {p.name}: {json.dumps(shown)}")
        c = self.counts()
        lines.append(f"{len(self.plans)} plan(s): {c['ok']} ok, {c['fail']} failed, "
                     f"{c['refused']} refused, {c['error']} raised")
        return "\n".join(lines)


def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def _differentiable(args: Sequence[Any]) -> tuple[int, ...]:
    """The arguments to differentiate: those whose array leaves are all floating (the
    parameters; not the token ids)."""
    out = []
    for i, a in enumerate(args):
        leaves = [x for x in jax.tree.leaves(a) if hasattr(x, "dtype")]
        if leaves and all(jnp.issubdtype(x.dtype, jnp.inexact) for x in leaves):
            out.append(i)
    return tuple(out)


def _key(path: Any) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".")


def _loss_and_grads(t: MeasureTarget) -> tuple[Any, list[tuple[str, Any]], Any]:
    """The loss, the gradients as ``(path, array)`` and the traced jaxpr, computed on the default
    device by one jitted ``value_and_grad``."""
    argnums = _differentiable(t.loss_args)
    if not argnums:
        raise RematError("remat_common.verify_parity: the target's loss_args hold no argument of "
                         "floating-point arrays to differentiate (the parameters). Fix: pass the "
                         "parameters as MeasureTarget.loss_args[0].")
    # one argument (the parameters): its gradient alone, so that paths read `blocks.0.attn...`
    which = argnums[0] if len(argnums) == 1 else argnums
    traced = jax.jit(jax.value_and_grad(t.loss_fn, argnums=which)).trace(*t.loss_args)
    loss, grads = traced.lower().compile()(*t.loss_args)
    paths = jax.tree_util.tree_flatten_with_path(jax.device_get(grads))[0]
    return np.asarray(jax.device_get(loss)), [(_key(p), g) for p, g in paths], traced.jaxpr


def _step_outputs(t: MeasureTarget) -> list[tuple[str, Any]]:
    """One training step's outputs (new state and loss), as ``(path, array)``."""
    fn, args = jittable(t.step_fn, tuple(t.step_args))
    outs = jax.device_get(jax.jit(fn)(*args))
    return [(_key(p), o) for p, o in zip(fn.out_paths, outs)]  # type: ignore[attr-defined]


def _refused(e: BaseException) -> bool:
    """Whether ``e`` is the project or JAX refusing the plan, rather than a crash. A project error
    that wraps a crash of the model's own code (``remat report``'s config builder does) is a crash."""
    if isinstance(e, RematError):
        return e.__cause__ is None or _refused(e.__cause__)
    if isinstance(e, NotImplementedError):
        return True
    if type(e).__module__.split(".")[0] in ("jax", "jaxlib"):
        return True
    tb = e.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    where = last.tb_frame.f_code.co_filename if last is not None else ""
    return any(f"{os.sep}{pkg}{os.sep}" in where for pkg in ("jax", "jaxlib"))


def coerce_plan(value: Any) -> Plan:
    """A plan from a :class:`~remat_common.Plan`, a plan config (``{"rules": ..., "state": ...}``,
    as :meth:`~remat_common.Plan.from_config` reads), a ``{pattern: annotation}`` mapping or a
    path."""
    if isinstance(value, Mapping) and "rules" in value:
        return Plan.from_config(value)
    return Plan.coerce(value)


@contextlib.contextmanager
def _matmul_precision(precision: str | None) -> Iterator[None]:
    if precision is None:
        yield
    else:
        with jax.default_matmul_precision(precision):
            yield


def verify_parity(builder: Callable[[Plan | None], MeasureTarget], plans: Mapping[str, Any], *,
                  precision: str | None = None,
                  progress: Callable[[PlanParity], None] | None = None) -> ParityReport:
    """The loss and gradients of each plan against the model as written, on this machine's
    default device.

    ``builder(plan)`` returns the model's :class:`MeasureTarget` under ``plan`` (``None``: the
    model as written, the reference that saves everything), as ``remat report`` targets do. Each
    plan's ``jax.value_and_grad`` of ``loss_fn`` (with respect to its floating-point arguments,
    the parameters) is jitted and run, and compared leaf by leaf with the reference's at the
    :func:`parity_tolerance` of the backend and the compute dtype (the narrowest dtype the loss's
    matrix products take). A plan that keeps training state on host (``state:``) also runs one
    training step, compared with the same plan's step with the state on device. A plan the project
    refuses (a :class:`~remat_common.PlanError`) or JAX refuses is ``"refused"``, not a failure.
    See https://docs.jax.dev/en/latest/gradient-checkpointing.html for what a plan changes.

    Args:
      builder: ``builder(plan | None) -> MeasureTarget``.
      plans: name -> plan (a :class:`~remat_common.Plan`, a plan config, a mapping of rules or a
        path; ``None`` entries, the reference itself, are skipped).
      precision: run under ``jax.default_matmul_precision(precision)`` (``"highest"``: float32
        matrix products in float32 on a TPU); ``None``: the ambient precision.
      progress: called with each plan's result as it is done.

    Returns:
      A :class:`ParityReport`; ``report.ok`` is False when a plan failed or raised.

    >>> import jax.numpy as jnp
    >>> import remat_common as rc
    >>> from remat_common.measurement import MeasureTarget
    >>> def build(plan):
    ...     layer = rc.checkpoint(lambda w, x: jnp.tanh(x @ w), "recompute") if plan else (
    ...         lambda w, x: jnp.tanh(x @ w))
    ...     loss = lambda w, x: jnp.sum(layer(w, layer(w, x)))
    ...     return MeasureTarget(loss, (jnp.eye(4), jnp.ones((2, 4))), loss, ())
    >>> report = rc.verify_parity(build, {"recompute": {"layer": "recompute"}})
    >>> report.ok, report.plans[0].status, report.plans[0].grads.used <= 1
    (True, 'ok', True)
    """
    with _matmul_precision(precision):
        ref_t = builder(None)
        ref_loss, ref_grads, jaxpr = _loss_and_grads(ref_t)
        dtype = compute_dtype(jaxpr, ref_t.loss_args)
        tol = parity_tolerance(dtype, precision=precision)
        rows = []
        for name, value in plans.items():
            if value is None:
                continue
            row = _one(str(name), value, builder, ref_loss, ref_grads, tol)
            rows.append(row)
            if progress is not None:
                progress(row)
    device = jax.devices()[0]
    return ParityReport(jax.default_backend(), str(getattr(device, "device_kind", device)),
                        jax.__version__, dtype.name,
                        str(precision or jax.config.jax_default_matmul_precision or "default"),
                        tol, tuple(rows))


def _one(name: str, value: Any, builder: Callable[[Plan | None], MeasureTarget], ref_loss: Any,
         ref_grads: list[tuple[str, Any]], tol: Tolerance) -> PlanParity:
    t0 = time.perf_counter()
    config = value if isinstance(value, Mapping) and "rules" in value else None
    try:
        plan = coerce_plan(value)
        config = plan.to_config()
        target = builder(plan)
        loss, grads, _ = _loss_and_grads(target)
        dl = compare([("loss", loss)], [("loss", ref_loss)], tol.value / 2)  # (|b| + max|b|) = 2|b|
        dg = compare(grads, ref_grads, tol.value)
        step = None
        if target.state is not None and not target.state.is_default:
            on_device = builder(dataclasses.replace(plan, state=StatePlacement()))
            step = compare(_step_outputs(target), _step_outputs(on_device), tol.value)
        bad = [(what, d) for what, d in (("the loss", dl), ("the gradients", dg),
                                         ("the state-on-host step", step)) if d is not None and not d.ok]
        msg = (f"plan {name!r}: {' and '.join(w for w, _ in bad)} differ from the model as written "
               f"beyond the tolerance (worst: {bad[0][1].worst}, {_g(bad[0][1].used)} times the "
               "tolerance): a wrong gradient. Report it with the plan, this output and `remat "
               "doctor`'s.") if bad else ""
        return PlanParity(name, "fail" if bad else "ok", dl, dg, step, msg, config,
                          time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - each plan's outcome is recorded, the run goes on
        status = "refused" if _refused(e) else "error"
        return PlanParity(name, status, message=f"{type(e).__name__}: {clip(str(e), 600)}",
                          plan=config, seconds=time.perf_counter() - t0)
