"""Measuring what a plan costs: the target a model provides, and the report per plan."""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Literal

import jax

from ..._capabilities import Capabilities, capabilities
from ..._compiler import compiler_identity
from ..._compile import CompiledBoundary, CompiledPlan
from ..._context import defer_name_checks
from ..._errors import RematError, check_bool, check_count, sorted_list
from ..._module_calls import ModuleCalls, scoped_module_calls
from ..._plan import Plan
from ..._resolve import layer_groups
from ..._verify import verify
from ..._residuals import Residual, saved_residuals
from ..accelerators._accelerators import Accelerator
from ..accelerators._compilers import compile_lowered
from ..accelerators._hlo import host_placements
from ..accelerators._profiles import HostLink, host_link
from ..breakdown._breakdown import breakdown_of, step_facts
from ..breakdown._figures import Group, MemoryBreakdown
from ._flops import count_flops
from ._layout import LayoutCheck, checked_stacks, reference_key, reference_plans, resolution_key
from ._layout import stack_param_bytes
from ._placements import placement_counts, placements_in_module
from ._report import (
    MemoryFigures,
    PlacementCheck,
    PlanReport,
    RefusedPlan,
    Report,
    StepTiming,
    accelerator_record,
    backend_notes,
    target_notes,
)
from ._state_transfer import StateFigures, state_figures
from ._step import FedSteps
from ._verify_target import offloads_asked, placement_problems
from ._notes import recomputes as _recomputes
from ._notes import with_cse_note as _with_cse_note
from ._notes import with_flops_below_note as _with_flops_below_note
from ._target import CompilerRefused, MeasureTarget, jittable, check_step, Where
from ._target import LOCAL as _LOCAL


# -- measuring -----------------------------------------------------------------------------------

Stage = Literal["build", "compile", "residuals", "placement", "reference", "time", "done"]


@dataclasses.dataclass(frozen=True)
class MeasureEvent:
    """Where :func:`measure` is: ``stage`` of ``plan`` (``None`` while timing all plans), unit
    ``index`` of ``total`` (four per plan, one per timing round: of all plans on a CPU, of each
    plan on an accelerator); the last event is ``done``.
    ``reference``: compiling a reference of the plan's layout check (not counted in ``total``)."""

    stage: Stage
    plan: str | None
    index: int
    total: int


Progress = Callable[[MeasureEvent], None]


def _placement_check(jitted: Any, args: tuple[Any, ...], platform: str,
                     offloaded: int) -> PlacementCheck:
    try:
        exported = jax.export.export(jitted, platforms=[platform])(*args)
        text = exported.mlir_module()
    except Exception as e:  # noqa: BLE001 - reported, not raised: the check is advisory
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return PlacementCheck(platform, (), offloaded, f"{type(e).__name__}: {first}")
    counts = placement_counts(text)
    try:
        placed = placements_in_module(text) or ()
    except Exception:  # noqa: BLE001 - propagation is extra detail: the counts stand without it
        placed = ()
    return PlacementCheck(
        platform, tuple(sorted(counts.items())), offloaded,
        resharded=sum(not p.keeps_sharding for p in placed),
        host_bytes_per_device=sum(p.shard_nbytes for p in placed if p.to_host))


def _names_summary(names: frozenset[str]) -> str:
    leaves = sorted({n.rpartition("/")[2] for n in names})
    return "{" + ", ".join(leaves) + "}" + (f" ({len(names)} tags)" if len(names) > len(leaves) else "")


def _describe(b: CompiledBoundary) -> str:
    """One boundary in a line: path, policy, and the kept names by leaf name."""
    bits = [f"{b.path or '<root>'}: {b.policy_name}"]
    if b.spec.save:
        bits.append(f"save {_names_summary(b.spec.save)}")
    if b.spec.offload:
        bits.append(f"offload {_names_summary(b.spec.offload)} "
                    f"{b.spec.offload_src}->{b.spec.offload_dst}")
    return " ".join(bits)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


@dataclasses.dataclass
class _Compiled:
    name: str
    target: MeasureTarget
    plan: Plan | None
    compiled: Any
    args: tuple[Any, ...]
    jitted: Any
    lower_s: float
    compile_s: float
    dump: str | None = None  # XLA's dump of the compile, read (and removed) by _breakdown
    fn: Any = None  # the jitted function (its arg_leaves, out_paths)
    calls: ModuleCalls | None = None  # the module calls its trace scoped
    donated: tuple[int, ...] = ()  # the inputs the step donates (its state)
    times: list[float] = dataclasses.field(default_factory=list)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)  # PlanReport's fields
    xla_remat: str | None = None


