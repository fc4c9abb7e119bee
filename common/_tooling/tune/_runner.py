"""Compiling the tuner's plans: :class:`Runner` compiles each plan (:func:`compile_figures`), turns
its report into a :class:`TunePoint` and says the progress; what a plan's config is
(:func:`config_of`)."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from ..._capabilities import capabilities
from ..._errors import PlanTypeError, RematError
from ..._plan import Plan
from ..._state import StatePlacement
from ..measurement._flops import count_flops
from ..measurement._measure import compile_figures
from ..measurement._target import Where
from ..measurement._measure import measure as measure_plans
from ..accelerators._compilers import OUT_OF_MEMORY
from ..accelerators._profiles import DeviceProfile, host_link
from ..accelerators._units import fmt_bytes
from ..measurement._report import PlanReport
from ._model import Builder
from ._result import Objective, TunePoint, TuneEvent


class Runner:
    """Compiles plans (:func:`compile_figures`) and turns each report into a :class:`TunePoint`."""

    def __init__(self, build: Builder, objective: Objective, profile: DeviceProfile | None,
                 max_compiles: int, deadline: float | None,
                 progress: Callable[[TuneEvent], None] | None, where: Where | None = None) -> None:
        self.build, self.objective, self.profile = build, objective, profile
        self.where = where or Where.of(None, None)
        self.link = host_link(profile)
        self.max_compiles, self.deadline, self.progress = max_compiles, deadline, progress
        self.caps = capabilities()
        self.compiles = 0
        self.cached = 0
        self.cache: dict[str, Any] | None = None
        #: where every plan compiled keeps the training state between steps (a plan's ``state:``)
        self.state = StatePlacement()
        #: ``{pattern: {tag: NAME}}`` rules every plan compiled carries (``tune(tags=...)``)
        self.tags: dict[str, Any] = {}
        #: count a program XLA's rematerialization pass changed as fitting at its compiled peak
        self.accept_xla_remat = False
        #: plans whose FLOPs are the countable part only, by the reason (the loops left uncounted)
        self.partial: dict[str, list[str]] = {}
        #: :attr:`state` and the arrays it puts on host (:meth:`host_arrays`), once resolved
        self._resolved: tuple[StatePlacement, list[int] | None] | None = None

    @property
    def exhausted(self) -> bool:
        return self.compiles >= self.max_compiles or (
            self.deadline is not None and time.perf_counter() > self.deadline)

    def cost(self, flops: float, host_bytes: int, state_bytes: int = 0) -> float:
        """What the objective minimises for a plan of ``flops`` offloading ``host_bytes`` of
        residuals and keeping ``state_bytes`` of training state on host (each goes to host and
        comes back every step)."""
        if self.objective == "time":
            assert self.profile is not None
            return self.profile.step_seconds(flops, 2 * host_bytes, 2 * state_bytes)
        # offload is not free: the residuals' and the state's trips, as FLOPs (host_link)
        return flops + self.link.flop_equivalent(2 * (host_bytes + state_bytes))

    def _count(self, name: str) -> None:
        if self.progress is not None:
            self.progress(TuneEvent("compile", name, self.compiles, self.max_compiles))
        self.compiles += 1

    def plan(self, config: dict[str, Any] | None) -> Plan | None:
        """The plan of a job's config, with the training state where :attr:`state` keeps it."""
        return None if config is None else Plan.from_mapping(config, state=self.state)

    def key(self, config: dict[str, Any] | None) -> str:
        """A config's cache key: the config, and the state placement where not all on device. A
        part of a kind (a fraction of the layers, module patterns) is keyed by the arrays it
        resolves to (:meth:`host_arrays`): ``optimizer=0.375`` and ``optimizer=0.5`` both put the
        last 2 of 4 layers on host, one program, compiled once."""
        if self.state.is_default:
            return json.dumps(config, sort_keys=True)
        arrays = self.host_arrays()
        if arrays is None:
            return json.dumps([config, self.state.to_config()], sort_keys=True)
        return json.dumps([config, {"on_host": list(self.state.on_host), "arrays": arrays}],
                          sort_keys=True)

    def host_arrays(self) -> list[int] | None:
        """Where :attr:`state` keeps a part of a kind on host: the positions, among the leaves of
        the target's step arguments, of the arrays the step takes in host memory
        (``remat_common.state.host_roles`` resolved by the target's ``with_state``), from one
        build of the target; ``None`` for whole kinds, or where that build fails (its error is
        each plan's, as before)."""
        if not self.state.partial:
            return None
        if self._resolved is None or self._resolved[0] != self.state:
            try:
                target = self.build(Plan.from_mapping({"**": "inherit"}, state=self.state))
                leaves = jax.tree_util.tree_leaves(target.step_args)
                arrays: list[int] | None = [
                    i for i, x in enumerate(leaves)
                    if getattr(getattr(x, "sharding", None), "memory_kind", None) == "pinned_host"]
            except RematError:
                arrays = None
            self._resolved = (self.state, arrays)
        return self._resolved[1]

    def report(self, name: str, plan: Plan | None, build: Builder | None = None) -> PlanReport:
        """One plan's compiled figures (a :class:`RematError` from its build or checks is raised)."""
        make = functools.partial(build or self.build, plan)
        self._count(name)
        (r,) = compile_figures([(name, plan, make)], accelerator=self.where.acc,
                               mesh=self.where.mesh, compiler_options=self.where.options)
        if isinstance(r, RematError):
            raise r
        return r

    def peak(self, r: PlanReport) -> tuple[int, bool]:
        """The device peak (state the plan keeps on host left out: :attr:`PlanReport.device_peak`)
        and whether it is an estimate (host bytes the compiler here did not place, taken out)."""
        total = r.device_peak
        if total is None:
            raise RematError(
                "remat_common.tune: the backend gives no memory_analysis() for the compiled step "
                f"({self.caps.backend}), so no plan can be checked against a budget.")
        dropped = r.state is not None and r.state.counted_on_device
        if r.host_bytes and not self.caps.host_offload_placed and self.where.acc.is_local:
            return total - r.host_bytes // self.split, True  # on a target, its compiler placed them
        return total, dropped

    @property
    def split(self) -> int:
        """The devices the batch is split over: the residuals are traced for the whole batch,
        the peak (and each device's host link) is per device."""
        return math.prod(self.where.mesh.values()) if self.where.mesh else 1

    def check_state(self, r: PlanReport) -> None:
        """Raises :class:`StateNotApplicable` where the plans keep state on host (:attr:`state`)
        but the compiled step ``r`` moves none there: the target does not place its state as a
        plan's ``state:`` says, or its state holds none of the parts placed on host."""
        if self.state.is_default:
            return
        config = ", ".join(f"{k}: {v}" for k, v in self.state.to_config().items())
        if r.state is None:
            why, fix = (
                "the target's step does not put its training state where a plan's state: says (its "
                "MeasureTarget carries no state: the target never passes plan.state to "
                "remat_common.measurement.with_state)",
                "or build the target's step with with_state(target, plan.state, roles), as the "
                "examples' measure_target does")
        elif not sum(int(r.state.state_bytes.get(k, 0)) for k in self.state.on_host):
            label = {"optimizer": "optimizer state", "params": "parameters"}
            held = ", ".join(f"{label.get(k, k)} {fmt_bytes(v)}"
                             for k, v in r.state.state_bytes.items())
            parts = " or ".join(label[k] for k in self.state.on_host)
            why, fix = (f"the target's training state holds no {parts} ({held})",
                        "or give the target the state it trains with")
        else:
            return
        raise StateNotApplicable(_MSG_STATE_NOT_APPLICABLE.format(
            placement=self.state.describe(), config=config, why=why, fix=fix), why)

    def _figures(self, name: str, r: PlanReport) -> tuple[Any, ...]:
        self.check_state(r)
        flops = r.flops
        if flops is None:
            if r.flops_counted is None:
                raise Unrankable(MSG_UNRANKABLE.format(
                    what=f"the FLOPs of plan {name!r}", reason=r.flops_unknown,
                    when=f"after {self.compiles} compile(s), at the first plan that showed it"))
            flops = r.flops_counted  # a lower bound: the loops without a trip count once
            self.partial.setdefault(r.flops_unknown or "", []).append(name)
        peak, est = self.peak(r)
        dominant = [] if r.breakdown is None else [list(g) for g in r.breakdown.largest(3)]
        # per device, as the peak: a model of global residuals against per-device peaks predicted
        # -20 GiB to 277 GiB for plans that compiled to 51-62 GiB (Llama-3-8B, h100x8, fsdp=8)
        return (peak, est, r.device_bytes // self.split, r.host_bytes // self.split, flops,
                tuple(r.problems), dominant, r.xla_remat,
                0 if r.state is None else r.state.host_argument_bytes)

    def points(self, jobs: Sequence[Job], *, at_least_one: bool = False
               ) -> list[TunePoint | RematError | None]:
        """Each job's point, in order: from the cache, else compiled (the compiles of a batch
        overlap its tracing: :func:`compile_figures`); a :class:`RematError` where the plan could
        not be built or checked; ``None`` where the compile or time limit left it out (the first
        job is compiled regardless when ``at_least_one``)."""
        out: list[TunePoint | RematError | None] = [None] * len(jobs)
        if self.tags:  # every plan names what the tags name (the plan recorded included)
            jobs = [j if j.config is None else j._replace(config={**j.config, **self.tags})
                    for j in jobs]
        keys = [self.key(j.config) for j in jobs]
        todo: list[int] = []
        again: dict[int, int] = {}  # a plan twice in the batch: compiled once
        first: dict[str, int] = {}
        for i, (job, key) in enumerate(zip(jobs, keys)):
            hit = None if self.cache is None else self.cache.get(key)
            if hit is not None:
                self.cached += 1
                out[i] = self._point(job, hit)
            elif key in first:
                again[i] = first[key]
            else:
                first[key] = i
                todo.append(i)
        figures: dict[int, tuple[Any, ...]] = {}
        sent: list[int] = []

        def items() -> Any:
            for i in todo:
                if self.exhausted and not (at_least_one and i == 0):
                    return
                job = jobs[i]
                self._count(job.name)
                sent.append(i)
                plan = self.plan(job.config)
                yield job.name, plan, functools.partial(self.build, plan)

        results = compile_figures(items(), accelerator=self.where.acc,  # fills ``sent`` as it goes
                                  mesh=self.where.mesh, compiler_options=self.where.options)
        for i, r in zip(sent, results):
            if isinstance(r, RematError):
                out[i] = r
                continue
            try:
                hit = self._figures(jobs[i].name, r)
            except (Unrankable, StateNotApplicable):
                raise  # no plan can be ranked, or none placed: stop now, not after every one
            except RematError as e:
                out[i] = e
                continue
            if self.cache is not None:
                self.cache[keys[i]] = hit
            figures[i] = hit
            out[i] = got = self._point(jobs[i], hit)
            if self.progress is not None:
                self.progress(TuneEvent("compiled", got.name, self.compiles, self.max_compiles,
                                        got.summary()))
        for i, j in again.items():
            if j in figures:
                self.cached += 1
                out[i] = self._point(jobs[i], figures[j])
            else:  # left out, or an error
                out[i] = out[j] if isinstance(out[j], RematError) else None
        return out

    def time_steps(self, pts: Sequence[TunePoint], steps: int
                   ) -> tuple[dict[str, float], dict[str, str]]:
        """Median step time of each point's plan, compiled again and run side by side, and the
        plans the device ran out of memory for while running them (``{name: error}``). On an
        accelerator each plan is timed in a measurement of its own (:func:`measure` runs them
        one after another there anyway), so that one the device cannot load leaves the times of
        the others: on a TPU v5e the runtime had 8.32 of 11.51 GiB free to load a fourth plan's
        program after three 15.2 GiB ones had run."""
        for p in pts:
            self._count(f"{p.name} (timed)")
        plans = {p.name: self.plan(p.plan) for p in pts}
        groups = ([plans] if jax.default_backend() == "cpu"
                  else [{n: q} for n, q in plans.items()])
        reports: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for group in groups:
            try:
                rep = measure_plans(self.build, group, steps=steps, warmup=2, placement=False,
                                    compiler_options=self.where.options,
                                    check_layouts=False)  # timing only: the search compiled them
            except Exception as e:  # noqa: BLE001 - out of device memory: that plan untimed
                if len(groups) == 1 or not OUT_OF_MEMORY.search(str(e)):
                    raise
                failed[next(iter(group))] = (str(e).strip().splitlines() or [""])[0][:300]
                continue
            reports.update({n: rep[n] for n in group})
        out = {}
        for p in pts:
            if p.name in failed:
                continue
            again = self.peak(reports[p.name])[0]
            if again != p.peak:
                raise RematError(f"remat_common.tune: plan {p.name!r} compiled to a peak of "
                                 f"{again} bytes to be timed, {p.peak} bytes in the search; the "
                                 "step is not deterministic, so its figures cannot be trusted.")
            median = reports[p.name].timing.median_s
            assert median is not None  # steps >= 1
            out[p.name] = median
        return out, failed

    def point(self, name: str, config: dict[str, Any] | None, assignment: tuple[str, ...] | None,
              source: str, predicted: float | None = None) -> TunePoint:
        """One plan's point (raises its :class:`RematError`; the caller checks the limits)."""
        (p,) = self.points([Job(name, config, assignment, source, predicted)])
        if isinstance(p, RematError):
            raise p
        assert p is not None, "point() called past the compile limit"
        return p

    def _point(self, job: Job, hit: tuple[Any, ...]) -> TunePoint:
        peak, est, dev, host, flops, problems = hit[:6]
        dominant = tuple((str(k), m, int(b)) for k, m, b in (hit[6] if len(hit) > 6 else ()))
        state = int(hit[8]) if len(hit) > 8 else 0
        # state on host moves to the device and back each step: priced as host traffic
        return TunePoint(job.name, job.config, job.assignment, peak, est, dev, host, flops,
                         self.cost(flops, host, state), job.predicted, job.source,
                         tuple(problems), dominant, hit[7] if len(hit) > 7 else None, state,
                         self.accept_xla_remat)