_MSG_TARGET = """\
remat_common.measurement.measure: {what}.
Give either a builder ``build(plan) -> MeasureTarget`` with ``plans={{name: plan or None}}``, or
``{{name: MeasureTarget}}`` with no ``plans``, or one MeasureTarget."""


def _same(t: MeasureTarget) -> MeasureTarget:
    return t


def _targets(target: Any, plans: Mapping[str, Any] | None
             ) -> list[tuple[str, Plan | None, Callable[[], MeasureTarget]]]:
    if isinstance(target, MeasureTarget):
        if plans is not None:
            raise RematError(_MSG_TARGET.format(what="got one MeasureTarget and plans"))
        t = target
        return [("step", None, lambda: t)]
    if isinstance(target, Mapping):
        if plans is not None:
            raise RematError(_MSG_TARGET.format(what="got a mapping of targets and plans"))
        out: list[tuple[str, Plan | None, Callable[[], MeasureTarget]]] = []
        for name, t in target.items():
            if not isinstance(t, MeasureTarget):
                raise RematError(_MSG_TARGET.format(
                    what=f"target {name!r} is a {type(t).__name__}, not a MeasureTarget"))
            out.append((str(name), None, functools.partial(_same, t)))
        return out
    if callable(target):
        if plans is None or not isinstance(plans, Mapping) or not plans:
            raise RematError(_MSG_TARGET.format(
                what=f"a builder needs a non-empty mapping plans={{name: plan}}, got {plans!r}"))
        out = []  # same element type as above
        for name, p in plans.items():
            plan = None if p is None else Plan.coerce(p)
            out.append((str(name), plan, functools.partial(target, plan)))
        return out
    raise RematError(_MSG_TARGET.format(what=f"cannot measure a {type(target).__name__}"))


def measure(
    target: Callable[[Plan | None], MeasureTarget] | Mapping[str, MeasureTarget] | MeasureTarget,
    plans: Mapping[str, Any] | None = None,
    *,
    baseline: str | None = None,
    steps: int = 10,
    warmup: int = 2,
    placement: bool | None = None,
    platform: str = "cuda",
    progress: Progress | None = None,
    accelerator: str | Accelerator | None = None,
    mesh: str | Mapping[str, int] | None = None,
    check_layouts: bool = True,
    compiler_options: Mapping[str, Any] | None = None,
) -> Report:
    """Compiles a training step under each plan and measures what each costs, side by side.

    For every plan: the residuals that reverse-mode AD of the loss keeps, by module path and
    name, with placement and bytes (checked against the plan by :func:`verify`); the compiled
    step's ``memory_analysis()`` and ``cost_analysis()`` FLOPs; the FLOP ratio against the
    baseline (recomputation overhead); host transfer bytes per step; whether offloads are placed
    on host in the step lowered for ``platform`` (``jax.export``, which works without that
    device); lower and compile times; and the median step time after warm-up. Steps of all plans
    are interleaved round by round, so step times are comparable as ratios within one report
    (all plans' compiled steps and arguments are held at once while timing; ``steps=0`` skips
    it). Verification problems are recorded in the report, not raised. With a builder, a plan that
    splits a scanned stack into layer groups or nests it is checked against one scan of the
    stack's layers (:attr:`PlanReport.layout`; the references are built and compiled once per
    report): a temp more than 5 % of the stack's parameter bytes above it is a problem.

    Args:
      target: a builder ``build(plan) -> MeasureTarget`` (called once per plan with a
        :class:`Plan`, or ``None`` for the un-annotated model), or ``{name: MeasureTarget}``,
        or a single :class:`MeasureTarget`.
      plans: with a builder, ``{name: plan}``; each plan is anything :meth:`Plan.coerce` takes
        (a mapping, a rule list, a file path) or ``None``.
      baseline: the plan ratios are taken against; default the first ``None`` plan, else the first.
      steps: timed steps per plan (0: compile only, no step is run).
      warmup: untimed steps per plan before timing.
      placement: lower for ``platform`` and count host placements; default: for plans that
        offload something.
      platform: the platform to lower for in the placement check.
      progress: called with a :class:`MeasureEvent` before each stage of each plan (build,
        compile, residuals, placement), before each timing round, and once when done.
      accelerator: compile for this accelerator instead of this machine (``h100x8``,
        ``v5p:2x2x2``, a GPU target-config file; :func:`parse_accelerator`): memory, FLOPs and
        host placements are then the target compiler's, per device, and no step is run (no
        timing). ``None``/``"local"``: this machine.
      mesh: the accelerator's devices as ``"data=2,fsdp=4"`` or ``{"fsdp": 8}`` (default: data
        parallel over all of them; :func:`parse_mesh`). With the local accelerator, this machine's
        devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8`` gives a CPU 8): the same
        layout compiled by the local compiler, to set beside a target's figures.
      check_layouts: with a builder, the layout check of plans that split a scanned stack into
        layer groups or nest it (it compiles their one-scan references); ``False`` skips it.
      compiler_options: XLA options for every compile, as ``jax.jit(..., compiler_options=...)``
        takes them: ``{"xla_disable_hlo_passes": "cse"}`` on jax 0.11.0's CPU, whose CSE merges
        the recomputation back (the report's notes say where), makes it show. Where they change
        the program, so do the figures: compare plans measured under the same options.

    Returns:
      A :class:`Report`.

    >>> import jax, jax.numpy as jnp
    >>> from remat_common import checkpoint_name, compile_plan
    >>> from remat_common.adapter import call_module
    >>> from remat_common.measurement import MeasureTarget
    >>> from remat_common import resolve
    >>> from remat_common.measurement import measure
    >>> def build(plan):
    ...     compiled = None if plan is None else compile_plan(resolve(plan, ["mlp"]))
    ...     layer = lambda w, x: jnp.tanh(checkpoint_name(x @ w, "h")) @ w
    ...     def loss(w, x):
    ...         y = layer(w, x) if plan is None else call_module(compiled, "mlp", layer, w, x)
    ...         return jnp.sum(y ** 2)
    ...     step = lambda w, x: w - 0.1 * jax.grad(loss)(w, x)
    ...     args = (jnp.eye(32), jnp.ones((8, 32)))
    ...     return MeasureTarget(loss, args, step, args, compiled)
    >>> rep = measure(build, {"none": None, "recompute": {"mlp": "recompute"}}, steps=2, warmup=1)
    >>> rep["recompute"].device_bytes < rep["none"].device_bytes
    True
    >>> rep["recompute"].flop_ratio > 1.0 or "CSE" in rep["recompute"].notes[-1]  # jax 0.11.0 CPU
    True
    """
    for name, v in (("steps", steps), ("warmup", warmup)):
        check_count("remat_common.measurement.measure", name, v, 0)
    check_bool("remat_common.measurement.measure", "check_layouts", check_layouts)
    if placement is not None and not isinstance(placement, bool):
        raise RematError(f"remat_common.measurement.measure: placement must be True, False or "
                         f"None (the default), got {type(placement).__name__} {placement!r:.60}.")
    items = _targets(target, plans)
    names = [n for n, _, _ in items]
    baseline = _baseline(items, baseline)
    where = Where.of(accelerator, mesh, compiler_options)
    if not where.acc.is_local:
        steps = 0  # a target compile has no device to run on
    rounds = warmup + steps if steps else 0
    # on an accelerator each plan is timed once measured, before the next is built: its state
    # parked on host meanwhile (:func:`_park`), so that host and device hold one plan's state at
    # a time (five parked states of a 533 M-parameter model ran a 40 GiB TPU host out of memory)
    one_by_one = bool(rounds) and jax.default_backend() != "cpu"
    release_device_memory()  # what a search before this call built and let go of
    tick = _Ticker(progress, 4 * len(items) + rounds * (len(items) if one_by_one else 1))
    caps = capabilities()
    built: list[_Compiled] = []
    refused: list[RefusedPlan] = []
    with defer_name_checks():  # a name no tag produces is one of each plan's reported problems
        for name, plan, make in items:
            try:
                built.append(_measure_plan(name, plan, make, tick, placement, platform, where))
            except CompilerRefused as e:  # out of the target's memory: a row, not the end
                refused.append(RefusedPlan(name, None if plan is None else plan.to_config(),
                                           e.error, e.seconds))
                continue
            if one_by_one and not _abstract(built[-1].args):
                _park(built[-1], jax.devices("cpu")[0])
                release_device_memory()
                _time_steps(built[-1:], rounds, warmup, tick)
            elif not rounds:  # compiled only: its arrays are not needed again, nor held
                _park(built[-1], None)
                release_device_memory()
        if not built:
            raise RematError(
                f"remat_common.measurement.measure: the {where.acc.name} compiler refused every "
                f"plan ({sorted_list(names)}) as out of its device memory: "
                f"{refused[0].error} Fix: a smaller size (remat report --size batch=N), more "
                "devices (--accelerator NAMExN, or a larger slice), or another --mesh.")
        if baseline in {r.name for r in refused}:
            baseline = built[0].name
        abstract = [c.name for c in built if _abstract(c.args)]
        if rounds and abstract:
            raise RematError(
                f"remat_common.measurement.measure: plan(s) {sorted_list(abstract)}: the step's "
                "arguments are abstract (jax.ShapeDtypeStruct: an nnx.eval_shape or "
                "eqx.filter_eval_shape model), so it can be compiled but not run. Fix: pass "
                "steps=0 (remat report --steps 0), or give an accelerator.")
        if check_layouts and callable(target) and not isinstance(target, MeasureTarget | Mapping):
            _check_layouts(built, target, where, tick)
        if not one_by_one:
            _time_steps(built, rounds, warmup, tick)
    tick(None, "done")
    report = _report(built, [c.name for c in built], baseline, caps, warmup if steps else 0, where)
    return dataclasses.replace(report, refused=tuple(refused)) if refused else report