class Unrankable(RematError):
    """The search cannot rank plans: their FLOPs cannot be counted at all."""


class StateNotApplicable(RematError):
    """The plans keep training state on host, but the target's step moves none there (``why``):
    the search would price a transfer that cannot happen."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


_MSG_STATE_NOT_APPLICABLE = (
    "remat_common.tune: every plan keeps {placement} between steps (state: {{{config}}}), but "
    "{why}: nothing would move to host, and the search would price a transfer that cannot "
    "happen and write a plan whose state: changes nothing. Fix: search with the state on device "
    "(state='device'; remat tune --state device), {fix}.")


class NoUsablePlan(RematError):
    """No plan the search compiled could be used (the compiler refused each, or none could be
    built); ``compiles``: how many it compiled."""

    def __init__(self, message: str, compiles: int) -> None:
        super().__init__(message)
        self.compiles = compiles


MSG_UNRANKABLE = (
    "remat_common.tune: {what} cannot be counted ({reason}), and the search ranks plans by them; "
    "it stopped {when}. Fix: run the search with a jax whose compiled steps can be costed per "
    "loop iteration (jax 0.11.0 to 0.12 on CPU can), or compare plans "
    "by compiled peak alone with `remat report`, which shows these FLOPs as unknown.")


@functools.cache
def flops_countable() -> str | None:
    """Why the FLOPs of a compiled step cannot be counted here (``None``: they can), from a probe
    as small as a step gets: a scan whose body draws random numbers (a loop in a loop, and the
    RNG's loops XLA:CPU outlines into calls), compiled in milliseconds."""
    import jax.numpy as jnp

    def probe(h: jax.Array, key: jax.Array) -> jax.Array:
        def body(c: jax.Array, k: jax.Array) -> tuple[jax.Array, None]:
            return jnp.tanh(c * jax.random.uniform(jax.random.fold_in(k, 1), c.shape)), None

        return jax.lax.scan(body, h, jax.random.split(key, 2))[0].sum()

    got = count_flops(jax.jit(probe).lower(jnp.ones((4,)), jax.random.key(0)).compile())
    return None if got.counted is not None else got.reason


class Job(NamedTuple):
    """A plan for the runner: its point's name, plan config, assignment, source, prediction."""

    name: str
    config: dict[str, Any] | None
    assignment: tuple[str, ...] | None
    source: str
    predicted: float | None = None
def config_of(value: Any, what: str = "plan") -> dict[str, Any]:
    try:
        plan = Plan.coerce(value)
    except PlanTypeError as e:  # the value itself is no plan: say which one
        raise PlanTypeError(f"{what}: {e}") from None
    return {r.pattern: r.annotation.to_config() for r in plan.rules}