# -- the stages of measure() -----------------------------------------------------------------------

def _baseline(items: list[tuple[str, Plan | None, Callable[[], MeasureTarget]]],
              baseline: str | None) -> str:
    """Checks the plan names are unique; the baseline: the one given, else the first ``None`` plan,
    else the first."""
    names = [n for n, _, _ in items]
    if len(set(names)) != len(names):
        raise RematError(f"remat_common.measurement.measure: plan names must be unique, got {names}.")
    if baseline is None:
        return next((n for n, p, _ in items if p is None), names[0])
    if baseline not in names:
        raise RematError(f"remat_common.measurement.measure: baseline {baseline!r} is not a plan; "
                         f"plans: {sorted_list(names)}. Fix: pass one of them.")
    return baseline


class _Ticker:
    """Reports each stage to ``progress`` as a :class:`MeasureEvent`, counting units done."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, name: str | None, stage: Stage) -> None:
        self.note(name, stage)
        self.done += 1

    def note(self, name: str | None, stage: Stage) -> None:
        """Reports ``stage`` without counting a unit."""
        if self.progress is not None:
            self.progress(MeasureEvent(stage, name, self.done, self.total))


def _build(name: str, make: Callable[[], MeasureTarget]) -> MeasureTarget:
    t = make()
    if not isinstance(t, MeasureTarget):
        raise RematError(f"remat_common.measurement.measure: the builder returned a "
                         f"{type(t).__name__} for plan {name!r}; it must return a "
                         "remat_common.measurement.MeasureTarget.")
    return t


def _abstract(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, jax.ShapeDtypeStruct) for a in args)


def _compile(name: str, t: MeasureTarget, plan: Plan | None, where: Where = _LOCAL) -> _Compiled:
    """Lowers and compiles the step (timed), and checks it has a backward pass and the plan's
    boundaries."""
    fn, args = jittable(t.step_fn, tuple(t.step_args))
    t0 = time.perf_counter()
    with scoped_module_calls() as calls:  # every module call in a named scope of its path
        lowered = where.lower(t, fn, args)
    t1 = time.perf_counter()
    jitted = jax.jit(fn, donate_argnums=lowered.donated)  # the same step, for jax.export
    tc = where.compile(lowered)
    if tc.compiled is None:
        raise CompilerRefused(f"remat_common.measurement.measure: plan {name!r}: the "
                              f"{where.acc.name} compiler refused the step: {tc.error}", tc.error,
                              t1 - t0 + tc.compile_s)
    try:
        check_step(name, tc.compiled, t.plan, functools.partial(jax.make_jaxpr(fn), *args), t)
    except RematError:
        breakdown_of(tc.dump, step_facts((), (), ()), compiler="")  # removes the dump
        raise
    c = _Compiled(name, t, plan, tc.compiled, args, jitted, t1 - t0, tc.compile_s, tc.dump, fn,
                  calls, lowered.donated)
    c.xla_remat = tc.xla_remat
    return c


def _breakdown(dump: str | None, t: MeasureTarget, fn: Any, residuals: tuple[Residual, ...],
               where: Where = _LOCAL, calls: ModuleCalls | None = None,
               memory: MemoryFigures | None = None) -> MemoryBreakdown | None:
    """The peak breakdown of a compiled step from its dump (removed afterwards); ``calls``: the
    module calls its trace scoped (their paths are modules too, their scans layer groups). Its
    peak is ``memory``'s (``device_total``: the compiler's own accounting, one peak in table,
    breakdown and JSON), any difference from the buffer assignment a row of its own."""
    paths = set(t.plan.resolution.paths) if t.plan is not None else set()
    scoped = calls.scoped if calls is not None else set()
    facts = step_facts(tuple(t.loss_args), fn.arg_leaves, fn.out_paths, residuals,
                       sorted(paths | scoped) if paths or scoped else None,
                       math.prod(where.mesh.values()) if where.mesh else 1)
    if where.acc.is_local:
        b = breakdown_of(dump, facts, compiler=jax.default_backend())
    else:
        try:  # the buffer assignment of the target's compiler, where it reads as XLA:CPU's does
            b = breakdown_of(dump, facts, compiler=where.acc.platform)
        except Exception:  # noqa: BLE001 - the breakdown is extra detail: the figures stand without it
            b = None
    if b is None:
        return b
    groups = {g[0]: g for g in (calls.groups.values() if calls is not None else ())}
    groups.update((g[0], g) for g in (_scanned_groups(t.plan) if t.plan is not None else ()))
    b = dataclasses.replace(b, groups=tuple(groups.values()))
    return b if memory is None else b.reconciled(memory.device_total)


def _scanned_groups(plan: CompiledPlan) -> tuple[Group, ...]:
    """``(path, label, layers, layer paths)`` of each group of layers whose values carry the
    first layer's path in the compiled step: a stack's layer group run as one scan, list layers
    sharing one traced boundary (``compile_plan(share_alike_layers=True)``)."""
    r = plan.resolution
    out: list[Group] = []
    for stack in r.stacks:
        prefix = f"{stack}." if stack else ""
        n = sum(1 for p in r.paths if p.startswith(prefix) and p[len(prefix):].isdigit())
        out.extend((g.path, f"{prefix}{g.start}-{g.stop - 1}", g.stop - g.start,
                    tuple(f"{prefix}{i}" for i in range(g.start, g.stop)))
                   for g in layer_groups(r, stack, n) if g.stop - g.start > 1)
    for first, layers in plan.shared_groups():
        stack, _, head = first.rpartition(".")
        idx = [int(p.rpartition(".")[2]) for p in layers if p.rpartition(".")[2].isdigit()]
        prefix = f"{stack}." if stack else ""
        contiguous = len(idx) == len(layers) and idx == list(range(idx[0], idx[0] + len(idx)))
        label = (f"{prefix}{idx[0]}-{idx[-1]}" if contiguous and len(idx) > 1
                 else f"{first} (shared x{len(layers)})")
        out.append((first, label, len(layers), tuple(layers)))
    return tuple(out)


def _residuals(t: MeasureTarget, plan: Plan | None) -> dict[str, Any]:
    """The residuals of the loss, verified against the compiled plan when the target has one;
    every module call traced in a named scope of its path (the residuals' modules)."""
    with scoped_module_calls():
        return _traced_residuals(t, plan)


def _traced_residuals(t: MeasureTarget, plan: Plan | None) -> dict[str, Any]:
    if t.plan is not None:
        v = verify(t.loss_fn, *t.loss_args, plan=t.plan, strict=False)
        return dict(residuals=tuple(v.report.residuals), problems=tuple(v.problems),
                    notes=tuple(v.notes), boundaries=tuple(_describe(b) for b in t.plan.boundaries),
                    shared=t.plan.shared_groups())
    notes: tuple[str, ...] = ()
    if plan is not None and plan.rules:
        notes = ("the target returned no compiled plan (MeasureTarget.plan), so the residuals "
                 "were not checked against the plan.",)
    return dict(residuals=tuple(saved_residuals(t.loss_fn, *t.loss_args).residuals), problems=(),
                notes=notes, boundaries=())


def _placement(c: _Compiled, residuals: tuple[Residual, ...], placement: bool | None,
               platform: str) -> PlacementCheck | None:
    """Host placements in the step lowered for ``platform``: when asked, or when it offloads."""
    offloaded = sum(1 for r in residuals if r.placement == "host")
    plan = c.target.plan
    wants_host = offloaded > 0 or (plan is not None and any(b.spec.offload for b in plan.boundaries))
    if placement or (placement is None and wants_host):
        return _placement_check(c.jitted, c.args, platform, offloaded)
    return None


def _target_placement(compiled: Any, residuals: tuple[Residual, ...], acc: Accelerator,
                      memory: MemoryFigures, state: bool = False) -> PlacementCheck:
    """Host placements read from the program the target's compiler produced (memory space 5)."""
    try:
        text = compiled.as_text()
    except Exception as e:  # noqa: BLE001 - advisory, as the export check
        return PlacementCheck(acc.name, (), 0, f"{type(e).__name__}: the compiled HLO is not available")
    offloaded = sum(1 for r in residuals if r.placement == "host")
    return PlacementCheck(acc.name, tuple(sorted(host_placements(text).items())), offloaded,
                          host_bytes_per_device=memory.host_temp_size_in_bytes or 0,
                          state_on_host=state)


def _placement_problems(figures: dict[str, Any], plan: CompiledPlan | None,
                        check: PlacementCheck | None) -> None:
    """Adds to ``figures["problems"]`` what the target's placements (``check``) say against the
    plan: an offload the target's compiler did not place in host memory, host placements the plan
    did not ask for (:func:`._verify_target.placement_problems`)."""
    if plan is None or check is None or check.error:
        return
    if check.state_on_host and not any(b.spec.offload for b in plan.boundaries):
        return  # the state's moves are the host placements: what the plan's state: asked for
    host = [r for r in figures["residuals"] if r.placement == "host"]
    asked = offloads_asked(plan, frozenset(r.name for r in host if r.name),
                           sum(r.nbytes for r in host))
    figures["problems"] = (*figures["problems"],
                           *placement_problems(asked, dict(check.placements), check.platform))


def _measure_plan(name: str, plan: Plan | None, make: Callable[[], MeasureTarget], tick: _Ticker,
                  placement: bool | None, platform: str, where: Where = _LOCAL) -> _Compiled:
    """Build, compile, residuals, placement and compiled figures of one plan (not yet timed)."""
    tick(name, "build")
    t = _build(name, make)
    tick(name, "compile")
    c = _compile(name, t, plan, where)
    tick(name, "residuals")
    figures = _residuals(t, plan)
    tick(name, "placement")
    memory = MemoryFigures.from_compiled(c.compiled)
    if where.acc.is_local:
        check = _placement(c, figures["residuals"], placement, platform)
    else:
        check = _target_placement(c.compiled, figures["residuals"], where.acc, memory,
                                  _keeps_state(t))
        _placement_problems(figures, t.plan, check)
    flops = count_flops(c.compiled)
    c.figures = dict(name=name, plan=None if plan is None else plan.to_config(), **figures,
                     memory=memory, flops=flops.flops, placement=check,
                     flops_unknown=flops.reason, flops_counted=flops.counted,
                     breakdown=_breakdown(c.dump, t, c.fn, figures["residuals"], where, c.calls,
                                          memory),
                     xla_remat=c.xla_remat, state=_state(t, c.compiled, c.args, memory, where))
    return c


def _keeps_state(t: MeasureTarget) -> bool:
    return t.state is not None and not t.state.is_default


def _state(t: MeasureTarget, compiled: Any, args: tuple[Any, ...], memory: MemoryFigures,
           where: Where) -> StateFigures | None:
    """The state the target keeps on host, as the compiled step takes it, priced at the
    accelerator's host link (this machine: the default profile's)."""
    acc = where.acc
    link = host_link(None) if acc.is_local or not acc.host_link_bytes_per_s else HostLink(
        acc.name, acc.host_link_bytes_per_s, acc.flops_per_s or 0.0, acc.source)
    return state_figures(t, compiled, args, memory.host_argument_size_in_bytes, link)


def _check_layouts(built: list[_Compiled], builder: Callable[[Plan | None], MeasureTarget],
                   where: Where, tick: _Ticker) -> None:
    """The layout check (:mod:`._layout`) of each plan that splits a scanned stack into layer
    groups or nests it: its temp against one scan of the stack's layers under each of its groups'
    annotations, built with ``builder`` and compiled as the plans are, each reference once per
    report (a plan of the report that is one counts as compiled). A flagged stack is a problem of
    the plan; every check is in its ``layout``."""
    temps: dict[Hashable, int | None] = {}
    for c in built:
        if c.target.plan is not None:
            temps.setdefault(resolution_key(c.target.plan.resolution),
                             c.figures["memory"].temp_size_in_bytes)
    for c in built:
        plan, temp = c.target.plan, c.figures["memory"].temp_size_in_bytes
        if plan is None or temp is None:
            continue
        r = plan.resolution
        checks, problems, notes = [], [], []
        for stack, groups, layout in checked_stacks(r):
            refs: list[tuple[str, int]] = []
            for label, ref in reference_plans(r, stack, groups):
                try:
                    key = reference_key(r, ref)
                    if key not in temps:
                        tick.note(c.name, "reference")
                        temps[key] = _reference_temp(c.name, builder, ref, where)
                except RematError as e:
                    why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    notes.append(f"the layout check of stack {stack!r} was skipped: its one-scan "
                                 f"reference ({label}) could not be built: {why}")
                    refs = []
                    break
                if temps[key] is not None and (label, temps[key]) not in refs:
                    refs.append((label, temps[key]))  # type: ignore[arg-type]
            if not refs:
                continue
            check = LayoutCheck(stack, layout, temp, tuple(refs),
                                stack_param_bytes(tuple(c.target.loss_args), stack))
            checks.append(check)
            if check.flagged:
                problems.append(check.problem())
        c.figures.update(layout=tuple(checks), problems=(*c.figures["problems"], *problems),
                         notes=(*c.figures["notes"], *notes))


def _reference_temp(name: str, builder: Callable[[Plan | None], MeasureTarget], plan: Plan,
                    where: Where) -> int | None:
    """Compiled temp bytes of the step ``builder`` makes under ``plan`` (``None``: the compiler
    refused it)."""
    t = _build(name, functools.partial(builder, plan))
    fn, args = jittable(t.step_fn, tuple(t.step_args))
    tc = compile_lowered(where.lower(t, fn, args), options=where.options)
    if tc.compiled is None:
        return None
    return MemoryFigures.from_compiled(tc.compiled).temp_size_in_bytes


def compile_figures(
    items: Iterable[tuple[str, Plan | None, Callable[[], MeasureTarget]]],
    *,
    before: Callable[[str], None] | None = None,
    accelerator: str | Accelerator | None = None,
    mesh: str | Mapping[str, int] | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> list[PlanReport | RematError]:
    """The compiled figures of each plan, as ``measure(..., steps=0, placement=False)`` reports
    them (residuals verified, memory, FLOPs; no step run, no ratios), in ``items`` order.

    Each XLA compile runs in a worker thread (XLA releases the GIL) while this thread builds, lowers
    and verifies the next plans: tracing and compiling overlap on two cores. One compile runs at a
    time. A plan whose build, lowering or checks raise a :class:`RematError` gets that error in
    its place; other errors propagate.

    Args:
      items: ``(name, plan, make)``, ``make() -> MeasureTarget`` the target under ``plan``.
      before: called with each plan's name before its build.
      accelerator, mesh, compiler_options: compile for this accelerator, with these options (see
        :func:`measure`).
    """
    from concurrent.futures import ThreadPoolExecutor

    where = Where.of(accelerator, mesh, compiler_options,
                     fn="remat_common.measurement.compile_figures")

    def finish(s: Any) -> PlanReport | RematError:
        if isinstance(s, RematError):
            return s
        name, plan, t, fn, args, lower_s, job, figures, calls = s
        tc = job.result()
        if tc.compiled is None:
            return CompilerRefused(f"plan {name!r}: the {where.acc.name} compiler refused "
                                   f"the step: {tc.error}", tc.error)
        compiled, dump = tc.compiled, tc.dump
        try:
            check_step(name, compiled, t.plan, functools.partial(jax.make_jaxpr(fn), *args), t)
        except RematError as e:
            breakdown_of(dump, step_facts((), (), ()), compiler="")  # removes the dump
            return e
        flops = count_flops(compiled)
        memory = MemoryFigures.from_compiled(compiled)
        check = None if where.acc.is_local else _target_placement(
            compiled, figures["residuals"], where.acc, memory, _keeps_state(t))
        _placement_problems(figures, t.plan, check)
        return PlanReport(
            name=name, plan=None if plan is None else plan.to_config(), **figures,
            memory=memory, flops=flops.flops, flop_ratio=None,
            placement=check, timing=StepTiming(lower_s, tc.compile_s),
            flops_unknown=flops.reason, flops_counted=flops.counted,
            breakdown=_breakdown(dump, t, fn, figures["residuals"], where, calls, memory),
            xla_remat=tc.xla_remat, state=_state(t, compiled, args, memory, where))

    # On an accelerator each plan is finished before the next is built: a built target holds its
    # model and training state in device memory, and a few plans of a model that fills the chip
    # staged at once ran a TPU v5e out of memory (RESOURCE_EXHAUSTED while building the next).
    one_at_a_time = where.acc.is_local and jax.default_backend() != "cpu"
    staged: list[Any] = []
    out: list[PlanReport | RematError] = []
    with defer_name_checks(), ThreadPoolExecutor(max_workers=1) as pool:
        for name, plan, make in items:
            if before is not None:
                before(name)
            try:
                t = _build(name, make)
                fn, args = jittable(t.step_fn, tuple(t.step_args))
                t0 = time.perf_counter()
                with scoped_module_calls() as calls:
                    lowered = where.lower(t, fn, args)
                lower_s = time.perf_counter() - t0
                job = pool.submit(where.compile, lowered)
                figures = _residuals(t, plan)  # traced while XLA compiles
            except RematError as e:
                staged.append(e)
                continue
            staged.append((name, plan, t, fn, args, lower_s, job, figures, calls))
            if one_at_a_time:
                out.extend(finish(x) for x in staged)
                staged.clear()
                del t, fn, args
                release_device_memory()
        out.extend(finish(x) for x in staged)
    return out


def _time_steps(built: list[_Compiled], rounds: int, warmup: int, tick: _Ticker) -> None:
    """Runs every plan's step ``rounds`` times as a training loop does (:class:`._step.FedSteps`:
    state donated, each step's outputs the next one's inputs; the first ``warmup`` untimed).

    On a CPU, round by round with the order rotated so no plan always runs first: the plans share
    a noisy machine, and interleaving makes their times comparable as ratios. On an accelerator,
    plan after plan (:func:`measure` times each once measured), each plan's state, parked on host
    (:func:`_park`), brought to the device for its steps and released after them, so that the
    device and the host hold one plan's state at a time, as training does.
    """
    if not rounds:
        return
    steps = [FedSteps(c.name, c.compiled, c.args, c.donated) for c in built]

    def one(c: _Compiled, s: FedSteps, rnd: int) -> None:
        dt = s.run()
        if rnd >= warmup:
            c.times.append(dt)

    if jax.default_backend() == "cpu":
        for rnd in range(rounds):
            tick(None, "time")
            k = rnd % len(built)
            for c, s in zip(built[k:] + built[:k], steps[k:] + steps[:k]):
                one(c, s, rnd)
    else:
        for c, s in zip(built, steps):
            tick.note(c.name, "time")
            for rnd in range(rounds):
                one(c, s, rnd)
            s.release()
        tick.done += rounds
    for c in built:
        c.args = ()  # the step's inputs are no longer needed


def measure_parked(target: MeasureTarget, name: str = "step") -> Any:
    """One step measured as :func:`measure` measures each plan, then parked on the host as it is
    on an accelerator before the steps run (:func:`_park`): its ``args`` on the CPU device, its
    ``target`` holding shapes only. For checking that parking lets go of the device arrays."""
    c = _measure_plan(name, None, lambda: target, _Ticker(None, 4), False, "cuda")
    _park(c, jax.devices("cpu")[0])
    return c


def release_device_memory() -> None:
    """On an accelerator, frees the device arrays of the models built and let go of. A Flax NNX
    model is a graph of objects that refer to each other, so its parameters and optimizer state
    outlive the last reference to it until Python's cycle collector runs, which a long search
    rarely triggers: on a TPU v5e, 11 compiles of a capacity search left 7.4 GiB of the chip's
    15.75 held, and timing a plan after it could not load its program (``RESOURCE_EXHAUSTED``,
    8.32 GiB free). On a CPU the arrays are host memory: nothing is collected."""
    if jax.default_backend() != "cpu":
        gc.collect()


def _park(c: _Compiled, cpu: Any | None) -> None:
    """Moves a measured plan's step inputs to host memory (the device ``cpu``; ``None``: drops
    them, their shapes kept) and keeps only the shapes of its target's arrays, so that an
    accelerator holds no plan's state until its steps run (it fits one plan's state and step,
    not every plan's state at once)."""
    shapes = functools.partial(jax.tree_util.tree_map,
                               lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
                               if isinstance(x, jax.Array) else x)
    c.args = (shapes(tuple(c.args)) if cpu is None else tuple(
        jax.device_put(x, cpu, may_alias=False) if isinstance(x, jax.Array) else x
        for x in c.args))
    c.target = dataclasses.replace(c.target, loss_args=shapes(tuple(c.target.loss_args)),
                                   step_args=())
    c.fn.arg_leaves = tuple((p, shapes(x)) for p, x in c.fn.arg_leaves)
    c.jitted = None  # jax.jit's wrapper copied the step's attributes (its arguments among them)


def _report(built: list[_Compiled], names: list[str], baseline: str, caps: Capabilities,
            warmup: int, where: Where = _LOCAL) -> Report:
    """Ratios against the baseline, the CSE note where it applies, and the backend's notes."""
    by_name = {c.name: c for c in built}
    timings = {c.name: StepTiming(c.lower_s, c.compile_s, tuple(c.times), warmup) for c in built}
    base_flops = by_name[baseline].figures["flops"]
    base_time = timings[baseline].median_s
    out = tuple(
        PlanReport(**by_name[n].figures, flop_ratio=_ratio(by_name[n].figures["flops"], base_flops),
                   timing=timings[n], step_time_ratio=_ratio(timings[n].median_s, base_time))
        for n in names
    )
    recomputes = {c.name: _recomputes(c.target.plan) for c in built}
    out = tuple(_with_cse_note(p, recomputes[p.name], out[names.index(baseline)],
                               not recomputes[baseline], caps) for p in out)
    out = tuple(_with_flops_below_note(p, recomputes[p.name], baseline, not recomputes[baseline])
                for p in out)
    if where.acc.is_local:
        return Report(out, baseline, caps, backend_notes(caps), compiler=compiler_identity())
    return Report(out, baseline, caps, target_notes(where.acc), accelerator_record(where.acc, where.mesh),
                  compiler=compiler_identity(where.acc.platform))


